//! The state server's OpenTelemetry spans (`[tracing]` in decree.toml; issue 36): the
//! decision with its log write (and, in a pair, the backup's confirmation as an event),
//! completions, one-phase notices and outcome answers, each a child of the client's span
//! when its request carried the trace-context field; each group-commit write, linked to
//! every sampled decision it made durable and kept exactly when it links one (the log
//! tells a callback its write: `decree_log::write_batch`); recovery passes and the branches they finish, linked to the
//! client's span through the global Xid.
//!
//! Off unless configured: the server then holds `None` and every call site is one
//! `Option` check, with nothing allocated. On, spans go to this server's own provider
//! (decree-otel), whose resource names the node, the pair member and the epoch.
//!
//! The map from Xid to the client's span context of recent requests ([`XidContexts`]) is
//! bounded by `tracing.xid_contexts_max` and forgets the oldest first: it never grows with
//! history. It lives in memory; what outlives the process is the log: a decision whose
//! `Decide` carried a sampled context is written with it (`DCD2`, decree-core's
//! `store.rs`), the pair ships that record as it is, and a server opening the log (after a
//! restart, or the member promoted after a failover) keeps those contexts apart
//! ([`ServerTrace::remember_logged`], [`KnownContexts`]): one per recovered decision, each
//! gone when recovery finishes its transaction, so that every recovered transaction links
//! to its client's span however many there are, and memory still follows the live
//! decisions only.
//!
//! Log lines carry the trace too: while the server works on a traced request (or recovery
//! on a transaction whose client context it holds), it enters a `tracing` span
//! ([`log_scope`]) whose `trace_id` and `span_id` fields the log formatter prints on every
//! line emitted inside it, on whichever thread the work goes on (the log's callback, the
//! pair link's confirmation).

use decree_core::trace::{end_recovered_branch, xid_attribute, TraceContext};
use decree_core::Xid;
use decree_log::write_batch::WriteBatch;
use decree_otel::{Exporter, OtelError, TracingConfig};
use opentelemetry::trace::{Link, Span, SpanContext, SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SdkTracer, Span as SdkSpan};
use parking_lot::Mutex;
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::time::SystemTime;

/// The server's tracer, its exporter and the Xid maps.
pub(crate) struct ServerTrace {
    tracer: SdkTracer,
    contexts: Mutex<KnownContexts>,
    /// Kept for its drop: exports what is queued when the server stops.
    _exporter: Exporter,
}

impl ServerTrace {
    /// Starts the exporter of `config` with node, member and epoch on its resource.
    pub(crate) fn start(
        config: &TracingConfig,
        node: u32,
        member: Option<u8>,
        epoch: u64,
    ) -> Result<ServerTrace, OtelError> {
        let mut attributes = vec![
            KeyValue::new("decree.node", i64::from(node)),
            KeyValue::new("decree.epoch", epoch.to_string()),
        ];
        if let Some(member) = member {
            attributes.push(KeyValue::new("decree.member", i64::from(member)));
        }
        let exporter = Exporter::start(config, attributes)?;
        Ok(ServerTrace {
            tracer: exporter.tracer("decree-server"),
            contexts: Mutex::new(KnownContexts::new(config.xid_contexts_max as usize)),
            _exporter: exporter,
        })
    }

    /// Remembers the client contexts that the log's decision records kept (`DCD2`), so that
    /// recovering those transactions, after a restart or on the member promoted after a
    /// failover, links its spans and log lines to the clients' spans. Kept apart from the
    /// recent requests' bounded map, so that none goes unlinked however many there are;
    /// each leaves when its transaction is finished ([`ServerTrace::forget`]).
    pub(crate) fn remember_logged(&self, logged: &HashMap<Xid, TraceContext>) {
        self.contexts.lock().remember_recovered(logged);
    }

    /// A span for a request about `xid`, a child of the client's context when it sent
    /// one (kept for recovery's links too).
    pub(crate) fn request(&self, name: &'static str, xid: &Xid, client: Option<&TraceContext>) -> SdkSpan {
        let parent = match client.and_then(TraceContext::to_span_context) {
            Some(sc) => {
                self.contexts.lock().recent.insert(xid.global(), sc.clone());
                Context::new().with_remote_span_context(sc)
            }
            None => Context::new(),
        };
        self.tracer
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .with_attributes([xid_attribute(xid)])
            .start_with_context(&self.tracer, &parent)
    }

    /// The span of the decision's log write, a child of `decide`, from `started` to now;
    /// called from the write's callback, it also counts the decision in its group-commit
    /// write ([`ServerTrace::group_write`]).
    pub(crate) fn log_write(&self, decide: &SdkSpan, xid: &Xid, started: SystemTime, error: Option<String>) {
        let batch = decree_log::write_batch::current();
        let parent = Context::new().with_remote_span_context(decide.span_context().clone());
        let mut attributes = vec![xid_attribute(xid)];
        if let Some(batch) = batch {
            attributes.push(KeyValue::new(WRITE_NUMBER_ATTRIBUTE, batch.number as i64));
        }
        let mut span = self
            .tracer
            .span_builder("decree.log.write")
            .with_kind(SpanKind::Internal)
            .with_start_time(started)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &parent);
        match error {
            Some(error) => span.set_status(Status::error(error)),
            None => {
                if let Some(batch) = batch {
                    self.group_write(batch, decide.span_context(), started);
                }
            }
        }
        span.end();
    }

    /// Counts the decision of `decide` (its append at `started`) in the group-commit write
    /// `batch` whose callback runs now; after the write's last callback, exports the
    /// write's span `decree.log.group_write`, linked to every sampled decision it made
    /// durable (a link to a span never exported would show nothing).
    /// The callbacks of one write run one after the other on one thread, so the write is
    /// gathered in a thread-local: no lock, and at most one write held per thread.
    fn group_write(&self, batch: WriteBatch, decide: &SpanContext, started: SystemTime) {
        let (stale, finished) = GROUP_WRITE.with(|cell| {
            let mut cell = cell.borrow_mut();
            // A write whose last callback was no decision's never finished: export it now.
            let stale = cell.take_if(|write| write.number != batch.number);
            let write = cell.get_or_insert_with(|| GroupWrite {
                number: batch.number,
                records: batch.callbacks,
                started,
                decisions: 0,
                links: Vec::new(),
            });
            write.started = write.started.min(started);
            write.decisions += 1;
            if decide.is_sampled() && write.links.len() < GROUP_LINKS_MAX {
                write.links.push(Link::with_context(decide.clone()));
            }
            assert!(
                write.links.len() <= write.decisions.min(GROUP_LINKS_MAX) && write.decisions <= write.records
            );
            (stale, cell.take_if(|_| batch.position + 1 == batch.callbacks))
        });
        for write in [stale, finished].into_iter().flatten() {
            self.export_group_write(write);
        }
    }

    /// Exports the span of a group-commit write, from its first decision's append (its
    /// start, whichever decision is sampled) to now: only when it links a sampled decision,
    /// and then always, whatever `tracing.sampling` (decree-otel's `ServerSampler` samples
    /// a new trace with links by its links), so that every sampled decision finds its write.
    fn export_group_write(&self, write: GroupWrite) {
        if let Some(mut span) = self.group_write_span(write) {
            span.end();
        }
    }

    /// The span of a group-commit write, `None` when it links no sampled decision.
    fn group_write_span(&self, write: GroupWrite) -> Option<SdkSpan> {
        if write.links.is_empty() {
            return None;
        }
        let span = self
            .tracer
            .span_builder("decree.log.group_write")
            .with_kind(SpanKind::Internal)
            .with_start_time(write.started)
            .with_links(write.links)
            .with_attributes([
                KeyValue::new(WRITE_NUMBER_ATTRIBUTE, write.number as i64),
                KeyValue::new("decree.log.records", write.records as i64),
                KeyValue::new("decree.log.decisions", write.decisions as i64),
            ])
            .start(&self.tracer);
        Some(span)
    }

    /// The span of one recovery pass that started at `started` (a new trace, sampled by
    /// `tracing.sampling`).
    pub(crate) fn pass(&self, started: SystemTime) -> SdkSpan {
        self.tracer
            .span_builder("decree.recovery.pass")
            .with_kind(SpanKind::Internal)
            .with_start_time(started)
            .start(&self.tracer)
    }

    /// The span of a branch that recovery finished (`commit` or `rollback` on `rm`; no
    /// `rm` for a presumed-abort rollback, which the engine reports per transaction), a
    /// child of the pass, linked to the client's span of its transaction when known.
    pub(crate) fn recovered_branch(&self, pass: &SdkSpan, xid: &Xid, rm: Option<&str>, commit: bool) {
        let global = xid.global();
        let links = match self.contexts.lock().get(&global) {
            Some(sc) => vec![Link::with_context(sc)],
            None => Vec::new(),
        };
        let parent = Context::new().with_remote_span_context(pass.span_context().clone());
        // Built by decree-core, as an embedded coordinator's recovery builds it.
        end_recovered_branch(&self.tracer, &parent, links, xid, rm, commit);
    }

    /// The log scope of `xid`'s transaction when its client's span context is known
    /// (recovery's lines then name the client's trace).
    pub(crate) fn log_scope_of(&self, xid: &Xid) -> Option<tracing::Span> {
        self.contexts.lock().get(&xid.global()).map(|sc| log_scope(&sc))
    }

    /// Forgets `xid`'s client contexts, recovered or not: its transaction is finished (by
    /// its client, or by recovery: a recovered context must leave with its decision).
    pub(crate) fn forget(&self, xid: &Xid) {
        self.contexts.lock().forget(&xid.global());
    }
}

/// The attribute naming a group-commit write on its span and on each decision's
/// `decree.log.write` span (the log's write number, `decree_log::write_batch`).
pub(crate) const WRITE_NUMBER_ATTRIBUTE: &str = "decree.log.write_number";

/// A group-commit write's span links at most this many decisions (OpenTelemetry's default
/// limit of links per span); `decree.log.records` still counts them all.
const GROUP_LINKS_MAX: usize = 128;

thread_local! {
    /// The group-commit write whose callbacks run on this thread now.
    static GROUP_WRITE: RefCell<Option<GroupWrite>> = const { RefCell::new(None) };
}

/// A group-commit write, gathered from its callbacks.
struct GroupWrite {
    number: u64,
    /// Records the write made durable (callbacks it calls).
    records: usize,
    /// The earliest append of its decisions.
    started: SystemTime,
    /// Decisions it made durable (at most `records`).
    decisions: usize,
    /// One per sampled decision, at most `GROUP_LINKS_MAX`.
    links: Vec<Link>,
}

/// Ends a request span, failed with `error` when given.
pub(crate) fn end(mut span: SdkSpan, error: Option<String>) {
    if let Some(error) = error {
        span.set_status(Status::error(error));
    }
    span.end();
}

/// A `tracing` span that puts `context`'s `trace_id` and `span_id` (lowercase hex, as the
/// exported spans show them) on every log line emitted while it is entered. At level
/// ERROR so that it is enabled whenever any line is printed: a span below the filter's
/// level would be disabled, and the warnings inside it would lose the ids. Built here, not
/// by decree-core's twin, so that its target is this crate's, which a log filter naming
/// `decree_server` enables.
pub(crate) fn log_scope(context: &SpanContext) -> tracing::Span {
    tracing::error_span!("otel", trace_id = %context.trace_id(), span_id = %context.span_id())
}

/// Runs `f` inside `scope` when there is one (spans on).
pub(crate) fn within<T>(scope: Option<&tracing::Span>, f: impl FnOnce() -> T) -> T {
    match scope {
        Some(scope) => scope.in_scope(f),
        None => f(),
    }
}

/// The log scope of a server span.
pub(crate) fn span_log_scope(span: &SdkSpan) -> tracing::Span {
    log_scope(span.span_context())
}

/// The client span contexts the server knows: those of recent requests, bounded, and
/// those the log kept for the decisions it recovered, bounded by those decisions.
pub(crate) struct KnownContexts {
    recent: XidContexts,
    /// The recovered decisions' contexts (`DCD2`) whose transaction is not finished yet:
    /// filled at open only, so it never holds more than `recovered_max`, the decisions the
    /// log held then, and shrinks as recovery finishes them.
    recovered: HashMap<Xid, SpanContext>,
    recovered_max: usize,
}

impl KnownContexts {
    pub(crate) fn new(recent_max: usize) -> KnownContexts {
        KnownContexts { recent: XidContexts::new(recent_max), recovered: HashMap::new(), recovered_max: 0 }
    }

    /// Keeps the valid contexts of `logged` (by global Xid) until their transactions finish.
    fn remember_recovered(&mut self, logged: &HashMap<Xid, TraceContext>) {
        for (xid, context) in logged {
            if let Some(sc) = context.to_span_context() {
                self.recovered.insert(xid.global(), sc);
            }
        }
        self.recovered_max = self.recovered.len();
    }

    /// The client context of `xid`'s transaction: the one its recovered record kept first
    /// (it names the decision's own client), else the latest request's.
    fn get(&self, xid: &Xid) -> Option<SpanContext> {
        self.recovered.get(xid).or_else(|| self.recent.get(xid)).cloned()
    }

    /// Forgets both contexts of `xid`, whose transaction is finished.
    fn forget(&mut self, xid: &Xid) {
        self.recent.remove(xid);
        self.recovered.remove(xid);
        assert!(self.recovered.len() <= self.recovered_max);
    }
}

/// The client span context of each recent transaction, at most `max`, the oldest
/// forgotten first. `order` holds each inserted Xid once per insertion; it is compacted
/// when it reaches twice the bound, so it stays within `2 * max` too.
pub(crate) struct XidContexts {
    map: HashMap<Xid, SpanContext>,
    order: VecDeque<Xid>,
    max: usize,
}

impl XidContexts {
    pub(crate) fn new(max: usize) -> XidContexts {
        assert!(max > 0);
        XidContexts { map: HashMap::new(), order: VecDeque::new(), max }
    }

    pub(crate) fn insert(&mut self, xid: Xid, context: SpanContext) {
        if self.map.insert(xid, context).is_none() {
            self.order.push_back(xid);
        }
        while self.map.len() > self.max {
            let Some(oldest) = self.order.pop_front() else { break };
            self.map.remove(&oldest);
        }
        if self.order.len() >= 2 * self.max {
            let map = &self.map;
            self.order.retain(|x| map.contains_key(x));
        }
        assert!(self.map.len() <= self.max && self.order.len() <= 2 * self.max);
    }

    pub(crate) fn get(&self, xid: &Xid) -> Option<&SpanContext> {
        self.map.get(xid)
    }

    pub(crate) fn remove(&mut self, xid: &Xid) {
        self.map.remove(xid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use decree_core::Origin;
    use opentelemetry::trace::{SpanId, TraceFlags, TraceId, TraceState};

    fn context(n: u64) -> SpanContext {
        let id = TraceId::from_bytes([(n % 200) as u8 + 1; 16]);
        SpanContext::new(id, SpanId::from_bytes([1; 8]), TraceFlags::SAMPLED, true, TraceState::NONE)
    }

    #[test]
    fn the_xid_map_keeps_the_newest_and_never_grows_past_its_bound() {
        let mut map = XidContexts::new(3);
        let xid = |n| Xid::decree(Origin { node: 1, incarnation: 1, session: 1, sequence: n });
        for n in 0..1000u64 {
            map.insert(xid(n), context(n));
            if n % 2 == 0 {
                map.remove(&xid(n));
            }
            assert!(map.map.len() <= 3 && map.order.len() <= 6);
        }
        assert!(map.get(&xid(999)).is_some() && map.get(&xid(997)).is_some());
        assert!(map.get(&xid(1)).is_none());
    }

    /// The group-commit write gathered on this thread, taken before its last callback.
    fn gathered() -> GroupWrite {
        GROUP_WRITE.with(|cell| cell.borrow_mut().take()).expect("a write not finished yet")
    }

    #[test]
    fn a_group_write_is_kept_by_its_sampled_decisions_whatever_the_sampling_ratio() {
        let config = TracingConfig { sampling: 0.0, ..TracingConfig::to("http://127.0.0.1:9") };
        let trace = ServerTrace::start(&config, 1, None, 1).expect("an exporter");
        let now = SystemTime::now();
        let unsampled = SpanContext::new(
            TraceId::from_bytes([3; 16]),
            SpanId::from_bytes([2; 8]),
            TraceFlags::default(),
            true,
            TraceState::NONE,
        );
        let batch = |number, callbacks, position| WriteBatch { number, callbacks, position };
        trace.group_write(batch(7, 3, 0), &unsampled, now);
        trace.group_write(batch(7, 3, 1), &context(1), now);
        let write = gathered();
        assert_eq!((write.decisions, write.links.len()), (2, 1), "links only the sampled decision");
        let span = trace.group_write_span(write).expect("it links a sampled decision");
        assert!(span.span_context().is_sampled(), "kept although tracing.sampling = 0");
        trace.group_write(batch(8, 2, 0), &unsampled, now);
        assert!(trace.group_write_span(gathered()).is_none(), "no sampled decision: nothing to find it from");
    }

    fn recovered_xid(n: u64) -> Xid {
        Xid::decree(Origin { node: 1, incarnation: 1, session: 2, sequence: n })
    }

    /// Five recovered contexts (`DCD2`), as a log read at open hands them over.
    fn logged_five() -> HashMap<Xid, TraceContext> {
        (0..5u64)
            .map(|n| {
                (recovered_xid(n), TraceContext { trace_id: [n as u8 + 1; 16], span_id: [9; 8], flags: 1 })
            })
            .collect()
    }

    #[test]
    fn every_recovered_context_stays_linked_past_the_recent_requests_bound() {
        let mut known = KnownContexts::new(1);
        known.remember_recovered(&logged_five());
        // Requests after the open fill the bounded map past its bound of one.
        for n in 100..110 {
            known.recent.insert(recovered_xid(n), context(n));
        }
        for n in 0..5u64 {
            let sc = known.get(&recovered_xid(n)).expect("a recovered context is never pushed out");
            assert_eq!(sc.trace_id(), TraceId::from_bytes([n as u8 + 1; 16]));
        }
        assert!(known.get(&recovered_xid(109)).is_some() && known.get(&recovered_xid(100)).is_none());
    }

    #[test]
    fn a_recovered_context_leaves_when_its_transaction_is_finished() {
        let config = TracingConfig { xid_contexts_max: 1, ..TracingConfig::to("http://127.0.0.1:9") };
        let trace = ServerTrace::start(&config, 1, None, 1).expect("an exporter (nothing is exported)");
        trace.remember_logged(&logged_five());
        assert!((0..5).all(|n| trace.log_scope_of(&recovered_xid(n)).is_some()), "all five linked");
        trace.forget(&recovered_xid(3));
        assert!(trace.log_scope_of(&recovered_xid(3)).is_none());
        let known = trace.contexts.lock();
        assert_eq!(known.recovered.len(), 4, "memory follows the live recovered decisions");
        assert!(known.recovered.len() <= known.recovered_max);
    }
}
