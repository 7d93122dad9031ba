//! TLS on the pair's replication link (`[pair.tls]`): each member proves itself to the
//! other by a certificate of the pair's CA that names it.
//!
//! The link carries every decision the pair acknowledges, so a member must never take
//! records from, or send them to, anyone but its peer. Both ends check the same thing: the
//! peer's certificate chains to `pair.tls.ca` and names `pair.tls.peer_name`. The primary
//! checks the backup's as rustls checks a server's name; the backup checks the primary's
//! client certificate with [`PeerVerifier`] during the handshake, so that a refused peer
//! gets a TLS alert (and says so) and never reaches the rules or the log. Each member
//! uses its one certificate both ways, since either may lead.
//!
//! Not here: the link's frames and rules (decree-pair), TLS for clients (`tls.rs`).

use crate::config::{ConfigError, PairTlsConfig};
use crate::tls::read_certificates;
use decree_pair::link::{LinkStream, Opening, Transport};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpStream;

/// The link's TLS: how this member dials its peer and accepts it.
pub struct LinkTls {
    client: Arc<rustls::ClientConfig>,
    server: Arc<rustls::ServerConfig>,
    peer: ServerName<'static>,
    peer_name: String,
}

impl LinkTls {
    /// Reads this member's certificate and key and the pair's CA.
    pub fn load(config: &PairTlsConfig) -> Result<LinkTls, ConfigError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = read_certificates(&config.cert, "pair.tls.cert")?;
        let key = || {
            PrivateKeyDer::from_pem_file(&config.key).map_err(|e| {
                ConfigError(format!(
                    "pair.tls.key {}: no private key could be read: {e}",
                    config.key.display()
                ))
            })
        };
        let mut roots = rustls::RootCertStore::empty();
        for ca in read_certificates(&config.ca, "pair.tls.ca")? {
            roots.add(ca).map_err(|e| {
                ConfigError(format!("pair.tls.ca {}: not a usable CA certificate: {e}", config.ca.display()))
            })?;
        }
        let roots = Arc::new(roots);
        let peer = ServerName::try_from(config.peer_name.clone()).map_err(|e| {
            ConfigError(format!("pair.tls.peer_name {:?} is not a DNS name: {e}", config.peer_name))
        })?;
        let unusable = |e: rustls::Error| {
            ConfigError(format!(
                "pair.tls.cert {} and pair.tls.key {} do not make a usable certificate: {e}",
                config.cert.display(),
                config.key.display()
            ))
        };
        let inner = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| ConfigError(format!("pair.tls.ca {}: {e}", config.ca.display())))?;
        let verifier = Arc::new(PeerVerifier { inner, peer: peer.clone() });
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| ConfigError(format!("pair.tls: {e}")))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key()?)
            .map_err(unusable)?;
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| ConfigError(format!("pair.tls: {e}")))?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key()?)
            .map_err(unusable)?;
        Ok(LinkTls {
            client: Arc::new(client),
            server: Arc::new(server),
            peer,
            peer_name: config.peer_name.clone(),
        })
    }
}

impl Transport for LinkTls {
    fn dial(&self, stream: TcpStream) -> Opening {
        let connector = tokio_rustls::TlsConnector::from(self.client.clone());
        let (peer, peer_name) = (self.peer.clone(), self.peer_name.clone());
        Box::pin(async move {
            match connector.connect(peer, stream).await {
                Ok(stream) => Ok(Box::new(stream) as LinkStream),
                Err(e) => Err(format!("{} ({e})", explain_dial(&e, &peer_name))),
            }
        })
    }

    fn accept(&self, stream: TcpStream, _from: SocketAddr) -> Opening {
        let acceptor = tokio_rustls::TlsAcceptor::from(self.server.clone());
        let peer_name = self.peer_name.clone();
        Box::pin(async move {
            match acceptor.accept(stream).await {
                Ok(stream) => Ok(Box::new(stream) as LinkStream),
                Err(e) => Err(format!("{} ({e})", explain_accept(&e, &peer_name))),
            }
        })
    }

    fn explain(&self, error: &std::io::Error) -> String {
        // In TLS 1.3 the backup's verdict on the primary's certificate arrives after the
        // primary's handshake ends: the primary learns it on its first read.
        match tls_error(error) {
            Some(_) => format!("{} ({error})", explain_dial(error, &self.peer_name)),
            None => error.to_string(),
        }
    }
}

/// The backup's check of the primary: the certificate chains to the pair's CA (the inner
/// verifier) and names the peer, as a server's certificate must name its host.
#[derive(Debug)]
struct PeerVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    peer: ServerName<'static>,
}

impl ClientCertVerifier for PeerVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self.inner.verify_client_cert(end_entity, intermediates, now)?;
        let parsed = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_name(&parsed, &self.peer)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The rustls error inside an IO error, if there is one.
fn tls_error(e: &std::io::Error) -> Option<&rustls::Error> {
    e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>())
}

/// What this member found wrong with the peer's (`peer`: "backup" or "primary")
/// certificate, the same on both sides.
fn explain_certificate(cert: &rustls::CertificateError, peer: &str, peer_name: &str) -> String {
    use rustls::CertificateError as Cert;
    match cert {
        Cert::NotValidForName | Cert::NotValidForNameContext { .. } => {
            format!("the {peer}'s certificate does not name {peer_name:?} (pair.tls.peer_name): not this pair's peer")
        }
        Cert::UnknownIssuer | Cert::BadSignature => {
            format!("the {peer}'s certificate does not chain to pair.tls.ca: not this pair's peer")
        }
        Cert::Expired | Cert::ExpiredContext { .. } => format!("the {peer}'s certificate has expired"),
        other => format!("the {peer}'s certificate was refused: {other:?}"),
    }
}

/// What a failed link means on the primary's side, which dialled.
fn explain_dial(e: &std::io::Error, peer_name: &str) -> String {
    use rustls::{AlertDescription as Alert, Error as Tls};
    match tls_error(e) {
        Some(Tls::InvalidCertificate(cert)) => explain_certificate(cert, "backup", peer_name),
        Some(Tls::AlertReceived(Alert::UnknownCA)) => {
            "the backup refused this member's certificate: it is not of the backup's pair.tls.ca".into()
        }
        Some(Tls::AlertReceived(Alert::BadCertificate | Alert::CertificateUnknown | Alert::AccessDenied)) => {
            "the backup refused this member's certificate: it does not name the member the backup expects \
             (its pair.tls.peer_name)"
                .into()
        }
        Some(Tls::AlertReceived(Alert::CertificateExpired)) => {
            "the backup refused this member's certificate as expired".into()
        }
        Some(Tls::AlertReceived(Alert::CertificateRequired)) => {
            "the backup requires a certificate on the link".into()
        }
        Some(Tls::InvalidMessage(_)) => {
            "the backup does not speak TLS on its link (a member without [pair.tls]?)".into()
        }
        Some(_) => "the TLS handshake with the backup failed".into(),
        None => format!(
            "the link failed during its TLS handshake: {e} (does the backup speak TLS on its link? a member \
             without [pair.tls] closes it)"
        ),
    }
}

/// What a refused link means on the backup's side, which accepted.
fn explain_accept(e: &std::io::Error, peer_name: &str) -> String {
    use rustls::{AlertDescription as Alert, Error as Tls};
    match tls_error(e) {
        Some(Tls::InvalidCertificate(cert)) => explain_certificate(cert, "primary", peer_name),
        Some(Tls::NoCertificatesPresented) => "the peer sent no certificate; the link requires one".into(),
        Some(Tls::AlertReceived(Alert::UnknownCA | Alert::BadCertificate | Alert::CertificateUnknown)) => {
            "the primary refused this member's certificate (not of its pair.tls.ca, or not naming its peer_name)"
                .into()
        }
        Some(Tls::InvalidMessage(_)) => {
            "the peer does not speak TLS on the link (a member without [pair.tls], or not a member at all)".into()
        }
        Some(_) => "the TLS handshake with the primary failed".into(),
        None => "the peer does not speak TLS on the link (a plaintext member, or not a member at all)".into(),
    }
}
