//! One client connection: one session, a reader that handles requests in order and a
//! writer that sends responses as they become ready (possibly out of order).
//!
//! Every response in flight holds a permit of the connection's semaphore (and a decide
//! one of the server-wide semaphore too), so the response channel can never hold more
//! than `inflight_per_connection_max` messages and a client that pipelines too much is
//! simply not read until a permit frees (backpressure, no unbounded queue). The writer
//! ends only when every sender is gone, including those held by decide callbacks, so once
//! it has ended no decision of this session can still become durable: only then are the
//! session's decided transactions handed to the recovery worker.
//!
//! Two bounds free the connection slot of a peer that says nothing: a connection must
//! deliver a complete `Hello` within `handshake_timeout_ms` of its accept (however slowly
//! it trickles bytes), and, when `idle_timeout_ms` is set, a session is closed once it has
//! sent no request for that long with none in flight (a decide waiting on the log keeps
//! its session alive, and the bound restarts when the last answer leaves).
//!
//! A session the server closes itself (an idle timeout, a protocol error) is read to its
//! end before it is closed in the state, for at most `close_drain_ms`: a `OnePhase` the
//! client wrote just before may be unread, and "rolled back" may be answered for the
//! session's undecided Xids only once every notice it sent has been seen
//! (docs/protocol.md, session rule 9).

use crate::crash_points::{self, CrashPoint};
use crate::pair::Acknowledged;
use crate::rules;
use crate::state::{SessionTxns, State};
use crate::trace;
use decree_core::{Decision, HeuristicOutcome, Outcome, TraceContext, Xid};
use decree_proto::{encode_frame, ErrorCode, Field, FrameBuffer, Message, Negotiated, REPLY_WHEN_KEPT};
use opentelemetry::trace::Span;
use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::Span as SdkSpan;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant as TokioInstant;

/// Bytes of responses coalesced into one write.
const WRITE_BATCH_BYTES_MAX: usize = 64 << 10;

/// A response on its way to the writer, with the permits it holds.
struct Response {
    request_id: u64,
    message: Message,
    /// Close the connection after sending this one.
    close: bool,
    _connection_permit: OwnedSemaphorePermit,
    _total_permit: Option<OwnedSemaphorePermit>,
}

/// What the reader does after a request.
enum Next {
    Continue,
    Close,
}

/// How the reader's loop ended, which decides what the session's close may claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// The client closed its end (or reset it): every byte it sent before was read.
    PeerClosed,
    /// The server is stopping: its next start is a new incarnation.
    Shutdown,
    /// The server closed the session itself; `framed` says whether the bytes that follow
    /// can still be cut into frames (not after a malformed one).
    ServerClosed { framed: bool },
}

/// Why the server closes a connection that stayed silent.
enum Expiry {
    /// No complete `Hello` within `handshake_timeout_ms` of the accept.
    Handshake,
    /// No request, and none in flight, for `idle_timeout_ms`.
    Idle,
}

/// Where a connection comes from: when it was accepted (the handshake bound counts from
/// there, a TLS handshake included) and, on a TLS listener, who its certificate names.
pub(crate) struct Peer {
    /// When the listener accepted the connection.
    pub accepted: TokioInstant,
    /// The name of the client's certificate; `None` on a plaintext listener.
    pub name: Option<String>,
}

impl Peer {
    /// A connection accepted now, without a certificate.
    pub fn plaintext() -> Peer {
        Peer { accepted: TokioInstant::now(), name: None }
    }
}

/// The reader's view of its connection.
struct Conn {
    state: Arc<State>,
    total: Arc<Semaphore>,
    permits: Arc<Semaphore>,
    /// The permits `permits` started with: all of them free means nothing is in flight.
    inflight_max: u32,
    responses: mpsc::Sender<Response>,
    session: Option<(u64, Arc<SessionTxns>)>,
    /// The protocol version agreed in the hello (1 for a client that offered none).
    version: u8,
    /// The certificate name of a TLS client, logged with its session.
    peer_name: Option<String>,
}

/// Serves one connection until the peer closes it, a protocol error, or shutdown.
pub(crate) async fn serve<R, W>(
    mut reader: R,
    writer: W,
    state: Arc<State>,
    total: Arc<Semaphore>,
    mut shutdown: watch::Receiver<bool>,
    peer: Peer,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let accepted = peer.accepted;
    let inflight_max = state.limits.inflight_per_connection_max;
    let (tx, rx) = mpsc::channel(inflight_max as usize);
    let writer_task = tokio::spawn(write_responses(writer, rx, state.fence().cloned()));
    let mut conn = Conn {
        state: state.clone(),
        total,
        permits: Arc::new(Semaphore::new(inflight_max as usize)),
        inflight_max,
        responses: tx,
        session: None,
        version: 1,
        peer_name: peer.name,
    };
    let mut frames = FrameBuffer::new(state.limits.frame_bytes_max as usize);
    let mut last_request = accepted;
    let ending = 'read: loop {
        loop {
            match frames.next_message_with_fields() {
                Ok(Some((id, message, fields))) => {
                    last_request = TokioInstant::now();
                    if let Next::Close = conn.handle_with_fields(id, message, &fields).await {
                        break 'read Ending::ServerClosed { framed: true };
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "closing a connection after a bad frame");
                    conn.fail(0, e.code(), e.to_string()).await;
                    break 'read Ending::ServerClosed { framed: false };
                }
            }
        }
        let space = frames.read_space();
        // Biased: shutdown first, and bytes already received before a bound that expired
        // at the same moment (a request that arrived in time is served).
        tokio::select! {
            biased;
            _ = shutdown.changed() => break 'read Ending::Shutdown,
            read = reader.read(space) => match read {
                Ok(0) => break 'read Ending::PeerClosed,
                Ok(n) => frames.commit(n),
                // A reset (or a TLS stream cut without its close alert) comes after every
                // byte sent before it: the session ends like a close. Any other error (a
                // TLS record that does not decrypt) may hide a notice: nothing is proven.
                Err(e) if peer_gone(&e) => break 'read Ending::PeerClosed,
                Err(_) => break 'read Ending::ServerClosed { framed: false },
            },
            expiry = conn.expiry(accepted, last_request) => {
                conn.expired(expiry);
                break 'read Ending::ServerClosed { framed: true };
            }
        }
    };
    let session = conn.session.take();
    let version = conn.version;
    drop(conn); // Drops the reader's sender: the writer ends once in-flight requests settle.
    let _ = writer_task.await; // Its end shuts the sending side down: the client sees it.
    if let Some((id, txns)) = session {
        if let Ending::ServerClosed { framed } = ending {
            let drained = framed && drain(&mut reader, &mut frames, &state, id, &txns, version).await;
            if !drained {
                state.closed_unread(&txns);
                state.metrics.sessions_closed_unread.fetch_add(1, Ordering::Relaxed);
                tracing::info!(session = id, "closed a session that did not close its end in time: its undecided transactions are answered unknown");
            }
        }
        state.close_session(id, &txns);
    }
}

/// Whether a read error only says that the peer went away (after everything it sent).
fn peer_gone(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
    matches!(e.kind(), ConnectionReset | ConnectionAborted | UnexpectedEof | BrokenPipe)
}

/// Reads a session the server has closed until the client closes its end, for at most
/// `close_drain_ms`, acting on `OnePhase` and `Complete` only (nothing else can be
/// answered any more); returns whether the end was reached, i.e. every notice was seen.
async fn drain<R: AsyncRead + Unpin>(
    reader: &mut R,
    frames: &mut FrameBuffer,
    state: &State,
    session: u64,
    txns: &SessionTxns,
    version: u8,
) -> bool {
    let deadline = TokioInstant::now() + state.limits.close_drain();
    loop {
        loop {
            match frames.next_message_with_fields() {
                Ok(Some((_, Message::OnePhase(xid), _)))
                    if version >= decree_proto::PROTOCOL_VERSION_TRAILER =>
                {
                    state.mark_one_phase(&xid, session, txns);
                }
                Ok(Some((_, Message::Complete(xid), _))) => {
                    state.complete_own(&xid, session, txns, None);
                }
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => return false,
            }
        }
        match tokio::time::timeout_at(deadline, reader.read(frames.read_space())).await {
            Err(_) => return false,
            Ok(Ok(0)) => return true,
            Ok(Err(e)) => return peer_gone(&e),
            Ok(Ok(n)) => frames.commit(n),
        }
    }
}

impl Conn {
    /// Handles one request and its version-3 field trailer: bytes after the body are
    /// malformed on an older session, and an unknown must-understand field refuses the
    /// request before anything of it is acted on.
    async fn handle_with_fields(&mut self, id: u64, message: Message, fields: &[Field]) -> Next {
        if fields.is_empty() {
            return self.handle(id, message, None).await;
        }
        let kind = message.kind().name();
        if self.version < decree_proto::PROTOCOL_VERSION_TRAILER {
            let why = format!("malformed {kind} body: bytes after the body (a field trailer needs protocol version 3, this session speaks {})", self.version);
            return self.fail(id, ErrorCode::Malformed, why).await;
        }
        let kept_reply = decree_proto::asks_reply_when_kept(message.kind(), fields);
        // The one must-understand field known here is the kept reply, on `CompleteHeuristic`.
        if let Some(f) =
            fields.iter().find(|f| f.must_understand() && !(kept_reply && f.tag == REPLY_WHEN_KEPT))
        {
            let why = format!("unknown must-understand field 0x{:04x} in {kind}", f.tag);
            return self.reply(id, Message::Error { code: ErrorCode::MustUnderstand, message: why }).await;
        }
        // The trace context is read only when spans are on; otherwise it is skipped.
        let client = self.state.trace.as_ref().and_then(|_| decree_proto::trace_context(fields));
        match (message, self.session.clone()) {
            (Message::CompleteHeuristic(xid, outcome), Some((session, txns))) if kept_reply => {
                self.complete_kept(id, &xid, session, &txns, outcome, client.as_ref()).await
            }
            (message, _) => self.handle(id, message, client.as_ref()).await,
        }
    }

    /// Handles one request (`client`: the trace context it carried, when spans are on); the
    /// response goes to the writer.
    async fn handle(&mut self, id: u64, message: Message, client: Option<&TraceContext>) -> Next {
        let Some((session, txns)) = self.session.clone() else {
            return match message {
                Message::Hello { node_expected, client, versions } => {
                    self.hello(id, node_expected, &client, &versions).await
                }
                other => {
                    let why = format!("{} before Hello", other.kind().name());
                    self.fail(id, ErrorCode::Protocol, why).await
                }
            };
        };
        match message {
            Message::Decide(decision) => self.decide(id, session, txns, decision, client).await,
            Message::Complete(xid) => self.complete(&xid, session, &txns, None, client, None),
            Message::CompleteHeuristic(xid, outcome) if self.version >= 2 => {
                self.complete(&xid, session, &txns, Some(outcome), client, None)
            }
            Message::OnePhase(xid) if self.version >= decree_proto::PROTOCOL_VERSION_TRAILER => {
                let span =
                    self.state.trace.as_ref().map(|t| t.request("decree.server.one_phase", &xid, client));
                let scope = span.as_ref().map(trace::span_log_scope);
                let _entered = scope.as_ref().map(tracing::Span::enter);
                self.state.metrics.one_phase_notices.fetch_add(1, Ordering::Relaxed);
                if !self.state.mark_one_phase(&xid, session, &txns) {
                    tracing::debug!(%xid, session, "ignored a OnePhase for a transaction of another session");
                }
                if let Some(span) = span {
                    trace::end(span, None);
                }
                Next::Continue
            }
            Message::Outcome(xid) => {
                let span =
                    self.state.trace.as_ref().map(|t| t.request("decree.server.outcome", &xid, client));
                let scope = span.as_ref().map(trace::span_log_scope);
                let outcome = trace::within(scope.as_ref(), || {
                    let outcome = self.state.outcome(&xid);
                    self.state.outcome_asked(&xid, outcome);
                    outcome
                });
                if let Some(mut span) = span {
                    span.set_attribute(KeyValue::new("decree.outcome", format!("{outcome:?}")));
                    trace::end(span, None);
                }
                self.reply(id, decree_proto::outcome_reply(outcome, self.version)).await
            }
            Message::Ping => self.reply(id, Message::Pong).await,
            other => {
                let why = format!("{} is not a request a client may send here", other.kind().name());
                self.fail(id, ErrorCode::Protocol, why).await
            }
        }
    }

    async fn hello(&mut self, id: u64, node_expected: u32, client: &str, versions: &[u8]) -> Next {
        let state = self.state.clone();
        if node_expected != 0 && node_expected != state.node {
            let why = format!("this server is node {}, the client expected node {node_expected}", state.node);
            return self.fail(id, ErrorCode::NodeMismatch, why).await;
        }
        let negotiated = if versions.is_empty() {
            None
        } else {
            let Some(version) = decree_proto::choose_version(versions) else {
                let why = format!(
                    "the client speaks protocol versions {versions:?}, this server speaks {:?}",
                    decree_proto::PROTOCOL_VERSIONS
                );
                return self.fail(id, ErrorCode::Version, why).await;
            };
            self.version = version;
            // Version-1 clients are not told, yet the bound applies to them too: the
            // operator opted in (see the config module).
            Some(Negotiated { version, idle_timeout_ms: state.limits.idle_timeout_ms })
        };
        let (session, txns) = state.open_session();
        match &self.peer_name {
            Some(peer) => tracing::info!(session, client, peer, version = self.version, "TLS session opened"),
            None => tracing::debug!(session, client, version = self.version, "session opened"),
        }
        self.session = Some((session, txns));
        let hello_ok = Message::HelloOk {
            node: state.node,
            incarnation: state.incarnation,
            session,
            frame_bytes_max: state.limits.frame_bytes_max,
            inflight_max: state.limits.inflight_per_connection_max,
            negotiated,
        };
        self.reply(id, hello_ok).await
    }

    /// A `Complete` or `CompleteHeuristic`: acts only on this session's own decisions.
    fn complete(
        &self,
        xid: &Xid,
        session: u64,
        txns: &SessionTxns,
        heuristic: Option<HeuristicOutcome>,
        client: Option<&TraceContext>,
        kept: Option<crate::state::KeptCallback>,
    ) -> Next {
        let span = self.state.trace.as_ref().map(|t| t.request("decree.server.complete", xid, client));
        let scope = span.as_ref().map(trace::span_log_scope);
        let _entered = scope.as_ref().map(tracing::Span::enter);
        let own = self.state.complete_own_kept(xid, session, txns, heuristic, kept);
        if !own {
            self.state.metrics.completes_ignored.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%xid, session, "ignored a Complete for a transaction this session has not decided");
        }
        if let (Some(t), Some(span)) = (self.state.trace.as_ref(), span) {
            t.forget(xid);
            trace::end(span, (!own).then(|| "ignored: not a decision of this session".to_string()));
        }
        Next::Continue
    }

    /// A `CompleteHeuristic` that asks for the kept reply: acted on as any other, then
    /// answered `OutcomeIs` heuristic once the outcome is durable and, in a pair, held by
    /// the backup, or `NotKept` (the client then leaves its branches to recovery).
    async fn complete_kept(
        &self,
        id: u64,
        xid: &Xid,
        session: u64,
        txns: &SessionTxns,
        outcome: HeuristicOutcome,
        client: Option<&TraceContext>,
    ) -> Next {
        let Some(send) = self.deferred_reply(id).await else { return Next::Close };
        let kept: crate::state::KeptCallback = Box::new(move |kept| {
            send(if kept {
                Message::OutcomeIs(Outcome::Heuristic)
            } else {
                // The text of the documented vector error_not_kept.
                let message = "the heuristic outcome is not kept: leave its branches to recovery".to_string();
                Message::Error { code: ErrorCode::NotKept, message }
            })
        });
        self.complete(xid, session, txns, Some(outcome), client, Some(kept))
    }

    /// A way to answer request `id` later, from any thread (a decision's durability, an
    /// outcome kept): it holds the connection's and the server's permits until it is sent.
    /// None when the server is closing.
    async fn deferred_reply(&self, id: u64) -> Option<Box<dyn FnOnce(Message) + Send>> {
        let connection_permit = self.permit().await?;
        let total_permit = self.total.clone().acquire_owned().await.ok()?;
        let responses = self.responses.clone();
        Some(Box::new(move |message: Message| {
            let response = Response {
                request_id: id,
                message,
                close: false,
                _connection_permit: connection_permit,
                _total_permit: Some(total_permit),
            };
            // Never full: every queued response holds one of the channel's permits.
            let _ = responses.try_send(response);
        }))
    }

    async fn decide(
        &mut self,
        id: u64,
        session: u64,
        txns: Arc<SessionTxns>,
        decision: Decision,
        client: Option<&TraceContext>,
    ) -> Next {
        let sequence = match check_decide(&self.state, session, &decision) {
            Ok(sequence) => sequence,
            Err(refusal) => return self.reply(id, *refusal).await,
        };
        let Some(send) = self.deferred_reply(id).await else { return Next::Close };
        commit_decision_traced(&self.state, txns, sequence, decision, send, client);
        Next::Continue
    }

    /// Resolves when the connection has stayed silent too long: before its `Hello`, at
    /// the handshake bound counted from `accepted`; in a session with an idle bound, once
    /// no request came since `last_request` and none is in flight for that long (an
    /// answer that leaves later restarts the bound, so a decide that waited on the log is
    /// not followed by an immediate close). Never resolves otherwise.
    async fn expiry(&self, accepted: TokioInstant, last_request: TokioInstant) -> Expiry {
        if self.session.is_none() {
            tokio::time::sleep_until(accepted + self.state.limits.handshake_timeout()).await;
            return Expiry::Handshake;
        }
        let Some(idle) = self.state.limits.idle_timeout() else {
            return std::future::pending().await;
        };
        let mut quiet_since = last_request;
        loop {
            tokio::time::sleep_until(quiet_since + idle).await;
            if self.permits.available_permits() == self.inflight_max as usize {
                return Expiry::Idle;
            }
            // Every answered request returns its permit: holding them all means nothing
            // is in flight any more. Only the reader takes permits, and it is waiting here.
            if let Ok(all) = self.permits.acquire_many(self.inflight_max).await {
                drop(all);
            }
            quiet_since = TokioInstant::now();
        }
    }

    /// Counts and logs a connection closed by [`Conn::expiry`]. Handshake timeouts are
    /// what a flood of hostile connections produces, so each one is logged at debug only
    /// and the running total at info when it reaches a power of two (a handful of lines
    /// even for millions); idle closes are bounded by the sessions and each one matters
    /// (its undecided branches are rolled back), so each is logged at info.
    fn expired(&self, expiry: Expiry) {
        let limits = &self.state.limits;
        let metrics = &self.state.metrics;
        match expiry {
            Expiry::Handshake => {
                let total = metrics.handshakes_timed_out.fetch_add(1, Ordering::Relaxed) + 1;
                let timeout_ms = limits.handshake_timeout_ms;
                tracing::debug!(timeout_ms, "closing a connection that sent no complete Hello in time");
                if total.is_power_of_two() {
                    tracing::info!(
                        total,
                        timeout_ms,
                        "connections closed for not completing their Hello in time (logged at 1, 2, 4, 8, ... of them)"
                    );
                }
            }
            Expiry::Idle => {
                metrics.sessions_idle_closed.fetch_add(1, Ordering::Relaxed);
                let session = self.session.as_ref().map_or(0, |(id, _)| *id);
                tracing::info!(
                    session,
                    timeout_ms = limits.idle_timeout_ms,
                    "closing an idle session; its undecided prepared branches will be rolled back"
                );
            }
        }
    }

    /// Waits for a connection permit (the client pipelines more than it was allowed).
    async fn permit(&self) -> Option<OwnedSemaphorePermit> {
        self.permits.clone().acquire_owned().await.ok()
    }

    async fn reply(&self, id: u64, message: Message) -> Next {
        self.send(id, message, false).await;
        Next::Continue
    }

    /// Sends an error naming the problem, then closes the connection.
    async fn fail(&self, id: u64, code: ErrorCode, message: String) -> Next {
        self.state.metrics.protocol_errors.fetch_add(1, Ordering::Relaxed);
        self.send(id, Message::Error { code, message }, true).await;
        Next::Close
    }

    async fn send(&self, request_id: u64, message: Message, close: bool) {
        let Some(permit) = self.permit().await else { return };
        let response =
            Response { request_id, message, close, _connection_permit: permit, _total_permit: None };
        let _ = self.responses.send(response).await;
    }
}

/// Writes responses, coalescing those that are ready into one write, until every sender
/// is gone; after a write error or a closing response, it discards the rest.
///
/// Under an election on etcd (`fence`), an acknowledgement or a known outcome leaves only
/// while the member's lease provably lives, checked just before the write: while it does
/// not, the answers wait for the next successful keepalive, and a member that stepped down
/// closes the connection unanswered (its client asks the new primary).
async fn write_responses<W: AsyncWrite + Unpin>(
    mut writer: W,
    mut rx: mpsc::Receiver<Response>,
    fence: Option<Arc<crate::fence::Fence>>,
) {
    let mut buf = Vec::with_capacity(4096);
    let mut open = true;
    while let Some(first) = rx.recv().await {
        if !open {
            continue;
        }
        buf.clear();
        let mut close = first.close;
        let mut fenced = is_fenced_answer(&first.message);
        encode_frame(&mut buf, first.request_id, &first.message);
        drop(first);
        while !close && buf.len() < WRITE_BATCH_BYTES_MAX {
            let Ok(next) = rx.try_recv() else { break };
            close = next.close;
            fenced |= is_fenced_answer(&next.message);
            encode_frame(&mut buf, next.request_id, &next.message);
        }
        if let Some(fence) = fence.as_ref().filter(|f| fenced && !f.alive()) {
            if !fence.reopened().await {
                // Closed now, unanswered, rather than when the client gives up waiting (its
                // reply timeout, 30 s by default): a stopping server waits for every
                // connection, and a switchover stalled that long (the 1,000-cycle elected
                // kill loop, cycle 222: its answer came after the fence had ended).
                let _ = writer.shutdown().await;
                open = false;
                continue;
            }
        }
        // The flush matters for TLS, whose writer may keep the end of a record back.
        if writer.write_all(&buf).await.is_err()
            || writer.flush().await.is_err()
            || (close && writer.shutdown().await.is_err())
        {
            open = false;
        }
        if close {
            open = false;
        }
    }
    let _ = writer.shutdown().await;
}

/// Whether `message` is an act a member's lease must cover: an acknowledgement, or an
/// outcome that says more than "unknown".
fn is_fenced_answer(message: &Message) -> bool {
    match message {
        Message::DecideOk => true,
        Message::OutcomeIs(outcome) => *outcome != decree_core::Outcome::Unknown,
        _ => false,
    }
}

/// Refuses a connection over the limit with a `Busy` error frame.
pub(crate) async fn refuse<W: AsyncWrite + Unpin>(mut writer: W, why: String) {
    let mut buf = Vec::new();
    encode_frame(&mut buf, 0, &Message::Error { code: ErrorCode::Busy, message: why });
    let _ = writer.write_all(&buf).await;
    let _ = writer.flush().await;
    let _ = writer.shutdown().await;
}

/// Checks a `Decide` of `session` before anything is written: its Xid was minted by that
/// session of this run, and the decision passes the rules. Returns the transaction's
/// sequence in the session, or the refusal to answer (boxed: a `Message` is large).
pub(crate) fn check_decide(state: &State, session: u64, decision: &Decision) -> Result<u64, Box<Message>> {
    let origin = decision.xid.origin();
    let Some(origin) =
        origin.filter(|o| o.node == state.node && o.incarnation == state.incarnation && o.session == session)
    else {
        let why = format!(
            "decision for {} does not belong to session {session} of node {} incarnation {}",
            decision.xid, state.node, state.incarnation
        );
        return Err(Box::new(Message::Error { code: ErrorCode::WrongSession, message: why }));
    };
    let known = |rm: &str| state.factories.iter().any(|f| f.name() == rm);
    if let Err((code, why)) = rules::check_decision(decision, known) {
        state.metrics.decides_refused.fetch_add(1, Ordering::Relaxed);
        return Err(Box::new(Message::Error { code, message: why }));
    }
    Ok(origin.sequence)
}

/// The commit path of a checked `Decide` of a session's transaction `sequence`, sans-IO:
/// writes the decision and, once it is durable here (and, for a pair's strict primary,
/// confirmed by the backup: `pair.rs`), makes it visible as decided and answers
/// `DecideOk` through `send`; a failed write is answered `LogFailed` and leaves the
/// decision in doubt. The connection calls it with its reply channel, the pair's
/// simulator (`decree-sim`) with its own.
/// `client` is the trace context the `Decide` carried (spans on only): the server's
/// `decree.server.decide` span is its child, with the log write as a child span and the
/// backup's confirmation, in a pair, as an event; the log lines of the decision, on every
/// thread it passes through, carry that span's trace and span ids. A sampled `client`
/// context is written with the decision (its log form `DCD2`), for recovery's links after
/// a restart or a failover.
pub(crate) fn commit_decision_traced(
    state: &Arc<State>,
    txns: Arc<SessionTxns>,
    sequence: u64,
    decision: Decision,
    send: Box<dyn FnOnce(Message) + Send>,
    client: Option<&TraceContext>,
) {
    let span = state
        .trace
        .as_ref()
        .map(|t| (t.request("decree.server.decide", &decision.xid, client), SystemTime::now()));
    let scope = span.as_ref().map(|(span, _)| trace::span_log_scope(span));
    // Kept only when sampled: an unsampled client span is never exported, nothing could
    // show a link to it. With spans off `client` is `None`: the record is DCD1, as ever.
    let logged = client.filter(|c| c.is_sampled() && c.is_valid()).copied();
    let payload = decision.encode_logged(logged.as_ref());
    trace::within(scope.as_ref(), || {
        commit_decision_scoped(state, txns, sequence, decision, payload, send, span, scope.clone())
    })
}

/// The decision's span and the write's start, when spans are on.
type DecideSpan = Option<(SdkSpan, SystemTime)>;

/// [`commit_decision_traced`] inside the decision's log scope (`scope`, entered again on
/// the threads that finish it); `payload` is the decision's log record.
#[allow(clippy::too_many_arguments)] // the decision, its record and its trace, each owned by the callback
fn commit_decision_scoped(
    state: &Arc<State>,
    txns: Arc<SessionTxns>,
    sequence: u64,
    decision: Decision,
    payload: Vec<u8>,
    send: Box<dyn FnOnce(Message) + Send>,
    span: DecideSpan,
    scope: Option<tracing::Span>,
) {
    // A pair's strict primary ships the decision while it writes it locally.
    let early = state.pair().and_then(|link| link.ship_before_write(state, decision.xid, &payload));
    let shipped = state.pair().filter(|_| early.is_none()).map(|_| payload.clone());
    let key = state.key_for(&txns, sequence);
    let state = state.clone();
    let started = Instant::now();
    let log_state = state.clone();
    log_state.log.append_with(
        key,
        &payload,
        Box::new(move |result| {
            let _entered = scope.as_ref().map(tracing::Span::enter);
            match result {
            Ok(()) => {
                let xid = decision.xid;
                let accepting = state.clone();
                let span = span.map(|(mut span, write_started)| {
                    if let Some(t) = &state.trace {
                        t.log_write(&span, &xid, write_started, None);
                    }
                    span.add_event("decision written", Vec::new());
                    span
                });
                let accept_scope = scope.clone();
                let accept = move |acknowledged: Acknowledged| {
                    let _entered = accept_scope.as_ref().map(tracing::Span::enter);
                    // Visible as decided before the client can see DecideOk.
                    accepting.decided_or_orphan(&txns, sequence, decision, key);
                    accepting.metrics.decides.fetch_add(1, Ordering::Relaxed);
                    let sampled = span.as_ref().map(|s| s.span_context()).filter(|c| c.is_sampled());
                    accepting.metrics.observe_decide(started.elapsed(), sampled);
                    crash_points::pass(CrashPoint::DecideConfirmed, &xid);
                    tracing::debug!(%xid, "decided: DecideOk sent");
                    if let Some(mut span) = span {
                        if let Acknowledged::Confirmed(at) = acknowledged {
                            let at = at.unwrap_or_else(SystemTime::now);
                            span.add_event_with_timestamp("backup confirmed", at, Vec::new());
                        }
                        trace::end(span, None);
                    }
                    send(Message::DecideOk)
                };
                match (state.pair(), early, shipped) {
                    // Shipped beside the write: the answer waits for the backup too.
                    (Some(link), Some(ticket), _) => link.written(&state, ticket, Box::new(accept)),
                    // Alone when the decide came: decided, then shipped (or pending if
                    // the primary turned strict meanwhile).
                    (Some(link), None, Some(payload)) => {
                        link.after_local_write(&state, xid, payload, Box::new(accept))
                    }
                    _ => accept(Acknowledged::Alone),
                }
            }
            Err(e) => {
                // The record may have reached the disk (or the backup's): in doubt
                // until a restart reads the log, never rolled back meanwhile.
                state.doubt(&decision.xid);
                if let (Some(link), Some(ticket)) = (state.pair(), early) {
                    link.write_failed(ticket);
                }
                state.metrics.decide_errors.fetch_add(1, Ordering::Relaxed);
                if let (Some(t), Some((span, write_started))) = (&state.trace, span) {
                    t.log_write(&span, &decision.xid, write_started, Some(e.to_string()));
                    trace::end(span, Some(format!("log write failed: {e}")));
                }
                tracing::error!(xid = %decision.xid, error = %e, "decision write failed; its outcome is unknown until a restart");
                let message = format!(
                    "the decision's write failed ({e}); it may or may not be durable, and the server touches none of its branches until a restart has read the log"
                );
                send(Message::Error { code: ErrorCode::LogFailed, message })
            }
            }
        }),
    );
}

#[cfg(test)]
mod tests {
    use super::{write_responses, Response};
    use decree_proto::Message;
    use std::sync::Arc;
    use tokio::io::AsyncReadExt;
    use tokio::sync::{mpsc, Semaphore};

    /// The bug it guards against: an acknowledgement reaching the writer after the member's
    /// fence had ended (it stepped down, or stopped for a switchover) was dropped, but the
    /// connection stayed open until its client's reply timeout, and the stopping server,
    /// which waits for every connection, with it.
    #[tokio::test]
    async fn an_acknowledgement_after_the_fence_ended_closes_the_connection_at_once() {
        let (ours, mut theirs) = tokio::net::UnixStream::pair().unwrap();
        let fence = Arc::new(crate::fence::Fence::closed());
        fence.end();
        let (tx, rx) = mpsc::channel(4);
        let writer = tokio::spawn(write_responses(ours, rx, Some(fence)));
        let permits = Arc::new(Semaphore::new(1));
        let permit = permits.clone().acquire_owned().await.unwrap();
        let answer = Response {
            request_id: 1,
            message: Message::DecideOk,
            close: false,
            _connection_permit: permit,
            _total_permit: None,
        };
        assert!(tx.send(answer).await.is_ok());
        // The sender lives on, as the connection's reader holds it while its client waits.
        let mut buf = [0u8; 64];
        // A bound for a hang only: the close comes at once.
        let read = tokio::time::timeout(std::time::Duration::from_secs(20), theirs.read(&mut buf)).await;
        assert!(matches!(read, Ok(Ok(0))), "the client sees the connection close, not an answer: {read:?}");
        drop(tx);
        writer.await.unwrap();
    }
}
