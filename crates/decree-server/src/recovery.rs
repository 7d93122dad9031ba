//! The recovery worker: finishes the phase two of decided transactions whose client is
//! gone, and rolls back prepared branches that have no decision and no live owner. It is
//! a thin user of decree-core's recovery engine (`decree_core::recovery`): the rules, the
//! connection cache and the backoff are the engine's; this module brings the state
//! server's liveness rule (a session's connection has closed), its decision lookup and its
//! books (the outcome memory and the metrics, through [`Books`]).
//!
//! It is one dedicated thread (resource-manager calls block), so finishing and the
//! presumed-abort pass never run at the same time: a pass that lists a branch of a
//! transaction being finished cannot roll it back halfway. It never rolls back a branch
//! whose owner may still decide: liveness is asked before the decision (the engine's
//! order), and a session leaves `live` only after its decisions moved to the orphans (see
//! `state.rs`). Failures (an RM down) are retried with the engine's server backoff; the
//! transaction stays in the log meanwhile.
//!
//! When it passes is the `[recovery]` configuration: at start, when a session closes, at
//! the rechecks each close asks for (`recheck.rs`: a `PREPARE` the dead client sent may
//! land in the database after the close's own pass), and at least every
//! `periodic_pass_ms`. Every pass is the same whole pass, whatever asked for it.

use crate::crash_points::{self, CrashPoint};
use crate::rules::Remembered;
use crate::state::State;
use crate::trace;
use decree_core::recovery::runtime::{self, ScanRules};
use decree_core::recovery::{Backoff, Connections, DecisionFact, PhaseTwo, Recorder};
use decree_core::{HeuristicOutcome, HeuristicReport, Origin, Xid};
use opentelemetry::trace::Span;
use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::Span as SdkSpan;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use std::time::SystemTime;

/// How long the worker waits before asking again whether it may call resource managers.
const FENCED_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// Runs passes until `stop` is set; call from a dedicated thread. A pass runs at start (it
/// replays recovered decisions), when woken (a session closed, an orphan appeared), when a
/// recheck after a close is due, and at the latest `recovery.periodic_pass_ms` after the
/// previous clean pass; after a failed pass, with the engine's backoff instead.
pub(crate) fn worker(state: Arc<State>, stop: Arc<AtomicBool>) {
    let periodic = state.recovery.periodic_pass();
    let mut backoff = None;
    let mut next_pass = Instant::now();
    loop {
        // Checked before every wait too: the stop's wake-up may have been taken by the
        // fenced wait below, and the next due time can be a second away (found by the
        // switchover test: a primary stopping with orphans waited for its next recheck).
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let due = state.next_recheck().map_or(next_pass, |recheck| recheck.min(next_pass));
        let now = Instant::now();
        if due > now && !state.wait_for_work(due - now) && Instant::now() < due {
            continue; // the timer ended a little early: nothing is due yet.
        }
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Some(clean) = leading_pass(&state, &stop) else {
            // Deposed by a newer epoch (the server is stopping), or the lease's fence is
            // closed (etcd away): touch nothing, and look again a little later, not at
            // once: the rechecks due stay due and would make this loop spin (found by the
            // etcd outage test: a deposed member at 99 % of a CPU).
            next_pass = Instant::now() + periodic;
            let _ = state.wait_for_work(FENCED_RETRY);
            continue;
        };
        if clean {
            backoff = None;
            next_pass = Instant::now() + periodic;
        } else {
            let delay = Backoff::SERVER.next(backoff);
            backoff = Some(delay);
            next_pass = Instant::now() + delay;
        }
    }
}

/// One pass, if this server may call resource managers (not once a newer epoch deposed
/// it: `None` then), marked as ended; whether it was clean. The worker runs it, and so
/// does the pair's simulator (`decree-sim`) on its own schedule.
pub(crate) fn leading_pass(state: &State, stop: &AtomicBool) -> Option<bool> {
    if !state.may_call_rms() {
        return None;
    }
    let started = Instant::now();
    let clean = pass(state, stop);
    state.pass_ended(started);
    Some(clean)
}

/// One pass: finish the orphans, then roll back abandoned prepared branches. Returns
/// whether everything that could be done was done (no retry needed).
pub(crate) fn pass(state: &State, stop: &AtomicBool) -> bool {
    let books = Books { state, span: Mutex::new(None), started: SystemTime::now() };
    let clean = pass_with(state, stop, &books);
    if let Some(mut span) = books.span.into_inner() {
        span.set_attribute(KeyValue::new("decree.recovery.clean", clean));
        trace::end(span, None);
    }
    clean
}

fn pass_with(state: &State, stop: &AtomicBool, books: &Books<'_>) -> bool {
    let mut connections = Connections::new(&state.factories);
    let mut clean = true;
    for orphan in state.orphans() {
        // Checked before each transaction: a member whose lease lapsed calls no resource
        // manager (issue 33's self-fencing).
        if stop.load(Ordering::SeqCst) || !state.fence_alive() {
            return false;
        }
        let decision = orphan.decision;
        // Its lines name its client's trace when the server holds that context.
        let scope = state.trace.as_ref().and_then(|t| t.log_scope_of(&decision.xid));
        let mut phase_two = PhaseTwo::new(decision.xid, true, decision.branches);
        clean &=
            trace::within(scope.as_ref(), || runtime::run_phase_two(&mut phase_two, &mut connections, books));
    }
    // A failed commit does not mean that listing fails: give every RM a fresh try.
    connections.forgive();
    let liveness = |origin: &Origin| state.owner_is_gone(origin);
    let role = state.pair_role();
    let decision = |xid: &Xid| {
        if !state.fence_alive() {
            // Before each branch: a member whose lease lapsed touches none.
            DecisionFact::InDoubt
        } else if state.is_decided(xid) {
            DecisionFact::Commit
        } else if !decree_pair::rules::may_presume_abort(role, state.is_doubtful(xid)) {
            // Written or sent and not confirmed, or this member no longer leads.
            DecisionFact::InDoubt
        } else {
            DecisionFact::Absent
        }
    };
    let rules = ScanRules { node: state.node, liveness: &liveness, decision: &decision };
    for rm in connections.names() {
        if stop.load(Ordering::SeqCst) || !state.fence_alive() {
            return false;
        }
        match runtime::scan(&rm, &mut connections, &rules, books) {
            Ok(counts) => clean &= counts.failed == 0,
            Err(e) => {
                tracing::warn!(%rm, error = %e, "cannot list prepared branches; will retry");
                connections.drop_connection(&rm);
                clean = false;
            }
        }
    }
    clean
}

/// The state server's books for the engine: completions finish orphans (the outcome is
/// remembered before the log records go), rollbacks and heuristics are remembered, and
/// the metrics count them.
/// With spans on, the pass's span holds one span per branch the pass finished; it is
/// started at the first such branch (with the pass's start time), so that the many passes
/// that finish nothing export nothing.
struct Books<'a> {
    state: &'a State,
    span: Mutex<Option<SdkSpan>>,
    started: SystemTime,
}

impl Recorder for Books<'_> {
    fn complete(&self, xid: &Xid, _heuristic: Option<HeuristicOutcome>) {
        // The heuristics of every pass were noted on the orphan as they came (`heuristic`).
        self.state.complete_orphan(xid);
    }

    fn rolled_back(&self, xid: &Xid, heuristic: Option<HeuristicOutcome>) {
        let state = self.state;
        if let Some(t) = &state.trace {
            let mut span = self.span.lock();
            let pass = span.get_or_insert_with(|| t.pass(self.started));
            t.recovered_branch(pass, xid, None, false);
        }
        // A heuristic was remembered, shipped and counted by `heuristic` before the branch
        // was forgotten.
        if heuristic.is_none() {
            state.metrics.recovery_rollbacks.fetch_add(1, Ordering::Relaxed);
            if state.remembered(xid).is_none() {
                state.remember(xid, Remembered::RolledBack, Box::new(|_| {}));
            }
        }
    }

    fn heuristic(&self, report: &HeuristicReport) -> bool {
        self.state.heuristic_kept(&report.xid, report.outcome)
    }

    fn calling(&self, xid: &Xid, _rm: &str) {
        crate::rm_calls::count(xid, self.state.node, self.state.incarnation);
    }

    /// A presumed abort has no decision record, but the server may still hold the client's
    /// context from an earlier traced request about that Xid (an `Outcome` question, say):
    /// its rollback's lines then carry that trace, as the rollback's span links to it.
    fn log_scope(&self, xid: &Xid) -> Option<tracing::Span> {
        self.state.trace.as_ref().and_then(|t| t.log_scope_of(xid))
    }

    fn branch_finished(&self, xid: &Xid, rm: &str, commit: bool) {
        if let Some(t) = &self.state.trace {
            let mut span = self.span.lock();
            let pass = span.get_or_insert_with(|| t.pass(self.started));
            t.recovered_branch(pass, xid, Some(rm), commit);
        }
        if commit {
            self.state.metrics.phase_two_commits.fetch_add(1, Ordering::Relaxed);
            tracing::info!(%xid, %rm, "committed branch of a finished session");
            crash_points::pass(CrashPoint::PhaseTwo, xid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use decree_core::testing::dummy::DummyFactory;
    use decree_core::{BranchRecord, Decision, RecoveredDecisions, ResourceManager, TraceContext};
    use decree_log::engine::volatile::VolatileLog;
    use decree_log::outcomes::OutcomeMemory;
    use decree_log::LiveRecord;

    const CONTEXT: TraceContext = TraceContext { trace_id: [0xab; 16], span_id: [0xcd; 8], flags: 1 };

    /// A server's state of incarnation 2 over `recovered`, spans on (sampling 0: the pass's
    /// own spans are dropped), with one dummy resource manager.
    fn traced_state(rm: &DummyFactory, recovered: RecoveredDecisions) -> State {
        let mut config = crate::ServerConfig::new("/nonexistent", decree_log::EngineKind::Volatile);
        let tracing = decree_otel::TracingConfig::to("http://127.0.0.1:9");
        config.tracing = Some(decree_otel::TracingConfig { sampling: 0.0, ..tracing });
        let outcomes = OutcomeMemory::volatile(config.limits.outcomes_remembered_max);
        State::new(Arc::new(VolatileLog::new()), outcomes, &config, vec![rm.arc()], recovered, 2)
    }

    #[test]
    fn recovery_forgets_a_recovered_context_once_it_finished_that_decision() {
        let rm = DummyFactory::named("a", 16);
        let xid = Xid::decree(Origin { node: 1, incarnation: 1, session: 1, sequence: 1 });
        rm.connection().prepare(&xid.branch(0)).expect("prepared");
        let decision = Decision { xid, branches: vec![BranchRecord { rm: "a".into(), branch: 0 }] };
        let record = LiveRecord { txn: 5, payload: decision.encode_logged(Some(&CONTEXT)) };
        let state = traced_state(&rm, RecoveredDecisions::from_records(vec![record]));
        let trace = state.trace.as_ref().expect("spans on");
        assert!(trace.log_scope_of(&xid).is_some(), "the log's context is known at open");
        assert!(pass(&state, &AtomicBool::new(false)), "a clean pass");
        assert_eq!(state.orphans().len(), 0, "the recovered decision is finished");
        assert!(trace.log_scope_of(&xid).is_none(), "its context left with it");
    }

    #[test]
    fn a_presumed_abort_logs_in_the_trace_of_an_earlier_request_about_its_xid() {
        let rm = DummyFactory::named("a", 16);
        let xid = Xid::decree(Origin { node: 1, incarnation: 1, session: 1, sequence: 1 });
        rm.connection().prepare(&xid.branch(0)).expect("prepared");
        let state = traced_state(&rm, RecoveredDecisions::default());
        let trace = state.trace.as_ref().expect("spans on");
        // A client asked about the transaction with its trace (its span goes to a port
        // where nothing listens).
        trace::end(trace.request("decree.server.outcome", &xid, Some(&CONTEXT)), None);
        let (_, lines) = decree_core::testing::log_lines::lines_of(|| {
            assert!(pass(&state, &AtomicBool::new(false)), "a clean pass")
        });
        let rolled = lines.lines().find(|l| l.contains("rolled back a prepared branch")).unwrap_or("");
        assert!(rolled.contains(&format!("trace_id={}", CONTEXT.trace_id_hex())), "{lines}");
    }
}
