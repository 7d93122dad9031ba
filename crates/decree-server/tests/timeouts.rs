//! The handshake and idle timeouts (issue 14, point 3): peers that say nothing must not
//! keep legitimate clients out, and an operator who sets an idle bound gets idle sessions
//! closed while the Rust client keeps its own sessions alive with `Ping`.
//!
//! Real servers started in-process on temporary Unix sockets and TCP on 127.0.0.1; the
//! resource manager is decree-core's dummy, whose branch outcomes show whether a session
//! was closed (its undecided branches are rolled back). No test asserts that something
//! took less than some time: each polls with a deadline, or reads with a long timeout.

mod common;

use common::{decision, eventually, metric, metrics, xid_of};
use decree_client::{ClientOptions, Endpoint, RemoteDecisions};
use decree_core::testing::dummy::BranchOutcome;
use decree_core::testing::DummyFactory;
use decree_core::{DecisionStore, Origin, Outcome, ResourceManager, Xid};
use decree_log::testing::fault::FaultStorage;
use decree_log::EngineKind;
use decree_proto::{encode_frame, ErrorCode, FrameBuffer, Message, Negotiated};
use decree_server::{ServerConfig, ServerHandle};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A server configuration on a Unix socket, TCP and metrics, with the volatile log.
fn config(dir: &Path) -> ServerConfig {
    let mut c = ServerConfig::new(dir.join("log"), EngineKind::Volatile);
    c.unix = Some(dir.join("decree.sock"));
    c.tcp = Some("127.0.0.1:0".parse().unwrap());
    c.metrics = Some("127.0.0.1:0".parse().unwrap());
    c
}

fn unix_endpoint(server: &ServerHandle) -> Endpoint {
    Endpoint::Unix(server.unix_path().unwrap().to_path_buf())
}

/// The frame of a `Hello` offering `versions` (empty: a version-1 client).
fn hello_frame(versions: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let hello = Message::Hello { node_expected: 0, client: "raw".into(), versions: versions.to_vec() };
    encode_frame(&mut out, 1, &hello);
    out
}

/// Reads until the peer closes: the frames received, and how the stream ended (`Ok` for
/// end of file, the error otherwise; a read timeout is an error too).
fn read_until_closed<S: Read>(stream: &mut S) -> (Vec<Message>, std::io::Result<()>) {
    let mut frames = FrameBuffer::new(decree_proto::FRAME_BYTES_MAX);
    let mut got = Vec::new();
    loop {
        while let Some((_, m)) = frames.next_message().unwrap() {
            got.push(m);
        }
        match stream.read(frames.read_space()) {
            Ok(0) => return (got, Ok(())),
            Ok(n) => frames.commit(n),
            Err(e) => return (got, Err(e)),
        }
    }
}

/// A raw session on the Unix socket: it said `Hello` and got `HelloOk`.
struct RawSession {
    stream: UnixStream,
    frames: FrameBuffer,
    hello_ok: Message,
}

impl RawSession {
    fn open(server: &ServerHandle, versions: &[u8]) -> RawSession {
        let mut stream = UnixStream::connect(server.unix_path().unwrap()).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        stream.write_all(&hello_frame(versions)).unwrap();
        let mut raw = RawSession {
            stream,
            frames: FrameBuffer::new(decree_proto::FRAME_BYTES_MAX),
            hello_ok: Message::Ping,
        };
        raw.hello_ok = raw.next().expect("HelloOk");
        assert!(matches!(raw.hello_ok, Message::HelloOk { .. }), "{:?}", raw.hello_ok);
        raw
    }

    /// The next frame, `None` at end of file; panics on a read error or timeout.
    fn next(&mut self) -> Option<Message> {
        loop {
            if let Some((_, m)) = self.frames.next_message().unwrap() {
                return Some(m);
            }
            match self.stream.read(self.frames.read_space()) {
                Ok(0) => return None,
                Ok(n) => self.frames.commit(n),
                Err(e) => panic!("reading from the server: {e}"),
            }
        }
    }

    fn negotiated(&self) -> Option<Negotiated> {
        match &self.hello_ok {
            Message::HelloOk { negotiated, .. } => *negotiated,
            other => panic!("expected HelloOk, got {other:?}"),
        }
    }

    fn xid(&self, sequence: u64) -> Xid {
        match &self.hello_ok {
            Message::HelloOk { node, incarnation, session, .. } => {
                Xid::decree(Origin { node: *node, incarnation: *incarnation, session: *session, sequence })
            }
            other => panic!("expected HelloOk, got {other:?}"),
        }
    }

    fn send(&mut self, id: u64, message: &Message) {
        let mut out = Vec::new();
        encode_frame(&mut out, id, message);
        self.stream.write_all(&out).unwrap();
    }
}

/// The slowloris of the review: more silent or half-sent connections than
/// `connections_max` kept a legitimate client out for good. With a handshake bound each
/// is closed (end of file, not merely left alone) and counted, and the client gets in.
#[test]
fn silent_and_half_sent_connections_are_closed_at_the_handshake_bound_and_free_their_slots() {
    const CONNECTIONS_MAX: u32 = 64;
    const RAW: usize = 80;
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.limits.connections_max = CONNECTIONS_MAX;
    c.limits.handshake_timeout_ms = 300;
    let server = decree_server::start(c, vec![DummyFactory::named("a", 0).arc()]).unwrap();
    let half_hello = hello_frame(&[1, 2]);
    let half_hello = &half_hello[..half_hello.len() / 2];
    // Half over TCP saying nothing, half over the Unix socket sending half a Hello.
    let mut tcp = Vec::new();
    let mut unix = Vec::new();
    for i in 0..RAW {
        if i % 2 == 0 {
            let s = TcpStream::connect(server.tcp_addr().unwrap()).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            tcp.push(s);
        } else {
            let mut s = UnixStream::connect(server.unix_path().unwrap()).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            // A refused connection may already be closed: its write can fail.
            let _ = s.write_all(half_hello);
            unix.push(s);
        }
    }
    let counted = || {
        let text = metrics(&server);
        (
            metric(&text, "decree_handshakes_timed_out_total"),
            metric(&text, "decree_connections_refused_total"),
        )
    };
    eventually("every raw connection is refused or timed out", || {
        let (timed_out, refused) = counted();
        timed_out + refused == RAW as f64
    });
    let (timed_out, _) = counted();
    // The first connections_max were accepted, as nobody else connected meanwhile.
    assert!(timed_out >= CONNECTIONS_MAX as f64, "{timed_out} timed out");

    // Each accepted one was closed by the server: end of file without a byte; each
    // refused one got Busy (then end of file, or a reset where the server did not read
    // what the client had sent).
    let mut closed_silently = 0;
    let mut check = |(frames, end): (Vec<Message>, std::io::Result<()>)| {
        if frames.is_empty() {
            assert!(end.is_ok(), "a timed-out connection must end with end of file: {end:?}");
            closed_silently += 1;
        } else {
            assert!(matches!(&frames[..], [Message::Error { code: ErrorCode::Busy, .. }]), "{frames:?}");
            assert!(
                end.as_ref().map_or_else(|e| e.kind() == ErrorKind::ConnectionReset, |()| true),
                "{end:?}"
            );
        }
    };
    tcp.iter_mut().for_each(|s| check(read_until_closed(s)));
    unix.iter_mut().for_each(|s| check(read_until_closed(s)));
    assert_eq!(closed_silently as f64, timed_out);

    // A legitimate client gets in and works.
    let mut store = None;
    eventually("a legitimate client connects", || {
        store = RemoteDecisions::connect_with(unix_endpoint(&server), ClientOptions::default()).ok();
        store.is_some()
    });
    let store = store.unwrap();
    let session = store.open_session().unwrap();
    store.decide(&decision(xid_of(&store, session, 1), &["a"])).unwrap();
    assert_eq!(metric(&metrics(&server), "decree_handshakes_timed_out_total"), timed_out);
    server.shutdown().unwrap();
}

/// The bound counts from the accept, not from the last byte: a Hello trickled one byte at a
/// time (a 64 KiB frame that would take minutes) is closed all the same.
#[test]
fn a_trickled_hello_is_closed_at_the_handshake_bound() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.limits.handshake_timeout_ms = 300;
    let server = decree_server::start(c, Vec::new()).unwrap();
    let mut s = UnixStream::connect(server.unix_path().unwrap()).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    // A Hello header announcing the largest frame (65,532 bytes after the length).
    let mut bytes = vec![0x00, 0x00, 0xff, 0xfc, 1, 0x01, 0, 0, 0, 0, 0, 0, 0, 1];
    bytes.resize(65_536, b'x');
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut sent = 0;
    let closed = loop {
        assert!(Instant::now() < deadline, "the server never closed the trickling connection");
        if s.write_all(&bytes[sent..sent + 1]).is_err() {
            break "write failed";
        }
        sent += 1;
        let mut byte = [0u8; 1];
        match s.read(&mut byte) {
            Ok(0) => break "end of file",
            Ok(_) => panic!("the server sent something to a connection without a Hello"),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            // Closed while a trickled byte was still unread on the server's side.
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break "reset",
            Err(e) => panic!("unexpected read error {e}"),
        }
    };
    assert!(sent < bytes.len(), "closed ({closed}) only after the whole frame");
    assert_eq!(metric(&metrics(&server), "decree_handshakes_timed_out_total"), 1.0);
    server.shutdown().unwrap();
}

/// An operator's idle bound: announced in `HelloOk`, kept at bay by the Rust client's
/// keep-alive (its session and its prepared branch survive several bounds of silence),
/// and enforced on raw sessions that say nothing after their Hello, version 1 or 2; such a
/// close rolls back the session's undecided branches, which is why the bound is opt-in.
/// The bound is a second: the client pings half a bound before it expires, and a busy
/// 2-core machine must not turn that margin into a false failure.
#[test]
fn an_idle_bound_is_announced_kept_alive_by_the_client_and_closes_silent_sessions() {
    const IDLE_MS: u32 = 1000;
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.limits.idle_timeout_ms = IDLE_MS;
    let a = DummyFactory::named("a", 1000);
    let server = decree_server::start(c, vec![a.arc()]).unwrap();
    let mut rm = a.connection();
    rm.open().unwrap();

    let store = RemoteDecisions::connect_with(unix_endpoint(&server), ClientOptions::default()).unwrap();
    assert_eq!(store.idle_timeout(), Some(Duration::from_millis(IDLE_MS.into())));
    let session = store.open_session().unwrap();
    let pending = xid_of(&store, session, 1);
    rm.prepare(&pending.branch(0)).unwrap();
    // Three bounds of silence from the application.
    std::thread::sleep(Duration::from_millis(3 * u64::from(IDLE_MS)));
    assert_eq!(store.outcome(&pending).unwrap(), Outcome::InProgress);
    assert_eq!(a.outcome(&pending.branch(0)), None, "the pending branch must still be prepared");
    store.decide(&decision(pending, &["a"])).unwrap();
    let text = metrics(&server);
    assert_eq!(metric(&text, "decree_sessions_closed_total"), 0.0);
    assert_eq!(metric(&text, "decree_sessions_idle_closed_total"), 0.0);

    // Raw sessions that say nothing after their Hello are closed, with or without the
    // negotiation that told them the bound.
    let mut told = RawSession::open(&server, &[1, 2]);
    let mut untold = RawSession::open(&server, &[]);
    assert_eq!(told.negotiated(), Some(Negotiated { version: 2, idle_timeout_ms: IDLE_MS }));
    assert_eq!(untold.negotiated(), None);
    let silent = told.xid(1);
    rm.prepare(&silent.branch(0)).unwrap();
    assert_eq!(told.next(), None, "the idle session must be closed by the server");
    assert_eq!(untold.next(), None, "the idle version-1 session must be closed by the server");
    assert_eq!(metric(&metrics(&server), "decree_sessions_idle_closed_total"), 2.0);
    eventually("the closed session's undecided branch is rolled back", || {
        a.outcome(&silent.branch(0)) == Some(BranchOutcome::RolledBack)
    });

    // The client's session went on through all of it.
    store.complete(&pending).unwrap();
    assert_eq!(store.outcome(&pending).unwrap(), Outcome::Committed);
    assert_eq!(metric(&metrics(&server), "decree_sessions_idle_closed_total"), 2.0);
    drop(store);
    server.shutdown().unwrap();
}

/// A session whose decide waits on the log (a sync slower than the idle bound) is not
/// idle: it gets its `DecideOk`, and only then, after a whole bound of silence, is closed.
#[test]
fn a_decide_waiting_on_the_log_keeps_its_session_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.engine = EngineKind::Journal.name().to_string();
    c.limits.idle_timeout_ms = 400;
    let storage = FaultStorage::new(11);
    storage.disable_direct_io();
    let a = DummyFactory::named("a", 0);
    let server = decree_server::start_on_storage(c, Arc::new(storage.clone()), vec![a.arc()]).unwrap();
    let mut raw = RawSession::open(&server, &[1, 2]);
    storage.set_sync_delay(Duration::from_millis(3 * 400));
    let xid = raw.xid(1);
    raw.send(2, &Message::Decide(decision(xid, &["a"])));
    assert_eq!(raw.next(), Some(Message::DecideOk), "a session waiting on the log must not be closed");
    storage.set_sync_delay(Duration::ZERO);
    assert_eq!(raw.next(), None, "the session must be closed once idle after its answer");
    assert_eq!(metric(&metrics(&server), "decree_sessions_idle_closed_total"), 1.0);
    server.shutdown().unwrap();
}

/// By default nothing closes an idle session: the client is told no bound and a raw
/// session that says nothing for a while is still answered.
#[test]
fn by_default_idle_sessions_stay_open() {
    let dir = tempfile::tempdir().unwrap();
    let server = decree_server::start(config(dir.path()), Vec::new()).unwrap();
    let store = RemoteDecisions::connect_with(unix_endpoint(&server), ClientOptions::default()).unwrap();
    assert_eq!(store.idle_timeout(), None);
    let mut raw = RawSession::open(&server, &[1, 2]);
    assert_eq!(raw.negotiated(), Some(Negotiated { version: 2, idle_timeout_ms: 0 }));
    raw.stream.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let mut byte = [0u8; 1];
    match raw.stream.read(&mut byte) {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!("an idle session must stay open by default, got {other:?}"),
    }
    raw.stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    raw.send(2, &Message::Ping);
    assert_eq!(raw.next(), Some(Message::Pong));
    let text = metrics(&server);
    assert_eq!(metric(&text, "decree_sessions_idle_closed_total"), 0.0);
    assert_eq!(metric(&text, "decree_handshakes_timed_out_total"), 0.0);
    server.shutdown().unwrap();
}
