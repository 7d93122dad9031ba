//! What a closed connection means. etcd (Go's TLS server) closes a connection it refuses
//! without a word the gRPC client passes on: a client certificate that its CA did not sign
//! and plaintext HTTP/2 sent to its TLS port both end as "connection closed", like a
//! member dying. [`Etcd::diagnose`] looks again, below gRPC, so that the operator reads
//! which of the two it is rather than "unreachable".

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::client::{Etcd, TlsPaths};
use crate::error::Refusal;

/// How long each look may take (connect, handshake, the first answer).
const LOOK_TIMEOUT: Duration = Duration::from_millis(500);

/// The first byte of a TLS record that carries a handshake message, and of an alert.
const TLS_HANDSHAKE: u8 = 0x16;
const TLS_ALERT: u8 = 0x15;

impl Etcd {
    /// After a request failed on its connection: whether an endpoint refuses this client
    /// (its certificate refused in the TLS handshake, or TLS spoken where the endpoint is
    /// `http://`), looking at each endpoint that accepts a TCP connection. `None` when none
    /// says so (etcd down, or a failure this look cannot tell).
    pub async fn diagnose(&self) -> Option<Refusal> {
        let (endpoints, tls) = (self.endpoint_list.clone(), self.tls.clone());
        tokio::task::spawn_blocking(move || endpoints.iter().find_map(|e| look(e, tls.as_ref())))
            .await
            .ok()
            .flatten()
    }
}

/// One endpoint's look.
fn look(endpoint: &str, tls: Option<&TlsPaths>) -> Option<Refusal> {
    let (scheme, rest) = endpoint.split_once("://")?;
    let authority = rest.split('/').next()?;
    let address: SocketAddr = authority.to_socket_addrs().ok()?.next()?;
    let host = authority.rsplit_once(':').map_or(authority, |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
    let socket = TcpStream::connect_timeout(&address, LOOK_TIMEOUT).ok()?;
    socket.set_read_timeout(Some(LOOK_TIMEOUT)).ok()?;
    socket.set_write_timeout(Some(LOOK_TIMEOUT)).ok()?;
    match (scheme, tls) {
        ("http", _) => speaks_tls(socket, &host).then_some(Refusal::NotPlaintext),
        ("https", Some(tls)) => handshake(socket, &host, tls),
        _ => None,
    }
}

/// Whether the endpoint answers a TLS ClientHello in TLS (a handshake or an alert): then it
/// is a TLS port, and plaintext HTTP/2 cannot work there.
fn speaks_tls(mut socket: TcpStream, host: &str) -> bool {
    let Ok(config) = client_config(rustls::RootCertStore::empty(), None) else { return false };
    let Ok(name) = ServerName::try_from(host.to_string()) else { return false };
    let Ok(mut connection) = rustls::ClientConnection::new(Arc::new(config), name) else { return false };
    if connection.write_tls(&mut socket).is_err() || socket.flush().is_err() {
        return false;
    }
    let mut first = [0u8; 1];
    matches!(socket.read(&mut first), Ok(1) if first[0] == TLS_HANDSHAKE || first[0] == TLS_ALERT)
}

/// The TLS handshake with this client's files, then one read: etcd verifies the client's
/// certificate after the client finished its part (TLS 1.3), so a refusal comes as an
/// alert on that read. A read that times out means the handshake was accepted.
fn handshake(socket: TcpStream, host: &str, tls: &TlsPaths) -> Option<Refusal> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in certificates(&tls.ca)? {
        roots.add(ca).ok()?;
    }
    let identity = (certificates(&tls.cert)?, PrivateKeyDer::from_pem_file(&tls.key).ok()?);
    let config = client_config(roots, Some(identity)).ok()?;
    let name = ServerName::try_from(host.to_string()).ok()?;
    let connection = rustls::ClientConnection::new(Arc::new(config), name).ok()?;
    let mut stream = rustls::StreamOwned::new(connection, socket);
    let mut byte = [0u8; 1];
    let outcome = (|| {
        while stream.conn.is_handshaking() {
            stream.conn.complete_io(&mut stream.sock)?;
        }
        stream.read(&mut byte)
    })();
    let error = outcome.err()?;
    let tls = error.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>())?;
    refusal(tls)
}

/// What a TLS error says of the configuration.
pub(crate) fn refusal(error: &rustls::Error) -> Option<Refusal> {
    use rustls::AlertDescription as Alert;
    match error {
        rustls::Error::InvalidCertificate(_) => Some(Refusal::ServerCertificate),
        rustls::Error::AlertReceived(
            Alert::BadCertificate
            | Alert::UnknownCA
            | Alert::CertificateRequired
            | Alert::CertificateUnknown
            | Alert::CertificateExpired
            | Alert::CertificateRevoked
            | Alert::UnsupportedCertificate,
        ) => Some(Refusal::ClientCertificate),
        _ => None,
    }
}

fn client_config(
    roots: rustls::RootCertStore,
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Result<rustls::ClientConfig, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    match identity {
        Some((certs, key)) => builder.with_client_auth_cert(certs, key),
        None => Ok(builder.with_no_client_auth()),
    }
}

fn certificates(path: &Path) -> Option<Vec<CertificateDer<'static>>> {
    CertificateDer::pem_file_iter(path).ok()?.collect::<Result<Vec<_>, _>>().ok()
}
