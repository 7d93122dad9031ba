//! The client side of TLS (`tls:host:port`): the CA that must have signed the server's
//! certificate, the certificate and key that prove who this client is, and errors that
//! say which side refused what.
//!
//! TLS 1.3 only (rustls with the ring provider, as the server). The server's certificate
//! is checked against `ca` and against the host name of the endpoint (or
//! [`ClientTls::server_name`]) at every connection, reconnections included. After the
//! handshake the connection carries the same frames as a plaintext one.

use decree_core::StoreError;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// A TLS connection over a blocking TCP socket.
pub(crate) type TlsStream = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// How this client connects with TLS: built once from PEM files, shared by every
/// connection of a [`crate::RemoteDecisions`].
#[derive(Debug, Clone)]
pub struct ClientTls {
    config: Arc<rustls::ClientConfig>,
    /// The name the server's certificate must carry; `None`: the endpoint's host.
    pub server_name: Option<String>,
}

impl ClientTls {
    /// Trusts the CA certificates of `ca` for the server and proves this client with the
    /// certificate chain of `cert` and the private key of `key` (all PEM files).
    pub fn from_files(ca: &Path, cert: &Path, key: &Path) -> Result<ClientTls, StoreError> {
        let bad = |what: &str, path: &Path, e: &dyn std::fmt::Display| {
            StoreError::Unreachable(format!("TLS {what} {}: {e}", path.display()))
        };
        let mut roots = rustls::RootCertStore::empty();
        for ca_cert in certificates(ca).map_err(|e| bad("CA", ca, &e))? {
            roots.add(ca_cert).map_err(|e| bad("CA", ca, &e))?;
        }
        let chain = certificates(cert).map_err(|e| bad("certificate", cert, &e))?;
        let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| bad("key", key, &e))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| StoreError::Unreachable(format!("TLS: {e}")))?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key_der)
            .map_err(|e| {
                StoreError::Unreachable(format!(
                    "TLS certificate {} and key {} do not make a usable client certificate: {e}",
                    cert.display(),
                    key.display()
                ))
            })?;
        Ok(ClientTls { config: Arc::new(config), server_name: None })
    }

    /// Same, expecting the server's certificate to name `name` instead of the endpoint's host.
    pub fn with_server_name(mut self, name: impl Into<String>) -> ClientTls {
        self.server_name = Some(name.into());
        self
    }

    /// The rustls configuration of this client's connections, for a benchmark's bare TLS
    /// round trip that must cost what the client's TLS costs.
    pub fn rustls_config(&self) -> Arc<rustls::ClientConfig> {
        self.config.clone()
    }

    /// Runs the TLS handshake over `socket` (connected to `host`), within `timeout`.
    pub(crate) fn handshake(
        &self,
        socket: TcpStream,
        host: &str,
        timeout: Duration,
    ) -> std::io::Result<TlsStream> {
        let name = self.server_name.as_deref().unwrap_or(host);
        let server_name = ServerName::try_from(name.to_string())
            .map_err(|e| std::io::Error::other(format!("{name:?} is not a valid TLS server name: {e}")))?;
        let connection = rustls::ClientConnection::new(self.config.clone(), server_name)
            .map_err(|e| std::io::Error::other(format!("TLS: {e}")))?;
        let previous = socket.read_timeout()?;
        socket.set_read_timeout(Some(timeout))?;
        let mut stream = rustls::StreamOwned::new(connection, socket);
        while stream.conn.is_handshaking() {
            stream.conn.complete_io(&mut stream.sock).map_err(explain)?;
        }
        stream.sock.set_read_timeout(previous)?;
        Ok(stream)
    }
}

/// The PEM certificates of `path` (at least one).
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(|e| e.to_string())?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    if certificates.is_empty() {
        return Err("holds no PEM certificate".into());
    }
    Ok(certificates)
}

/// An IO error of a TLS connection, with what it means for the operator: which side
/// refused which certificate, or that the server does not speak TLS.
pub(crate) fn explain(e: std::io::Error) -> std::io::Error {
    use rustls::{AlertDescription as Alert, CertificateError as Cert, Error as Tls};
    let Some(tls) = e.get_ref().and_then(|inner| inner.downcast_ref::<Tls>()) else {
        if e.kind() == std::io::ErrorKind::UnexpectedEof || e.kind() == std::io::ErrorKind::ConnectionReset {
            return std::io::Error::new(
                e.kind(),
                format!(
                    "{e}: the server closed the connection during the TLS handshake (a listener \
                     without TLS does so; otherwise the server's log says why)"
                ),
            );
        }
        return e;
    };
    let meaning = match tls {
        Tls::AlertReceived(Alert::CertificateExpired) => {
            "the server refused this client's certificate: it has expired (or is not yet valid)"
        }
        Tls::AlertReceived(Alert::UnknownCA | Alert::BadCertificate | Alert::DecryptError) => {
            "the server refused this client's certificate: it does not chain to the CA the server \
             trusts (tls.client_ca)"
        }
        Tls::AlertReceived(Alert::CertificateRequired) => {
            "the server requires a client certificate (mutual TLS)"
        }
        Tls::AlertReceived(Alert::ProtocolVersion) => "the server does not speak TLS 1.3",
        Tls::InvalidCertificate(Cert::Expired | Cert::ExpiredContext { .. }) => {
            "the server's certificate has expired"
        }
        Tls::InvalidCertificate(Cert::UnknownIssuer) => {
            "the server's certificate is not signed by the CA this client trusts"
        }
        Tls::InvalidCertificate(Cert::NotValidForName | Cert::NotValidForNameContext { .. }) => {
            "the server's certificate does not name the host this client connected to"
        }
        Tls::InvalidMessage(_) => {
            "the server did not answer in TLS: is it listening without TLS? (use tcp:host:port then)"
        }
        _ => "",
    };
    if meaning.is_empty() {
        return e;
    }
    std::io::Error::new(e.kind(), format!("{meaning} ({tls})"))
}

/// The host part of `host:port` (brackets of an IPv6 literal removed), the name the
/// server's certificate must carry.
pub(crate) fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Where a [`ClientTls`] comes from on the command line: three paths given together.
#[derive(Debug, Clone, Default)]
pub struct ClientTlsFiles {
    /// The CA of the server's certificate.
    pub ca: Option<PathBuf>,
    /// This client's certificate chain.
    pub cert: Option<PathBuf>,
    /// This client's private key.
    pub key: Option<PathBuf>,
}

impl ClientTlsFiles {
    /// `None` when no path is given; an error that names what is missing when only some are.
    pub fn load(&self) -> Result<Option<ClientTls>, StoreError> {
        match (&self.ca, &self.cert, &self.key) {
            (None, None, None) => Ok(None),
            (Some(ca), Some(cert), Some(key)) => ClientTls::from_files(ca, cert, key).map(Some),
            _ => Err(StoreError::Unreachable(
                "TLS needs three files together: the server's CA, this client's certificate and its key"
                    .into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_of_an_address_is_what_the_certificate_must_name() {
        assert_eq!(host_of("db.example:7411"), "db.example");
        assert_eq!(host_of("127.0.0.1:7411"), "127.0.0.1");
        assert_eq!(host_of("[::1]:7411"), "::1");
    }

    #[test]
    fn files_given_in_part_are_refused_by_what_is_missing() {
        assert!(ClientTlsFiles::default().load().unwrap().is_none());
        let partial = ClientTlsFiles { ca: Some("ca.pem".into()), ..Default::default() };
        let e = partial.load().unwrap_err().to_string();
        assert!(e.contains("three files"), "{e}");
        let missing = ClientTlsFiles {
            ca: Some("/nonexistent/ca.pem".into()),
            cert: Some("c.pem".into()),
            key: Some("c.key".into()),
        };
        let e = missing.load().unwrap_err().to_string();
        assert!(e.contains("TLS CA /nonexistent/ca.pem"), "{e}");
    }
}
