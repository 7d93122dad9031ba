//! A blocking HTTP/1.1 client for the OTLP exporter: one POST per export batch over a
//! plain TCP connection, or TLS for an `https://` endpoint, from the batch processor's own
//! thread.
//!
//! OpenTelemetry's exporter takes any [`HttpClient`]; its built-in ones bring reqwest or
//! hyper and an async runtime. Exports are rare (one request per batch, from one thread),
//! so a connection per request over `std::net` is enough and adds no dependency: TLS is
//! rustls with the ring provider, which the workspace has already (the server's listeners
//! and the pair's link). An `https://` collector's certificate must chain to the CA file
//! configured (`tracing.ca_file`, `OTEL_EXPORTER_OTLP_CERTIFICATE`) or, without one, to the
//! system's CA bundle ([`SYSTEM_CA_FILES`], or `SSL_CERT_FILE`), and name the endpoint's
//! host. A collector that asks for a client certificate (mutual TLS) gets the one
//! configured ([`ClientIdentity`]: `tracing.cert_file` and `key_file`,
//! `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE` and `_CLIENT_KEY`). Every read and write has the exporter's timeout, and a response is read up to
//! [`RESPONSE_BYTES_MAX`].

use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The most of a response that is read (a collector answers with a small protobuf).
pub const RESPONSE_BYTES_MAX: usize = 1 << 20;

/// Where the system's CA bundle is looked for when no CA file is configured, in order
/// (Debian and Ubuntu, then Fedora and RHEL); `SSL_CERT_FILE` comes first when set.
pub const SYSTEM_CA_FILES: [&str; 2] =
    ["/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt"];

/// A client certificate chain and its private key (PEM files), which the exporter presents
/// to a collector that asks for one (mutual TLS): the collector then knows who sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    /// The certificate chain, the client's own certificate first.
    pub cert_file: PathBuf,
    /// Its private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
}

impl ClientIdentity {
    /// The identity of `cert_file` and `key_file`, which go together: one without the
    /// other is refused, naming `names` (the two keys or variables as the user wrote them).
    pub fn from_pair(
        cert_file: Option<&Path>,
        key_file: Option<&Path>,
        names: [&str; 2],
    ) -> Result<Option<ClientIdentity>, String> {
        match (cert_file, key_file) {
            (Some(cert), Some(key)) => {
                Ok(Some(ClientIdentity { cert_file: cert.to_path_buf(), key_file: key.to_path_buf() }))
            }
            (None, None) => Ok(None),
            _ => Err(format!("{} and {} go together: set both or neither", names[0], names[1])),
        }
    }

    /// Reads the chain and the key, each error naming its file.
    fn load(&self) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
        let chain = CertificateDer::pem_file_iter(&self.cert_file)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("client certificate file {}: {e}", self.cert_file.display()))?;
        if chain.is_empty() {
            return Err(format!(
                "client certificate file {} holds no PEM certificate",
                self.cert_file.display()
            ));
        }
        let key = PrivateKeyDer::from_pem_file(&self.key_file)
            .map_err(|e| format!("client key file {}: {e}", self.key_file.display()))?;
        Ok((chain, key))
    }
}

/// The exporter's HTTP client: blocking, one connection per request.
#[derive(Debug, Clone)]
pub struct BlockingHttp {
    /// Bound of the connect and of each read and write.
    pub timeout: Duration,
    /// The TLS configuration of `https://` endpoints; `None`: only `http://` works.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

impl BlockingHttp {
    /// A client for `endpoint` (its scheme decides whether TLS is set up), trusting the CA
    /// certificates of `ca_file` or, without one, the system's, and presenting `identity`
    /// to a collector that asks for a client certificate.
    pub fn for_endpoint(
        endpoint: &str,
        ca_file: Option<&Path>,
        identity: Option<&ClientIdentity>,
        timeout: Duration,
    ) -> Result<BlockingHttp, String> {
        let tls = match endpoint.starts_with("https://") {
            true => Some(tls_config(ca_file, identity)?),
            false => None,
        };
        Ok(BlockingHttp { timeout, tls })
    }
}

/// A TLS client configuration trusting the CA certificates (PEM) of `ca_file`, or of the
/// system's bundle without one, with `identity` as its client certificate when given.
pub fn tls_config(
    ca_file: Option<&Path>,
    identity: Option<&ClientIdentity>,
) -> Result<Arc<rustls::ClientConfig>, String> {
    let path = match ca_file {
        Some(path) => path.to_path_buf(),
        None => system_ca_file()?,
    };
    let certificates = CertificateDer::pem_file_iter(&path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("CA file {}: {e}", path.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(certificates);
    if added == 0 {
        return Err(format!("CA file {} holds no usable PEM certificate", path.display()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots);
    let config = match identity {
        Some(identity) => {
            let (chain, key) = identity.load()?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                format!(
                    "client certificate {} with key {}: {e}",
                    identity.cert_file.display(),
                    identity.key_file.display()
                )
            })?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// The system's CA bundle: `SSL_CERT_FILE`, else the first of [`SYSTEM_CA_FILES`] that exists.
fn system_ca_file() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("SSL_CERT_FILE") {
        return Ok(PathBuf::from(path));
    }
    SYSTEM_CA_FILES.iter().map(PathBuf::from).find(|p| p.exists()).ok_or_else(|| {
        format!(
            "no CA file configured for an https:// endpoint and no system CA bundle ({}); \
             set tracing.ca_file or OTEL_EXPORTER_OTLP_CERTIFICATE",
            SYSTEM_CA_FILES.join(", ")
        )
    })
}

#[async_trait::async_trait]
impl HttpClient for BlockingHttp {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        post(self, request)
    }
}

/// Sends `request` and reads the whole response (the server closes the connection).
fn post(client: &BlockingHttp, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
    let uri = request.uri();
    let https = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => return Err(format!("OTLP endpoint {uri}: only http:// and https:// are supported").into()),
    };
    let host = uri.host().ok_or_else(|| format!("OTLP endpoint {uri} names no host"))?;
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let addr = (host, port).to_socket_addrs()?.next().ok_or_else(|| format!("{host} resolves to nothing"))?;
    let timeout = client.timeout;
    let stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut head =
        format!("{} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n", request.method());
    for (name, value) in request.headers() {
        head.push_str(&format!("{name}: {}\r\n", value.to_str().unwrap_or("")));
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", request.body().len()));
    let raw = if https {
        let Some(config) = &client.tls else {
            return Err(format!("OTLP endpoint {uri}: https:// without a TLS configuration").into());
        };
        // An IP address or a DNS name, as the certificate must name it.
        let name = ServerName::try_from(host.trim_start_matches('[').trim_end_matches(']').to_string())
            .map_err(|e| format!("OTLP endpoint {uri}: {host:?} is no TLS server name: {e}"))?;
        let connection = rustls::ClientConnection::new(config.clone(), name)?;
        exchange(rustls::StreamOwned::new(connection, stream), &head, request.body())?
    } else {
        exchange(stream, &head, request.body())?
    };
    parse_response(&raw)
}

/// Writes the request's `head` and `body` to `stream` and reads the response to its end
/// (at most [`RESPONSE_BYTES_MAX`]). A TLS peer that closes without its close_notify
/// ends the response too: the body's length is in its header.
fn exchange(mut stream: impl Read + Write, head: &str, body: &[u8]) -> std::io::Result<Vec<u8>> {
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    stream.flush()?;
    let mut raw = Vec::new();
    match stream.take(RESPONSE_BYTES_MAX as u64).read_to_end(&mut raw) {
        Ok(_) => Ok(raw),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => Ok(raw),
        Err(e) => Err(e),
    }
}

/// The status and body of a whole HTTP/1.1 response (`Content-Length` or read to the end).
fn parse_response(raw: &[u8]) -> Result<Response<Bytes>, HttpError> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or("HTTP response without a header end")?;
    let head = std::str::from_utf8(&raw[..end])?;
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status in HTTP response {:?}", head.lines().next()))?;
    let body = Bytes::copy_from_slice(&raw[end + 4..]);
    Ok(Response::builder().status(status).body(body)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_gives_its_status_and_body() {
        let r = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").unwrap();
        assert_eq!((r.status().as_u16(), &r.body()[..]), (200, &b"ok"[..]));
        assert!(parse_response(b"HTTP/1.1 200 OK\r\n").is_err());
        assert!(parse_response(b"garbage\r\n\r\n").is_err());
    }

    #[test]
    fn a_ca_file_without_certificates_is_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("decree-otel-ca-{}", std::process::id()));
        std::fs::write(&dir, "not a certificate\n").unwrap();
        let why = tls_config(Some(&dir), None).unwrap_err();
        std::fs::remove_file(&dir).unwrap();
        assert!(why.contains("no usable PEM certificate") && why.contains("decree-otel-ca-"), "{why}");
        let why = tls_config(Some(Path::new("/nonexistent/ca.pem")), None).unwrap_err();
        assert!(why.contains("/nonexistent/ca.pem"), "{why}");
    }

    /// A throwaway CA: its parameters, its key and its certificate (PEM).
    struct TestCa {
        params: rcgen::CertificateParams,
        key: rcgen::KeyPair,
        pem: String,
    }

    /// A CA named `name`.
    fn ca(name: &str) -> TestCa {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let pem = params.self_signed(&key).unwrap().pem();
        TestCa { params, key, pem }
    }

    /// A certificate for `dns_name` that `ca` signed, and its key.
    fn leaf(ca: &TestCa, dns_name: &str) -> (rcgen::Certificate, rcgen::KeyPair) {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec![dns_name.to_string()]).unwrap();
        let cert = params.signed_by(&key, &rcgen::Issuer::from_params(&ca.params, &ca.key)).unwrap();
        (cert, key)
    }

    /// A CA named `name` (its PEM) and a certificate for `localhost` it signed, with the key.
    fn pki(name: &str) -> (String, CertificateDer<'static>, PrivateKeyDer<'static>) {
        let ca = ca(name);
        let (cert, key) = leaf(&ca, "localhost");
        let key_der = rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der()).into();
        (ca.pem, cert.der().clone(), key_der)
    }

    /// A TLS collector on a loopback port answering every request `200 ok`, asking for a
    /// client certificate that chains to `client_ca` (PEM) when given; each request's
    /// bytes go to the receiver returned.
    fn tls_collector(
        cert: CertificateDer<'static>,
        key: PrivateKeyDer<'static>,
        client_ca: Option<&str>,
    ) -> (u16, std::sync::mpsc::Receiver<Vec<u8>>) {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = match client_ca {
            Some(pem) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                    roots.add(cert.unwrap()).unwrap();
                }
                let verifier =
                    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .unwrap();
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let config = builder.with_single_cert(vec![cert], key).unwrap();
        let config = Arc::new(config);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (sender, received) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                let connection = rustls::ServerConnection::new(config.clone()).unwrap();
                let mut tls = rustls::StreamOwned::new(connection, stream);
                let mut request = Vec::new();
                let mut chunk = [0u8; 4096];
                // The test's requests end with the body `spans`.
                while !request.ends_with(b"spans") {
                    match tls.read(&mut chunk) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&chunk[..n]),
                    }
                }
                if request.is_empty() {
                    continue; // a refused handshake
                }
                let _ = tls.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
                tls.conn.send_close_notify();
                let _ = tls.flush();
                let _ = sender.send(request);
            }
        });
        (port, received)
    }

    fn export_request(port: u16) -> Request<Bytes> {
        Request::builder()
            .method("POST")
            .uri(format!("https://localhost:{port}/v1/traces"))
            .header("Content-Type", "application/x-protobuf")
            .body(Bytes::from_static(b"spans"))
            .unwrap()
    }

    #[test]
    fn an_https_collector_is_reached_when_its_certificate_chains_to_the_ca_file_only() {
        let dir = std::env::temp_dir().join(format!("decree-otel-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (ca_pem, cert, key) = pki("collector-ca");
        let (other_ca_pem, _, _) = pki("another-ca");
        std::fs::write(dir.join("ca.pem"), ca_pem).unwrap();
        std::fs::write(dir.join("other-ca.pem"), other_ca_pem).unwrap();
        let (port, received) = tls_collector(cert, key, None);
        let timeout = Duration::from_secs(10);
        let endpoint = format!("https://localhost:{port}");
        let trusting =
            BlockingHttp::for_endpoint(&endpoint, Some(&dir.join("ca.pem")), None, timeout).unwrap();
        let response = post(&trusting, export_request(port)).expect("exported over TLS");
        assert_eq!((response.status().as_u16(), &response.body()[..]), (200, &b"ok"[..]));
        let request = String::from_utf8(received.recv_timeout(timeout).unwrap()).unwrap();
        assert!(
            request.starts_with("POST /v1/traces HTTP/1.1\r\n") && request.ends_with("\r\n\r\nspans"),
            "{request}"
        );
        let refusing =
            BlockingHttp::for_endpoint(&endpoint, Some(&dir.join("other-ca.pem")), None, timeout).unwrap();
        let why = post(&refusing, export_request(port)).unwrap_err().to_string();
        assert!(why.contains("UnknownIssuer"), "{why}");
        let plain = BlockingHttp::for_endpoint("http://localhost:1", None, None, timeout).unwrap();
        assert!(plain.tls.is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Issue 36: mutual TLS. A collector that asks for a client certificate chaining to
    /// its clients' CA gets the exporter's configured one and takes the export; without a
    /// client certificate, or with one of another CA, the handshake fails and nothing is
    /// received. A certificate without its key (or the reverse) and an unreadable key are
    /// refused by name before any connection.
    #[test]
    fn a_collector_that_asks_for_a_client_certificate_gets_the_configured_one() {
        let dir = std::env::temp_dir().join(format!("decree-otel-mtls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (server_ca_pem, cert, key) = pki("collector-ca");
        std::fs::write(dir.join("ca.pem"), server_ca_pem).unwrap();
        let clients = ca("exporters-ca");
        let identity = |name: &str, ca: &TestCa| {
            let (cert, key) = leaf(ca, "exporter");
            std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
            std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
            ClientIdentity {
                cert_file: dir.join(format!("{name}.pem")),
                key_file: dir.join(format!("{name}.key")),
            }
        };
        let known = identity("exporter", &clients);
        let stranger = identity("stranger", &ca("strangers-ca"));
        let (port, received) = tls_collector(cert, key, Some(&clients.pem));
        let timeout = Duration::from_secs(10);
        let endpoint = format!("https://localhost:{port}");
        let ca_file = dir.join("ca.pem");
        let client =
            |identity| BlockingHttp::for_endpoint(&endpoint, Some(&ca_file), identity, timeout).unwrap();

        let response = post(&client(Some(&known)), export_request(port)).expect("exported over mutual TLS");
        assert_eq!(response.status().as_u16(), 200);
        let request = received.recv_timeout(timeout).expect("the collector took the export");
        assert!(request.ends_with(b"\r\n\r\nspans"));
        for (who, identity) in [("no certificate", None), ("another CA's", Some(&stranger))] {
            let refused = post(&client(identity), export_request(port));
            assert!(refused.is_err(), "{who}: the collector answered {refused:?}");
            let nothing = received.recv_timeout(Duration::from_millis(300));
            assert!(nothing.is_err(), "{who}: the collector took an export");
        }

        let names = ["tracing.cert_file", "tracing.key_file"];
        let why = ClientIdentity::from_pair(Some(&known.cert_file), None, names).unwrap_err();
        assert_eq!(why, "tracing.cert_file and tracing.key_file go together: set both or neither");
        assert_eq!(ClientIdentity::from_pair(None, None, names), Ok(None));
        let unreadable = ClientIdentity { key_file: dir.join("missing.key"), ..known.clone() };
        let why = tls_config(Some(&ca_file), Some(&unreadable)).unwrap_err();
        assert!(why.contains("client key file") && why.contains("missing.key"), "{why}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
