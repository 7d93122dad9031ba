//! `decree serve` as a child process: it listens on a private socket, answers a client,
//! and stops with status 0 on SIGTERM.

mod common;

use common::{free_port, Reaped};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `decree serve --config config` as a child, once its Unix socket `socket` exists.
fn serve(config: &std::path::Path, socket: &std::path::Path, stderr: Stdio) -> Reaped {
    let mut reaped = Reaped(
        Command::new(env!("CARGO_BIN_EXE_decree"))
            .args(["serve", "--config"])
            .arg(config)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("starts decree serve"),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !socket.exists() {
        if let Ok(Some(status)) = reaped.0.try_wait() {
            panic!("decree serve exited early with {status}");
        }
        assert!(Instant::now() < deadline, "no socket after 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    reaped
}

#[test]
fn serve_listens_with_mode_0600_and_exits_0_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("d.sock");
    let config = dir.path().join("decree.toml");
    std::fs::write(
        &config,
        format!(
            "log_dir = \"{}\"\nengine = \"journal\"\nunix = \"{}\"\n\
             [[rm]]\nname = \"dummy-0\"\nkind = \"dummy\"\n[[rm]]\nname = \"dummy-1\"\nkind = \"dummy\"\n",
            dir.path().join("log").display(),
            socket.display()
        ),
    )
    .unwrap();
    let mut reaped = serve(&config, &socket, Stdio::piped());
    let child = &mut reaped.0;
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "socket mode {mode:o}");
    // A client can talk to it: bench cycles through it (their decisions name dummy-0 and
    // dummy-1, which the configuration lists).
    let work = tempfile::tempdir_in(".").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_decree"))
        .args(["bench", "--mode", "unix", "--threads", "1", "--cycles", "3", "--t1", "0", "--t2", "0"])
        .arg("--connect")
        .arg(format!("unix:{}", socket.display()))
        .current_dir(work.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // SAFETY: kill with a pid of our own child.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) }, 0);
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
    }
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(!socket.exists(), "the socket is removed at shutdown");
}

/// The bug this guards against: `decree serve` killed by SIGPIPE when a peer closes its
/// socket while the server writes to it (the command line restored SIGPIPE's default
/// disposition for every subcommand, so that `decree ... | head` ends quietly; TLS writes
/// go through `writev`, which raises it). Clients pipeline a thousand pings and close
/// without reading a reply, twenty times over the Unix socket and twenty over TLS; the
/// server must live through it and serve the next client.
#[test]
fn a_client_that_closes_before_reading_its_replies_does_not_kill_the_server() {
    use decree_proto::{encode_frame, Message};
    use decree_server::testing::{TestCa, Validity};
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("closes-early-ca");
    let ca_file = ca.write_ca(&dir.path().join("ca.pem"));
    let server_files = ca.server(dir.path(), "server", Validity::Current);
    let client_files = ca.client(dir.path(), "app-1", Validity::Current);
    let (socket, port) = (dir.path().join("d.sock"), free_port());
    let config = dir.path().join("decree.toml");
    std::fs::write(
        &config,
        format!(
            "log_dir = \"{}\"\nunix = \"{}\"\ntcp = \"127.0.0.1:{port}\"\n\
             [tls]\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n",
            dir.path().join("log").display(),
            socket.display(),
            server_files.cert.display(),
            server_files.key.display(),
            ca_file.display()
        ),
    )
    .unwrap();
    let mut server = Reaped(
        Command::new(env!("CARGO_BIN_EXE_decree"))
            .args(["serve", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starts decree serve"),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    // Both listeners: the Unix socket may exist before the TCP port is bound.
    while !socket.exists() || std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "no listeners after 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut frames = Vec::new();
    let hello = Message::Hello { node_expected: 0, client: "closes early".into(), versions: vec![1, 2] };
    encode_frame(&mut frames, 1, &hello);
    for id in 2..1_002 {
        encode_frame(&mut frames, id, &Message::Ping);
    }
    for _ in 0..20 {
        let mut client = std::os::unix::net::UnixStream::connect(&socket).unwrap();
        client.write_all(&frames).unwrap();
        drop(client);
        let mut client = raw_tls_client(port, &ca_file, &client_files);
        client.write_all(&frames).unwrap();
        client.flush().unwrap();
        drop(client);
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(server.0.try_wait().unwrap().is_none(), "decree serve died: {:?}", server.0.try_wait());
    let store = decree_client::RemoteDecisions::connect(&format!("unix:{}", socket.display()));
    assert!(store.is_ok(), "the server still serves: {:?}", store.err().map(|e| e.to_string()));
    assert!(tls_client(port, &ca_file, &client_files).is_ok(), "and over TLS");
}

/// A TLS connection that sends whatever the test writes, without the client library.
fn raw_tls_client(
    port: u16,
    ca: &std::path::Path,
    files: &decree_server::testing::CertFiles,
) -> rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_file(ca).unwrap()).unwrap();
    let chain = vec![CertificateDer::from_pem_file(&files.cert).unwrap()];
    let key = PrivateKeyDer::from_pem_file(&files.key).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let connection = rustls::ClientConnection::new(std::sync::Arc::new(config), name).unwrap();
    rustls::StreamOwned::new(connection, std::net::TcpStream::connect(("127.0.0.1", port)).unwrap())
}

/// The stderr of a child, collected by a thread so that the test can wait for a line.
struct Stderr(std::sync::Arc<std::sync::Mutex<String>>);

impl Stderr {
    fn collect(child: &mut std::process::Child) -> Stderr {
        let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let mut pipe = child.stderr.take().unwrap();
        let sink = text.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = std::io::Read::read(&mut pipe, &mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Stderr(text)
    }
    /// Waits up to 20 s for `needle` to appear; returns everything read so far.
    fn wait_for(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = self.0.lock().unwrap().clone();
            if text.contains(needle) {
                return text;
            }
            assert!(Instant::now() < deadline, "no {needle:?} on stderr after 20 s:\n{text}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The error of a connection that must be refused.
fn refused(result: Result<decree_client::RemoteDecisions, String>) -> String {
    match result {
        Ok(_) => panic!("the connection must be refused"),
        Err(e) => e,
    }
}

/// A loopback port free a moment ago (the server binds it next).
fn tls_client(
    port: u16,
    ca: &std::path::Path,
    files: &decree_server::testing::CertFiles,
) -> Result<decree_client::RemoteDecisions, String> {
    let tls = decree_client::ClientTls::from_files(ca, &files.cert, &files.key).map_err(|e| e.to_string())?;
    let options = decree_client::ClientOptions { tls: Some(tls), ..Default::default() };
    let endpoint = decree_client::Endpoint::Tls(format!("127.0.0.1:{port}"));
    decree_client::RemoteDecisions::connect_with(endpoint, options).map_err(|e| e.to_string())
}

/// The operator's view of TLS: each refused client is named with its reason in the
/// server's log as well as in the client's error, SIGHUP swaps the certificates without a
/// restart, and a remote listener without TLS does not start at all.
#[test]
fn serve_names_each_tls_refusal_and_reloads_its_files_on_sighup() {
    use decree_server::testing::{TestCa, Validity};
    let dir = tempfile::tempdir().unwrap();
    let (old_dir, new_dir) = (dir.path().join("old"), dir.path().join("new"));
    std::fs::create_dir(&old_dir).unwrap();
    std::fs::create_dir(&new_dir).unwrap();
    let (old, new) = (TestCa::new("old"), TestCa::new("new"));
    let live = |name: &str| dir.path().join(name);
    old.write_ca(&live("ca.pem"));
    let server = old.server(&old_dir, "server", Validity::Current);
    std::fs::copy(&server.cert, live("server.pem")).unwrap();
    std::fs::copy(&server.key, live("server.key")).unwrap();
    let port = free_port();
    let config = dir.path().join("decree.toml");
    std::fs::write(
        &config,
        format!(
            "log_dir = \"{}\"\ntcp = \"127.0.0.1:{port}\"\n[tls]\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n\
             clients_allowed = [\"app-1\"]\n",
            dir.path().join("log").display(),
            live("server.pem").display(),
            live("server.key").display(),
            live("ca.pem").display()
        ),
    )
    .unwrap();
    let mut child = Reaped(
        Command::new(env!("CARGO_BIN_EXE_decree"))
            .args(["serve", "-v", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starts decree serve"),
    );
    let stderr = Stderr::collect(&mut child.0);
    stderr.wait_for("decree server listening");
    let old_ca = old_dir.join("ca.pem");
    old.write_ca(&old_ca);

    let app = old.client(&old_dir, "app-1", Validity::Current);
    tls_client(port, &old_ca, &app).expect("an allowed client connects").ping().unwrap();
    let log = stderr.wait_for("TLS session opened");
    assert!(log.contains("peer=\"app-1 (127.0.0.1:"), "the session is logged with its name: {log}");

    let expired =
        refused(tls_client(port, &old_ca, &old.client(&old_dir, "app-1-expired", Validity::Expired)));
    assert!(expired.contains("has expired"), "{expired}");
    let log = stderr.wait_for("the client's certificate has expired");
    assert!(log.contains("TLS handshake failed"), "{log}");

    let stranger = refused(tls_client(port, &old_ca, &old.client(&old_dir, "app-2", Validity::Current)));
    assert!(stranger.contains("none of which this server's tls.clients_allowed lists"), "{stranger}");
    stderr.wait_for("names no one in tls.clients_allowed");

    let new_app = new.client(&new_dir, "app-1", Validity::Current);
    let foreign = refused(tls_client(port, &old_ca, &new_app));
    assert!(foreign.contains("does not chain to the CA the server trusts"), "{foreign}");
    stderr.wait_for("the client's certificate does not chain to tls.client_ca");

    // The operator installs the new CA's files and sends SIGHUP.
    let new_server = new.server(&new_dir, "server", Validity::Current);
    std::fs::copy(&new_server.cert, live("server.pem")).unwrap();
    std::fs::copy(&new_server.key, live("server.key")).unwrap();
    new.write_ca(&live("ca.pem"));
    let new_ca = new.write_ca(&new_dir.join("ca.pem"));
    // SAFETY: kill with a pid of our own child.
    assert_eq!(unsafe { libc::kill(child.0.id() as libc::pid_t, libc::SIGHUP) }, 0);
    stderr.wait_for("TLS certificate, key and client CA reloaded");
    tls_client(port, &new_ca, &new_app).expect("the new CA's client connects").ping().unwrap();
    let stale = refused(tls_client(port, &old_ca, &app));
    assert!(stale.contains("not signed by the CA this client trusts"), "{stale}");
    stderr.wait_for("the client does not trust this server's certificate");

    // A reload from a broken key keeps the files in use and says which file is wrong.
    std::fs::write(live("server.key"), "garbage").unwrap();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(child.0.id() as libc::pid_t, libc::SIGHUP) }, 0);
    let log = stderr.wait_for("TLS reload failed");
    assert!(log.contains("tls.key"), "{log}");
    tls_client(port, &new_ca, &new_app).expect("still served").ping().unwrap();
    eprintln!("the server's log:\n{}", stderr.wait_for(""));

    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(child.0.id() as libc::pid_t, libc::SIGTERM) }, 0);
    assert_eq!(child.0.wait().unwrap().code(), Some(0));
}

#[test]
fn a_remote_listener_without_tls_does_not_start_and_says_what_to_add() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_decree"))
        .args(["serve", "--tcp", "0.0.0.0:7411", "--allow-remote", "--dir"])
        .arg(dir.path().join("log"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    for needed in ["without TLS", "[tls]", "client_ca", "insecure_plaintext = true"] {
        assert!(stderr.contains(needed), "{needed:?} missing from: {stderr}");
    }
    assert!(!dir.path().join("log").exists(), "nothing was created: the server never started");
}

/// The DSN in `var`, or None (a skip) outside CI when the test databases are not set.
fn test_dsn(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(dsn) if !dsn.is_empty() => Some(dsn),
        _ => {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
            assert!(!ci, "CI=true but {var} is not set: run scripts/test-dbs.sh start and eval its env");
            eprintln!(
                "skipped: {var} is not set (scripts/test-dbs.sh start; eval \"$(scripts/test-dbs.sh env)\")"
            );
            None
        }
    }
}

/// `decree bench --rm postgres --connect unix:...`: the 2pc runs' decisions go to the
/// server (the reference for a client that must cross its socket, as decree-jta does), not
/// to a log of the bench's own. The server counts exactly the 2pc transfers as commit
/// points, and the bench's checks (totals, nothing left prepared of the server's node)
/// pass.
#[test]
fn bench_rm_postgres_sends_the_decisions_of_its_2pc_runs_to_the_server_of_connect() {
    let (Some(dsn_a), Some(dsn_b)) = (test_dsn("DECREE_TEST_PG_A"), test_dsn("DECREE_TEST_PG_B")) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (socket, port) = (dir.path().join("d.sock"), free_port());
    let config = dir.path().join("decree.toml");
    std::fs::write(
        &config,
        format!(
            "node = 4242\nmetrics = \"127.0.0.1:{port}\"\nlog_dir = \"{}\"\nengine = \"journal\"\nunix = \"{}\"\n\
             [[rm]]\nname = \"bench-a\"\nkind = \"postgres\"\ndsn = \"{dsn_a}\"\n\
             [[rm]]\nname = \"bench-b\"\nkind = \"postgres\"\ndsn = \"{dsn_b}\"\n",
            dir.path().join("log").display(),
            socket.display()
        ),
    )
    .unwrap();
    let _server = serve(&config, &socket, Stdio::null());
    let work = tempfile::tempdir_in(".").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_decree"))
        .args(["bench", "--rm", "postgres", "--threads", "2", "--cycles", "15", "--format", "json"])
        .args(["--dsn", &dsn_a, "--dsn", &dsn_b, "--connect"])
        .arg(format!("unix:{}", socket.display()))
        .current_dir(work.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let two_phase = stdout
        .lines()
        .find(|l| l.contains("\"mode\":\"2pc\""))
        .unwrap_or_else(|| panic!("no 2pc run in:\n{stdout}"));
    assert!(two_phase.contains("\"transfers\":30"), "{two_phase}");
    assert!(!two_phase.contains("log_writes_per_commit"), "no log of the bench's own: {two_phase}");
    let metrics = scrape_metrics(port);
    let commits =
        metrics.lines().find_map(|l| l.strip_prefix("decree_commits_total ")).expect("commits_total");
    assert_eq!(
        commits.trim().parse::<f64>().unwrap(),
        30.0,
        "every 2pc transfer decided on the server:\n{metrics}"
    );
}

/// The text of `GET /metrics` on `port`.
fn scrape_metrics(port: u16) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("metrics endpoint");
    stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text
}
