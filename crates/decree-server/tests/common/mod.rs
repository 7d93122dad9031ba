//! Helpers shared by the state server's integration tests: decisions and Xids of a
//! session, polling for the server's asynchronous work, its metrics, and the throwaway
//! PostgreSQL databases of scripts/test-dbs.sh.
//!
//! Without the DECREE_TEST_* variables a database test prints "skipped: ..." and returns;
//! with CI=true it fails instead, so that CI cannot pass without the databases.

#![allow(dead_code)] // each test binary uses its own subset

use decree_client::RemoteDecisions;
use decree_core::{BranchRecord, Decision, DecisionStore, Origin, ResourceManager, Xid};
use decree_proto::{ErrorCode, FrameBuffer, Message};
use decree_rm::PgRm;
use decree_server::ServerHandle;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// The Xid `sequence` of `session`, minted as the server told `store`.
pub fn xid_of(store: &RemoteDecisions, session: u64, sequence: u64) -> Xid {
    Xid::decree(Origin { node: store.node(), incarnation: store.incarnation(), session, sequence })
}

/// A decision of `xid` with branch i on `rms[i]`.
pub fn decision(xid: Xid, rms: &[&str]) -> Decision {
    let branches =
        rms.iter().enumerate().map(|(i, rm)| BranchRecord { rm: rm.to_string(), branch: i as u16 }).collect();
    Decision { xid, branches }
}

/// Polls `cond` for up to twenty seconds (the server's background work is asynchronous).
pub fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The server's Prometheus text.
pub fn metrics(server: &ServerHandle) -> String {
    let mut s = std::net::TcpStream::connect(server.metrics_addr().unwrap()).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.0 200 OK"), "{out}");
    out
}

/// The value of metric `name` in `text`.
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("metric {name} missing"))
        .parse()
        .unwrap()
}

/// The DSN in `var`, or `None` (after printing why) when the test must be skipped.
pub fn dsn(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Some(v),
        _ => {
            let hint = format!(
                "{var} is not set: run scripts/test-dbs.sh start && eval \"$(scripts/test-dbs.sh env)\""
            );
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{hint}");
            }
            eprintln!("skipped: run scripts/test-dbs.sh start ({hint})");
            None
        }
    }
}

/// Starts `xid` on `rm`, inserts row `id` into `table` and prepares.
pub fn prepare_insert(rm: &mut PgRm, xid: &Xid, table: &str, id: i64) {
    rm.start(xid).expect("start");
    rm.client()
        .expect("client")
        .execute(&format!("INSERT INTO {table} VALUES ($1)"), &[&id])
        .expect("insert");
    rm.end(xid).expect("end");
    rm.prepare(xid).expect("prepare");
}

/// Rows with `id` in `table`.
pub fn count(rm: &PgRm, table: &str, id: i64) -> i64 {
    let row = rm
        .client()
        .expect("client")
        .query_one(&format!("SELECT count(*) FROM {table} WHERE id = $1"), &[&id])
        .expect("count");
    row.get(0)
}

/// A raw connection speaking protocol `versions` (empty: a version-1 client of today).
pub struct Raw {
    pub stream: UnixStream,
    frames: FrameBuffer,
    next_id: u64,
    hello_ok: Message,
}

impl Raw {
    pub fn connect(dir: &Path, versions: &[u8]) -> Raw {
        let stream = UnixStream::connect(dir.join("decree.sock")).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let frames = FrameBuffer::new(decree_proto::FRAME_BYTES_MAX);
        let mut raw = Raw { stream, frames, next_id: 1, hello_ok: Message::Ping };
        let hello = Message::Hello { node_expected: 0, client: "raw".into(), versions: versions.to_vec() };
        raw.hello_ok = raw.request(&hello);
        raw
    }

    pub fn session(&self) -> (u32, u64, u64) {
        match &self.hello_ok {
            Message::HelloOk { node, incarnation, session, .. } => (*node, *incarnation, *session),
            other => panic!("expected HelloOk, got {other:?}"),
        }
    }

    pub fn xid(&self, sequence: u64) -> Xid {
        let (node, incarnation, session) = self.session();
        Xid::decree(Origin { node, incarnation, session, sequence })
    }

    /// The server's `HelloOk`.
    pub fn hello_ok(&self) -> &Message {
        &self.hello_ok
    }

    pub fn send(&mut self, message: &Message) -> u64 {
        self.send_with_fields(message, &[])
    }

    /// Sends `message` followed by a version-3 field trailer.
    pub fn send_with_fields(&mut self, message: &Message, fields: &[decree_proto::Field]) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let mut buf = Vec::new();
        decree_proto::encode_frame_with_fields(&mut buf, id, message, fields);
        self.stream.write_all(&buf).unwrap();
        id
    }

    pub fn request(&mut self, message: &Message) -> Message {
        self.request_with_fields(message, &[])
    }

    /// Sends `message` with a field trailer and waits for its reply.
    pub fn request_with_fields(&mut self, message: &Message, fields: &[decree_proto::Field]) -> Message {
        let id = self.send_with_fields(message, fields);
        loop {
            if let Some((got, reply)) = self.frames.next_message().unwrap() {
                assert_eq!(got, id, "replies come in order on this connection: {reply:?}");
                return reply;
            }
            let n = self.stream.read(self.frames.read_space()).unwrap();
            assert!(n > 0, "the server closed the connection while {message:?} waited for its reply");
            self.frames.commit(n);
        }
    }
}

pub fn error_code(reply: &Message) -> ErrorCode {
    match reply {
        Message::Error { code, message } => {
            assert!(!message.is_empty(), "an error names its problem");
            *code
        }
        other => panic!("expected an Error, got {other:?}"),
    }
}
