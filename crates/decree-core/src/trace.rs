//! OpenTelemetry spans of the coordinator: one trace per transaction, with a span for the
//! transaction, each branch's prepare, commit or rollback (database semantic conventions),
//! the decision and the completion; and the trace context that travels to a state server
//! on the wire (protocol version 3's trace-context field), so that the server's spans join
//! the application's trace.
//!
//! Off unless [`enable`] was called (decree-otel does when it installs an exporter; an
//! application that installs its own OpenTelemetry provider calls it itself). Off, the
//! coordinator pays one relaxed atomic load per transaction and allocates nothing: every
//! span lives in an `Option` that stays `None`. On, spans go to OpenTelemetry's global
//! tracer provider, as children of the application's current context.
//!
//! The embedded coordinator's recovery (start-up and background passes) emits its spans
//! here too ([`RecoveryPass`]): the same `decree.recovery.pass` span and per-branch spans
//! as a state server's recovery, linked to the client's span that a `DCD2` decision kept.
//!
//! It is not for the state server's own spans (decree-server keeps its own tracer, with
//! its node, member and epoch as resource attributes) nor for exporting (decree-otel).

use crate::xid::Xid;
use opentelemetry::global::{BoxedSpan, BoxedTracer};
use opentelemetry::trace::{
    Link, Span, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
    Tracer,
};
use opentelemetry::{Context, KeyValue};
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

/// Whether the coordinator emits spans: set once by [`enable`].
static ENABLED: AtomicBool = AtomicBool::new(false);

/// The name of the coordinator's tracer (its instrumentation scope).
pub const TRACER_NAME: &str = "decree";

/// The attribute holding the global Xid (hex of format id, gtrid and bqual) on every span.
pub const XID_ATTRIBUTE: &str = "decree.xid";

/// Turns the coordinator's spans on for this process (they go to the global provider).
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// Whether spans are on: the one check the commit path makes when they are off.
#[inline]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// A W3C trace context as it travels on the wire: the trace, the span that is the parent
/// of the receiver's spans, and the flags (bit 0: sampled).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceContext {
    /// The trace id (never all zero).
    pub trace_id: [u8; 16],
    /// The parent span id (never all zero).
    pub span_id: [u8; 8],
    /// W3C trace flags; 0x01 = sampled.
    pub flags: u8,
}

impl TraceContext {
    /// The wire form of an OpenTelemetry span context; `None` for an invalid one.
    pub fn from_span_context(sc: &SpanContext) -> Option<TraceContext> {
        sc.is_valid().then(|| TraceContext {
            trace_id: sc.trace_id().to_bytes(),
            span_id: sc.span_id().to_bytes(),
            flags: sc.trace_flags().to_u8(),
        })
    }

    /// The remote span context a receiver parents its spans on; `None` when an id is zero
    /// (invalid in W3C Trace Context, so ignored).
    pub fn to_span_context(&self) -> Option<SpanContext> {
        let sc = SpanContext::new(
            TraceId::from_bytes(self.trace_id),
            SpanId::from_bytes(self.span_id),
            TraceFlags::new(self.flags),
            true,
            TraceState::NONE,
        );
        sc.is_valid().then_some(sc)
    }

    /// The trace id in lowercase hex, as log lines and exemplars show it.
    pub fn trace_id_hex(&self) -> String {
        hex::encode(self.trace_id)
    }

    /// The span id in lowercase hex, as log lines and `decree recover list` show it.
    pub fn span_id_hex(&self) -> String {
        hex::encode(self.span_id)
    }

    /// Whether the sender sampled its span (W3C flag bit 0): only such a context is worth
    /// keeping for later spans to link to, since an unsampled span is never exported.
    pub fn is_sampled(&self) -> bool {
        self.flags & 0x01 != 0
    }

    /// Whether both ids are non-zero, as W3C Trace Context requires of a valid context.
    pub fn is_valid(&self) -> bool {
        self.trace_id != [0; 16] && self.span_id != [0; 8]
    }

    /// Appends the fixed-width form a decision record keeps (`DCD2`, store.rs): trace id
    /// (16 bytes), span id (8), flags (1), [`TRACE_CONTEXT_BYTES`] in all.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        assert!(self.is_valid(), "a stored trace context has non-zero ids");
        out.extend_from_slice(&self.trace_id);
        out.extend_from_slice(&self.span_id);
        out.push(self.flags);
    }

    /// Reads the form of [`TraceContext::encode_into`]: exactly [`TRACE_CONTEXT_BYTES`]
    /// bytes with non-zero ids, or why not.
    pub fn decode(buf: &[u8]) -> Result<TraceContext, &'static str> {
        let bytes: &[u8; TRACE_CONTEXT_BYTES] = buf.try_into().map_err(|_| {
            if buf.len() < TRACE_CONTEXT_BYTES {
                "trace context truncated"
            } else {
                "trailing bytes after the trace context"
            }
        })?;
        let mut context = TraceContext { trace_id: [0; 16], span_id: [0; 8], flags: bytes[24] };
        context.trace_id.copy_from_slice(&bytes[..16]);
        context.span_id.copy_from_slice(&bytes[16..24]);
        if !context.is_valid() {
            return Err("trace context with a zero trace or span id");
        }
        Ok(context)
    }
}

/// Bytes of a trace context in a decision record's `DCD2` form: trace id (16), span id
/// (8), flags (1).
pub const TRACE_CONTEXT_BYTES: usize = 16 + 8 + 1;

/// The wire form of the caller's current OpenTelemetry context (spans on and a valid
/// span current), for requests made outside a transaction (`Outcome`).
pub fn current_context() -> Option<TraceContext> {
    if !enabled() {
        return None;
    }
    TraceContext::from_span_context(Context::current().span().span_context())
}

/// The Xid attribute of a span.
pub fn xid_attribute(xid: &Xid) -> KeyValue {
    KeyValue::new(XID_ATTRIBUTE, xid.to_string())
}

/// The spans of one transaction in progress: the transaction's span (the parent of every
/// other) and the start of each connection's branch call under way.
pub(crate) struct TxTrace {
    tracer: BoxedTracer,
    /// The context holding the transaction's span.
    cx: Context,
    xid: Xid,
    /// When each connection's current branch call started.
    started: Vec<Option<SystemTime>>,
    /// When each connection's current branch call was answered.
    answered: Vec<Option<SystemTime>>,
}

impl TxTrace {
    /// The transaction's span, a child of the caller's current context; `None` (nothing
    /// allocated) when spans are off. Boxed, so that the session's field is one pointer:
    /// writing `None` to it is one store, not a copy of the whole state.
    #[inline]
    pub(crate) fn begin(xid: &Xid, connections: usize) -> Option<Box<TxTrace>> {
        if !enabled() {
            return None;
        }
        Some(Self::begin_on(xid, connections))
    }

    #[cold]
    fn begin_on(xid: &Xid, connections: usize) -> Box<TxTrace> {
        let tracer = opentelemetry::global::tracer(TRACER_NAME);
        let span = tracer
            .span_builder("decree.transaction")
            .with_kind(SpanKind::Internal)
            .with_attributes([xid_attribute(xid)])
            .start_with_context(&tracer, &Context::current());
        let cx = Context::current().with_span(span);
        Box::new(TxTrace {
            tracer,
            cx,
            xid: *xid,
            started: vec![None; connections],
            answered: vec![None; connections],
        })
    }

    /// The wire context of the transaction's span (what `OnePhase` carries).
    pub(crate) fn wire(&self) -> Option<TraceContext> {
        TraceContext::from_span_context(self.cx.span().span_context())
    }

    /// Notes that connection `i`'s branch call starts now.
    pub(crate) fn call_started(&mut self, i: usize) {
        if let Some(s) = self.started.get_mut(i) {
            *s = Some(SystemTime::now());
        }
    }

    /// Notes that connection `i`'s branch call was answered now.
    pub(crate) fn call_answered(&mut self, i: usize) {
        if let Some(s) = self.answered.get_mut(i) {
            *s = Some(SystemTime::now());
        }
    }

    /// Emits the span of connection `i`'s branch call, from [`TxTrace::call_started`] to
    /// [`TxTrace::call_answered`] (or now): `operation` on `rm` (a `db_system` database), branch `branch`, failed with
    /// `error` when given.
    pub(crate) fn call_ended(
        &mut self,
        i: usize,
        operation: &'static str,
        rm: &str,
        db_system: &'static str,
        branch: u16,
        error: Option<String>,
    ) {
        let end = self.answered.get_mut(i).and_then(Option::take).unwrap_or_else(SystemTime::now);
        let start = self.started.get_mut(i).and_then(Option::take).unwrap_or(end);
        let mut span = self
            .tracer
            .span_builder(format!("{operation} {rm}"))
            .with_kind(SpanKind::Client)
            .with_start_time(start)
            .with_attributes([
                xid_attribute(&self.xid),
                KeyValue::new("db.system.name", db_system),
                KeyValue::new("db.system", db_system),
                KeyValue::new("db.operation.name", operation),
                KeyValue::new("db.namespace", rm.to_string()),
                KeyValue::new("decree.rm", rm.to_string()),
                KeyValue::new("decree.branch", i64::from(branch)),
            ])
            .start_with_context(&self.tracer, &self.cx);
        if let Some(error) = error {
            span.set_status(Status::error(error));
        }
        span.end_with_timestamp(end);
    }

    /// A span for a call to the decision store (`decree.decide`, `decree.complete`,
    /// `decree.one_phase`), a child of the transaction's; its context goes on the wire.
    pub(crate) fn store_call(&self, name: &'static str) -> BoxedSpan {
        self.tracer
            .span_builder(name)
            .with_kind(SpanKind::Client)
            .with_attributes([xid_attribute(&self.xid)])
            .start_with_context(&self.tracer, &self.cx)
    }

    /// Ends the transaction's span with its outcome (`committed`, `rolled_back`, or
    /// `unknown` and the error).
    pub(crate) fn end(self: Box<Self>, outcome: &'static str, error: Option<String>) {
        let span = self.cx.span();
        span.set_attribute(KeyValue::new("decree.outcome", outcome));
        if let Some(error) = error {
            span.set_status(Status::error(error));
        }
        span.end();
    }
}

/// The wire context of a store call's span.
pub(crate) fn wire_of(span: &BoxedSpan) -> Option<TraceContext> {
    TraceContext::from_span_context(span.span_context())
}

/// Ends a store call's span, failed with `error` when given.
pub(crate) fn end_store_call(mut span: BoxedSpan, error: Option<String>) {
    if let Some(error) = error {
        span.set_status(Status::error(error));
    }
    span.end();
}

/// A `tracing` span that puts `context`'s `trace_id` and `span_id` (lowercase hex, as the
/// exported spans show them) on every log line emitted while it is entered. At level
/// ERROR so that it is enabled whenever any line is printed: a span below the filter's
/// level would be disabled, and the warnings inside it would lose the ids.
pub fn log_scope(context: &SpanContext) -> tracing::Span {
    tracing::error_span!("otel", trace_id = %context.trace_id(), span_id = %context.span_id())
}

/// The name of the span of a branch that recovery finished: `commit {rm}` or
/// `rollback {rm}`, or `rollback (presumed abort)` when the engine reports the rollback
/// per transaction (no `rm`), as a state server names it.
pub fn recovered_branch_name(rm: Option<&str>, commit: bool) -> String {
    let operation = if commit { "commit" } else { "rollback" };
    match rm {
        Some(rm) => format!("{operation} {rm}"),
        None => format!("{operation} (presumed abort)"),
    }
}

/// The attributes of the span of a branch that recovery finished, the same in every
/// process that recovers: the global Xid, the operation, the RM (empty for a presumed
/// abort), the branch number and `decree.recovery`.
pub fn recovered_branch_attributes(xid: &Xid, rm: Option<&str>, commit: bool) -> [KeyValue; 5] {
    [
        xid_attribute(&xid.global()),
        KeyValue::new("db.operation.name", if commit { "commit" } else { "rollback" }),
        KeyValue::new("decree.rm", rm.unwrap_or("").to_string()),
        KeyValue::new("decree.branch", i64::from(xid.branch_number().unwrap_or(0))),
        KeyValue::new("decree.recovery", true),
    ]
}

/// Emits the span of a branch that recovery finished, a child of `parent` (the pass),
/// linked to `links` (the client's span, when known): one builder for every process that
/// recovers (the embedded coordinator's global tracer, the state server's own).
pub fn end_recovered_branch<T: Tracer>(
    tracer: &T,
    parent: &Context,
    links: Vec<Link>,
    xid: &Xid,
    rm: Option<&str>,
    commit: bool,
) {
    let mut span = tracer
        .span_builder(recovered_branch_name(rm, commit))
        .with_kind(SpanKind::Client)
        .with_links(links)
        .with_attributes(recovered_branch_attributes(xid, rm, commit))
        .start_with_context(tracer, parent);
    span.end();
}

/// The spans of one recovery pass of the embedded coordinator (its start-up recovery, or
/// one pass of its background thread): the pass's span `decree.recovery.pass`, a new
/// trace, and one child per branch the pass finished. The pass's span starts at its first
/// branch (with the pass's start time), so that the many passes that finish nothing
/// export nothing.
pub(crate) struct RecoveryPass {
    tracer: BoxedTracer,
    started: SystemTime,
    /// The context holding the pass's span, once a branch was finished. A `RefCell`: one
    /// pass runs on one thread.
    cx: RefCell<Option<Context>>,
}

impl RecoveryPass {
    /// A pass starting now; `None` (nothing allocated) when spans are off.
    #[inline]
    pub(crate) fn begin() -> Option<RecoveryPass> {
        if !enabled() {
            return None;
        }
        let tracer = opentelemetry::global::tracer(TRACER_NAME);
        Some(RecoveryPass { tracer, started: SystemTime::now(), cx: RefCell::new(None) })
    }

    /// Emits the span of a branch of `xid` that this pass finished (see
    /// [`recovered_branch_name`]), a child of the pass's span, linked to the client's span
    /// of its transaction when known (`client`, from its `DCD2` decision record).
    pub(crate) fn branch(&self, xid: &Xid, rm: Option<&str>, commit: bool, client: Option<&TraceContext>) {
        let links: Vec<Link> =
            client.and_then(TraceContext::to_span_context).map(Link::with_context).into_iter().collect();
        let mut cx = self.cx.borrow_mut();
        let parent = cx.get_or_insert_with(|| self.pass_context());
        end_recovered_branch(&self.tracer, parent, links, xid, rm, commit);
    }

    /// A context holding the pass's span, a new trace (not the caller's current context:
    /// the start-up recovery runs on the application's thread, but belongs to no request).
    fn pass_context(&self) -> Context {
        let span = self
            .tracer
            .span_builder("decree.recovery.pass")
            .with_kind(SpanKind::Internal)
            .with_start_time(self.started)
            .start_with_context(&self.tracer, &Context::new());
        Context::new().with_span(span)
    }

    /// Ends the pass's span, if a branch started it, noting whether the pass was clean
    /// (nothing left to retry).
    pub(crate) fn end(self, clean: bool) {
        if let Some(cx) = self.cx.into_inner() {
            let span = cx.span();
            span.set_attribute(KeyValue::new("decree.recovery.clean", clean));
            span.end();
        }
    }
}
