//! The decree client library: a [`DecisionStore`] that keeps the decisions on a state
//! server instead of an embedded log, so that an application moves between embedded and
//! server mode by configuration only.
//!
//! Design for latency: every coordinator session gets its own connection (one server
//! session), used with plain blocking std sockets, so a decide is one write and one read
//! on the calling thread — no runtime, no hand-off to another thread. `complete` is lazy:
//! completions are buffered on the session's connection and sent with its next request,
//! when [`COMPLETES_BUFFERED_MAX`] accumulate, or when the session closes (a completion
//! the server never sees only makes it redo an idempotent phase two). A control
//! connection, opened by [`RemoteDecisions::connect`] (and again when it broke), answers
//! `node`, `incarnation` and [`RemoteDecisions::outcome`]. Any IO error or timeout breaks that connection: the call
//! in progress and every later call on it return [`StoreError::Unreachable`].

use decree_core::{Decision, DecisionStore, Outcome, StoreError, Xid};
use decree_proto::{encode_decide_frame, encode_frame, ErrorCode, FrameBuffer, Message};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

/// Completions buffered on one connection before they are sent on their own.
pub const COMPLETES_BUFFERED_MAX: usize = 16;

/// Where the state server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// `unix:/path/to/socket`
    Unix(PathBuf),
    /// `tcp:host:port`
    Tcp(String),
}

impl FromStr for Endpoint {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self, StoreError> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(StoreError::Unreachable("endpoint `unix:` needs a socket path".into()));
            }
            return Ok(Endpoint::Unix(PathBuf::from(path)));
        }
        if let Some(addr) = s.strip_prefix("tcp:") {
            if !addr.contains(':') {
                return Err(StoreError::Unreachable(format!("endpoint {s:?} needs tcp:host:port")));
            }
            return Ok(Endpoint::Tcp(addr.to_string()));
        }
        Err(StoreError::Unreachable(format!("endpoint {s:?} must start with unix: or tcp:")))
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
            Endpoint::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

/// How the client connects and how long it waits.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// The node id the server must have (0: any).
    pub node_expected: u32,
    /// The longest wait for a reply; past it the connection is closed and the call fails.
    pub reply_timeout: Option<Duration>,
    /// The longest wait to establish a TCP connection.
    pub connect_timeout: Duration,
    /// The name the server logs for this client.
    pub client_name: String,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            node_expected: 0,
            reply_timeout: Some(Duration::from_secs(30)),
            connect_timeout: Duration::from_secs(5),
            client_name: format!("decree-client/{} pid {}", env!("CARGO_PKG_VERSION"), std::process::id()),
        }
    }
}

/// A blocking socket of either kind.
enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    fn connect(endpoint: &Endpoint, options: &ClientOptions) -> std::io::Result<Stream> {
        let stream = match endpoint {
            Endpoint::Unix(path) => {
                let s = UnixStream::connect(path)?;
                s.set_read_timeout(options.reply_timeout)?;
                Stream::Unix(s)
            }
            Endpoint::Tcp(addr) => {
                let mut last = None;
                let mut found = None;
                for a in addr.to_socket_addrs()? {
                    match TcpStream::connect_timeout(&a, options.connect_timeout) {
                        Ok(s) => {
                            found = Some(s);
                            break;
                        }
                        Err(e) => last = Some(e),
                    }
                }
                let s = found.ok_or_else(|| {
                    last.unwrap_or_else(|| std::io::Error::other(format!("{addr} resolves to no address")))
                })?;
                s.set_nodelay(true)?;
                s.set_read_timeout(options.reply_timeout)?;
                Stream::Tcp(s)
            }
        };
        Ok(stream)
    }
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        match self {
            Stream::Unix(s) => s.write_all(buf),
            Stream::Tcp(s) => s.write_all(buf),
        }
    }
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
    fn shutdown(&self, how: Shutdown) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(how),
            Stream::Tcp(s) => s.shutdown(how),
        };
    }
}

/// What the server said in `HelloOk`.
#[derive(Debug, Clone, Copy)]
struct Session {
    node: u32,
    incarnation: u64,
    id: u64,
    frame_bytes_max: usize,
}

/// One connection = one server session, used by one caller at a time.
struct Connection {
    stream: Stream,
    session: Session,
    endpoint: String,
    next_request: u64,
    out: Vec<u8>,
    completes_buffered: usize,
    frames: FrameBuffer,
    broken: Option<String>,
}

impl Connection {
    fn open(endpoint: &Endpoint, options: &ClientOptions) -> Result<Connection, StoreError> {
        let unreachable =
            |e: std::io::Error| StoreError::Unreachable(format!("cannot connect to {endpoint}: {e}"));
        let stream = Stream::connect(endpoint, options).map_err(unreachable)?;
        let mut conn = Connection {
            stream,
            session: Session {
                node: 0,
                incarnation: 0,
                id: 0,
                frame_bytes_max: decree_proto::FRAME_BYTES_MAX,
            },
            endpoint: endpoint.to_string(),
            next_request: 1,
            out: Vec::with_capacity(1024),
            completes_buffered: 0,
            frames: FrameBuffer::new(decree_proto::FRAME_BYTES_MAX),
            broken: None,
        };
        let hello =
            Message::Hello { node_expected: options.node_expected, client: options.client_name.clone() };
        match conn.request(&hello)? {
            Message::HelloOk { node, incarnation, session, frame_bytes_max, .. } => {
                conn.session = Session {
                    node,
                    incarnation,
                    id: session,
                    frame_bytes_max: (frame_bytes_max as usize).min(decree_proto::FRAME_BYTES_MAX),
                };
                Ok(conn)
            }
            other => Err(conn.break_with(format!("expected HelloOk, got {}", other.kind().name()))),
        }
    }

    /// Sends `message` (after any buffered completions) and waits for its reply.
    fn request(&mut self, message: &Message) -> Result<Message, StoreError> {
        let id = self.next_request;
        encode_frame(&mut self.out, id, message);
        self.exchange(id)
    }

    /// Stores a decision: one write, one read.
    fn decide(&mut self, decision: &Decision) -> Result<(), StoreError> {
        let id = self.next_request;
        let start = self.out.len();
        let len = encode_decide_frame(&mut self.out, id, decision);
        if len > self.session.frame_bytes_max {
            self.out.truncate(start);
            return Err(StoreError::Malformed(format!(
                "decision of {len} bytes exceeds the server's frame limit of {} bytes",
                self.session.frame_bytes_max
            )));
        }
        match self.exchange(id)? {
            Message::DecideOk => Ok(()),
            other => Err(self.break_with(format!("expected DecideOk, got {}", other.kind().name()))),
        }
    }

    /// Buffers a completion; sends the buffer once it holds enough of them.
    fn complete(&mut self, xid: &Xid) -> Result<(), StoreError> {
        self.check()?;
        let id = self.next_request;
        self.next_request += 1;
        encode_frame(&mut self.out, id, &Message::Complete(*xid));
        self.completes_buffered += 1;
        if self.completes_buffered >= COMPLETES_BUFFERED_MAX {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StoreError> {
        self.check()?;
        if self.out.is_empty() {
            return Ok(());
        }
        let result = self.stream.write_all(&self.out);
        self.out.clear();
        self.completes_buffered = 0;
        if let Err(e) = result {
            let closed =
                matches!(e.kind(), std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset);
            let refusal = if closed { self.salvage_refusal() } else { None };
            return Err(self.break_with(refusal.unwrap_or_else(|| format!("write failed: {e}"))));
        }
        Ok(())
    }

    /// The message of an Error frame the server sent before closing (a refused connection
    /// closes before the client's first write lands); reads only what the closed peer left.
    fn salvage_refusal(&mut self) -> Option<String> {
        for _ in 0..16 {
            match self.frames.next_message() {
                Ok(Some((_, Message::Error { message, .. }))) => return Some(message),
                Ok(Some(_)) => {}
                Ok(None) => match self.stream.read(self.frames.read_space()) {
                    Ok(n) if n > 0 => self.frames.commit(n),
                    _ => return None,
                },
                Err(_) => return None,
            }
        }
        None
    }

    /// Writes the buffer (ending with request `id`) and reads frames until `id`'s reply.
    fn exchange(&mut self, id: u64) -> Result<Message, StoreError> {
        self.next_request += 1;
        self.flush()?;
        loop {
            match self.frames.next_message() {
                Ok(Some((rid, message))) if rid == id => {
                    return match message {
                        Message::Error { code, message } => Err(self.server_error(code, message)),
                        m => Ok(m),
                    };
                }
                Ok(Some((rid, Message::Error { code, message }))) => {
                    // A failed completion (they get no reply on success), or a refusal.
                    tracing::warn!(request = rid, ?code, %message, "state server reported an error");
                    if rid == 0 {
                        return Err(self.server_error(code, message));
                    }
                }
                Ok(Some((rid, other))) => {
                    tracing::warn!(request = rid, kind = other.kind().name(), "unexpected reply; ignored");
                }
                Ok(None) => {
                    let space = self.frames.read_space();
                    match self.stream.read(space) {
                        Ok(0) => return Err(self.break_with("the server closed the connection".into())),
                        Ok(n) => self.frames.commit(n),
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(self.break_with(format!("no reply: {e}"))),
                    }
                }
                Err(e) => return Err(self.break_with(format!("bad frame from the server: {e}"))),
            }
        }
    }

    fn server_error(&mut self, code: ErrorCode, message: String) -> StoreError {
        match code {
            ErrorCode::LogFailed => StoreError::Log(message),
            ErrorCode::WrongSession => {
                StoreError::Malformed(format!("refused by the state server: {message}"))
            }
            ErrorCode::Busy | ErrorCode::ShuttingDown => self.break_with(message),
            _ => self.break_with(format!("state server error {code:?}: {message}")),
        }
    }

    fn check(&self) -> Result<(), StoreError> {
        match &self.broken {
            Some(why) => Err(StoreError::Unreachable(why.clone())),
            None => Ok(()),
        }
    }

    /// Marks the connection unusable and closes it, so that the server ends the session.
    fn break_with(&mut self, why: String) -> StoreError {
        let why = format!("{} (session {}): {why}", self.endpoint, self.session.id);
        self.stream.shutdown(Shutdown::Both);
        self.broken = Some(why.clone());
        StoreError::Unreachable(why)
    }
}

/// A [`DecisionStore`] backed by a decree state server.
pub struct RemoteDecisions {
    endpoint: Endpoint,
    options: ClientOptions,
    node: u32,
    incarnation: u64,
    control: Mutex<Connection>,
    sessions: RwLock<HashMap<u64, Arc<Mutex<Connection>>>>,
}

impl RemoteDecisions {
    /// Connects to `unix:/path` or `tcp:host:port` with default options.
    pub fn connect(endpoint: &str) -> Result<Self, StoreError> {
        Self::connect_with(endpoint.parse()?, ClientOptions::default())
    }

    /// Connects with explicit options.
    pub fn connect_with(endpoint: Endpoint, options: ClientOptions) -> Result<Self, StoreError> {
        let control = Connection::open(&endpoint, &options)?;
        let Session { node, incarnation, .. } = control.session;
        Ok(RemoteDecisions {
            endpoint,
            options,
            node,
            incarnation,
            control: Mutex::new(control),
            sessions: RwLock::new(HashMap::new()),
        })
    }

    /// What became of `xid`: committed, still in progress, or rolled back (presumed abort).
    pub fn outcome(&self, xid: &Xid) -> Result<Outcome, StoreError> {
        match self.control_request(&Message::Outcome(*xid))? {
            Message::OutcomeIs(o) => Ok(o),
            other => Err(self
                .control
                .lock()
                .break_with(format!("expected OutcomeIs, got {}", other.kind().name()))),
        }
    }

    /// Checks that the server answers on the control connection.
    pub fn ping(&self) -> Result<(), StoreError> {
        match self.control_request(&Message::Ping)? {
            Message::Pong => Ok(()),
            other => {
                Err(self.control.lock().break_with(format!("expected Pong, got {}", other.kind().name())))
            }
        }
    }

    /// An idempotent request on the control connection, tried once more on a fresh
    /// connection when the old one turns out to be dead (the server restarted).
    fn control_request(&self, message: &Message) -> Result<Message, StoreError> {
        let first = self.control().request(message); // The guard is dropped here.
        match first {
            Err(StoreError::Unreachable(_)) => self.control().request(message),
            other => other,
        }
    }

    /// The control connection, opened again if it broke: asking an outcome after the
    /// server restarted is exactly when it is needed.
    fn control(&self) -> parking_lot::MutexGuard<'_, Connection> {
        let mut control = self.control.lock();
        if control.broken.is_some() {
            match Connection::open(&self.endpoint, &self.options) {
                Ok(fresh) => *control = fresh,
                Err(e) => tracing::debug!(error = %e, "control connection not reopened"),
            }
        }
        control
    }

    /// The endpoint this store talks to.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The connection of the session that minted `xid`.
    fn session_of(&self, xid: &Xid) -> Result<Arc<Mutex<Connection>>, StoreError> {
        let origin =
            xid.origin().ok_or_else(|| StoreError::Malformed(format!("{xid} is not a decree Xid")))?;
        if origin.node != self.node || origin.incarnation != self.incarnation {
            return Err(StoreError::Malformed(format!(
                "{xid} was not minted by node {} incarnation {} of this store",
                self.node, self.incarnation
            )));
        }
        self.sessions.read().get(&origin.session).cloned().ok_or_else(|| {
            StoreError::Unreachable(format!("session {} is not open on this store", origin.session))
        })
    }
}

impl DecisionStore for RemoteDecisions {
    fn node(&self) -> u32 {
        self.node
    }

    fn incarnation(&self) -> u64 {
        self.incarnation
    }

    fn open_session(&self) -> Result<u64, StoreError> {
        let conn = Connection::open(&self.endpoint, &self.options)?;
        if conn.session.incarnation != self.incarnation || conn.session.node != self.node {
            return Err(StoreError::Unreachable(format!(
                "the state server restarted (node {} incarnation {}, this store has node {} incarnation {}): \
                 connect again",
                conn.session.node, conn.session.incarnation, self.node, self.incarnation
            )));
        }
        let id = conn.session.id;
        self.sessions.write().insert(id, Arc::new(Mutex::new(conn)));
        Ok(id)
    }

    fn close_session(&self, session: u64) {
        let Some(conn) = self.sessions.write().remove(&session) else { return };
        let mut conn = conn.lock();
        if let Err(e) = conn.flush() {
            tracing::debug!(session, error = %e, "completions not delivered at close");
        }
        // Write side only: what was written is still delivered, and the server sees the end.
        conn.stream.shutdown(Shutdown::Write);
    }

    fn decide(&self, decision: &Decision) -> Result<(), StoreError> {
        let conn = self.session_of(&decision.xid)?;
        let mut conn = conn.lock();
        conn.decide(decision)
    }

    fn complete(&self, xid: &Xid) -> Result<(), StoreError> {
        match self.session_of(xid) {
            Ok(conn) => conn.lock().complete(xid),
            Err(_) => {
                // The session is gone: tell the server through the control connection.
                let mut control = self.control();
                control.complete(xid)?;
                control.flush()
            }
        }
    }
}

impl Drop for RemoteDecisions {
    fn drop(&mut self) {
        for (_, conn) in self.sessions.write().drain() {
            let mut conn = conn.lock();
            let _ = conn.flush();
            conn.stream.shutdown(Shutdown::Write);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_and_bad_ones_are_named() {
        assert_eq!("unix:/run/d.sock".parse::<Endpoint>().unwrap(), Endpoint::Unix("/run/d.sock".into()));
        assert_eq!("tcp:127.0.0.1:7411".parse::<Endpoint>().unwrap(), Endpoint::Tcp("127.0.0.1:7411".into()));
        assert_eq!(Endpoint::Tcp("h:1".into()).to_string(), "tcp:h:1");
        for bad in ["unix:", "tcp:localhost", "http://x", ""] {
            match bad.parse::<Endpoint>() {
                Err(StoreError::Unreachable(why)) => {
                    assert!(why.contains("unix") || why.contains("tcp"), "{why}")
                }
                other => panic!("{bad:?} must be refused, got {other:?}"),
            }
        }
    }

    #[test]
    fn connecting_to_nothing_is_unreachable() {
        let dir = std::env::temp_dir().join(format!("decree-client-none-{}.sock", std::process::id()));
        match RemoteDecisions::connect(&format!("unix:{}", dir.display())) {
            Err(StoreError::Unreachable(why)) => assert!(why.contains("cannot connect"), "{why}"),
            Err(e) => panic!("expected Unreachable, got {e}"),
            Ok(_) => panic!("nothing listens there"),
        }
    }
}
