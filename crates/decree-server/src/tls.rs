//! TLS on the TCP listener: who may connect, proved by certificate (mutual TLS).
//!
//! The protocol has no authentication of its own; on a Unix socket the file mode is the
//! authorisation, and on loopback TCP the machine is. Across machines, the TCP listener
//! runs TLS 1.3 (rustls, the ring provider: no OpenSSL) and asks every client for a
//! certificate that chains to `tls.client_ca`. The names the certificate carries (its DNS
//! subject-alternative names, else its common name) are who the client is: the server logs
//! them with the session and, when `tls.clients_allowed` is set, refuses a client that
//! names no one in it with a `NotAllowed` error frame before reading its `Hello`.
//!
//! Not here: the accept loop and its limits (`lib.rs`), the frames (`connection.rs`). The
//! files are read at start and again on [`TlsListener::reload`] (SIGHUP): a reload that
//! fails keeps the configuration that works and says why.

use crate::config::{ConfigError, TlsConfig};
use parking_lot::RwLock;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

/// The first byte of every TLS record that opens a connection (a handshake record). A
/// decree frame starts with its length, whose first byte is 0 for every frame up to 16 MiB,
/// so this byte tells a TLS client from a plaintext one without ambiguity.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Certificates in the chain file, or CA certificates, read at most: a bound on what a
/// wrong path (a directory of certificates concatenated) can make the server parse.
const PEM_CERTIFICATES_MAX: usize = 64;

/// Who a client's certificate says it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    /// The DNS subject-alternative names, then the common names: what `clients_allowed`
    /// matches and what the log shows.
    pub names: Vec<String>,
}

impl ClientIdentity {
    /// The name the log shows for the session (the first one), or a placeholder for a
    /// certificate that names no one.
    pub fn display_name(&self) -> &str {
        self.names.first().map(String::as_str).unwrap_or("(a certificate without names)")
    }
}

/// The TCP listener's TLS state: the rustls configuration in use and the files it came
/// from, so that a reload rereads them.
pub struct TlsListener {
    config: TlsConfig,
    server: RwLock<Arc<rustls::ServerConfig>>,
}

/// What became of the first bytes of an accepted TCP connection.
pub enum Upgraded {
    /// The client spoke TLS and its certificate chains to the CA.
    Tls(Box<TlsStream<TcpStream>>, ClientIdentity),
    /// The client's first byte was not a TLS handshake: it speaks plaintext.
    Plaintext(TcpStream),
    /// The client closed before sending anything.
    Closed,
}

impl TlsListener {
    /// Reads the certificate, key and client CA named by `config`.
    pub fn load(config: &TlsConfig) -> Result<TlsListener, ConfigError> {
        let server = build_server_config(config)?;
        Ok(TlsListener { config: config.clone(), server: RwLock::new(server) })
    }

    /// Rereads the files; on an error the configuration in use stays and the error says
    /// which file is wrong. Connections already open keep the certificate they agreed on.
    pub fn reload(&self) -> Result<(), ConfigError> {
        let server = build_server_config(&self.config)?;
        *self.server.write() = server;
        Ok(())
    }

    /// The rustls configuration in use, for a benchmark's bare TLS echo that must cost what
    /// the listener's TLS costs (same versions, provider and client verification).
    pub fn rustls_config(&self) -> Arc<rustls::ServerConfig> {
        self.server.read().clone()
    }

    /// Whether `identity` may open a session: any certificate of the CA when
    /// `clients_allowed` is empty, else one that carries an allowed name.
    pub fn allows(&self, identity: &ClientIdentity) -> bool {
        allowed(&self.config.clients_allowed, identity)
    }

    /// Tells TLS from plaintext by the first byte, then runs the TLS handshake (which
    /// checks the client's certificate against the CA). The caller bounds the time.
    pub async fn upgrade(&self, stream: TcpStream) -> std::io::Result<Upgraded> {
        let mut first = [0u8; 1];
        if stream.peek(&mut first).await? == 0 {
            return Ok(Upgraded::Closed);
        }
        if first[0] != TLS_HANDSHAKE_RECORD {
            return Ok(Upgraded::Plaintext(stream));
        }
        let acceptor = tokio_rustls::TlsAcceptor::from(self.server.read().clone());
        let stream = acceptor.accept(stream).await?;
        let identity = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .map(|leaf| identity_of(leaf.as_ref()))
            .unwrap_or(ClientIdentity { names: Vec::new() });
        Ok(Upgraded::Tls(Box::new(stream), identity))
    }
}

/// Whether `identity` carries a name of `allowed` (everyone when `allowed` is empty).
pub fn allowed(allowed: &[String], identity: &ClientIdentity) -> bool {
    allowed.is_empty() || identity.names.iter().any(|name| allowed.contains(name))
}

/// The names of a DER certificate: DNS subject-alternative names first, then common names.
/// A certificate that does not parse here passed rustls's own checks, so it names no one.
pub fn identity_of(der: &[u8]) -> ClientIdentity {
    let mut names = Vec::new();
    if let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) {
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for name in &san.value.general_names {
                if let x509_parser::extensions::GeneralName::DNSName(dns) = name {
                    names.push(dns.to_string());
                }
            }
        }
        for cn in cert.subject().iter_common_name() {
            if let Ok(text) = cn.as_str() {
                if !names.iter().any(|n| n == text) {
                    names.push(text.to_string());
                }
            }
        }
    }
    ClientIdentity { names }
}

/// What a failed handshake means for the operator: which side refused which certificate.
/// The rustls error itself is logged beside it.
pub fn explain_handshake(e: &std::io::Error) -> &'static str {
    use rustls::{AlertDescription as Alert, CertificateError as Cert, Error as Tls};
    let Some(tls) = e.get_ref().and_then(|inner| inner.downcast_ref::<Tls>()) else {
        return "the connection failed during the TLS handshake";
    };
    match tls {
        Tls::NoCertificatesPresented => {
            "the client sent no certificate; this listener requires one (mutual TLS)"
        }
        Tls::InvalidCertificate(Cert::Expired | Cert::ExpiredContext { .. }) => {
            "the client's certificate has expired"
        }
        Tls::InvalidCertificate(Cert::NotValidYet | Cert::NotValidYetContext { .. }) => {
            "the client's certificate is not valid yet"
        }
        Tls::InvalidCertificate(Cert::UnknownIssuer | Cert::BadSignature) => {
            "the client's certificate does not chain to tls.client_ca"
        }
        Tls::InvalidCertificate(_) => "the client's certificate was refused",
        Tls::AlertReceived(Alert::UnknownCA) => {
            "the client does not trust this server's certificate: its CA is not the one the client trusts"
        }
        Tls::AlertReceived(Alert::BadCertificate | Alert::CertificateUnknown) => {
            "the client refused this server's certificate (does it name the host the client connects to?)"
        }
        Tls::AlertReceived(Alert::CertificateExpired) => {
            "the client refused this server's certificate as expired"
        }
        Tls::PeerIncompatible(_) | Tls::AlertReceived(Alert::ProtocolVersion) => {
            "the client does not speak TLS 1.3"
        }
        _ => "the TLS handshake failed",
    }
}

/// Sends an error frame over an established TLS session and closes it (the close_notify
/// tells the client the frame is complete).
pub async fn refuse_tls(mut stream: TlsStream<TcpStream>, code: decree_proto::ErrorCode, why: String) {
    let mut buf = Vec::new();
    decree_proto::encode_frame(&mut buf, 0, &decree_proto::Message::Error { code, message: why });
    let _ = stream.write_all(&buf).await;
    let _ = stream.flush().await;
    let _ = stream.shutdown().await;
}

/// Answers a plaintext client of a TLS listener with a plaintext `TlsRequired` frame, after
/// reading what it sent (at most one frame's worth, so that the close does not reset the
/// connection before the client reads the answer).
pub async fn refuse_plaintext(mut stream: TcpStream, why: String) {
    let mut buf = Vec::new();
    decree_proto::encode_frame(
        &mut buf,
        0,
        &decree_proto::Message::Error { code: decree_proto::ErrorCode::TlsRequired, message: why },
    );
    let _ = stream.write_all(&buf).await;
    let _ = stream.shutdown().await;
    let mut drain = [0u8; 4096];
    let _ = tokio::time::timeout(std::time::Duration::from_millis(100), stream.read(&mut drain)).await;
}

/// The rustls configuration of `config`: TLS 1.3 only, a client certificate required and
/// checked against the client CA.
fn build_server_config(config: &TlsConfig) -> Result<Arc<rustls::ServerConfig>, ConfigError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = read_certificates(&config.cert, "tls.cert")?;
    let key = PrivateKeyDer::from_pem_file(&config.key).map_err(|e| {
        ConfigError(format!("tls.key {}: no private key could be read: {e}", config.key.display()))
    })?;
    let mut roots = rustls::RootCertStore::empty();
    for ca in read_certificates(&config.client_ca, "tls.client_ca")? {
        roots.add(ca).map_err(|e| {
            ConfigError(format!(
                "tls.client_ca {}: not a usable CA certificate: {e}",
                config.client_ca.display()
            ))
        })?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| ConfigError(format!("tls.client_ca {}: {e}", config.client_ca.display())))?;
    let server = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| ConfigError(format!("tls: {e}")))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| {
            ConfigError(format!(
                "tls.cert {} and tls.key {} do not make a usable certificate: {e}",
                config.cert.display(),
                config.key.display()
            ))
        })?;
    Ok(Arc::new(server))
}

/// The PEM certificates of `path`, at least one, at most [`PEM_CERTIFICATES_MAX`].
pub(crate) fn read_certificates(
    path: &Path,
    field: &str,
) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let iter = CertificateDer::pem_file_iter(path)
        .map_err(|e| ConfigError(format!("{field} {}: cannot be read: {e}", path.display())))?;
    let mut certificates = Vec::new();
    for certificate in iter {
        let certificate = certificate
            .map_err(|e| ConfigError(format!("{field} {}: not a PEM certificate: {e}", path.display())))?;
        if certificates.len() == PEM_CERTIFICATES_MAX {
            return Err(ConfigError(format!(
                "{field} {}: more than {PEM_CERTIFICATES_MAX} certificates",
                path.display()
            )));
        }
        certificates.push(certificate);
    }
    if certificates.is_empty() {
        return Err(ConfigError(format!("{field} {}: holds no PEM certificate", path.display())));
    }
    Ok(certificates)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(names: &[&str]) -> ClientIdentity {
        ClientIdentity { names: names.iter().map(|s| s.to_string()).collect() }
    }

    #[test]
    fn an_empty_allow_list_lets_every_certificate_of_the_ca_in() {
        assert!(allowed(&[], &id(&["app-1"])));
        assert!(allowed(&[], &id(&[])));
    }

    #[test]
    fn an_allow_list_needs_one_of_its_names_exactly() {
        let list = vec!["app-1".to_string(), "app-2".to_string()];
        assert!(allowed(&list, &id(&["app-2"])));
        assert!(allowed(&list, &id(&["other", "app-1"])));
        assert!(!allowed(&list, &id(&["app-3"])));
        assert!(!allowed(&list, &id(&["APP-1"])));
        assert!(!allowed(&list, &id(&["app-1.example"])));
        assert!(!allowed(&list, &id(&[])));
    }

    #[test]
    fn a_certificate_that_does_not_parse_names_no_one() {
        assert_eq!(identity_of(b"not a certificate"), id(&[]));
        assert_eq!(id(&[]).display_name(), "(a certificate without names)");
    }
}
