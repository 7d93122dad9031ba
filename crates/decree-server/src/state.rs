//! What the server knows about transactions: live sessions, their decided-but-unfinished
//! transactions, orphans (decided, owner gone) and recently finished ones.
//!
//! A decided transaction moves only forward: a live session's `decided` map, then (when
//! its connection closes) `orphans`, then (once every branch is committed and the log has
//! its completion) `finished`. Each move inserts into the next set before removing from
//! the previous one, and [`State::outcome`] looks in the same order, so a concurrent
//! outcome query can never miss a decided transaction while it moves. A session is removed
//! from `live` only after its decisions were moved to `orphans`, so whoever sees a session
//! dead sees all its decisions: the recovery pass relies on this to never roll back a
//! branch that has a decision.

use crate::config::Limits;
use crate::metrics::Metrics;
use decree_core::{Decision, Origin, Outcome, RmFactory, Xid};
use decree_log::Log;
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The decided-but-not-completed transactions of one live session, by sequence number.
#[derive(Default)]
pub(crate) struct SessionTxns {
    pub(crate) decided: Mutex<HashMap<u64, Decision>>,
}

/// A bounded memory of finished transactions, oldest forgotten first.
struct Finished {
    set: HashSet<Origin>,
    order: VecDeque<Origin>,
    max: usize,
}

impl Finished {
    fn insert(&mut self, origin: Origin) {
        if self.max == 0 || !self.set.insert(origin) {
            return;
        }
        self.order.push_back(origin);
        while self.order.len() > self.max {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }
}

/// The shared state of one server run.
pub(crate) struct State {
    pub(crate) log: Box<dyn Log>,
    pub(crate) node: u32,
    pub(crate) incarnation: u64,
    pub(crate) limits: Limits,
    pub(crate) factories: Vec<Arc<dyn RmFactory>>,
    pub(crate) metrics: Metrics,
    next_session: AtomicU64,
    live: Mutex<HashMap<u64, Arc<SessionTxns>>>,
    orphans: Mutex<HashMap<Xid, Decision>>,
    finished: Mutex<Finished>,
    /// Set when the recovery worker has work (a session closed, an orphan appeared).
    wake: Mutex<bool>,
    wake_signal: Condvar,
}

impl State {
    pub(crate) fn new(
        log: Box<dyn Log>,
        node: u32,
        limits: Limits,
        factories: Vec<Arc<dyn RmFactory>>,
    ) -> Self {
        let incarnation = log.incarnation();
        State {
            log,
            node,
            incarnation,
            limits,
            factories,
            metrics: Metrics::default(),
            next_session: AtomicU64::new(1),
            live: Mutex::new(HashMap::new()),
            orphans: Mutex::new(HashMap::new()),
            finished: Mutex::new(Finished {
                set: HashSet::new(),
                order: VecDeque::new(),
                max: limits.outcomes_remembered_max as usize,
            }),
            wake: Mutex::new(false),
            wake_signal: Condvar::new(),
        }
    }

    /// Registers a new live session and returns its id.
    pub(crate) fn open_session(&self) -> (u64, Arc<SessionTxns>) {
        let id = self.next_session.fetch_add(1, Ordering::SeqCst);
        let txns = Arc::new(SessionTxns::default());
        self.live.lock().insert(id, txns.clone());
        self.metrics.sessions_opened.fetch_add(1, Ordering::Relaxed);
        (id, txns)
    }

    /// Ends a session whose requests have all settled: its decided transactions become
    /// the server's to finish, its undecided ones are left to the recovery pass.
    pub(crate) fn close_session(&self, id: u64, txns: &SessionTxns) {
        let decided: Vec<Decision> = txns.decided.lock().drain().map(|(_, d)| d).collect();
        let handed_over = decided.len();
        if handed_over > 0 {
            let mut orphans = self.orphans.lock();
            for d in decided {
                orphans.insert(d.xid.global(), d);
            }
        }
        self.live.lock().remove(&id);
        self.metrics.sessions_closed.fetch_add(1, Ordering::Relaxed);
        if handed_over > 0 {
            tracing::info!(session = id, handed_over, "session closed with decided transactions to finish");
        }
        self.wake_recovery();
    }

    /// Adds decisions found in the log at start.
    pub(crate) fn add_orphan(&self, decision: Decision) {
        self.orphans.lock().insert(decision.xid.global(), decision);
    }

    /// A snapshot of the orphans (the recovery worker finishes them one by one).
    pub(crate) fn orphans(&self) -> Vec<Decision> {
        self.orphans.lock().values().cloned().collect()
    }

    /// Number of decided transactions whose owner is gone and that are not finished yet.
    pub(crate) fn in_doubt(&self) -> usize {
        self.orphans.lock().len()
    }

    /// Number of live sessions.
    pub(crate) fn live_sessions(&self) -> usize {
        self.live.lock().len()
    }

    /// Records that `xid` is finished: remembered for outcomes, forgotten by the log.
    /// `session` is the completing session's transactions when the request came from one.
    pub(crate) fn complete(&self, xid: &Xid, session: Option<(u64, &SessionTxns)>) -> Result<bool, String> {
        let global = xid.global();
        let origin = global.origin();
        // Remember before forgetting (under the lock of the set it leaves), see the module comment.
        let remember = |o: Option<Origin>| {
            if let Some(o) = o {
                self.finished.lock().insert(o);
            }
        };
        let mut found = false;
        if let (Some(o), Some((id, txns))) = (origin, session) {
            if o.node == self.node && o.incarnation == self.incarnation && o.session == id {
                let mut decided = txns.decided.lock();
                if decided.contains_key(&o.sequence) {
                    remember(origin);
                    decided.remove(&o.sequence);
                    found = true;
                }
            }
        }
        if !found {
            let mut orphans = self.orphans.lock();
            if orphans.contains_key(&global) {
                remember(origin);
                orphans.remove(&global);
                found = true;
            }
        }
        if found {
            self.log.complete(global.log_key()).map_err(|e| e.to_string())?;
            self.metrics.completes.fetch_add(1, Ordering::Relaxed);
        }
        Ok(found)
    }

    /// Whether `session` of the current incarnation is connected.
    pub(crate) fn is_live(&self, origin: &Origin) -> bool {
        origin.incarnation == self.incarnation && self.live.lock().contains_key(&origin.session)
    }

    /// Whether a decision record exists (or existed, within memory) for `xid`.
    pub(crate) fn is_decided(&self, xid: &Xid) -> bool {
        let global = xid.global();
        let origin = global.origin();
        if let Some(o) = origin {
            if o.node == self.node && o.incarnation == self.incarnation {
                let txns = self.live.lock().get(&o.session).cloned();
                if let Some(t) = txns {
                    if t.decided.lock().contains_key(&o.sequence) {
                        return true;
                    }
                }
            }
        }
        if self.orphans.lock().contains_key(&global) {
            return true;
        }
        origin.is_some_and(|o| self.finished.lock().set.contains(&o))
    }

    /// The answer to an `Outcome` request (see the module comment for why the order of
    /// the checks matters).
    pub(crate) fn outcome(&self, xid: &Xid) -> Outcome {
        if self.is_decided(xid) {
            return Outcome::Committed;
        }
        match xid.origin() {
            Some(o) if o.node == self.node && self.is_live(&o) => Outcome::InProgress,
            _ => Outcome::RolledBack,
        }
    }

    /// Whether a prepared branch without a decision may be rolled back: it is this node's
    /// and its session is gone (an older incarnation, or a closed connection).
    pub(crate) fn owner_is_gone(&self, origin: &Origin) -> bool {
        if origin.node != self.node {
            return false;
        }
        if origin.incarnation < self.incarnation {
            return true;
        }
        origin.incarnation == self.incarnation
            && origin.session < self.next_session.load(Ordering::SeqCst)
            && !self.live.lock().contains_key(&origin.session)
    }

    /// Asks the recovery worker for a pass.
    pub(crate) fn wake_recovery(&self) {
        *self.wake.lock() = true;
        self.wake_signal.notify_all();
    }

    /// Waits until woken or `timeout` passes; returns whether it was woken.
    pub(crate) fn wait_for_work(&self, timeout: std::time::Duration) -> bool {
        let mut woken = self.wake.lock();
        if !*woken {
            self.wake_signal.wait_for(&mut woken, timeout);
        }
        std::mem::replace(&mut *woken, false)
    }
}
