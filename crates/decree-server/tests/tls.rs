//! TLS on the state server's TCP listener, end to end: certificates made by the test (a
//! throwaway CA from `decree_server::testing`), the real client library, and raw TLS
//! clients where a test must say what the library never would.
//!
//! The bug these guard against: a listener that lets in a client the operator did not
//! authorise (no certificate, another CA's, an expired one, a name not allowed), or that
//! lets such a client's bytes reach the log; and errors so vague that an operator cannot
//! tell which side refused what.

mod common;

use common::{decision, metric, metrics, xid_of};
use decree_client::{ClientOptions, ClientTls, Endpoint, RemoteDecisions};
use decree_core::testing::DummyFactory;
use decree_core::{DecisionStore, Outcome, StoreError};
use decree_log::EngineKind;
use decree_proto::{encode_frame, ErrorCode, FrameBuffer, Message};
use decree_server::testing::{CertFiles, TestCa, Validity};
use decree_server::{ServerConfig, ServerHandle, TlsConfig};
use rustls::pki_types::pem::PemObject;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The files of one test: a CA, the server's certificate, and the client certificates.
struct Pki {
    ca: TestCa,
    ca_file: PathBuf,
    server: CertFiles,
    dir: PathBuf,
}

impl Pki {
    /// A CA named `name` whose files go to their own folder under `dir` (client files are
    /// named after the client, and two CAs may issue the same name).
    fn new(dir: &Path, name: &str) -> Pki {
        let dir = &dir.join(name);
        std::fs::create_dir(dir).unwrap();
        let ca = TestCa::new(name);
        let ca_file = ca.write_ca(&dir.join(format!("{name}-ca.pem")));
        let server = ca.server(dir, &format!("{name}-server"), Validity::Current);
        Pki { ca, ca_file, server, dir: dir.to_path_buf() }
    }
    fn client(&self, name: &str, validity: Validity) -> CertFiles {
        self.ca.client(&self.dir, name, validity)
    }
    fn tls_config(&self, allowed: &[&str]) -> TlsConfig {
        TlsConfig {
            cert: self.server.cert.clone(),
            key: self.server.key.clone(),
            client_ca: self.ca_file.clone(),
            clients_allowed: allowed.iter().map(|s| s.to_string()).collect(),
        }
    }
}

fn start(dir: &Path, tls: Option<TlsConfig>) -> ServerHandle {
    start_with(dir, tls, |_| {})
}

fn start_with(dir: &Path, tls: Option<TlsConfig>, adjust: impl FnOnce(&mut ServerConfig)) -> ServerHandle {
    let mut c = ServerConfig::new(dir.join("log"), EngineKind::Journal);
    adjust(&mut c);
    c.tcp = Some("127.0.0.1:0".parse().unwrap());
    c.metrics = Some("127.0.0.1:0".parse().unwrap());
    c.tls = tls;
    let rms = vec![DummyFactory::named("a", 0).arc(), DummyFactory::named("b", 0).arc()];
    decree_server::start(c, rms).expect("server starts")
}

/// Connects the client library to `server` with TLS, trusting `ca` and proving `client`.
fn connect(server: &ServerHandle, ca: &Path, client: &CertFiles) -> Result<RemoteDecisions, StoreError> {
    let tls = ClientTls::from_files(ca, &client.cert, &client.key)?;
    connect_with(server, tls)
}

fn connect_with(server: &ServerHandle, tls: ClientTls) -> Result<RemoteDecisions, StoreError> {
    let options =
        ClientOptions { tls: Some(tls), reply_timeout: Some(Duration::from_secs(10)), ..Default::default() };
    RemoteDecisions::connect_with(Endpoint::Tls(server.tcp_addr().unwrap().to_string()), options)
}

/// The error of a connection that must be refused.
fn refused(result: Result<RemoteDecisions, StoreError>) -> String {
    match result {
        Ok(_) => panic!("the connection must be refused"),
        Err(e) => e.to_string(),
    }
}

/// A raw TLS client: trusts `ca`, proves `client` (or nothing), sends `bytes` at once after
/// the handshake and returns the frames received until the server closes, or the error.
fn raw_tls(
    server: &ServerHandle,
    ca: &Path,
    client: Option<&CertFiles>,
    bytes: &[u8],
) -> Result<Vec<(u64, Message)>, String> {
    raw_tls_then(server, ca, client, bytes, false)
}

/// [`raw_tls`], closing the client's side of the TLS session after `bytes` when `close`.
fn raw_tls_then(
    server: &ServerHandle,
    ca: &Path,
    client: Option<&CertFiles>,
    bytes: &[u8],
    close: bool,
) -> Result<Vec<(u64, Message)>, String> {
    raw_tls_to(server.tcp_addr().unwrap(), ca, client, bytes, close)
}

/// [`raw_tls_then`] to a TLS listener at `addr`.
fn raw_tls_to(
    addr: std::net::SocketAddr,
    ca: &Path,
    client: Option<&CertFiles>,
    bytes: &[u8],
    close: bool,
) -> Result<Vec<(u64, Message)>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some(files) => {
            let chain = rustls::pki_types::CertificateDer::pem_file_iter(&files.cert)
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = rustls::pki_types::PrivateKeyDer::from_pem_file(&files.key).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
    };
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let connection = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let socket = TcpStream::connect(addr).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut stream = rustls::StreamOwned::new(connection, socket);
    stream.write_all(bytes).map_err(|e| e.to_string())?;
    if close {
        stream.conn.send_close_notify();
    }
    stream.flush().map_err(|e| e.to_string())?;
    let mut frames = FrameBuffer::new(decree_proto::FRAME_BYTES_MAX);
    let mut got = Vec::new();
    loop {
        while let Some(m) = frames.next_message().map_err(|e| e.to_string())? {
            got.push(m);
        }
        match stream.read(frames.read_space()) {
            Ok(0) => return Ok(got),
            Ok(n) => frames.commit(n),
            Err(e) if got.is_empty() => return Err(e.to_string()),
            Err(_) => return Ok(got),
        }
    }
}

fn hello() -> Vec<u8> {
    let mut out = Vec::new();
    encode_frame(
        &mut out,
        1,
        &Message::Hello { node_expected: 0, client: "raw".into(), versions: Vec::new() },
    );
    out
}

#[test]
fn a_client_with_a_certificate_of_the_ca_decides_and_asks_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "pair");
    let server = start(dir.path(), Some(pki.tls_config(&["app-1"])));
    let store = connect(&server, &pki.ca_file, &pki.client("app-1", Validity::Current)).expect("connects");
    assert_eq!(store.node(), server.node());
    let session = store.open_session().unwrap();
    for sequence in 1..=50 {
        let xid = xid_of(&store, session, sequence);
        store.decide(&decision(xid, &["a", "b"])).unwrap();
        assert_eq!(store.outcome(&xid).unwrap(), Outcome::Committed);
    }
    let text = metrics(&server);
    assert_eq!(metric(&text, "decree_commits_total"), 50.0);
    assert_eq!(metric(&text, "decree_tls_refused_total"), 0.0);
    server.shutdown().unwrap();
}

#[test]
fn refused_clients_each_get_their_own_error_and_nothing_of_theirs_reaches_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "pair");
    let other = Pki::new(dir.path(), "other");
    let server = start(dir.path(), Some(pki.tls_config(&["app-1"])));
    // Each refused client sends its Hello and a Decide at once, as a hostile one would.
    let mut bytes = hello();
    let xid = decree_core::Xid::decree(decree_core::Origin {
        node: server.node(),
        incarnation: server.incarnation(),
        session: 1,
        sequence: 1,
    });
    encode_frame(&mut bytes, 2, &Message::Decide(decision(xid, &["a"])));

    let no_certificate = raw_tls(&server, &pki.ca_file, None, &bytes).unwrap_err();
    eprintln!("no certificate: {no_certificate}");
    assert!(no_certificate.contains("CertificateRequired"), "{no_certificate}");
    let other_ca = refused(connect(&server, &pki.ca_file, &other.client("app-1", Validity::Current)));
    assert!(other_ca.contains("does not chain to the CA the server trusts"), "{other_ca}");
    let expired = refused(connect(&server, &pki.ca_file, &pki.client("app-1-old", Validity::Expired)));
    assert!(expired.contains("has expired"), "{expired}");
    let not_allowed = refused(connect(&server, &pki.ca_file, &pki.client("app-2", Validity::Current)));
    assert!(not_allowed.contains("names [\"app-2\"], none of which"), "{not_allowed}");
    eprintln!("other CA: {other_ca}\nexpired: {expired}\nnot allowed: {not_allowed}");
    let raw = raw_tls(&server, &pki.ca_file, Some(&pki.client("app-3", Validity::Current)), &bytes).unwrap();
    match raw.as_slice() {
        [(0, Message::Error { code: ErrorCode::NotAllowed, message })] => {
            assert!(message.contains("app-3"), "{message}")
        }
        other => panic!("expected only a NotAllowed error, got {other:?}"),
    }
    // The server's certificate is checked too: another CA's client does not trust it.
    let untrusted = refused(connect(&server, &other.ca_file, &other.client("app-1", Validity::Current)));
    assert!(untrusted.contains("not signed by the CA this client trusts"), "{untrusted}");

    // The server counts a refusal when its side of the handshake ends, which can be just
    // after the client has given up (the last one above is refused by the client).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut text = metrics(&server);
    while metric(&text, "decree_tls_refused_total") < 6.0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        text = metrics(&server);
    }
    assert_eq!(metric(&text, "decree_tls_refused_total"), 6.0);
    assert_eq!(metric(&text, "decree_sessions_opened_total"), 0.0);
    assert_eq!(metric(&text, "decree_commits_total"), 0.0);
    assert_eq!(metric(&text, "decree_log_records_total"), 0.0);
    // An allowed client asks about the refused client's Xid: nothing was decided.
    let store = connect(&server, &pki.ca_file, &pki.client("app-1", Validity::Current)).unwrap();
    assert_ne!(store.outcome(&xid).unwrap(), Outcome::Committed);
    assert_eq!(metric(&metrics(&server), "decree_sessions_opened_total"), 1.0);
    server.shutdown().unwrap();
}

#[test]
fn a_server_certificate_for_another_name_is_refused_by_the_client() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "pair");
    let server = start(dir.path(), Some(pki.tls_config(&[])));
    let client = pki.client("app-1", Validity::Current);
    let tls = ClientTls::from_files(&pki.ca_file, &client.cert, &client.key).unwrap();
    let why = refused(connect_with(&server, tls.clone().with_server_name("decree.example")));
    assert!(why.contains("does not name the host"), "{why}");
    // An empty allow list lets every certificate of the CA in.
    connect_with(&server, tls).expect("any client of the CA").ping().unwrap();
    server.shutdown().unwrap();
}

#[test]
fn plaintext_and_tls_mismatches_are_clear_errors_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "pair");
    let secured = start(&dir.path().join("secured"), Some(pki.tls_config(&[])));
    let plain = start(&dir.path().join("plain"), None);
    let client = pki.client("app-1", Validity::Current);

    let why = refused(RemoteDecisions::connect(&format!("tcp:{}", secured.tcp_addr().unwrap())));
    assert!(why.contains("this listener requires TLS"), "{why}");
    let why = refused(connect(&plain, &pki.ca_file, &client));
    assert!(why.contains("did not answer in TLS") || why.contains("during the TLS handshake"), "{why}");
    let why = refused(RemoteDecisions::connect(&format!("tls:{}", secured.tcp_addr().unwrap())));
    assert!(why.contains("needs ClientOptions::tls"), "{why}");

    // Neither server minds: each still serves its own kind of client.
    connect(&secured, &pki.ca_file, &client).unwrap().ping().unwrap();
    RemoteDecisions::connect(&format!("tcp:{}", plain.tcp_addr().unwrap())).unwrap().ping().unwrap();
    assert_eq!(metric(&metrics(&secured), "decree_tls_refused_total"), 1.0);
    secured.shutdown().unwrap();
    plain.shutdown().unwrap();
}

#[test]
fn bad_frames_over_tls_close_only_their_own_connection() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "pair");
    let server = start(dir.path(), Some(pki.tls_config(&[])));
    let client = pki.client("app-1", Validity::Current);
    let store = connect(&server, &pki.ca_file, &client).unwrap();
    let session = store.open_session().unwrap();
    store.decide(&decision(xid_of(&store, session, 1), &["a"])).unwrap();

    let ping_frame = || {
        let mut ping = Vec::new();
        encode_frame(&mut ping, 5, &Message::Ping);
        ping
    };
    let cases: [(&[u8], bool, ErrorCode); 5] = [
        (&[0, 0, 0, 10, 1, 0x42, 0, 0, 0, 0, 0, 0, 0, 2], true, ErrorCode::UnknownType),
        (&[0x00, 0x10, 0x00, 0x00, 1, 3], true, ErrorCode::FrameTooLarge),
        (&[0, 0, 0, 10, 9, 8, 0, 0, 0, 0, 0, 0, 0, 2], true, ErrorCode::Version),
        (&[0, 0, 0, 12, 1, 3, 0, 0, 0, 0, 0, 0, 0, 2, b'D', b'C'], true, ErrorCode::Malformed),
        (&ping_frame(), false, ErrorCode::Protocol),
    ];
    for (bytes, with_hello, expected) in cases {
        let mut out = if with_hello { hello() } else { Vec::new() };
        out.extend_from_slice(bytes);
        let got = raw_tls(&server, &pki.ca_file, Some(&client), &out).unwrap();
        match got.last() {
            Some((_, Message::Error { code, message })) => {
                assert_eq!(*code, expected, "{message}");
                assert!(!message.is_empty());
            }
            other => panic!("expected an error frame last for {expected:?}, got {other:?}"),
        }
    }
    // A half frame, then the client closes: the server just drops the connection.
    let mut half = hello();
    half.extend_from_slice(&[0, 0, 0, 40, 1, 3, 0]);
    let got = raw_tls_then(&server, &pki.ca_file, Some(&client), &half, true).unwrap();
    assert!(matches!(got.first(), Some((1, Message::HelloOk { .. }))), "{got:?}");

    // The well-behaved session never noticed.
    store.decide(&decision(xid_of(&store, session, 2), &["a"])).unwrap();
    let text = metrics(&server);
    assert_eq!(metric(&text, "decree_protocol_errors_total"), 5.0);
    assert_eq!(metric(&text, "decree_commits_total"), 2.0);
    server.shutdown().unwrap();
}

#[test]
fn a_reload_serves_new_files_to_new_connections_and_a_failed_one_keeps_the_old() {
    let dir = tempfile::tempdir().unwrap();
    let old = Pki::new(dir.path(), "old");
    let new = Pki::new(dir.path(), "new");
    // The server reads its files from fixed paths, which the operator rewrites.
    let live = dir.path().join("live");
    std::fs::create_dir(&live).unwrap();
    let install = |pki: &Pki| {
        std::fs::copy(&pki.server.cert, live.join("server.pem")).unwrap();
        std::fs::copy(&pki.server.key, live.join("server.key")).unwrap();
        std::fs::copy(&pki.ca_file, live.join("ca.pem")).unwrap();
    };
    install(&old);
    let config = TlsConfig {
        cert: live.join("server.pem"),
        key: live.join("server.key"),
        client_ca: live.join("ca.pem"),
        clients_allowed: Vec::new(),
    };
    let server = start(dir.path(), Some(config));
    let old_client = old.client("app-1", Validity::Current);
    let new_client = new.client("app-1", Validity::Current);
    let open = connect(&server, &old.ca_file, &old_client).unwrap();
    refused(connect(&server, &new.ca_file, &new_client));

    install(&new);
    server.reload_tls().expect("the new files load");
    connect(&server, &new.ca_file, &new_client).unwrap().ping().unwrap();
    let why = refused(connect(&server, &old.ca_file, &old_client));
    assert!(why.contains("not signed by the CA this client trusts"), "{why}");
    open.ping().expect("an open connection keeps the certificate it agreed on");

    std::fs::write(live.join("server.key"), "not a key").unwrap();
    let e = server.reload_tls().unwrap_err().to_string();
    assert!(e.contains("tls.key") && e.contains("server.key"), "{e}");
    connect(&server, &new.ca_file, &new_client)
        .expect("a failed reload keeps the files in use")
        .ping()
        .unwrap();
    server.shutdown().unwrap();
}

#[test]
fn silent_peers_of_the_tls_listener_lose_their_slot_at_the_handshake_bound() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "pair");
    let server = start_with(dir.path(), Some(pki.tls_config(&[])), |c| {
        c.limits.handshake_timeout_ms = 300;
        c.limits.connections_max = 2;
    });
    let client = pki.client("app-1", Validity::Current);
    // One peer says nothing at all; another completes TLS and then never says Hello.
    let mut silent = TcpStream::connect(server.tcp_addr().unwrap()).unwrap();
    silent.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let quiet = std::thread::spawn({
        let (ca, client) = (pki.ca_file.clone(), client.clone());
        let addr = server.tcp_addr().unwrap();
        move || raw_tls_to(addr, &ca, Some(&client), &[], false)
    });
    let started = std::time::Instant::now();
    let mut byte = [0u8; 1];
    assert_eq!(silent.read(&mut byte).unwrap_or(0), 0, "the silent peer is closed");
    assert_eq!(quiet.join().unwrap().unwrap(), Vec::new(), "the quiet TLS peer is closed without a frame");
    assert!(started.elapsed() < Duration::from_secs(10));
    // Both slots are free again: two clients hold them at once. A slot is released just
    // after its socket closes, so a client that connects at that moment may still find the
    // limit reached: each retries for a while.
    let both: Vec<_> = (0..2)
        .map(|_| {
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            loop {
                match connect(&server, &pki.ca_file, &client) {
                    Ok(store) => break store,
                    Err(e) if std::time::Instant::now() > deadline => panic!("no free slot: {e}"),
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        })
        .collect();
    for store in &both {
        store.ping().unwrap();
    }
    assert_eq!(
        metric(&metrics(&server), "decree_tls_refused_total"),
        1.0,
        "the silent peer never finished TLS"
    );
    server.shutdown().unwrap();
}

#[test]
fn the_connection_limit_holds_on_the_tls_listener_and_frees_with_a_close() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "pair");
    let server = start_with(dir.path(), Some(pki.tls_config(&[])), |c| c.limits.connections_max = 2);
    let client = pki.client("app-1", Validity::Current);
    let first = connect(&server, &pki.ca_file, &client).unwrap();
    first.ping().unwrap();
    // The client library keeps one control connection per RemoteDecisions: two of them
    // take both slots.
    let second = connect(&server, &pki.ca_file, &client).unwrap();
    second.ping().unwrap();
    // Over the limit the socket is closed before any handshake: the client says so.
    let why = refused(connect(&server, &pki.ca_file, &client));
    assert!(why.contains("during the TLS handshake"), "{why}");
    assert_eq!(metric(&metrics(&server), "decree_connections_refused_total"), 1.0);
    drop(second);
    common::eventually("a slot is free again", || connect(&server, &pki.ca_file, &client).is_ok());
    first.ping().expect("the first session never noticed");
    server.shutdown().unwrap();
}
