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

use crate::rules::Remembered;
use crate::state::{LiveDecision, State};
use decree_core::protocol::{self, PhaseTwoStep};
use decree_core::{ResourceManager, RmFactory};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// First retry delay after a failure.
const BACKOFF_MIN: Duration = Duration::from_millis(50);
/// Longest retry delay.
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Longest idle wait (a pass runs at least this often while branches may be pending).
const IDLE_WAIT: Duration = Duration::from_secs(60);

/// Runs passes until `stop` is set; call from a dedicated thread.
pub(crate) fn worker(state: Arc<State>, stop: Arc<AtomicBool>) {
    let mut backoff = BACKOFF_MIN;
    let mut wait = Duration::ZERO; // a first pass at start replays recovered decisions.
    loop {
        if !wait.is_zero() {
            state.wait_for_work(wait);
        }
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let clean = pass(&state, &stop);
        state.first_pass_ended();
        if clean {
            backoff = BACKOFF_MIN;
            wait = IDLE_WAIT;
        } else {
            wait = backoff;
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
