//! The embedded coordinator's recovery emits the spans a state server's does: a
//! `decree.recovery.pass` span per pass that finished something, with a child per branch
//! (`commit {rm}`, `rollback (presumed abort)`) carrying the Xid, linked to the client's
//! span that a `DCD2` decision record kept, and the phase two of such a decision logs
//! inside that client's trace. A live session's phase two handed to the background thread
//! (a branch's commit or rollback failed) is linked to that session's transaction span the
//! same way.
//!
//! The bugs guarded against: an embedded coordinator read the recovered contexts and
//! dropped them, so that its recovery, unlike a state server's, was invisible in traces;
//! and a session's failed phase two, finished in the background, was cut from its trace.
//!
//! Spans go to OpenTelemetry's global provider, which is process-wide: this file is its
//! own test binary, installs an SDK provider over an exporter that keeps what it is given,
//! and runs its tests one at a time.

mod common;

use common::*;
use decree_core::testing::dummy::{BranchOutcome, Call, DummyFactory, FaultAction, FaultRule};
use decree_core::testing::log_lines::lines_of;
use decree_core::testing::restartable::RestartableLog;
use decree_core::trace::{self, XID_ATTRIBUTE};
use decree_core::{
    BranchRecord, CommitKind, Decision, DecisionStore, LogDecisions, Origin, ResourceManager, RmFactory,
    TraceContext, TransactionManager, TxContext, Xid,
};
use decree_log::engine::volatile::VolatileLog;
use decree_log::Log;
use opentelemetry::trace::{SpanId, TraceId};
use opentelemetry::Value;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SimpleSpanProcessor, SpanData, SpanExporter};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(10);
const NODE: u32 = 7;

/// The client's span that the decision records keep (sampled).
const CLIENT: TraceContext = TraceContext { trace_id: [0xab; 16], span_id: [0xcd; 8], flags: 1 };

/// Every span ended in this process, as the global provider exported it.
#[derive(Debug, Clone, Default)]
struct Collected(Arc<Mutex<Vec<SpanData>>>);

impl SpanExporter for Collected {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        self.0.lock().expect("the span list").extend(batch);
        std::future::ready(Ok(()))
    }
}

/// The spans exported so far, with spans on and the collecting provider installed (once).
fn collected() -> &'static Collected {
    static COLLECTED: OnceLock<Collected> = OnceLock::new();
    COLLECTED.get_or_init(|| {
        let collected = Collected::default();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(SimpleSpanProcessor::new(collected.clone()))
            .build();
        opentelemetry::global::set_tracer_provider(provider);
        trace::enable();
        collected
    })
}

/// Holds the other tests of this file off while one runs (they share the provider).
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The exported spans whose Xid attribute names `xid`'s transaction.
fn spans_of(xid: &Xid) -> Vec<SpanData> {
    let wanted = Value::from(xid.global().to_string());
    let spans = collected().0.lock().expect("the span list");
    spans
        .iter()
        .filter(|s| s.attributes.iter().any(|kv| kv.key.as_str() == XID_ATTRIBUTE && kv.value == wanted))
        .cloned()
        .collect()
}

/// The exported recovery pass span that is `span`'s parent.
fn pass_of(span: &SpanData) -> Option<SpanData> {
    let spans = collected().0.lock().expect("the span list");
    spans
        .iter()
        .find(|s| {
            s.name == "decree.recovery.pass"
                && s.span_context.span_id() == span.parent_span_id
                && s.span_context.trace_id() == span.span_context.trace_id()
        })
        .cloned()
}

/// [`pass_of`], waiting for it: a background pass ends its span after its last job, a
/// little after the coordinator says it is idle.
fn pass_of_within(span: &SpanData, wait: Duration) -> Option<SpanData> {
    let deadline = Instant::now() + wait;
    loop {
        let pass = pass_of(span);
        if pass.is_some() || Instant::now() >= deadline {
            return pass;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// First life: a transaction on `rm` prepared and decided with the client's sampled span
/// (`DCD2`), then the process dies before phase two. Returns its Xid and the next life's log.
fn decided_before_a_crash(rm: &DummyFactory, sequence: u64) -> (Xid, Arc<RestartableLog>) {
    let first = Arc::new(RestartableLog::default());
    let store = LogDecisions::new(first.clone(), NODE);
    let xid = Xid::decree(Origin { node: NODE, incarnation: store.incarnation(), session: 1, sequence });
    rm.connection().prepare(&xid.branch(0)).expect("prepared");
    let decision = Decision { xid, branches: vec![BranchRecord { rm: rm.name().to_string(), branch: 0 }] };
    store.decide_traced(&decision, Some(&CLIENT)).expect("decided");
    (xid, first.restart())
}

/// Asserts that `span` is a recovery span of branch 0 linked to the client's span, the
/// child of a recovery pass.
fn assert_linked_recovery_branch(span: &SpanData) {
    assert_linked_to(span, &CLIENT);
}

/// Asserts that `span` is linked to `client`'s span only, and the child of a recovery pass.
fn assert_linked_to(span: &SpanData, client: &TraceContext) {
    let links: Vec<TraceId> = span.links.iter().map(|l| l.span_context.trace_id()).collect();
    assert_eq!(links, vec![TraceId::from_bytes(client.trace_id)], "linked to the client's span");
    assert_eq!(span.links[0].span_context.span_id(), SpanId::from_bytes(client.span_id));
    let pass = pass_of_within(span, WAIT);
    assert!(pass.is_some(), "{:?} is the child of a decree.recovery.pass span", span.name);
}

/// The wire context of `xid`'s `decree.transaction` span, as the session exported it.
fn transaction_span(xid: &Xid) -> TraceContext {
    let spans = spans_of(xid);
    let span = spans.iter().find(|s| s.name == "decree.transaction").expect("the transaction's span");
    TraceContext::from_span_context(&span.span_context).expect("a valid context")
}

/// The span named `name` of `xid` that a recovery pass emitted (waiting for it: the
/// pass exports its spans a little after the coordinator says it is idle).
fn background_span(xid: &Xid, name: &str) -> SpanData {
    let deadline = Instant::now() + WAIT;
    loop {
        let found = spans_of(xid).into_iter().find(|s| s.name == name && pass_of(s).is_some());
        match found {
            Some(span) => return span,
            None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            None => panic!("no {name:?} span from a recovery pass for {xid}: {:?}", spans_of(xid)),
        }
    }
}

#[test]
fn start_up_recovery_commits_a_dcd2_decision_in_a_span_linked_to_its_client() {
    let _serial = one_at_a_time();
    collected();
    let rm = dummy("a");
    let (xid, log) = decided_before_a_crash(&rm, 1);
    let tm = TransactionManager::embedded(log, quick_config(), vec![rm.arc()]).expect("started");
    assert_eq!(tm.recovery_report().branches_committed, 1);
    assert_eq!(rm.outcome(&xid.branch(0)), Some(BranchOutcome::Committed));
    let spans = spans_of(&xid);
    let commit = spans.iter().find(|s| s.name == "commit a").expect("a commit span for the branch");
    assert_linked_recovery_branch(commit);
    assert_eq!(tm.client_contexts(), 0, "the context left with its completed decision");
}

#[test]
fn a_presumed_abort_rollback_gets_its_span() {
    let _serial = one_at_a_time();
    collected();
    let rm = dummy("a");
    let log = Arc::new(VolatileLog::new());
    let dead =
        Xid::decree(Origin { node: NODE, incarnation: log.incarnation() - 1, session: 3, sequence: 9 });
    rm.connection().prepare(&dead.branch(0)).expect("prepared");
    let tm = TransactionManager::embedded(log, quick_config(), vec![rm.arc()]).expect("started");
    assert_eq!(tm.recovery_report().branches_rolled_back, 1);
    let spans = spans_of(&dead);
    let rollback =
        spans.iter().find(|s| s.name == "rollback (presumed abort)").expect("a span for the presumed abort");
    assert!(rollback.links.is_empty(), "no decision, so no client's span known: {:?}", rollback.links);
    let pass = pass_of(rollback).expect("the child of a decree.recovery.pass span");
    assert_ne!(pass.span_context.trace_id(), TraceId::from_bytes(CLIENT.trace_id), "a trace of its own");
}

#[test]
fn a_background_pass_commits_in_a_linked_span_and_its_retries_log_in_the_clients_trace() {
    let _serial = one_at_a_time();
    collected();
    let rm = dummy("b");
    let (xid, log) = decided_before_a_crash(&rm, 2);
    rm.set_rules(vec![FaultRule::first(Call::Commit, FaultAction::Fail, 1)]);
    let (tm, lines) = lines_of(|| TransactionManager::embedded(log, quick_config(), vec![rm.arc()]));
    let tm = tm.expect("started");
    assert_eq!(tm.recovery_report().deferred, 1, "the first commit failed: retried in the background");
    let failed = lines.lines().find(|l| l.contains("phase two failed")).unwrap_or("");
    assert!(failed.contains(&format!("trace_id={}", CLIENT.trace_id_hex())), "{lines}");
    assert!(tm.wait_idle(WAIT));
    assert_eq!(rm.outcome(&xid.branch(0)), Some(BranchOutcome::Committed));
    let spans = spans_of(&xid);
    let commit = spans.iter().find(|s| s.name == "commit b").expect("a commit span from the background");
    // Linked: the context was kept past the start-up pass, until the decision completed.
    assert_linked_recovery_branch(commit);
    assert_eq!(tm.client_contexts(), 0, "the context left with its completed decision");
}

/// A fresh embedded coordinator over `a` and `b`, and a transaction begun on both.
fn begun_on(a: &DummyFactory, b: &DummyFactory) -> (Arc<TransactionManager>, TxContext, Xid) {
    let tm =
        TransactionManager::embedded(Arc::new(VolatileLog::new()), quick_config(), vec![a.arc(), b.arc()])
            .expect("started");
    let conns: Vec<Box<dyn ResourceManager>> = vec![Box::new(a.connection()), Box::new(b.connection())];
    let mut tx = TxContext::open(&tm, conns).expect("opened");
    let xid = tx.begin().expect("begun");
    (tm, tx, xid)
}

#[test]
fn a_live_commit_finished_in_the_background_is_linked_to_its_transaction() {
    let _serial = one_at_a_time();
    collected();
    let (a, b) = (dummy("la"), dummy("lb"));
    // The session's commit of b fails, and so does the background's first try.
    b.set_rules(vec![FaultRule::first(Call::Commit, FaultAction::Fail, 2)]);
    let (tm, mut tx, xid) = begun_on(&a, &b);
    let report = tx.commit().expect("committed");
    assert_eq!(
        (report.kind, report.phase_two_pending),
        (CommitKind::TwoPhase, 1),
        "b's commit was handed over"
    );
    assert!(tm.wait_idle(WAIT), "the background commit ended");
    assert_eq!(b.outcome(&xid.branch(1)), Some(BranchOutcome::Committed));
    // Linked though the background's first try failed too: kept until the commit ended.
    let commit = background_span(&xid, "commit lb");
    assert_linked_to(&commit, &transaction_span(&xid));
    assert_eq!(tm.client_contexts(), 0, "the context left once the background commit completed");
    tx.close().expect("closed");
}

#[test]
fn a_live_rollback_finished_in_the_background_is_linked_to_its_transaction() {
    let _serial = one_at_a_time();
    collected();
    let (a, b) = (dummy("ra"), dummy("rb"));
    // a votes no, so the transaction rolls back; b's first rollback fails.
    a.set_rules(vec![FaultRule::first(Call::Prepare, FaultAction::VoteNo, 1)]);
    b.set_rules(vec![FaultRule::first(Call::Rollback, FaultAction::Fail, 1)]);
    let (tm, mut tx, xid) = begun_on(&a, &b);
    assert!(tx.commit().is_err(), "a voted no: rolled back");
    assert!(tm.wait_idle(WAIT), "the background rollback ended");
    assert_eq!(b.outcome(&xid.branch(1)), Some(BranchOutcome::RolledBack));
    let rollback = background_span(&xid, "rollback rb");
    assert_linked_to(&rollback, &transaction_span(&xid));
    assert_eq!(tm.client_contexts(), 0, "the context left once the background rollback ended");
    tx.close().expect("closed");
}
