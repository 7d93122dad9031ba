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
//!
//! Every connection offers protocol versions 1 and 2 in its `Hello` and speaks what the
//! server chose (a server that answers a plain `HelloOk` speaks version 1; one that refuses
//! the version list as malformed, a server older than version 2, gets a plain `Hello` on a
//! new connection). Callers see the same answers in both versions: on a version-1
//! connection the errors the server sends for an unknown or heuristic outcome become
//! [`Outcome::Unknown`] and [`Outcome::Heuristic`], and a heuristic completion is sent as
//! a plain `Complete`.
//!
//! A server may close sessions that stay silent (`idle_timeout_ms` in its `HelloOk`; off
//! by default), which would roll back their undecided branches. When it announces such a
//! bound, a [`RemoteDecisions`] runs one keep-alive thread (stopped when it is dropped)
//! that sends `Ping` on every connection that has sent nothing for a third of the bound.
//! The thread takes a connection only when nobody uses it (a connection in use is not
//! idle), holds it for that one round trip and never while it sleeps, and keeps no queue.
//! With no bound announced, there is no thread.
//!
//! Several independent pairs (each with its own node id) behind one client: [`Pairs`] and
//! [`PairsCoordinator`] spread sessions over them and route outcome questions by the Xid's
//! node id; their rules are [`route`]'s, pure.

mod tls;

pub use tls::{ClientTls, ClientTlsFiles};

mod alive;

pub mod route;

mod pairs;

pub use pairs::{PairStore, Pairs, PairsCoordinator, PAIR_DOWN_FOR};

use decree_core::{Decision, DecisionStore, HeuristicOutcome, Outcome, StoreError, TraceContext, Xid};
use decree_proto::{
    encode_decide_frame, encode_frame, encode_frame_with_fields, ErrorCode, FrameBuffer, Message, Negotiated,
};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Completions buffered on one connection before they are sent on their own.
pub const COMPLETES_BUFFERED_MAX: usize = 16;

/// Where the state server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// `unix:/path/to/socket`
    Unix(PathBuf),
    /// `tcp:host:port`
    Tcp(String),
    /// `tls:host:port`: TCP with TLS 1.3; needs [`ClientOptions::tls`].
    Tls(String),
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
        if let Some(addr) = s.strip_prefix("tls:") {
            if !addr.contains(':') {
                return Err(StoreError::Unreachable(format!("endpoint {s:?} needs tls:host:port")));
            }
            return Ok(Endpoint::Tls(addr.to_string()));
        }
        Err(StoreError::Unreachable(format!("endpoint {s:?} must start with unix:, tcp: or tls:")))
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
            Endpoint::Tcp(a) => write!(f, "tcp:{a}"),
            Endpoint::Tls(a) => write!(f, "tls:{a}"),
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
    /// The CA, certificate and key for `tls:` endpoints.
    pub tls: Option<ClientTls>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            node_expected: 0,
            reply_timeout: Some(Duration::from_secs(30)),
            connect_timeout: Duration::from_secs(5),
            client_name: format!("decree-client/{} pid {}", env!("CARGO_PKG_VERSION"), std::process::id()),
            tls: None,
        }
    }
}

/// A blocking socket of either kind.
enum Stream {
    /// With its reply timeout, which poll(2) applies (see [`wait_readable`]).
    Unix(UnixStream, Option<Duration>),
    Tcp(TcpStream),
    Tls(Box<tls::TlsStream>),
}

impl Stream {
    fn connect(endpoint: &Endpoint, options: &ClientOptions) -> std::io::Result<Stream> {
        let stream = match endpoint {
            Endpoint::Unix(path) => {
                let s = UnixStream::connect(path)?;
                s.set_read_timeout(options.reply_timeout)?;
                Stream::Unix(s, options.reply_timeout)
            }
            Endpoint::Tcp(addr) => Stream::Tcp(Self::tcp(addr, options)?),
            Endpoint::Tls(addr) => {
                let Some(config) = &options.tls else {
                    return Err(std::io::Error::other(
                        "a tls: endpoint needs ClientOptions::tls (the server's CA, this client's certificate and key)",
                    ));
                };
                let socket = Self::tcp(addr, options)?;
                Stream::Tls(Box::new(config.handshake(
                    socket,
                    tls::host_of(addr),
                    options.connect_timeout,
                )?))
            }
        };
        Ok(stream)
    }
    /// A TCP connection to the first address of `addr` that answers.
    fn tcp(addr: &str, options: &ClientOptions) -> std::io::Result<TcpStream> {
        let mut last = None;
        for a in addr.to_socket_addrs()? {
            match TcpStream::connect_timeout(&a, options.connect_timeout) {
                Ok(s) => {
                    s.set_nodelay(true)?;
                    s.set_read_timeout(options.reply_timeout)?;
                    return Ok(s);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other(format!("{addr} resolves to no address"))))
    }
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        match self {
            Stream::Unix(s, _) => s.write_all(buf),
            Stream::Tcp(s) => s.write_all(buf),
            // StreamOwned writes whole records to the socket before returning.
            Stream::Tls(s) => s.write_all(buf).and_then(|()| s.flush()).map_err(tls::explain),
        }
    }
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Unix(s, timeout) => {
                wait_readable(s, *timeout)?;
                s.read(buf)
            }
            Stream::Tcp(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf).map_err(tls::explain),
        }
    }
    /// Why the server is known to have closed this connection, checked without blocking.
    fn ended(&self) -> Option<String> {
        use std::os::fd::AsRawFd;
        alive::ended(match self {
            Stream::Unix(s, _) => s.as_raw_fd(),
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Tls(s) => s.sock.as_raw_fd(),
        })
    }
    fn shutdown(&self, how: Shutdown) {
        let _ = match self {
            Stream::Unix(s, _) => s.shutdown(how),
            Stream::Tcp(s) => s.shutdown(how),
            Stream::Tls(s) => s.sock.shutdown(how),
        };
    }
}

/// Waits in poll(2) until `socket` has bytes (or `timeout` passes). A thread asleep in a
/// Unix socket's read(2) is woken every time the server reads what this client sent (the
/// kernel's write-space wake-up reaches every sleeper of the socket, whatever it waits
/// for); poll(2) filters that wake-up out, saving two context switches per request
/// (measured in docs/measurements.md, "Spurious wake-ups on the Unix socket").
fn wait_readable(socket: &UnixStream, timeout: Option<Duration>) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let timeout_ms = match timeout {
        Some(t) => i32::try_from(t.as_millis().max(1)).unwrap_or(i32::MAX),
        None => -1,
    };
    let mut fd = libc::pollfd { fd: socket.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd that lives across the call.
    match unsafe { libc::poll(&mut fd, 1, timeout_ms) } {
        0 => Err(std::io::Error::new(std::io::ErrorKind::WouldBlock, "timed out waiting for a reply")),
        n if n < 0 => Err(std::io::Error::last_os_error()),
        // Readable, closed or in error: read(2) says which.
        _ => Ok(()),
    }
}

/// What the server said in `HelloOk`.
#[derive(Debug, Clone, Copy)]
struct Session {
    node: u32,
    incarnation: u64,
    id: u64,
    frame_bytes_max: usize,
    /// The protocol version of the session (1 when the server did not negotiate).
    version: u8,
    /// Milliseconds of silence after which the server closes the session; 0 = never.
    idle_timeout_ms: u32,
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
    /// When bytes last went to the server: the server's idle clock restarts with each
    /// request, so this is what the keep-alive measures.
    last_sent: Instant,
}

/// What became of a `Hello`.
enum Greeting {
    /// The session is open (boxed: a connection is large, the refusal is nothing).
    Open(Box<Connection>),
    /// The server refused the version list as malformed (it predates protocol version 2)
    /// and closed the connection.
    ListRefused,
}

impl Connection {
    /// Opens a session, offering every protocol version this client speaks; falls back to
    /// a plain `Hello` (version 1) for a server that does not know the version list.
    fn open(endpoint: &Endpoint, options: &ClientOptions) -> Result<Connection, StoreError> {
        match Self::greet(endpoint, options, decree_proto::PROTOCOL_VERSIONS)? {
            Greeting::Open(conn) => Ok(*conn),
            Greeting::ListRefused => {
                tracing::debug!(%endpoint, "the state server refused the version list: connecting with protocol version 1");
                match Self::greet(endpoint, options, &[])? {
                    Greeting::Open(conn) => Ok(*conn),
                    Greeting::ListRefused => Err(StoreError::Unreachable(format!(
                        "{endpoint}: the state server refused a plain Hello as malformed"
                    ))),
                }
            }
        }
    }

    /// One connection and its `Hello` offering `versions` (none: a version-1 hello).
    fn greet(endpoint: &Endpoint, options: &ClientOptions, versions: &[u8]) -> Result<Greeting, StoreError> {
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
                version: decree_proto::PROTOCOL_VERSION_DEFAULT,
                idle_timeout_ms: 0,
            },
            endpoint: endpoint.to_string(),
            next_request: 1,
            out: Vec::with_capacity(1024),
            completes_buffered: 0,
            frames: FrameBuffer::new(decree_proto::FRAME_BYTES_MAX),
            broken: None,
            last_sent: Instant::now(),
        };
        let hello = Message::Hello {
            node_expected: options.node_expected,
            client: options.client_name.clone(),
            versions: versions.to_vec(),
        };
        let id = conn.next_request;
        encode_frame(&mut conn.out, id, &hello);
        match conn.exchange_raw(id)? {
            Message::HelloOk { node, incarnation, session, frame_bytes_max, negotiated, .. } => {
                let (version, idle_timeout_ms) = match negotiated {
                    None => (decree_proto::PROTOCOL_VERSION_DEFAULT, 0),
                    Some(Negotiated { version, idle_timeout_ms }) if versions.contains(&version) => {
                        (version, idle_timeout_ms)
                    }
                    Some(Negotiated { version, .. }) => {
                        return Err(conn.break_with(format!(
                            "the server chose protocol version {version}, which this client did not offer ({versions:?})"
                        )))
                    }
                };
                conn.session = Session {
                    node,
                    incarnation,
                    id: session,
                    frame_bytes_max: (frame_bytes_max as usize).min(decree_proto::FRAME_BYTES_MAX),
                    version,
                    idle_timeout_ms,
                };
                Ok(Greeting::Open(Box::new(conn)))
            }
            Message::Error { code: ErrorCode::Malformed, message } if !versions.is_empty() => {
                let _ = conn.break_with(format!("hello refused: {message}"));
                Ok(Greeting::ListRefused)
            }
            Message::Error { code, message } => Err(conn.server_error(code, message)),
            other => Err(conn.break_with(format!("expected HelloOk, got {}", other.kind().name()))),
        }
    }

    /// Sends `message` (after any buffered completions) and waits for its reply.
    fn request(&mut self, message: &Message) -> Result<Message, StoreError> {
        let id = self.next_request;
        encode_frame(&mut self.out, id, message);
        self.exchange(id)
    }

    /// Asks what became of `xid`: the same answers whatever the session's version.
    fn outcome(&mut self, xid: &Xid) -> Result<Outcome, StoreError> {
        let id = self.next_request;
        let start = self.out.len();
        encode_frame(&mut self.out, id, &Message::Outcome(*xid));
        self.add_trace_context(start, decree_core::trace::current_context().as_ref());
        match self.exchange_raw(id)? {
            Message::OutcomeIs(o) => Ok(o),
            // The version-1 answers for outcomes version 1 has no value for.
            Message::Error { code: ErrorCode::OutcomeUnknown, .. } => Ok(Outcome::Unknown),
            Message::Error { code: ErrorCode::OutcomeHeuristic, .. } => Ok(Outcome::Heuristic),
            Message::Error { code, message } => Err(self.server_error(code, message)),
            other => Err(self.break_with(format!("expected OutcomeIs, got {}", other.kind().name()))),
        }
    }

    /// Stores a decision: one write, one read.
    fn decide(&mut self, decision: &Decision, trace: Option<&TraceContext>) -> Result<(), StoreError> {
        let id = self.next_request;
        let start = self.out.len();
        encode_decide_frame(&mut self.out, id, decision);
        self.add_trace_context(start, trace);
        let len = self.out.len() - start;
        if len > self.session.frame_bytes_max {
            self.out.truncate(start);
            return Err(StoreError::Malformed(format!(
                "decision of {len} bytes exceeds the server's frame limit of {} bytes",
                self.session.frame_bytes_max
            )));
        }
        // A session the server already ended would lose the decision unread: not sent.
        if let Some(why) = self.stream.ended() {
            self.out.truncate(start);
            return Err(StoreError::NotSent(self.break_with(why).to_string()));
        }
        // Written whole or not decided: a failed write never took the frame's last byte.
        self.next_request += 1;
        if let Err(e) = self.flush() {
            return Err(StoreError::NotSent(format!("the decision's write failed: {e}")));
        }
        match self.read_reply(id)? {
            Message::Error { code, message } => Err(self.server_error(code, message)),
            Message::DecideOk => Ok(()),
            other => Err(self.break_with(format!("expected DecideOk, got {}", other.kind().name()))),
        }
    }

    /// Sends `OnePhase` for `xid` at once (protocol version 3) and returns once its whole
    /// frame is written; false on an older session, which has no such message.
    fn one_phase(&mut self, xid: &Xid, trace: Option<&TraceContext>) -> Result<bool, StoreError> {
        if self.session.version < decree_proto::PROTOCOL_VERSION_TRAILER {
            return Ok(false);
        }
        self.check().map_err(|e| StoreError::NotSent(e.to_string()))?;
        let id = self.next_request;
        self.next_request += 1;
        let start = self.out.len();
        encode_frame(&mut self.out, id, &Message::OnePhase(*xid));
        self.add_trace_context(start, trace);
        self.flush().map_err(|e| StoreError::NotSent(format!("the one-phase notice's write failed: {e}")))?;
        Ok(true)
    }

    /// Buffers a completion (`heuristic`: at least one branch decided on its own); sends
    /// the buffer once it holds enough of them. Version 1 has no heuristic completion: it
    /// gets a plain `Complete`.
    fn complete(
        &mut self,
        xid: &Xid,
        heuristic: Option<HeuristicOutcome>,
        trace: Option<&TraceContext>,
    ) -> Result<(), StoreError> {
        self.check()?;
        let id = self.next_request;
        self.next_request += 1;
        let message = match heuristic {
            Some(h) if self.session.version >= 2 => Message::CompleteHeuristic(*xid, h),
            _ => Message::Complete(*xid),
        };
        let start = self.out.len();
        encode_frame(&mut self.out, id, &message);
        self.add_trace_context(start, trace);
        self.completes_buffered += 1;
        if self.completes_buffered >= COMPLETES_BUFFERED_MAX {
            self.flush()?;
        }
        Ok(())
    }

    /// Sends `CompleteHeuristic` asking for the kept reply (protocol version 3) and waits
    /// for it: true once the server keeps the heuristic outcome for good, after which the
    /// branches' resource managers may forget them. False (the branches are left to the
    /// server's recovery, which reports them again) on an older session, which gets the
    /// plain notice, and when the server says it is not kept or does not know the field.
    fn complete_kept(
        &mut self,
        xid: &Xid,
        heuristic: HeuristicOutcome,
        trace: Option<&TraceContext>,
    ) -> Result<bool, StoreError> {
        if self.session.version < decree_proto::PROTOCOL_VERSION_TRAILER {
            self.complete(xid, Some(heuristic), trace)?;
            return Ok(false);
        }
        self.check()?;
        let id = self.next_request;
        let start = self.out.len();
        let kept = decree_proto::Field { tag: decree_proto::REPLY_WHEN_KEPT, value: Vec::new() };
        encode_frame_with_fields(&mut self.out, id, &Message::CompleteHeuristic(*xid, heuristic), &[kept]);
        self.add_trace_context(start, trace);
        match self.exchange_raw(id)? {
            Message::OutcomeIs(Outcome::Heuristic) => Ok(true),
            Message::Error { code: ErrorCode::NotKept | ErrorCode::MustUnderstand, message } => {
                tracing::warn!(%xid, %message, "heuristic outcome not kept by the server: its branches are left to recovery");
                Ok(false)
            }
            Message::Error { code, message } => Err(self.server_error(code, message)),
            other => Err(self.break_with(format!("expected OutcomeIs heuristic, got {other:?}"))),
        }
    }

    /// Adds the trace-context field to the frame just encoded at `start`, on a session of
    /// version 3 or later (older servers would refuse the trailer as malformed).
    fn add_trace_context(&mut self, start: usize, trace: Option<&TraceContext>) {
        if let Some(trace) = trace {
            if self.session.version >= decree_proto::PROTOCOL_VERSION_TRAILER {
                decree_proto::append_trace_context(&mut self.out, start, trace);
            }
        }
    }

    fn flush(&mut self) -> Result<(), StoreError> {
        self.check()?;
        if self.out.is_empty() {
            return Ok(());
        }
        let result = self.stream.write_all(&self.out);
        self.out.clear();
        self.completes_buffered = 0;
        self.last_sent = Instant::now();
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

    /// Writes the buffer (ending with request `id`) and reads frames until `id`'s reply;
    /// an `Error` reply is a [`StoreError`].
    fn exchange(&mut self, id: u64) -> Result<Message, StoreError> {
        match self.exchange_raw(id)? {
            Message::Error { code, message } => Err(self.server_error(code, message)),
            m => Ok(m),
        }
    }

    /// Like [`Connection::exchange`], but returns an `Error` reply (with `id` or with
    /// request id 0, about the connection) as a message, for the caller to interpret.
    fn exchange_raw(&mut self, id: u64) -> Result<Message, StoreError> {
        self.next_request += 1;
        self.flush()?;
        self.read_reply(id)
    }

    /// Reads frames until `id`'s reply (an `Error` with `id` or with request id 0 is
    /// returned as a message).
    fn read_reply(&mut self, id: u64) -> Result<Message, StoreError> {
        loop {
            match self.frames.next_message_with_fields() {
                Ok(Some((rid, _, fields))) if !self.fields_understood(&fields) => {
                    let why = format!(
                        "reply to request {rid} carries a field trailer this client cannot read on a version-{} \
                         session: {fields:?}",
                        self.session.version
                    );
                    return Err(self.break_with(why));
                }
                Ok(Some((rid, message, _))) if rid == id => return Ok(message),
                Ok(Some((rid, Message::Error { code, message }, _))) => {
                    // A failed completion (they get no reply on success), or a refusal.
                    tracing::warn!(request = rid, ?code, %message, "state server reported an error");
                    if rid == 0 {
                        return Ok(Message::Error { code, message });
                    }
                }
                Ok(Some((rid, other, _))) => {
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
                Err(e) if self.session.id == 0 => {
                    let why = not_a_decree_server(self.frames.pending_bytes(), &e);
                    return Err(self.break_with(why));
                }
                Err(e) => return Err(self.break_with(format!("bad frame from the server: {e}"))),
            }
        }
    }

    /// Whether a server message's trailer may be acted on: none before version 3, and
    /// from version 3 on no must-understand field (this client knows none).
    fn fields_understood(&self, fields: &[decree_proto::Field]) -> bool {
        fields.is_empty()
            || (self.session.version >= decree_proto::PROTOCOL_VERSION_TRAILER
                && !fields.iter().any(|f| f.must_understand()))
    }

    fn server_error(&mut self, code: ErrorCode, message: String) -> StoreError {
        match code {
            ErrorCode::LogFailed => StoreError::Log(message),
            ErrorCode::WrongSession => {
                StoreError::Malformed(format!("refused by the state server: {message}"))
            }
            // A refused decision: the connection stays open, the decision is not stored.
            ErrorCode::UnknownRm => StoreError::Malformed(format!(
                "decision refused by the state server (unknown resource manager): {message}"
            )),
            ErrorCode::BranchQualifier => StoreError::Malformed(format!(
                "decision refused by the state server (the Xid has a branch qualifier; a decision names \
                 the global transaction): {message}"
            )),
            ErrorCode::DuplicateBranch => StoreError::Malformed(format!(
                "decision refused by the state server (two branches share a branch number): {message}"
            )),
            ErrorCode::NoBranches => StoreError::Malformed(format!(
                "decision refused by the state server (no branches): {message}"
            )),
            ErrorCode::Busy | ErrorCode::ShuttingDown => self.break_with(message),
            ErrorCode::NotAllowed => self.break_with(format!("refused by the state server: {message}")),
            ErrorCode::TlsRequired => self.break_with(format!("refused by the state server: {message}")),
            ErrorCode::NotPrimary => self.break_with(format!("not the primary: {message}")),
            _ => self.break_with(format!("state server error {code:?}: {message}")),
        }
    }

    /// Sends a `Ping` (after any buffered completions) when the server announced an idle
    /// bound and this connection has sent nothing for a third of it, so the server does
    /// not close the session; a broken connection is left for its next user to report.
    fn keep_alive(&mut self) -> Result<(), StoreError> {
        if self.broken.is_some() || self.session.idle_timeout_ms == 0 {
            return Ok(());
        }
        let third = Duration::from_millis(u64::from(self.session.idle_timeout_ms) / 3);
        if self.last_sent.elapsed() < third {
            return Ok(());
        }
        match self.request(&Message::Ping)? {
            Message::Pong => Ok(()),
            other => Err(self.break_with(format!("expected Pong, got {}", other.kind().name()))),
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

/// What to say when the first bytes from an endpoint are no decree frame: another kind of
/// server answered (an HTTP server's "HTTP/1.1" reads as a frame of about 1.2 GB).
fn not_a_decree_server(first: &[u8], error: &decree_proto::ProtoError) -> String {
    let shown: String = first
        .iter()
        .take(16)
        .map(|&b| if b.is_ascii_graphic() || b == b' ' { b as char } else { '.' })
        .collect();
    format!(
        "this endpoint did not answer as a decree state server (its first bytes read {shown:?}: {error}); \
         check the address and port"
    )
}

/// The addresses of a state server, or of the two members of a pair (in the order given;
/// the one that answered last is tried first), and the opening of a session on whichever
/// serves: a pair's backup answers `NotPrimary` and the next address is tried.
#[derive(Debug)]
struct Addresses {
    endpoints: Vec<Endpoint>,
    preferred: std::sync::atomic::AtomicUsize,
}

impl Addresses {
    fn new(endpoints: Vec<Endpoint>) -> Result<Addresses, StoreError> {
        if endpoints.is_empty() {
            return Err(StoreError::Unreachable("no address to connect to".into()));
        }
        Ok(Addresses { endpoints, preferred: std::sync::atomic::AtomicUsize::new(0) })
    }

    /// The address that answered last.
    fn preferred(&self) -> &Endpoint {
        &self.endpoints[self.preferred.load(std::sync::atomic::Ordering::Relaxed) % self.endpoints.len()]
    }

    /// A session on the first address that serves, starting with the preferred one; the
    /// error names every address and why it did not serve.
    fn open(&self, options: &ClientOptions) -> Result<Connection, StoreError> {
        use std::sync::atomic::Ordering;
        let start = self.preferred.load(Ordering::Relaxed);
        let mut failures = Vec::new();
        for i in 0..self.endpoints.len() {
            let index = (start + i) % self.endpoints.len();
            match Connection::open(&self.endpoints[index], options) {
                Ok(conn) => {
                    self.preferred.store(index, Ordering::Relaxed);
                    return Ok(conn);
                }
                // Refused as a pair's backup, or unreachable: the next address may serve.
                Err(StoreError::Unreachable(why)) if self.endpoints.len() > 1 => failures.push(why),
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::Unreachable(failures.join("; ")))
    }
}

/// A [`DecisionStore`] backed by a decree state server.
pub struct RemoteDecisions {
    addresses: Addresses,
    options: ClientOptions,
    node: u32,
    incarnation: u64,
    control: Arc<Mutex<Connection>>,
    sessions: Arc<RwLock<HashMap<u64, Arc<Mutex<Connection>>>>>,
    /// Pings idle connections when the server announced an idle bound; `None` otherwise.
    keep_alive: Option<KeepAlive>,
}

/// Shortest pause between two rounds of the keep-alive thread, whatever a server announces.
const KEEP_ALIVE_TICK_MIN: Duration = Duration::from_millis(10);

/// The keep-alive thread of a [`RemoteDecisions`]; dropping it stops and joins the thread.
struct KeepAlive {
    /// Dropped to stop the thread (which wakes at once: it waits on this channel).
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl KeepAlive {
    /// Starts the thread when `idle_timeout_ms` is not 0. It wakes every sixth of the bound
    /// and pings the connections quiet for a third of it, so a session is pinged at most
    /// half the bound after its last request: the other half is the margin for the round
    /// trip and a busy machine.
    fn start(
        idle_timeout_ms: u32,
        control: Arc<Mutex<Connection>>,
        sessions: Arc<RwLock<HashMap<u64, Arc<Mutex<Connection>>>>>,
    ) -> Option<KeepAlive> {
        if idle_timeout_ms == 0 {
            return None;
        }
        let tick = Duration::from_millis(u64::from(idle_timeout_ms) / 6).max(KEEP_ALIVE_TICK_MIN);
        let (stop, stopped) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("decree-keepalive".into())
            .spawn(move || keep_alive(&control, &sessions, tick, &stopped));
        match thread {
            Ok(thread) => Some(KeepAlive { stop: Some(stop), thread: Some(thread) }),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the keep-alive thread: idle sessions may be closed by the server");
                None
            }
        }
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The keep-alive loop: every `tick` until `stopped` says so (its sender is dropped), pings
/// the control connection and every session connection that has been quiet too long. The
/// map's lock is held only to copy the list of connections, never across IO.
fn keep_alive(
    control: &Mutex<Connection>,
    sessions: &RwLock<HashMap<u64, Arc<Mutex<Connection>>>>,
    tick: Duration,
    stopped: &mpsc::Receiver<()>,
) {
    let mut snapshot: Vec<Arc<Mutex<Connection>>> = Vec::new();
    while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(tick) {
        ping_if_idle(control);
        snapshot.extend(sessions.read().values().cloned());
        for conn in snapshot.drain(..) {
            ping_if_idle(&conn);
        }
    }
}

/// Pings `conn` if it is idle; a connection someone holds is in use, hence not idle, and
/// is skipped rather than waited for.
fn ping_if_idle(conn: &Mutex<Connection>) {
    let Some(mut conn) = conn.try_lock() else { return };
    if let Err(e) = conn.keep_alive() {
        tracing::debug!(error = %e, "keep-alive ping failed");
    }
}

impl RemoteDecisions {
    /// Connects to `unix:/path`, `tcp:host:port` or `tls:host:port` with default options;
    /// a comma-separated list names the members of a pair (whichever serves is used).
    pub fn connect(endpoints: &str) -> Result<Self, StoreError> {
        let list = endpoints.split(',').map(|e| e.trim().parse()).collect::<Result<Vec<Endpoint>, _>>()?;
        Self::connect_any(list, ClientOptions::default())
    }

    /// Connects with explicit options.
    pub fn connect_with(endpoint: Endpoint, options: ClientOptions) -> Result<Self, StoreError> {
        Self::connect_any(vec![endpoint], options)
    }

    /// Connects to whichever of `endpoints` serves (a pair's primary), with explicit
    /// options; later connections try the one that served first.
    pub fn connect_any(endpoints: Vec<Endpoint>, options: ClientOptions) -> Result<Self, StoreError> {
        let addresses = Addresses::new(endpoints)?;
        let control = addresses.open(&options)?;
        let Session { node, incarnation, idle_timeout_ms, .. } = control.session;
        let control = Arc::new(Mutex::new(control));
        let sessions = Arc::new(RwLock::new(HashMap::new()));
        let keep_alive = KeepAlive::start(idle_timeout_ms, control.clone(), sessions.clone());
        Ok(RemoteDecisions { addresses, options, node, incarnation, control, sessions, keep_alive })
    }

    /// What became of `xid`: committed, in progress, rolled back, heuristic (a branch
    /// decided on its own) or unknown (the server cannot prove any of the others); see the
    /// rules in docs/protocol.md. The same answers on a version-1 server, which sends
    /// unknown and heuristic as errors 15 and 16.
    pub fn outcome(&self, xid: &Xid) -> Result<Outcome, StoreError> {
        self.with_control(|c| c.outcome(xid))
    }

    /// The protocol version of the control connection (1 or 2).
    pub fn protocol_version(&self) -> u8 {
        self.control.lock().session.version
    }

    /// How long the server lets the control connection's session be silent before it
    /// closes it (`None`: forever), as negotiated in its hello. When it is set, this
    /// store's keep-alive thread pings idle connections (see the crate documentation).
    pub fn idle_timeout(&self) -> Option<Duration> {
        match self.control.lock().session.idle_timeout_ms {
            0 => None,
            ms => Some(Duration::from_millis(ms.into())),
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
        self.with_control(|c| c.request(message))
    }

    /// Runs an idempotent exchange on the control connection, once more on a fresh
    /// connection when the old one turns out to be dead.
    fn with_control<T>(&self, f: impl Fn(&mut Connection) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let first = f(&mut self.control()); // The guard is dropped here.
        match first {
            Err(StoreError::Unreachable(_)) => f(&mut self.control()),
            other => other,
        }
    }

    /// The control connection, opened again if it broke: asking an outcome after the
    /// server restarted is exactly when it is needed.
    fn control(&self) -> parking_lot::MutexGuard<'_, Connection> {
        let mut control = self.control.lock();
        if control.broken.is_some() {
            match self.addresses.open(&self.options) {
                Ok(fresh) => *control = fresh,
                Err(e) => tracing::debug!(error = %e, "control connection not reopened"),
            }
        }
        control
    }

    /// The endpoint this store talks to (of a list, the one that served last).
    pub fn endpoint(&self) -> &Endpoint {
        self.addresses.preferred()
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
        let conn = self.addresses.open(&self.options)?;
        if conn.session.incarnation != self.incarnation || conn.session.node != self.node {
            return Err(StoreError::Unreachable(format!(
                "the state server restarted, or another member of its pair leads now (node {} incarnation {}, \
                 this store has node {} incarnation {}): connect again",
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
        self.decide_traced(decision, None)
    }

    fn complete(&self, xid: &Xid) -> Result<(), StoreError> {
        self.complete_with(xid, None, None)
    }

    fn complete_heuristic(&self, xid: &Xid, outcome: HeuristicOutcome) -> Result<(), StoreError> {
        self.complete_with(xid, Some(outcome), None)
    }

    fn one_phase(&self, xid: &Xid) -> Result<bool, StoreError> {
        self.one_phase_traced(xid, None)
    }

    fn decide_traced(&self, decision: &Decision, trace: Option<&TraceContext>) -> Result<(), StoreError> {
        // Refused here, before anything is sent: the frame could only carry it truncated.
        decision.check_limits()?;
        let conn = self.session_of(&decision.xid)?;
        let mut conn = conn.lock();
        conn.decide(decision, trace)
    }

    fn complete_traced(
        &self,
        xid: &Xid,
        heuristic: Option<HeuristicOutcome>,
        trace: Option<&TraceContext>,
    ) -> Result<(), StoreError> {
        self.complete_with(xid, heuristic, trace)
    }

    fn complete_heuristic_kept(
        &self,
        xid: &Xid,
        outcome: HeuristicOutcome,
        trace: Option<&TraceContext>,
    ) -> Result<bool, StoreError> {
        match self.session_of(xid) {
            Ok(conn) => conn.lock().complete_kept(xid, outcome, trace),
            // The session is gone, and with it whatever the server would have kept for it.
            Err(_) => Ok(false),
        }
    }

    fn one_phase_traced(&self, xid: &Xid, trace: Option<&TraceContext>) -> Result<bool, StoreError> {
        let conn = self.session_of(xid).map_err(|e| StoreError::NotSent(e.to_string()))?;
        let mut conn = conn.lock();
        conn.one_phase(xid, trace)
    }
}

impl RemoteDecisions {
    /// A completion, buffered on the connection of the session that decided `xid`.
    fn complete_with(
        &self,
        xid: &Xid,
        heuristic: Option<HeuristicOutcome>,
        trace: Option<&TraceContext>,
    ) -> Result<(), StoreError> {
        match self.session_of(xid) {
            Ok(conn) => conn.lock().complete(xid, heuristic, trace),
            // The session is gone: the server finishes its decisions itself and ignores a
            // completion from any other session, so there is nobody to tell.
            Err(_) => Ok(()),
        }
    }
}

impl Drop for RemoteDecisions {
    fn drop(&mut self) {
        // The keep-alive first, so that no ping races the closes below.
        drop(self.keep_alive.take());
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
    use decree_core::{BranchRecord, Origin};
    use std::os::unix::net::UnixListener;
    use std::time::Instant;

    /// How the scripted server answers a `Hello`.
    #[derive(Clone, Copy)]
    enum Greets {
        /// Negotiates among these versions, like a version-2 server.
        Speaks(&'static [u8]),
        /// Answers a plain `HelloOk` even to a list (a version-1 server that ignores it).
        Plain,
        /// Refuses a list as malformed and closes (a server older than version 2).
        RefusesList,
        /// Names a version the client did not offer.
        Chooses(u8),
    }

    /// A scripted state server on a Unix socket: node 1, incarnation 7; `Outcome` answers
    /// from the Xid's sequence (1 committed, 2 in progress, 3 rolled back, 4 unknown,
    /// 5 heuristic); `Decide` refuses no branches (14) and the RM "nope" (11). Records
    /// (session version, message) for every message it receives.
    struct Fake {
        endpoint: Endpoint,
        path: PathBuf,
        seen: Arc<Mutex<Vec<(u8, Message)>>>,
        /// The session of every `Ping` received, in order.
        pinged: Arc<Mutex<Vec<u64>>>,
    }

    impl Fake {
        fn start(name: &str, greets: Greets) -> Fake {
            Self::start_with_idle(name, greets, 0)
        }

        /// A fake that announces `idle_timeout_ms` to negotiating clients (it closes
        /// nothing itself).
        fn start_with_idle(name: &str, greets: Greets, idle_timeout_ms: u32) -> Fake {
            let path = std::env::temp_dir().join(format!("decree-client-{name}-{}.sock", std::process::id()));
            let _ = std::fs::remove_file(&path);
            let listener = UnixListener::bind(&path).unwrap();
            let seen = Arc::new(Mutex::new(Vec::new()));
            let pinged = Arc::new(Mutex::new(Vec::new()));
            let (record, pings) = (seen.clone(), pinged.clone());
            std::thread::spawn(move || {
                for (n, stream) in listener.incoming().enumerate() {
                    let Ok(stream) = stream else { return };
                    let script = Script { greets, session: n as u64 + 1, idle_timeout_ms };
                    let (record, pings) = (record.clone(), pings.clone());
                    std::thread::spawn(move || serve(stream, script, record, pings));
                }
            });
            Fake { endpoint: Endpoint::Unix(path.clone()), path, seen, pinged }
        }

        fn connect(&self) -> Result<RemoteDecisions, StoreError> {
            RemoteDecisions::connect_with(self.endpoint.clone(), ClientOptions::default())
        }

        /// Waits until the server has seen a message `pick` accepts.
        fn wait_for(&self, pick: impl Fn(&(u8, Message)) -> bool) -> (u8, Message) {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if let Some(m) = self.seen.lock().iter().find(|m| pick(m)) {
                    return m.clone();
                }
                assert!(Instant::now() < deadline, "the server never saw it: {:?}", self.seen.lock());
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.path);
        }
    }

    /// What one connection of a [`Fake`] says about itself.
    #[derive(Clone, Copy)]
    struct Script {
        greets: Greets,
        session: u64,
        idle_timeout_ms: u32,
    }

    fn serve(
        mut stream: UnixStream,
        script: Script,
        seen: Arc<Mutex<Vec<(u8, Message)>>>,
        pinged: Arc<Mutex<Vec<u64>>>,
    ) {
        let Script { greets, session, idle_timeout_ms } = script;
        let mut frames = FrameBuffer::new(decree_proto::FRAME_BYTES_MAX);
        let mut version = 1;
        loop {
            let (id, message) = match frames.next_message() {
                Ok(Some(m)) => m,
                Ok(None) => match stream.read(frames.read_space()) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        frames.commit(n);
                        continue;
                    }
                },
                Err(e) => panic!("the client sent a bad frame: {e}"),
            };
            seen.lock().push((version, message.clone()));
            let error = |code, message: &str| Message::Error { code, message: message.into() };
            let (reply, close) = match message {
                Message::Hello { versions, .. } => {
                    let negotiated = match greets {
                        _ if versions.is_empty() => None,
                        Greets::Plain => None,
                        Greets::RefusesList => {
                            let mut out = Vec::new();
                            encode_frame(&mut out, 0, &error(ErrorCode::Malformed, "malformed Hello body"));
                            let _ = stream.write_all(&out);
                            return;
                        }
                        Greets::Chooses(v) => Some(v),
                        Greets::Speaks(ours) => ours.iter().rev().copied().find(|v| versions.contains(v)),
                    };
                    match (versions.is_empty() || matches!(greets, Greets::Plain), negotiated) {
                        (false, None) => (error(ErrorCode::Version, "this server speaks [1]"), true),
                        (_, negotiated) => {
                            version = negotiated.unwrap_or(1);
                            let hello_ok = Message::HelloOk {
                                node: 1,
                                incarnation: 7,
                                session,
                                frame_bytes_max: 65536,
                                inflight_max: 64,
                                negotiated: negotiated.map(|version| Negotiated { version, idle_timeout_ms }),
                            };
                            (hello_ok, false)
                        }
                    }
                }
                Message::Decide(d) if d.branches.is_empty() => {
                    (error(ErrorCode::NoBranches, "no branch"), false)
                }
                Message::Decide(d) if d.branches.iter().any(|b| b.rm == "nope") => {
                    (error(ErrorCode::UnknownRm, "no resource manager \"nope\""), false)
                }
                Message::Decide(d) if d.branches.iter().any(|b| b.rm == "silent") => continue,
                Message::Decide(_) => (Message::DecideOk, false),
                Message::Outcome(xid) => {
                    let outcome = match xid.origin().unwrap().sequence {
                        1 => Outcome::Committed,
                        2 => Outcome::InProgress,
                        3 => Outcome::RolledBack,
                        4 => Outcome::Unknown,
                        _ => Outcome::Heuristic,
                    };
                    (decree_proto::outcome_reply(outcome, version), false)
                }
                Message::Ping => {
                    pinged.lock().push(session);
                    (Message::Pong, false)
                }
                Message::Complete(_) => continue,
                Message::CompleteHeuristic(..) if version >= 2 => continue,
                other => (error(ErrorCode::Protocol, other.kind().name()), true),
            };
            let mut out = Vec::new();
            encode_frame(&mut out, id, &reply);
            if stream.write_all(&out).is_err() || close {
                return;
            }
        }
    }

    fn xid(session: u64, sequence: u64) -> Xid {
        Xid::decree(Origin { node: 1, incarnation: 7, session, sequence })
    }

    fn decision(xid: Xid, rms: &[&str]) -> Decision {
        let branches = rms
            .iter()
            .enumerate()
            .map(|(i, rm)| BranchRecord { rm: rm.to_string(), branch: i as u16 })
            .collect();
        Decision { xid, branches }
    }

    /// Asks every outcome and checks the answers are the same whatever the version.
    fn every_outcome_reads_the_same(store: &RemoteDecisions) {
        let want = [
            Outcome::Committed,
            Outcome::InProgress,
            Outcome::RolledBack,
            Outcome::Unknown,
            Outcome::Heuristic,
        ];
        for (sequence, o) in (1..).zip(want) {
            assert_eq!(store.outcome(&xid(99, sequence)).unwrap(), o, "sequence {sequence}");
        }
        store.ping().unwrap(); // The control connection is still open.
    }

    #[test]
    fn a_version_2_server_negotiates_2_and_gets_heuristic_completions() {
        let fake = Fake::start("v2", Greets::Speaks(&[1, 2]));
        let store = fake.connect().unwrap();
        assert_eq!(store.protocol_version(), 2);
        assert_eq!(store.idle_timeout(), None);
        let (_, hello) = fake.wait_for(|(_, m)| matches!(m, Message::Hello { .. }));
        assert!(
            matches!(hello, Message::Hello { versions, .. } if versions == decree_proto::PROTOCOL_VERSIONS)
        );
        every_outcome_reads_the_same(&store);
        let session = store.open_session().unwrap();
        store.decide(&decision(xid(session, 1), &["pg-a", "pg-b"])).unwrap();
        store.complete_heuristic(&xid(session, 1), HeuristicOutcome::Mixed).unwrap();
        store.close_session(session);
        let (version, _) = fake
            .wait_for(|(_, m)| *m == Message::CompleteHeuristic(xid(session, 1), HeuristicOutcome::Mixed));
        assert_eq!(version, 2);
    }

    #[test]
    fn a_version_1_server_gets_the_same_answers_and_plain_completions() {
        for (name, greets) in [("v1-plain", Greets::Plain), ("v1-list", Greets::Speaks(&[1]))] {
            let fake = Fake::start(name, greets);
            let store = fake.connect().unwrap();
            assert_eq!(store.protocol_version(), 1, "{name}");
            every_outcome_reads_the_same(&store);
            let session = store.open_session().unwrap();
            store.decide(&decision(xid(session, 1), &["pg-a"])).unwrap();
            store.complete_heuristic(&xid(session, 1), HeuristicOutcome::Committed).unwrap();
            store.close_session(session);
            fake.wait_for(|(_, m)| *m == Message::Complete(xid(session, 1)));
            assert!(!fake.seen.lock().iter().any(|(_, m)| matches!(m, Message::CompleteHeuristic(..))));
        }
    }

    #[test]
    fn a_server_older_than_version_2_gets_a_plain_hello() {
        let fake = Fake::start("old", Greets::RefusesList);
        let store = fake.connect().unwrap();
        assert_eq!(store.protocol_version(), 1);
        let hellos: Vec<Vec<u8>> = fake
            .seen
            .lock()
            .iter()
            .filter_map(|(_, m)| match m {
                Message::Hello { versions, .. } => Some(versions.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(hellos, vec![decree_proto::PROTOCOL_VERSIONS.to_vec(), vec![]]);
        every_outcome_reads_the_same(&store);
    }

    #[test]
    fn a_version_the_client_did_not_offer_or_none_in_common_is_refused() {
        let fake = Fake::start("v9", Greets::Chooses(9));
        match fake.connect() {
            Err(StoreError::Unreachable(why)) => assert!(why.contains("version 9"), "{why}"),
            other => panic!("expected Unreachable, got {:?}", other.map(|_| ())),
        }
        let fake = Fake::start("v4", Greets::Speaks(&[4]));
        match fake.connect() {
            Err(StoreError::Unreachable(why)) => assert!(why.contains("speaks [1]"), "{why}"),
            other => panic!("expected Unreachable, got {:?}", other.map(|_| ())),
        }
    }

    /// The reply wait on a Unix socket is a poll(2) with the reply timeout: a server that
    /// never answers gives an error after it, not a thread blocked for good.
    #[test]
    fn a_decide_the_server_never_answers_fails_after_the_reply_timeout() {
        let fake = Fake::start("silent", Greets::Speaks(&[1, 2]));
        let options = ClientOptions { reply_timeout: Some(Duration::from_millis(300)), ..Default::default() };
        let store = RemoteDecisions::connect_with(fake.endpoint.clone(), options).unwrap();
        let session = store.open_session().unwrap();
        let started = Instant::now();
        match store.decide(&decision(xid(session, 1), &["silent"])) {
            Err(e) => assert!(e.to_string().contains("no reply"), "{e}"),
            Ok(()) => panic!("a decide nobody answered succeeded"),
        }
        assert!(started.elapsed() >= Duration::from_millis(300), "it waited for the timeout");
    }

    #[test]
    fn refused_decisions_name_the_problem_and_keep_the_session() {
        let fake = Fake::start("refuse", Greets::Speaks(&[1, 2]));
        let store = fake.connect().unwrap();
        let session = store.open_session().unwrap();
        match store.decide(&decision(xid(session, 1), &["pg-a", "nope"])) {
            Err(StoreError::Malformed(why)) => assert!(why.contains("unknown resource manager"), "{why}"),
            other => panic!("expected Malformed, got {other:?}"),
        }
        match store.decide(&decision(xid(session, 2), &[])) {
            Err(StoreError::Malformed(why)) => assert!(why.contains("no branches"), "{why}"),
            other => panic!("expected Malformed, got {other:?}"),
        }
        store.decide(&decision(xid(session, 3), &["pg-a"])).unwrap();
        store.close_session(session);
    }

    #[test]
    fn idle_connections_are_pinged_when_the_server_announces_an_idle_bound() {
        let fake = Fake::start_with_idle("idle", Greets::Speaks(&[1, 2]), 150);
        let store = fake.connect().unwrap();
        assert_eq!(store.idle_timeout(), Some(Duration::from_millis(150)));
        let session = store.open_session().unwrap();
        let control = 1; // The fake numbers connections from 1: the control connection.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let pinged = fake.pinged.lock().clone();
            let count = |s: u64| pinged.iter().filter(|&&p| p == s).count();
            if count(control) >= 2 && count(session) >= 2 {
                break;
            }
            assert!(Instant::now() < deadline, "idle connections were not pinged: {pinged:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
        // A connection in use is still usable between pings, and dropping the store stops
        // the thread (the drop returns).
        store.decide(&decision(xid(session, 1), &["pg-a"])).unwrap();
        drop(store);
    }

    #[test]
    fn without_an_idle_bound_nothing_is_pinged() {
        let fake = Fake::start("no-idle", Greets::Speaks(&[1, 2]));
        let store = fake.connect().unwrap();
        assert_eq!(store.idle_timeout(), None);
        let _session = store.open_session().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        assert!(fake.pinged.lock().is_empty(), "pinged {:?}", fake.pinged.lock());
    }

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

    /// Issue 31, item 6: an endpoint that is another kind of server (here an HTTP one) was
    /// reported as "frame of 1213486160 bytes exceeds the limit".
    #[test]
    fn an_endpoint_that_is_not_a_decree_server_is_named_so() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let _ = conn.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
            std::thread::sleep(Duration::from_millis(100));
        });
        match RemoteDecisions::connect(&format!("tcp:127.0.0.1:{port}")) {
            Err(StoreError::Unreachable(why)) => {
                assert!(why.contains("did not answer as a decree state server"), "{why}");
                assert!(why.contains("HTTP/1.1 400"), "{why}");
            }
            Err(e) => panic!("expected Unreachable, got {e}"),
            Ok(_) => panic!("an HTTP server is no decree server"),
        }
        server.join().unwrap();
    }
}
