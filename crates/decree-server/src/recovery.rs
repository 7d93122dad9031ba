//! The recovery worker: finishes the phase two of decided transactions whose client is
//! gone, and rolls back prepared branches that have no decision and no live owner.
//!
//! It is one dedicated thread (resource-manager calls block), so finishing and the
//! presumed-abort pass never run at the same time: a pass that lists a branch of a
//! transaction being finished cannot roll it back halfway. It never rolls back a branch
//! whose owner may still decide: [`State::owner_is_gone`] is checked before
//! [`State::is_decided`], and a session leaves `live` only after its decisions moved to
//! the orphans (see `state.rs`). Failures (an RM down) are retried with a doubling backoff;
//! the transaction stays in the log meanwhile.
//!
//! When it passes is the `[recovery]` configuration: at start, when a session closes, at
//! the rechecks each close asks for (`recheck.rs`: a `PREPARE` the dead client sent may
//! land in the database after the close's own pass), and at least every
//! `periodic_pass_ms`. Every pass is the same whole pass, whatever asked for it.

use crate::rules::Remembered;
use crate::state::{LiveDecision, State};
use decree_core::protocol::{self, PhaseTwoStep};
use decree_core::{ResourceManager, RmFactory};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// First retry delay after a failure.
const BACKOFF_MIN: Duration = Duration::from_millis(50);
/// Longest retry delay.
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Runs passes until `stop` is set; call from a dedicated thread. A pass runs at start (it
/// replays recovered decisions), when woken (a session closed, an orphan appeared), when a
/// recheck after a close is due, and at the latest `recovery.periodic_pass_ms` after the
/// previous clean pass; after a failed pass, with a doubling backoff instead.
pub(crate) fn worker(state: Arc<State>, stop: Arc<AtomicBool>) {
    let periodic = state.recovery.periodic_pass();
    let mut backoff = BACKOFF_MIN;
    let mut next_pass = Instant::now();
    loop {
        let due = state.next_recheck().map_or(next_pass, |recheck| recheck.min(next_pass));
        let now = Instant::now();
        if due > now && !state.wait_for_work(due - now) && Instant::now() < due {
            continue; // the timer ended a little early: nothing is due yet.
        }
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let started = Instant::now();
        let clean = pass(&state, &stop);
        state.pass_ended(started);
        if clean {
            backoff = BACKOFF_MIN;
            next_pass = Instant::now() + periodic;
        } else {
            next_pass = Instant::now() + backoff;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }
}

/// One pass: finish the orphans, then roll back abandoned prepared branches. Returns
/// whether everything that could be done was done (no retry needed).
pub(crate) fn pass(state: &State, stop: &AtomicBool) -> bool {
    let mut connections: HashMap<String, Box<dyn ResourceManager>> = HashMap::new();
    let mut clean = true;
    for orphan in state.orphans() {
        if stop.load(Ordering::SeqCst) {
            return false;
        }
        if finish(state, &orphan, &mut connections) {
            state.complete_orphan(&orphan.decision.xid);
        } else {
            clean = false;
        }
    }
    for factory in &state.factories {
        if stop.load(Ordering::SeqCst) {
            return false;
        }
        if !roll_back_abandoned(state, factory.as_ref(), &mut connections) {
            clean = false;
        }
    }
    clean
}

/// Commits every branch named in `orphan`'s decision; true when all are done. A branch
/// that decided on its own makes the transaction's outcome heuristic.
fn finish(
    state: &State,
    orphan: &LiveDecision,
    connections: &mut HashMap<String, Box<dyn ResourceManager>>,
) -> bool {
    let decision = &orphan.decision;
    let mut done = true;
    for branch in &decision.branches {
        let Some(rm) = connection(state, &branch.rm, connections) else {
            done = false;
            continue;
        };
        let xid = decision.xid.branch(branch.branch);
        let result = rm.commit(&xid, false);
        // What an answer means is decree-core's rule, the same as a client's phase two.
        match protocol::phase_two_step(&result, true) {
            PhaseTwoStep::Done => {
                if result.is_ok() {
                    state.metrics.phase_two_commits.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(%xid, rm = %branch.rm, "committed branch of a finished session");
                } // else already committed (by the client or an earlier pass)
            }
            PhaseTwoStep::Heuristic(outcome) => {
                tracing::error!(%xid, rm = %branch.rm, ?outcome, error = ?result, "heuristic outcome on commit; forgetting it");
                state.orphan_heuristic(&xid, outcome);
                let _ = rm.forget(&xid);
            }
            PhaseTwoStep::Retry => {
                tracing::warn!(%xid, rm = %branch.rm, error = ?result, "phase two failed; will retry");
                connections.remove(&branch.rm);
                done = false;
            }
        }
    }
    done
}

/// Rolls back this node's prepared branches that have no decision and no live owner.
fn roll_back_abandoned(
    state: &State,
    factory: &dyn RmFactory,
    connections: &mut HashMap<String, Box<dyn ResourceManager>>,
) -> bool {
    let name = factory.name().to_string();
    let Some(rm) = connection(state, &name, connections) else {
        return false;
    };
    let prepared = match rm.recover() {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(rm = %name, error = %e, "cannot list prepared branches; will retry");
            connections.remove(&name);
            return false;
        }
    };
    let mut clean = true;
    for xid in prepared {
        let Some(origin) = xid.origin() else { continue };
        // Liveness first: once the owner is seen gone, all its decisions are visible. A
        // decision whose write failed in this run is in doubt: left for a restart.
        if !state.owner_is_gone(&origin) || state.is_decided(&xid) {
            continue;
        }
        let result = rm.rollback(&xid);
        match protocol::phase_two_step(&result, false) {
            PhaseTwoStep::Done => {
                state.metrics.recovery_rollbacks.fetch_add(1, Ordering::Relaxed);
                if state.remembered(&xid).is_none() {
                    state.remember(&xid, Remembered::RolledBack, Box::new(|_| {}));
                }
                tracing::info!(%xid, rm = %name, "rolled back a prepared branch without decision");
            }
            PhaseTwoStep::Heuristic(outcome) => {
                state.metrics.heuristics.fetch_add(1, Ordering::Relaxed);
                tracing::error!(%xid, rm = %name, ?outcome, "heuristic outcome on a presumed-abort rollback");
                state.remember(&xid, Remembered::Heuristic(outcome), Box::new(|_| {}));
                let _ = rm.forget(&xid);
            }
            PhaseTwoStep::Retry => {
                tracing::warn!(%xid, rm = %name, error = ?result, "rollback failed; will retry");
                clean = false;
            }
        }
    }
    clean
}

/// A connection to the RM named `name`, made on first use within a pass.
fn connection<'a>(
    state: &State,
    name: &str,
    connections: &'a mut HashMap<String, Box<dyn ResourceManager>>,
) -> Option<&'a mut Box<dyn ResourceManager>> {
    if !connections.contains_key(name) {
        let Some(factory) = state.factories.iter().find(|f| f.name() == name) else {
            tracing::warn!(rm = %name, "a decision names a resource manager that is not configured");
            return None;
        };
        match factory.connect() {
            Ok(rm) => {
                connections.insert(name.to_string(), rm);
            }
            Err(e) => {
                tracing::warn!(rm = %name, error = %e, "cannot connect; will retry");
                return None;
            }
        }
    }
    connections.get_mut(name)
}
