//! The state server's OpenTelemetry spans (`[tracing]` in decree.toml; issue 36): the
//! decision with its log write (and, in a pair, the backup's confirmation as an event),
//! completions, one-phase notices and outcome answers, each a child of the client's span
//! when its request carried the trace-context field; recovery passes and the branches they
//! finish, linked to the client's span through the global Xid.
//!
//! Off unless configured: the server then holds `None` and every call site is one
//! `Option` check, with nothing allocated. On, spans go to this server's own provider
//! (decree-otel), whose resource names the node, the pair member and the epoch.
//!
//! The map from Xid to the client's span context ([`XidContexts`]) is bounded by
//! `tracing.xid_contexts_max` and forgets the oldest first: it never grows with history.
//! It lives in memory, so recovery after a restart, or by the other member of a pair after
//! a failover, has no link to give: its spans carry the Xid attribute only.

use decree_core::trace::{xid_attribute, TraceContext};
use decree_core::Xid;
use decree_otel::{Exporter, OtelError, TracingConfig};
use opentelemetry::trace::{Link, Span, SpanContext, SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SdkTracer, Span as SdkSpan};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::time::SystemTime;

/// The server's tracer, its exporter and the Xid map.
pub(crate) struct ServerTrace {
    tracer: SdkTracer,
    contexts: Mutex<XidContexts>,
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
            contexts: Mutex::new(XidContexts::new(config.xid_contexts_max as usize)),
            _exporter: exporter,
        })
    }

    /// A span for a request about `xid`, a child of the client's context when it sent
    /// one (kept for recovery's links too).
    pub(crate) fn request(&self, name: &'static str, xid: &Xid, client: Option<&TraceContext>) -> SdkSpan {
        let parent = match client.and_then(TraceContext::to_span_context) {
            Some(sc) => {
                self.contexts.lock().insert(xid.global(), sc.clone());
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

    /// The span of the decision's log write, a child of `decide`, from `started` to now.
    pub(crate) fn log_write(&self, decide: &SdkSpan, xid: &Xid, started: SystemTime, error: Option<String>) {
        let parent = Context::new().with_remote_span_context(decide.span_context().clone());
        let mut span = self
            .tracer
            .span_builder("decree.log.write")
            .with_kind(SpanKind::Internal)
            .with_start_time(started)
            .with_attributes([xid_attribute(xid)])
            .start_with_context(&self.tracer, &parent);
        if let Some(error) = error {
            span.set_status(Status::error(error));
        }
        span.end();
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
            Some(sc) => vec![Link::with_context(sc.clone())],
            None => Vec::new(),
        };
        let operation = if commit { "commit" } else { "rollback" };
        let parent = Context::new().with_remote_span_context(pass.span_context().clone());
        let mut span = self
            .tracer
            .span_builder(match rm {
                Some(rm) => format!("{operation} {rm}"),
                None => format!("{operation} (presumed abort)"),
            })
            .with_kind(SpanKind::Client)
            .with_links(links)
            .with_attributes([
                xid_attribute(&global),
                KeyValue::new("db.operation.name", operation),
                KeyValue::new("decree.rm", rm.unwrap_or("").to_string()),
                KeyValue::new("decree.branch", i64::from(xid.branch_number().unwrap_or(0))),
                KeyValue::new("decree.recovery", true),
            ])
            .start_with_context(&self.tracer, &parent);
        span.end();
    }

    /// Forgets `xid`'s client context (its transaction is finished).
    pub(crate) fn forget(&self, xid: &Xid) {
        self.contexts.lock().remove(&xid.global());
    }
}

/// Ends a request span, failed with `error` when given.
pub(crate) fn end(mut span: SdkSpan, error: Option<String>) {
    if let Some(error) = error {
        span.set_status(Status::error(error));
    }
    span.end();
}

/// The trace id of a span in hex, for log lines and exemplars.
pub(crate) fn trace_id_hex(span: &SdkSpan) -> String {
    span.span_context().trace_id().to_string()
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
}
