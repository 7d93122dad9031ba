//! What the server knows about transactions: live sessions and their decided-but-unfinished
//! transactions, orphans (decided, owner gone), Xids whose decision write failed, and the
//! durable memory of finished outcomes.
//!
//! A decided transaction moves only forward: a live session's `decided` map, then (when
//! its connection closes) `orphans`, then (once every branch is finished) the outcome
//! memory; its log record is completed only after its outcome entry is durable, so a
//! restart finds either the decision or the outcome. Each move inserts into the next set
//! before removing from the previous one, and [`State::facts`] looks in the same order,
//! after it has read the owner's liveness, so a concurrent outcome query never misses a
//! decided transaction while it moves. A session is removed from `live` only after its
//! decisions were moved to `orphans` (and after every decide it sent was answered), so
//! whoever sees a session closed sees all its decisions: the recovery pass and the
//! "rolled back" answer rely on this.

use crate::config::{Limits, RecoveryConfig};
use crate::live_set;
use crate::metrics::Metrics;
use crate::recheck::RecheckSchedule;
use crate::rules::{self, Facts, Owner, Remembered};
use decree_core::{
    Decision, HeuristicOutcome, KeyAllocator, Origin, Outcome, RecoveredDecisions, RmFactory, Xid,
};
use decree_log::outcomes::OutcomeMemory;
use decree_log::Log;
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest a recovery pass waits for a heuristic outcome to be kept (durable, and in a
/// pair held by the backup) before it leaves the branch for the next pass.
pub(crate) const HEURISTIC_KEPT_WAIT: Duration = Duration::from_secs(10);

/// Xids whose decision write failed that are remembered one by one; past this, every
/// undecided Xid of this incarnation counts as doubtful (the log is fail-stop anyway).
pub(crate) const DOUBTFUL_MAX: usize = 65_536;

/// `OnePhase` marks one session holds (protocol version 3); past this the session is marked
/// overflowed instead, and after its close none of its undecided Xids is answered rolled
/// back (other sessions keep their answers).
pub(crate) const ONE_PHASE_MARKS_MAX: usize = 1024;

/// Xids and sessions of closed sessions remembered as "a database may have committed it in
/// one phase"; past this, no closed session's undecided Xid of this incarnation is answered
/// rolled back (the answers become unknown, never false).
pub(crate) const CLOSED_UNKNOWN_MAX: usize = 65_536;

/// A decision that is durable in the log and not finished yet, with its log keys.
#[derive(Debug, Clone)]
pub(crate) struct LiveDecision {
    pub(crate) decision: Decision,
    /// The log keys its records were written under (one, unless it was decided again).
    pub(crate) keys: Vec<u64>,
    /// What branches finished so far decided on their own.
    pub(crate) heuristic: Option<HeuristicOutcome>,
    /// When this run decided it (or found it in the log at start): an in-doubt
    /// transaction's age is counted from here.
    pub(crate) decided_at: Instant,
}

impl LiveDecision {
    /// Adds a record of the same transaction written again (a repeated `Decide`).
    fn merge(&mut self, other: LiveDecision) {
        self.decision.join(other.decision);
        for k in other.keys {
            if !self.keys.contains(&k) {
                self.keys.push(k);
            }
        }
    }
}

/// The decided-but-not-completed transactions of one live session, by sequence number.
#[derive(Default)]
pub(crate) struct SessionTxns {
    pub(crate) decided: Mutex<HashMap<u64, LiveDecision>>,
    /// An outcome of this session was evicted from the memory: "not decided" is unproven.
    evicted: AtomicBool,
    /// Set by `close_session` under the `decided` lock once its decisions moved to the
    /// orphans: a pair's decision confirmed later goes to the orphans instead.
    pub(crate) closed: AtomicBool,
    /// The transactions this session said it commits in one phase (`OnePhase`), until its
    /// `Complete` for them.
    one_phase: Mutex<OnePhaseMarks>,
    /// The server closed the session without reading it to its end: a `OnePhase` may have
    /// been lost unread, so none of its undecided Xids may be answered rolled back.
    unread: AtomicBool,
}

/// The `OnePhase` marks of one session, by sequence number.
#[derive(Default)]
struct OnePhaseMarks {
    sequences: HashSet<u64>,
    /// More than `ONE_PHASE_MARKS_MAX` were marked at once: every undecided Xid counts.
    overflowed: bool,
}

/// What closed sessions left of their one-phase marks: the Xids, or whole sessions (marks
/// overflowed, or not read to the end).
#[derive(Default)]
struct ClosedUnknown {
    xids: HashSet<Xid>,
    sessions: HashSet<u64>,
    /// More than `CLOSED_UNKNOWN_MAX` entries: every closed session counts.
    overflowed: bool,
}

impl ClosedUnknown {
    fn room(&mut self) -> bool {
        if self.xids.len() + self.sessions.len() < CLOSED_UNKNOWN_MAX {
            return true;
        }
        if !self.overflowed {
            tracing::warn!(
                max = CLOSED_UNKNOWN_MAX,
                "too many one-phase marks of closed sessions: every undecided transaction of a closed session \
                 of this run is now answered unknown, not rolled back"
            );
        }
        self.overflowed = true;
        false
    }

    /// Keeps what a closing session leaves: its marked Xids, or the whole session.
    fn keep(&mut self, node: u32, incarnation: u64, session: u64, marks: OnePhaseMarks, unread: bool) {
        if marks.overflowed || unread {
            if self.room() {
                self.sessions.insert(session);
            }
            return;
        }
        for sequence in marks.sequences {
            if !self.room() {
                return;
            }
            self.xids.insert(Xid::decree(Origin { node, incarnation, session, sequence }));
        }
    }

    fn holds(&self, xid: &Xid, session: u64) -> bool {
        self.overflowed || self.sessions.contains(&session) || self.xids.contains(xid)
    }
}

/// Xids answered `LogFailed` in this run.
#[derive(Default)]
struct Doubtful {
    xids: HashSet<Xid>,
    /// More than `DOUBTFUL_MAX` failed: every undecided Xid of this incarnation is doubtful.
    overflowed: bool,
}

/// The shared state of one server run.
pub(crate) struct State {
    pub(crate) log: Arc<dyn Log>,
    pub(crate) outcomes: OutcomeMemory,
    pub(crate) node: u32,
    pub(crate) incarnation: u64,
    pub(crate) limits: Limits,
    /// When the recovery worker passes (periodic pass, rechecks after a close).
    pub(crate) recovery: RecoveryConfig,
    pub(crate) factories: Vec<Arc<dyn RmFactory>>,
    pub(crate) metrics: Metrics,
    keys: KeyAllocator,
    next_session: AtomicU64,
    live: Mutex<HashMap<u64, Arc<SessionTxns>>>,
    orphans: Mutex<HashMap<Xid, LiveDecision>>,
    doubtful: Mutex<Doubtful>,
    /// An outcome of this incarnation was evicted from the memory.
    incarnation_evicted: AtomicBool,
    /// The first recovery pass of this run has ended.
    first_pass_done: AtomicBool,
    /// The passes asked for after sessions closed, for `PREPARE`s that land late.
    rechecks: Mutex<RecheckSchedule>,
    /// Set when the recovery worker has work (a session closed, an orphan appeared).
    wake: Mutex<bool>,
    wake_signal: Condvar,
    /// The link to the backup, when this server leads a pair.
    pair: std::sync::OnceLock<Arc<crate::pair::PrimaryLink>>,
    /// Decisions durable here and not yet confirmed by the backup (a pair in strict
    /// mode): in doubt, never rolled back, never answered as decided.
    unconfirmed: Mutex<HashSet<Xid>>,
    /// Closed sessions' one-phase marks: never answered rolled back.
    closed_unknown: Mutex<ClosedUnknown>,
    /// Spans, when `[tracing]` is configured (`None`: off, nothing allocated).
    pub(crate) trace: Option<crate::trace::ServerTrace>,
    /// The member's lease under an election on etcd (always open without one).
    fence: std::sync::OnceLock<Arc<crate::fence::Fence>>,
}

impl State {
    /// The state of a run over `log` and `outcomes`, with the decisions `recovered` from
    /// the log at open as orphans to finish; no key of a recovered record (a decision or
    /// not) is handed out again.
    pub(crate) fn new(
        log: Arc<dyn Log>,
        outcomes: OutcomeMemory,
        config: &crate::config::ServerConfig,
        factories: Vec<Arc<dyn RmFactory>>,
        recovered: RecoveredDecisions,
        incarnation: u64,
    ) -> Self {
        let keys = KeyAllocator::new(recovered.all_keys());
        let mut record_keys = recovered.keys;
        let orphans: HashMap<Xid, LiveDecision> = recovered
            .decisions
            .into_iter()
            .map(|(xid, decision)| {
                let keys = record_keys.remove(&xid).unwrap_or_default();
                (xid, LiveDecision { decision, keys, heuristic: None, decided_at: Instant::now() })
            })
            .collect();
        let (node, limits, recovery) = (config.node, config.limits, config.recovery);
        let member = config.pair.as_ref().map(|p| p.member);
        let trace = config.tracing.as_ref().and_then(|tracing| {
            crate::trace::ServerTrace::start(tracing, node, member, incarnation)
                .inspect_err(
                    |e| tracing::error!(error = %e, "tracing not started; the server runs without spans"),
                )
                .ok()
        });
        // The client contexts the log kept: recovery's spans of these transactions link to them.
        if let Some(trace) = &trace {
            trace.remember_logged(&recovered.traces);
        }
        State {
            log,
            outcomes,
            node,
            incarnation,
            limits,
            recovery,
            factories,
            metrics: Metrics::default(),
            keys,
            next_session: AtomicU64::new(1),
            live: Mutex::new(HashMap::new()),
            orphans: Mutex::new(orphans),
            doubtful: Mutex::new(Doubtful::default()),
            incarnation_evicted: AtomicBool::new(false),
            first_pass_done: AtomicBool::new(false),
            rechecks: Mutex::new(RecheckSchedule::new(
                recovery.recheck_after_close(),
                recovery.rechecks_after_close,
            )),
            wake: Mutex::new(false),
            wake_signal: Condvar::new(),
            pair: std::sync::OnceLock::new(),
            unconfirmed: Mutex::new(HashSet::new()),
            closed_unknown: Mutex::new(ClosedUnknown::default()),
            trace,
            fence: std::sync::OnceLock::new(),
        }
    }

    /// Makes this state's acts (acknowledgements, `Outcome` answers, resource manager
    /// calls) wait for `fence`: the member's lease under an election on etcd.
    pub(crate) fn set_fence(&self, fence: Arc<crate::fence::Fence>) {
        assert!(self.fence.set(fence).is_ok(), "a state has one fence");
    }

    /// Whether this member's lease provably lives (always, without an election).
    pub(crate) fn fence_alive(&self) -> bool {
        self.fence.get().is_none_or(|f| f.alive())
    }

    /// The fence, when an election sets one.
    pub(crate) fn fence(&self) -> Option<&Arc<crate::fence::Fence>> {
        self.fence.get()
    }

    /// Makes this state the primary's of a pair: decisions wait for `link`'s confirmation.
    pub(crate) fn set_pair(&self, link: Arc<crate::pair::PrimaryLink>) {
        assert!(self.pair.set(link).is_ok(), "a state leads one pair link");
    }

    /// The pair link, when this server leads a pair.
    pub(crate) fn pair(&self) -> Option<&Arc<crate::pair::PrimaryLink>> {
        self.pair.get()
    }

    /// This server's role as the pair's rules see it: a single server leads, alone.
    pub(crate) fn pair_role(&self) -> decree_pair::Role {
        self.pair().map_or(decree_pair::Role::Primary { alone: true }, |link| link.role())
    }

    /// Whether this server may call resource managers (`rules::may_call_rms`): not once a
    /// newer epoch deposed it.
    pub(crate) fn may_call_rms(&self) -> bool {
        decree_pair::rules::may_call_rms(self.pair_role()) && self.fence_alive()
    }

    /// `xid`'s decision is durable here and waits for the backup's confirmation.
    pub(crate) fn unconfirm(&self, xid: &Xid) {
        self.unconfirmed.lock().insert(xid.global());
    }

    /// `xid`'s decision was confirmed (its session's `decided` or the orphans hold it).
    pub(crate) fn confirm(&self, xid: &Xid) {
        self.unconfirmed.lock().remove(&xid.global());
    }

    /// Records a decision confirmed by the backup: in its session's map, or among the
    /// orphans if the session closed meanwhile (the `closed` flag is read under the same
    /// lock `close_session` sets it under, so the decision is never left behind).
    pub(crate) fn decided_or_orphan(&self, txns: &SessionTxns, sequence: u64, decision: Decision, key: u64) {
        let decided = txns.decided.lock();
        if !txns.closed.load(Ordering::SeqCst) {
            drop(decided);
            return self.decided(txns, sequence, decision, key);
        }
        let live = LiveDecision { decision, keys: vec![key], heuristic: None, decided_at: Instant::now() };
        let mut orphans = self.orphans.lock();
        match orphans.get_mut(&live.decision.xid) {
            Some(existing) => existing.merge(live),
            None => {
                orphans.insert(live.decision.xid, live);
            }
        }
        drop(orphans);
        drop(decided);
        self.wake_recovery();
    }

    /// Every decision this server holds live (sessions' and orphans'): a pair's live set.
    /// The sessions are read before the orphans, the way `close_session` moves decisions
    /// (issue 32, defect 2; `live_set` holds that order, checked under loom); one moved
    /// between the two reads is read twice, which the caller removes.
    pub(crate) fn live_decisions(&self) -> Vec<Decision> {
        live_set::snapshot(&self.live, |t: &SessionTxns| &t.decided, &self.orphans, |d| d.decision.clone())
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
    /// the server's to finish, its undecided ones are left to the recovery pass, which
    /// runs now and again at the rechecks (a `PREPARE` of this session may still be
    /// running in a database and land after the first pass).
    pub(crate) fn close_session(&self, id: u64, txns: &SessionTxns) {
        // Into the orphans before out of the session (see the module comment).
        let handed_over = live_set::close(
            &self.live,
            id,
            &txns.decided,
            &self.orphans,
            |d| d.decision.xid,
            LiveDecision::merge,
            || txns.closed.store(true, Ordering::SeqCst),
            || {
                // What its one-phase marks say, before it leaves `live` (the outcome rule
                // reads the owner first): a marked Xid of a closed session is never answered
                // rolled back.
                let marks = std::mem::take(&mut *txns.one_phase.lock());
                let unread = txns.unread.load(Ordering::SeqCst);
                if unread || marks.overflowed || !marks.sequences.is_empty() {
                    self.closed_unknown.lock().keep(self.node, self.incarnation, id, marks, unread);
                }
            },
        );
        self.metrics.sessions_closed.fetch_add(1, Ordering::Relaxed);
        if handed_over > 0 {
            tracing::info!(session = id, handed_over, "session closed with decided transactions to finish");
        }
        // Asked for only once the session has left `live`: a recheck looks after it.
        self.rechecks.lock().after_close(Instant::now());
        self.wake_recovery();
    }

    /// A `OnePhase` of a live session (protocol version 3): `xid` may be committed by its
    /// database in one phase. Another session's Xid is ignored (false).
    pub(crate) fn mark_one_phase(&self, xid: &Xid, session: u64, txns: &SessionTxns) -> bool {
        let Some(o) = xid.global().origin() else { return false };
        if o.node != self.node || o.incarnation != self.incarnation || o.session != session {
            return false;
        }
        let mut marks = txns.one_phase.lock();
        if marks.sequences.len() < ONE_PHASE_MARKS_MAX {
            marks.sequences.insert(o.sequence);
        } else if !marks.overflowed {
            marks.overflowed = true;
            tracing::warn!(
                session,
                max = ONE_PHASE_MARKS_MAX,
                "a session marked too many one-phase commits without completing them: its undecided \
                 transactions will be answered unknown, not rolled back"
            );
        }
        true
    }

    /// The server closes `txns`' session without having read it to its end.
    pub(crate) fn closed_unread(&self, txns: &SessionTxns) {
        txns.unread.store(true, Ordering::SeqCst);
    }

    /// Whether a database may have committed `xid` in one phase (see [`Facts::one_phase`]).
    fn one_phase(&self, global: &Xid, origin: Option<Origin>) -> bool {
        let Some(o) = origin.filter(|o| o.node == self.node && o.incarnation == self.incarnation) else {
            return false;
        };
        if let Some(txns) = self.live.lock().get(&o.session).cloned() {
            let marks = txns.one_phase.lock();
            return marks.overflowed
                || marks.sequences.contains(&o.sequence)
                || txns.unread.load(Ordering::SeqCst);
        }
        self.closed_unknown.lock().holds(global, o.session)
    }

    /// A fresh log key for a decision of `session`'s transaction `sequence`: the key it
    /// already has if it was decided before (a repeated `Decide` joins its record).
    pub(crate) fn key_for(&self, txns: &SessionTxns, sequence: u64) -> u64 {
        match txns.decided.lock().get(&sequence) {
            Some(d) => d.keys[0],
            None => self.keys.next(),
        }
    }

    /// Records a decision of a live session that is now durable.
    pub(crate) fn decided(&self, txns: &SessionTxns, sequence: u64, decision: Decision, key: u64) {
        let live = LiveDecision { decision, keys: vec![key], heuristic: None, decided_at: Instant::now() };
        let mut decided = txns.decided.lock();
        match decided.get_mut(&sequence) {
            Some(existing) => existing.merge(live),
            None => {
                decided.insert(sequence, live);
            }
        }
    }

    /// Records that the write of `xid`'s decision failed: it may be on disk or not, so
    /// nothing may act on it or answer for it until a restart has read the log.
    pub(crate) fn doubt(&self, xid: &Xid) {
        let mut doubtful = self.doubtful.lock();
        if doubtful.xids.len() < DOUBTFUL_MAX {
            doubtful.xids.insert(xid.global());
        } else {
            doubtful.overflowed = true;
        }
    }

    /// Whether `xid`'s decision write failed in this run (or may have: past the limit).
    pub(crate) fn is_doubtful(&self, xid: &Xid) -> bool {
        if self.unconfirmed.lock().contains(&xid.global()) {
            return true;
        }
        let doubtful = self.doubtful.lock();
        if doubtful.xids.is_empty() && !doubtful.overflowed {
            return false;
        }
        let of_this_run =
            xid.origin().is_some_and(|o| o.node == self.node && o.incarnation == self.incarnation);
        doubtful.xids.contains(&xid.global()) || (doubtful.overflowed && of_this_run)
    }

    /// A snapshot of the orphans (the recovery worker finishes them one by one), in Xid
    /// order: the same in every run, whatever the hasher (a simulation's seed replays).
    pub(crate) fn orphans(&self) -> Vec<LiveDecision> {
        let mut orphans: Vec<LiveDecision> = self.orphans.lock().values().cloned().collect();
        orphans.sort_by_key(|o| o.decision.xid);
        orphans
    }

    /// Notes a heuristic outcome seen while finishing orphan `xid`, and remembers it at
    /// once (durably, lazily): a restart before the orphan is finished must not lose it.
    /// A branch of `xid` decided `outcome` on its own: remembered (with the other branches'
    /// heuristics, for an orphan), and true once that is durable here and, in a pair, held
    /// by the backup, waiting at most [`HEURISTIC_KEPT_WAIT`]: only then may its resource
    /// manager forget the branch (issue 32, defect 7). False leaves the branch to the next
    /// pass, whose call reports it again.
    pub(crate) fn heuristic_kept(&self, xid: &Xid, outcome: HeuristicOutcome) -> bool {
        let combined = {
            let mut orphans = self.orphans.lock();
            match orphans.get_mut(&xid.global()) {
                Some(o) => {
                    let combined = decree_core::protocol::combine_heuristic(o.heuristic, outcome);
                    o.heuristic = Some(combined);
                    combined
                }
                // A presumed-abort rollback's: the transaction has no other record.
                None => match self.remembered(xid) {
                    Some(Remembered::Heuristic(earlier)) => {
                        decree_core::protocol::combine_heuristic(Some(earlier), outcome)
                    }
                    _ => outcome,
                },
            }
        };
        // The same join of the two answers (durable here, held by the backup) as the kept
        // reply to a client's CompleteHeuristic.
        let (kept_tx, kept) = std::sync::mpsc::channel::<bool>();
        let (durable, held) = join_kept(Some(Box::new(move |kept| {
            let _ = kept_tx.send(kept);
        })));
        let durable: decree_log::DurableCallback = Box::new(move |result| durable.arrive(result.is_ok()));
        let remembered = self.remember_shipped(xid, Remembered::Heuristic(combined), durable, held, None);
        let kept = remembered && kept.recv_timeout(HEURISTIC_KEPT_WAIT).unwrap_or(false);
        // Counted once per branch: a report not kept comes again with the next pass.
        if kept {
            self.metrics.heuristics.fetch_add(1, Ordering::Relaxed);
        }
        kept
    }

    /// Number of decided transactions whose owner is gone and that are not finished yet.
    pub(crate) fn in_doubt(&self) -> usize {
        self.orphans.lock().len()
    }

    /// How long the oldest in-doubt transaction has waited since it was decided (or found
    /// in the log at start); zero when there is none. Walks the orphans: for scrapes only.
    pub(crate) fn in_doubt_oldest(&self) -> Duration {
        self.orphans.lock().values().map(|o| o.decided_at.elapsed()).max().unwrap_or_default()
    }

    /// Number of live sessions.
    pub(crate) fn live_sessions(&self) -> usize {
        self.live.lock().len()
    }

    /// A live session's `Complete` (or `CompleteHeuristic`): finishes `xid` if this
    /// session decided it, and remembers the heuristic of an undecided one it rolled back;
    /// anything else (another session's Xid, one the server is finishing, a plain
    /// `Complete` of one never decided) is ignored, since only the owner knows its phase
    /// two is done. Returns whether it was acted on.
    pub(crate) fn complete_own(
        &self,
        xid: &Xid,
        session: u64,
        txns: &SessionTxns,
        heuristic: Option<HeuristicOutcome>,
    ) -> bool {
        self.complete_own_kept(xid, session, txns, heuristic, None)
    }

    /// [`State::complete_own`], telling `kept` (when given) whether the heuristic outcome
    /// is kept for good: durable here and, in a pair, held by the backup (the kept reply of
    /// protocol version 3, after which the client's resource managers may forget the
    /// branches). Anything not acted on, or refused by the memory, is not kept.
    pub(crate) fn complete_own_kept(
        &self,
        xid: &Xid,
        session: u64,
        txns: &SessionTxns,
        heuristic: Option<HeuristicOutcome>,
        kept: Option<KeptCallback>,
    ) -> bool {
        let global = xid.global();
        let not_kept = |kept: Option<KeptCallback>| {
            if let Some(kept) = kept {
                kept(false);
            }
            false
        };
        let Some(o) = global.origin() else { return not_kept(kept) };
        if o.node != self.node || o.incarnation != self.incarnation || o.session != session {
            return not_kept(kept);
        }
        let mut decided = txns.decided.lock();
        let Some(live) = decided.get(&o.sequence) else {
            drop(decided);
            let marked = txns.one_phase.lock().sequences.contains(&o.sequence);
            if heuristic.is_none() && marked {
                return self.one_phase_committed(&global, o.sequence, txns);
            }
            // An undecided transaction of this session that it rolled back, or committed in
            // one phase, where a branch decided on its own: remembered, or "rolled back"
            // (or "committed") would be answered for it.
            let Some(h) = heuristic else { return not_kept(kept) };
            self.metrics.heuristics.fetch_add(1, Ordering::Relaxed);
            let (durable, held) = join_kept(kept);
            let durable: decree_log::DurableCallback = Box::new(move |result| durable.arrive(result.is_ok()));
            if !self.remember_shipped(&global, Remembered::Heuristic(h), durable, held, None) {
                return false;
            }
            if marked {
                txns.one_phase.lock().sequences.remove(&o.sequence);
            }
            return true;
        };
        let heuristic =
            heuristic.map(|h| decree_core::protocol::combine_heuristic(live.heuristic, h)).or(live.heuristic);
        let keys = live.keys.clone();
        // Remembered (visible) before it leaves the session's map; kept there if the
        // memory refused it (the server then finishes it after the session closes).
        if self.finish_kept(&global, keys, heuristic, kept) {
            decided.remove(&o.sequence);
        }
        true
    }

    /// A `Complete` for a transaction this session marked with `OnePhase`: its one-phase
    /// commit succeeded. Remembered committed (visible) before the mark goes; kept marked
    /// if the memory refused it, so that it is answered unknown, never rolled back.
    fn one_phase_committed(&self, global: &Xid, sequence: u64, txns: &SessionTxns) -> bool {
        if !self.remember(global, Remembered::Committed, Box::new(|_| {})) {
            return false;
        }
        txns.one_phase.lock().sequences.remove(&sequence);
        self.metrics.one_phase_completes.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// The server finished orphan `xid` itself (every branch done).
    pub(crate) fn complete_orphan(&self, xid: &Xid) {
        let global = xid.global();
        let mut orphans = self.orphans.lock();
        let Some(live) = orphans.get(&global) else { return };
        let (keys, heuristic) = (live.keys.clone(), live.heuristic);
        if self.finish(&global, keys, heuristic) {
            orphans.remove(&global);
            drop(orphans);
            // A recovered decision's client context goes with it: memory follows live decisions.
            if let Some(t) = &self.trace {
                t.forget(&global);
            }
        }
    }

    /// Remembers the outcome of a finished transaction and completes its log records once
    /// that memory is durable (if its flush fails, the decision stays live in the log and
    /// a restart answers from it). Returns false when the memory refused the entry (its
    /// queue is full, or it has failed): the caller keeps the decision live.
    fn finish(&self, global: &Xid, keys: Vec<u64>, heuristic: Option<HeuristicOutcome>) -> bool {
        self.finish_kept(global, keys, heuristic, None)
    }

    /// [`State::finish`], telling `kept` (when given) whether the outcome is kept for good.
    fn finish_kept(
        &self,
        global: &Xid,
        keys: Vec<u64>,
        heuristic: Option<HeuristicOutcome>,
        kept: Option<KeptCallback>,
    ) -> bool {
        let remembered = heuristic.map_or(Remembered::Committed, Remembered::Heuristic);
        let log = self.log.clone();
        let xid = *global;
        let pair = self.pair().cloned();
        let (durable, held) = join_kept(kept);
        // Set before the memory can flush (the outcome ships before it is remembered).
        let shipped = Arc::new(AtomicBool::new(false));
        let outcome_shipped = shipped.clone();
        let accepted = self.remember_shipped(
            global,
            remembered,
            Box::new(move |result| {
                let ok = result.is_ok();
                match result {
                    Ok(()) => {
                        for key in keys {
                            if let Err(e) = log.complete(key) {
                                tracing::error!(%xid, error = %e, "cannot record completion; the decision stays live");
                            }
                        }
                        if let Some(pair) = pair {
                            pair.ship_completion(&xid, outcome_shipped.load(Ordering::Acquire));
                        }
                    }
                    Err(e) => {
                        tracing::error!(%xid, error = %e, "outcome not durable; the decision stays live in the log")
                    }
                }
                durable.arrive(ok);
            }),
            held,
            Some(&shipped),
        );
        if accepted {
            self.metrics.completes.fetch_add(1, Ordering::Relaxed);
        }
        accepted
    }

    /// Remembers `outcome` for `xid` in the durable memory, noting whose memory an
    /// eviction forgot; false (logged) when the memory refused it.
    pub(crate) fn remember(
        &self,
        xid: &Xid,
        outcome: Remembered,
        durable: decree_log::DurableCallback,
    ) -> bool {
        self.remember_shipped(xid, outcome, durable, None, None)
    }

    /// [`State::remember`], and in a pair `held` runs once the backup holds the outcome too
    /// (at once on a primary alone, whose next live set carries it; never on a deposed one).
    /// `shipped` is set when the backup will get the outcome (always without a pair or with
    /// `held`, whose outcome waits for the backup): the completion follows it only then.
    fn remember_shipped(
        &self,
        xid: &Xid,
        outcome: Remembered,
        durable: decree_log::DurableCallback,
        held: Option<Box<dyn FnOnce() + Send>>,
        shipped: Option<&AtomicBool>,
    ) -> bool {
        let mut id = Vec::with_capacity(40);
        xid.global().encode(&mut id);
        // Shipped before it is remembered, so that `shipped` is known before the memory's
        // flush ships the completion (an outcome the memory then refuses is still true:
        // the backup holds it beside the decision, which stays live on both).
        let lazy = match (self.pair(), held.is_some()) {
            (Some(pair), false) => pair.ship_outcome(&xid.global(), outcome.to_byte()),
            _ => true,
        };
        if let Some(shipped) = shipped {
            shipped.store(lazy, Ordering::Release);
        }
        let evicted = match self.outcomes.remember(&id, outcome.to_byte(), durable) {
            Ok(evicted) => {
                match (self.pair(), held) {
                    (Some(pair), Some(held)) => {
                        pair.ship_outcome_held(&xid.global(), outcome.to_byte(), held)
                    }
                    (None, Some(held)) => held(),
                    (_, None) => {}
                }
                evicted
            }
            Err(e) => {
                tracing::error!(%xid, ?outcome, error = %e, "the outcome memory refused an entry");
                return false;
            }
        };
        let Some(evicted) = evicted else { return true };
        let Ok((old, _)) = Xid::decode(&evicted.id) else { return true };
        if let Some(o) = old.origin().filter(|o| o.node == self.node && o.incarnation == self.incarnation) {
            self.incarnation_evicted.store(true, Ordering::SeqCst);
            if let Some(txns) = self.live.lock().get(&o.session) {
                txns.evicted.store(true, Ordering::SeqCst);
            }
        }
        true
    }

    /// What the durable memory says of `xid`.
    pub(crate) fn remembered(&self, xid: &Xid) -> Option<Remembered> {
        let mut id = Vec::with_capacity(40);
        xid.global().encode(&mut id);
        self.outcomes.lookup(&id).and_then(Remembered::from_byte)
    }

    /// Who owns an Xid, as this run can tell.
    fn owner(&self, origin: Option<Origin>) -> Owner {
        let Some(o) = origin.filter(|o| o.node == self.node) else { return Owner::Foreign };
        if o.incarnation < self.incarnation {
            return Owner::Earlier;
        }
        if o.incarnation > self.incarnation || o.session == 0 {
            return Owner::NeverIssued;
        }
        if let Some(txns) = self.live.lock().get(&o.session) {
            return Owner::Live { evicted: txns.evicted.load(Ordering::SeqCst) };
        }
        if o.session < self.next_session.load(Ordering::SeqCst) {
            Owner::Closed
        } else {
            Owner::NeverIssued
        }
    }

    /// The live decision of `xid`, if any: its session's, else an orphan.
    fn live_decision(
        &self,
        global: &Xid,
        origin: Option<Origin>,
    ) -> Option<(bool, Option<HeuristicOutcome>)> {
        if let Some(o) = origin.filter(|o| o.node == self.node && o.incarnation == self.incarnation) {
            let txns = self.live.lock().get(&o.session).cloned();
            if let Some(t) = txns {
                if let Some(d) = t.decided.lock().get(&o.sequence) {
                    return Some((true, d.heuristic));
                }
            }
        }
        self.orphans.lock().get(global).map(|d| (true, d.heuristic))
    }

    /// The facts the outcome rule needs, read in the order transactions move (see the
    /// module comment): owner first, then the live decisions, then the memory.
    pub(crate) fn facts(&self, xid: &Xid) -> Facts {
        let global = xid.global();
        let origin = global.origin();
        let owner = self.owner(origin);
        let first_pass_done = self.first_pass_done.load(Ordering::SeqCst);
        let live = self.live_decision(&global, origin);
        let remembered = self.remembered(&global);
        Facts {
            owner,
            decided: live.is_some(),
            heuristic_seen: live.is_some_and(|(_, h)| h.is_some()),
            remembered,
            doubtful: self.is_doubtful(&global),
            incarnation_evicted: self.incarnation_evicted.load(Ordering::SeqCst),
            first_pass_done,
            one_phase: self.one_phase(&global, origin),
        }
    }

    /// The answer to an `Outcome` request.
    pub(crate) fn outcome(&self, xid: &Xid) -> Outcome {
        rules::outcome(&self.facts(xid))
    }

    /// Whether a decision exists or is remembered as committed or heuristic for `xid`:
    /// its prepared branches must not be rolled back.
    pub(crate) fn is_decided(&self, xid: &Xid) -> bool {
        let global = xid.global();
        self.live_decision(&global, global.origin()).is_some()
            || matches!(self.remembered(&global), Some(Remembered::Committed | Remembered::Heuristic(_)))
    }

    /// Whether a prepared branch without a decision may be rolled back: it is this node's,
    /// its session is gone (an older incarnation, or a closed connection), and no write of
    /// a decision for it failed in this run.
    pub(crate) fn owner_is_gone(&self, origin: &Origin) -> bool {
        let gone = matches!(self.owner(Some(*origin)), Owner::Earlier | Owner::Closed);
        gone && !self.is_doubtful(&Xid::decree(*origin))
    }

    /// Marks the end of a recovery pass that started at `started`: the first one of this
    /// run has ended, and every recheck due by `started` is served.
    pub(crate) fn pass_ended(&self, started: Instant) {
        self.first_pass_done.store(true, Ordering::SeqCst);
        self.rechecks.lock().served(started);
        self.metrics.recovery_passes.fetch_add(1, Ordering::Relaxed);
    }

    /// When the next recheck after a close is due, if any is pending.
    pub(crate) fn next_recheck(&self) -> Option<Instant> {
        self.rechecks.lock().next_due()
    }

    /// Rechecks after closes not served yet (each may stand for many closes).
    pub(crate) fn rechecks_pending(&self) -> usize {
        self.rechecks.lock().pending()
    }

    /// A client asked the outcome of `xid` and was answered `answer`. An Xid of this
    /// node's earlier incarnation with nothing known of it is answered unknown, but its
    /// branches may still be prepared: a client whose server restarted mid-transaction
    /// prepares them afterwards, and asks once its `Decide` found no server (issue 31,
    /// item 2). So a pass runs now and again on the rechecks' doubling schedule (which
    /// coalesces any number of questions into a few passes); a pass that rolls a branch
    /// back remembers it, and the next question is answered rolled back. Only while this
    /// member may call resource managers: a deposed primary speeds up nothing.
    pub(crate) fn outcome_asked(&self, xid: &Xid, answer: Outcome) {
        let Some(origin) = xid.global().origin() else { return };
        let earlier = origin.node == self.node && origin.incarnation < self.incarnation;
        if answer != Outcome::Unknown || !earlier || !self.may_call_rms() {
            return;
        }
        self.rechecks.lock().after_close(Instant::now());
        self.wake_recovery();
    }

    /// Asks the recovery worker for a pass.
    pub(crate) fn wake_recovery(&self) {
        *self.wake.lock() = true;
        self.wake_signal.notify_all();
    }

    /// Waits until woken or `timeout` passes; returns whether it was woken.
    pub(crate) fn wait_for_work(&self, timeout: Duration) -> bool {
        let mut woken = self.wake.lock();
        if !*woken {
            self.wake_signal.wait_for(&mut woken, timeout);
        }
        std::mem::replace(&mut *woken, false)
    }
}

/// Told once whether a heuristic outcome is kept for good (durable here and, in a pair,
/// held by the backup): the server's side of the kept reply.
pub(crate) type KeptCallback = Box<dyn FnOnce(bool) + Send>;

/// What the answers joined by [`join_kept`] still wait for.
struct KeptJoin {
    /// Answers still to come.
    left: u8,
    /// Called once: at the first "no", or when every answer said yes.
    kept: Option<KeptCallback>,
}

/// One of the answers [`join_kept`] waits for; dropped without an answer, it says no (a
/// memory that refused the entry drops its callback: the caller must still be answered).
pub(crate) struct KeptArrival(Option<Arc<Mutex<KeptJoin>>>);

impl KeptArrival {
    /// Gives this answer.
    pub(crate) fn arrive(mut self, ok: bool) {
        if let Some(join) = self.0.take() {
            arrive(&join, ok);
        }
    }
}

impl Drop for KeptArrival {
    fn drop(&mut self) {
        if let Some(join) = self.0.take() {
            arrive(&join, false);
        }
    }
}

/// Counts one answer into `join`, calling its callback when the outcome is settled.
fn arrive(join: &Mutex<KeptJoin>, ok: bool) {
    let settled = {
        let mut join = join.lock();
        join.left = join.left.saturating_sub(1);
        if !ok || join.left == 0 {
            join.kept.take().map(|kept| (kept, ok))
        } else {
            None
        }
    };
    if let Some((kept, ok)) = settled {
        kept(ok);
    }
}

/// Splits `kept` into the two answers an outcome waits for: durable here, and held by the
/// backup (the second is `None` when nobody waits, so that shipping stays as it was).
fn join_kept(kept: Option<KeptCallback>) -> (KeptArrival, Option<Box<dyn FnOnce() + Send>>) {
    let Some(kept) = kept else { return (KeptArrival(None), None) };
    let join = Arc::new(Mutex::new(KeptJoin { left: 2, kept: Some(kept) }));
    let held = KeptArrival(Some(join.clone()));
    (KeptArrival(Some(join)), Some(Box::new(move || held.arrive(true))))
}
