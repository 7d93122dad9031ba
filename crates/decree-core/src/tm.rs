//! The transaction manager: the shared part of the coordinator.
//!
//! One [`TransactionManager`] per process holds the decision store, the factories of the
//! configured resource managers (by name), and a background thread that finishes what the
//! sessions could not: phase-two calls that failed because an RM was down, rollbacks of
//! prepared branches after a failed phase one, and recovery scans of RMs that were down at
//! start. Sessions ([`crate::Session`], [`crate::TxContext`]) run the protocol on their own
//! threads and only hand work to this thread when something failed.
//!
//! Invariants: a decision is completed in the store only after every branch it names is
//! finished; recovery commits exactly the branches named by recovered decisions and rolls
//! back only decree branches of this node from an older incarnation that no decision names.
//! Heuristic outcomes found in the background are kept (up to `heuristics_max`) and logged.
//!
//! With spans on (`trace.rs`), each recovery pass (the start-up one and each background
//! pass) emits a `decree.recovery.pass` span with one child per branch it finished, as a
//! state server's recovery does; a branch of a recovered decision whose record kept its
//! client's span (`DCD2`) links to that span, and its phase two logs inside that trace.

use crate::embedded::LogDecisions;
use crate::error::{HeuristicReport, TmError};
use crate::recovery::runtime::{self, Backoff, Connections, Recorder, ScanRules};
use crate::recovery::{DecisionFact, OlderIncarnation, PhaseTwo};
use crate::rm::{HeuristicOutcome, RmError, RmFactory};
use crate::store::{BranchRecord, Decision, DecisionStore, RecoveredDecisions};
use crate::trace::{self, RecoveryPass, TraceContext};
use crate::xid::Xid;
use decree_log::Log;
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Settings of the coordinator.
#[derive(Debug, Clone)]
pub struct TmConfig {
    /// The node id minted into every Xid (embedded mode; the state server assigns its own).
    pub node: u32,
    /// First wait before retrying a failed phase-two call.
    pub retry_backoff_min: Duration,
    /// Longest wait between retries.
    pub retry_backoff_max: Duration,
    /// Most transactions waiting for a retry at once; beyond it, a decision stays in the
    /// log for the next recovery instead of being retried by this process.
    pub retry_jobs_max: usize,
    /// Most branches (resource managers) one session may enlist: 1 to
    /// [`crate::BRANCHES_MAX`], [`BRANCHES_MAX_DEFAULT`] by default.
    pub branches_max: usize,
    /// Most heuristic reports kept for [`TransactionManager::take_heuristics`].
    pub heuristics_max: usize,
    /// How a session calls the branches that prefer parallel calls (network RMs).
    pub branch_calls: BranchCalls,
}

/// How a session drives the prepare and phase-two calls of branches whose resource
/// managers prefer parallel calls (`ResourceManager::prefers_parallel`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BranchCalls {
    /// At once from the session's own thread where the resource managers have split-phase
    /// calls (every request sent, then every answer taken: PostgreSQL); for the others in
    /// parallel on helper threads while the machine has a CPU to spare and one after
    /// another when it is busy (see `cpu_spare.rs` for why).
    #[default]
    Auto,
    /// Always in parallel on helper threads, split-phase calls unused.
    Parallel,
    /// Always one after another on the caller's thread.
    Sequential,
}

/// The default of [`TmConfig::branches_max`].
pub const BRANCHES_MAX_DEFAULT: usize = 64;

const _: () =
    assert!(BRANCHES_MAX_DEFAULT <= crate::limits::BRANCHES_MAX, "the default configuration is valid");

impl Default for TmConfig {
    fn default() -> Self {
        TmConfig {
            node: 1,
            retry_backoff_min: Duration::from_millis(10),
            retry_backoff_max: Duration::from_secs(5),
            retry_jobs_max: 65_536,
            branches_max: BRANCHES_MAX_DEFAULT,
            heuristics_max: 1024,
            branch_calls: BranchCalls::Auto,
        }
    }
}

/// What recovery found and did when the coordinator started.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Decided-but-unfinished transactions read from the log.
    pub decisions: usize,
    /// Branches named by recovered decisions that are now finished (committed now, or
    /// unknown to their RM because an earlier attempt committed them).
    pub branches_committed: usize,
    /// Prepared branches of a dead incarnation rolled back (presumed abort).
    pub branches_rolled_back: usize,
    /// Prepared branches left alone (other transaction managers, other nodes, live ones).
    pub branches_left_alone: usize,
    /// Transactions or RM scans handed to the background retry thread (an RM was down).
    pub deferred: usize,
    /// RM names found in decisions with no factory configured: those decisions stay in
    /// the log (and are retried) until the RM is configured again.
    pub missing_rms: Vec<String>,
}

/// What a background job must do.
#[derive(Debug)]
enum JobKind {
    /// Phase two of a transaction: commit (then complete it) or roll back its branches.
    PhaseTwo(PhaseTwo),
    /// List an RM's prepared branches and resolve ours (recovery of an RM that was down).
    Scan { rm: String },
}

#[derive(Debug)]
struct Job {
    kind: JobKind,
    due: Instant,
    backoff: Duration,
    attempts: u64,
}

/// Jobs waiting for their due time, and how many the worker is running right now.
#[derive(Default)]
struct Queue {
    waiting: Vec<Job>,
    running: usize,
}

/// State shared with the background thread.
pub(crate) struct Shared {
    pub(crate) store: Arc<dyn DecisionStore>,
    factories: Vec<Arc<dyn RmFactory>>,
    pub(crate) config: TmConfig,
    /// Transactions whose decision was recovered from the log at start.
    recovered_decided: HashSet<Xid>,
    /// The client's span context of each transaction that recovery or the background
    /// thread finishes, by global Xid, for their spans to link to: a recovered decision
    /// whose record kept one (`DCD2`, filled at start), and a live session's sampled
    /// transaction whose phase two was handed over ([`TransactionManager::defer`]). Each
    /// entry leaves when its phase two ends: it holds the live decisions at most (the
    /// recovered ones and the retry queue, bounded by `retry_jobs_max`), never the history.
    client_traces: Mutex<HashMap<Xid, TraceContext>>,
    jobs: Mutex<Queue>,
    wake: Condvar,
    stop: AtomicBool,
    heuristics: Mutex<Vec<HeuristicReport>>,
    heuristics_dropped: AtomicU64,
    retries: AtomicU64,
    retry_passes: AtomicU64,
}

/// The coordinator shared by all sessions of a process.
pub struct TransactionManager {
    shared: Arc<Shared>,
    worker: Option<JoinHandle<()>>,
    recovery: RecoveryReport,
}

impl TransactionManager {
    /// Embedded mode: decisions go to `log`; runs recovery before returning.
    pub fn embedded(
        log: Arc<dyn Log>,
        config: TmConfig,
        factories: Vec<Arc<dyn RmFactory>>,
    ) -> Result<Arc<Self>, TmError> {
        let recovered = RecoveredDecisions::from_records(log.take_recovered());
        // An embedded coordinator refuses to start on a record it cannot read: it might be
        // a decision whose branches presumed abort would then roll back.
        if let Some((_, e)) = recovered.undecodable.into_iter().next() {
            return Err(TmError::Store(e));
        }
        let decisions = recovered.decisions;
        let store: Arc<dyn DecisionStore> =
            Arc::new(LogDecisions::with_recovered(log, config.node, recovered.keys));
        let decided = decisions.keys().copied().collect();
        let mut tm = Self::build(store, config, factories, decided)?;
        tm.shared.keep_recovered_traces(recovered.traces);
        let shared = tm.shared.clone();
        tm.recovery = shared.recover(decisions.into_values().collect());
        Ok(Arc::new(tm))
    }

    /// Client/server mode: decisions go to `store` (the state server recovers).
    pub fn with_store(
        store: Arc<dyn DecisionStore>,
        config: TmConfig,
        factories: Vec<Arc<dyn RmFactory>>,
    ) -> Result<Arc<Self>, TmError> {
        Ok(Arc::new(Self::build(store, config, factories, HashSet::new())?))
    }

    fn build(
        store: Arc<dyn DecisionStore>,
        config: TmConfig,
        factories: Vec<Arc<dyn RmFactory>>,
        recovered_decided: HashSet<Xid>,
    ) -> Result<Self, TmError> {
        if config.retry_backoff_min.is_zero() || config.retry_backoff_max < config.retry_backoff_min {
            return Err(TmError::Config(format!(
                "retry backoff must satisfy 0 < min ({:?}) <= max ({:?})",
                config.retry_backoff_min, config.retry_backoff_max
            )));
        }
        let branches_limit = crate::limits::BRANCHES_MAX;
        if config.branches_max == 0 || config.branches_max > branches_limit {
            return Err(TmError::Config(format!(
                "branches_max = {} must be between 1 and BRANCHES_MAX = {branches_limit}",
                config.branches_max
            )));
        }
        let mut names = HashSet::new();
        for f in &factories {
            // Decision records name the RM: a longer name could only be stored truncated.
            crate::limits::check_rm_name(f.name())?;
            if !names.insert(f.name().to_string()) {
                return Err(TmError::Config(format!("two resource managers are named {:?}", f.name())));
            }
        }
        let shared = Arc::new(Shared {
            store,
            factories,
            config,
            recovered_decided,
            client_traces: Mutex::new(HashMap::new()),
            jobs: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            heuristics: Mutex::new(Vec::new()),
            heuristics_dropped: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            retry_passes: AtomicU64::new(0),
        });
        let worker_shared = shared.clone();
        let worker = std::thread::Builder::new()
            .name("decree-retry".into())
            .spawn(move || worker_shared.run())
            .map_err(|e| TmError::Config(format!("cannot start the retry thread: {e}")))?;
        Ok(TransactionManager { shared, worker: Some(worker), recovery: RecoveryReport::default() })
    }

    /// The decision store (embedded log or state server).
    pub fn store(&self) -> &Arc<dyn DecisionStore> {
        &self.shared.store
    }

    /// The configuration.
    pub fn config(&self) -> &TmConfig {
        &self.shared.config
    }

    /// What recovery did at start (empty in client/server mode).
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// The factory of the RM named `name`.
    pub fn factory(&self, name: &str) -> Option<&Arc<dyn RmFactory>> {
        self.shared.factory(name)
    }

    /// Transactions and scans waiting in the background (phase two not yet finished).
    pub fn pending(&self) -> usize {
        let queue = self.shared.jobs.lock();
        queue.waiting.len() + queue.running
    }

    /// Background attempts made so far (each failed or succeeded call batch counts).
    pub fn retries(&self) -> u64 {
        self.shared.retries.load(Ordering::Relaxed)
    }

    /// Passes the retry thread has made (each takes every job due, over one set of
    /// connections opened at most once per RM).
    pub fn retry_passes(&self) -> u64 {
        self.shared.retry_passes.load(Ordering::Relaxed)
    }

    /// The client span contexts still held for the spans of recovery and the background
    /// thread: one per recovered `DCD2` decision or handed-over sampled phase two not
    /// finished yet, so that memory follows the live decisions, never the history.
    pub fn client_contexts(&self) -> usize {
        self.shared.client_traces.lock().len()
    }

    /// Waits until no background work is pending or `timeout` passes; true when idle.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.pending() == 0 {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Heuristic outcomes found by background phase two since the last call (never
    /// hidden: they are also logged with `tracing::error!`).
    pub fn take_heuristics(&self) -> Vec<HeuristicReport> {
        std::mem::take(&mut *self.shared.heuristics.lock())
    }

    /// Heuristic reports not kept because `heuristics_max` were already waiting (they
    /// were still logged).
    pub fn heuristics_dropped(&self) -> u64 {
        self.shared.heuristics_dropped.load(Ordering::Relaxed)
    }

    /// Hands phase two of a stored decision to the background thread (a state server
    /// finishing the transaction of a client that died after deciding); the decision is
    /// completed in the store once every branch is committed. False when the retry queue
    /// is full (the decision then waits for the next recovery).
    pub fn finish_later(&self, decision: &Decision) -> bool {
        self.defer(decision.xid.global(), true, decision.branches.clone(), None, None)
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Hands unfinished phase-two work to the background thread; the spans of its passes
    /// link to `client` (the session's sampled transaction span), kept until the work ends.
    pub(crate) fn defer(
        &self,
        xid: Xid,
        commit: bool,
        branches: Vec<BranchRecord>,
        heuristic: Option<HeuristicOutcome>,
        client: Option<TraceContext>,
    ) -> bool {
        let phase_two = PhaseTwo::new(xid, commit, branches).with_heuristic(heuristic);
        // Kept before the push, so that the first pass finds it; taken back when refused.
        let client = client.filter(TraceContext::is_sampled);
        if let Some(context) = client {
            self.shared.client_traces.lock().insert(xid.global(), context);
        }
        let queued = self.shared.push(self.shared.job(JobKind::PhaseTwo(phase_two)));
        if !queued && client.is_some() {
            self.shared.forget_client_trace(&xid);
        }
        queued
    }
}

impl Drop for TransactionManager {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        {
            let _jobs = self.shared.jobs.lock();
            self.shared.wake.notify_all();
        }
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
        let left = self.shared.jobs.lock().waiting.len();
        if left > 0 {
            tracing::warn!(left, "coordinator stopped with phase-two work pending; recovery will finish it");
        }
    }
}

impl Shared {
    pub(crate) fn factory(&self, name: &str) -> Option<&Arc<dyn RmFactory>> {
        self.factories.iter().find(|f| f.name() == name)
    }

    fn push(&self, job: Job) -> bool {
        let mut queue = self.jobs.lock();
        if queue.waiting.len() + queue.running >= self.config.retry_jobs_max {
            tracing::error!(
                job = ?job.kind,
                jobs_max = self.config.retry_jobs_max,
                "retry queue full; the decision stays in the log until the next recovery"
            );
            return false;
        }
        queue.waiting.push(job);
        self.wake.notify_one();
        true
    }

    pub(crate) fn report_heuristic(&self, report: HeuristicReport) {
        tracing::error!(%report, "heuristic outcome");
        self.keep_heuristic(report);
    }

    /// Keeps `report` for [`TransactionManager::take_heuristics`] (up to `heuristics_max`).
    fn keep_heuristic(&self, report: HeuristicReport) {
        let mut list = self.heuristics.lock();
        if list.len() < self.config.heuristics_max {
            list.push(report);
        } else {
            self.heuristics_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The backoff of background retries.
    fn backoff(&self) -> Backoff {
        Backoff { min: self.config.retry_backoff_min, max: self.config.retry_backoff_max }
    }

    /// A job due after the first backoff delay.
    fn job(&self, kind: JobKind) -> Job {
        let backoff = self.backoff().next(None);
        Job { kind, due: Instant::now() + backoff, backoff, attempts: 0 }
    }

    /// Keeps the recovered decisions' client contexts (`DCD2`) for the spans of recovery's
    /// passes. Kept whether spans are on yet or not: an application may turn them on after
    /// start-up, and the background passes then link to them; the map holds live recovered
    /// decisions only.
    fn keep_recovered_traces(&self, traces: HashMap<Xid, TraceContext>) {
        if traces.is_empty() {
            return;
        }
        let mut kept = self.client_traces.lock();
        kept.extend(traces.into_iter().map(|(xid, context)| (xid.global(), context)));
    }

    /// The client's span context of `xid`, when a recovered record or a handed-over
    /// session left one.
    fn client_trace(&self, xid: &Xid) -> Option<TraceContext> {
        self.client_traces.lock().get(&xid.global()).copied()
    }

    /// Forgets `xid`'s client context: its phase two has ended. Only recovery and the
    /// background thread call it, never the commit path.
    fn forget_client_trace(&self, xid: &Xid) {
        self.client_traces.lock().remove(&xid.global());
    }

    /// Recovery at start: commit recovered decisions, then scan every RM.
    fn recover(&self, decisions: Vec<Decision>) -> RecoveryReport {
        let books = Books::new(self);
        let report = self.recover_with(decisions, &books);
        books.end(report.deferred == 0);
        report
    }

    /// [`Shared::recover`] recording to `books`.
    fn recover_with(&self, decisions: Vec<Decision>, books: &Books<'_>) -> RecoveryReport {
        let mut report = RecoveryReport { decisions: decisions.len(), ..Default::default() };
        let mut conns = Connections::new(&self.factories);
        for d in decisions {
            for b in &d.branches {
                if self.factory(&b.rm).is_none() && !report.missing_rms.contains(&b.rm) {
                    tracing::error!(rm = %b.rm, xid = %d.xid, "a decision names an unconfigured RM");
                    report.missing_rms.push(b.rm.clone());
                }
            }
            let total = d.branches.len();
            let mut phase_two = PhaseTwo::new(d.xid, true, d.branches);
            let finished = books.run_phase_two(&mut phase_two, &mut conns);
            report.branches_committed += total - phase_two.left().len();
            if !finished {
                report.deferred += 1;
                self.push(self.job(JobKind::PhaseTwo(phase_two)));
            }
        }
        // A failed commit does not mean that listing fails: give every RM a fresh try.
        conns.forgive();
        for rm in conns.names() {
            match self.scan(&mut conns, &rm, books) {
                Ok(counts) => {
                    report.branches_rolled_back += counts.rolled_back;
                    report.branches_left_alone += counts.left_alone;
                }
                Err(e) => {
                    tracing::warn!(rm = %rm, error = %e, "recovery scan failed; retrying in the background");
                    conns.drop_connection(&rm);
                    report.deferred += 1;
                    self.push(self.job(JobKind::Scan { rm }));
                }
            }
        }
        report
    }

    /// Lists `rm`'s prepared branches and rolls back ours from dead incarnations that no
    /// decision names. Branches with a decision are committed by the decision's own job.
    /// A rollback that failed is an error too (the scan is retried).
    fn scan(
        &self,
        conns: &mut Connections,
        rm: &str,
        books: &Books<'_>,
    ) -> Result<runtime::ScanCounts, RmError> {
        let decision = |xid: &Xid| {
            if self.recovered_decided.contains(xid) {
                DecisionFact::Commit
            } else {
                DecisionFact::Absent
            }
        };
        let liveness = OlderIncarnation { current: self.store.incarnation() };
        let rules = ScanRules { node: self.store.node(), liveness: &liveness, decision: &decision };
        let counts = runtime::scan(rm, conns, &rules, books)?;
        if counts.failed > 0 {
            return Err(RmError::Unavailable(format!("{} rollbacks on {rm:?} failed", counts.failed)));
        }
        Ok(counts)
    }

    fn complete(&self, xid: &Xid, heuristic: Option<HeuristicOutcome>) {
        let result = match heuristic {
            Some(h) => self.store.complete_heuristic(xid, h),
            None => self.store.complete(xid),
        };
        if let Err(e) = result {
            tracing::warn!(%xid, error = %e, "completion record not written; recovery will redo phase two");
        }
    }

    /// The background thread: runs due jobs, sleeps until the next one is due.
    fn run(&self) {
        loop {
            let due: Vec<Job> = {
                let mut queue = self.jobs.lock();
                loop {
                    if self.stop.load(Ordering::Acquire) {
                        return;
                    }
                    let now = Instant::now();
                    if queue.waiting.iter().any(|j| j.due <= now) {
                        break;
                    }
                    let next = queue.waiting.iter().map(|j| j.due).min();
                    match next {
                        Some(at) => {
                            self.wake.wait_until(&mut queue, at);
                        }
                        None => self.wake.wait(&mut queue),
                    }
                }
                let now = Instant::now();
                let (ready, waiting): (Vec<Job>, Vec<Job>) =
                    queue.waiting.drain(..).partition(|j| j.due <= now);
                queue.waiting = waiting;
                queue.running = ready.len();
                ready
            };
            self.retry_passes.fetch_add(1, Ordering::Relaxed);
            self.pass(due);
        }
    }

    /// One pass of the background thread over the jobs `due`, over one set of connections.
    fn pass(&self, due: Vec<Job>) {
        let books = Books::new(self);
        let mut clean = true;
        let mut conns = Connections::new(&self.factories);
        for job in due {
            self.retries.fetch_add(1, Ordering::Relaxed);
            let again = self.run_job(&mut conns, job, &books);
            clean &= again.is_none();
            let mut queue = self.jobs.lock();
            queue.running -= 1;
            if let Some(again) = again {
                queue.waiting.push(again);
            }
        }
        conns.close_all();
        books.end(clean);
    }

    /// Runs one job; returns it (with a later due time) when it must be retried.
    fn run_job(&self, conns: &mut Connections, mut job: Job, books: &Books<'_>) -> Option<Job> {
        let done = match &mut job.kind {
            JobKind::PhaseTwo(phase_two) => books.run_phase_two(phase_two, conns),
            JobKind::Scan { rm } => match self.scan(conns, rm, books) {
                Ok(_) => true,
                Err(e) => {
                    tracing::warn!(rm = %rm, error = %e, "recovery scan failed again");
                    let rm = rm.clone();
                    conns.drop_connection(&rm);
                    false
                }
            },
        };
        if done {
            return None;
        }
        job.attempts += 1;
        job.backoff = self.backoff().next(Some(job.backoff));
        job.due = Instant::now() + job.backoff;
        Some(job)
    }
}

/// The embedded coordinator's books for one recovery pass (the start-up recovery or one
/// background pass): completions go to its decision store, heuristics to the list
/// [`TransactionManager::take_heuristics`] returns, and, with spans on, each finished
/// branch to the pass's spans.
struct Books<'a> {
    shared: &'a Shared,
    /// `None` with spans off: nothing is allocated for a pass then.
    trace: Option<RecoveryPass>,
}

impl<'a> Books<'a> {
    fn new(shared: &'a Shared) -> Books<'a> {
        Books { shared, trace: RecoveryPass::begin() }
    }

    /// Runs one pass of `phase_two`, its log lines inside its client's trace when known;
    /// once it has ended (a commit completed, or a rollback's branches all finished), its
    /// client's context is forgotten.
    fn run_phase_two(&self, phase_two: &mut PhaseTwo, conns: &mut Connections) -> bool {
        let ended = match self.log_scope(phase_two.xid()) {
            Some(scope) => scope.in_scope(|| runtime::run_phase_two(phase_two, conns, self)),
            None => runtime::run_phase_two(phase_two, conns, self),
        };
        if ended {
            // Memory follows the live decisions: this one is finished.
            self.shared.forget_client_trace(phase_two.xid());
        }
        ended
    }

    /// Emits the span of a branch of `xid` that the pass finished (spans on).
    fn branch_span(&self, xid: &Xid, rm: Option<&str>, commit: bool) {
        if let Some(pass) = &self.trace {
            pass.branch(xid, rm, commit, self.shared.client_trace(xid).as_ref());
        }
    }

    /// Ends the pass's span, if any: `clean` when nothing is left to retry.
    fn end(self, clean: bool) {
        if let Some(pass) = self.trace {
            pass.end(clean);
        }
    }
}

impl Recorder for Books<'_> {
    fn complete(&self, xid: &Xid, heuristic: Option<HeuristicOutcome>) {
        self.shared.complete(xid, heuristic);
    }

    /// Kept in memory only: an embedded coordinator's heuristics are for its application
    /// to take ([`TransactionManager::take_heuristics`]), and are not kept across a restart.
    fn heuristic(&self, report: &HeuristicReport) -> bool {
        self.shared.keep_heuristic(report.clone());
        true
    }

    fn branch_finished(&self, xid: &Xid, rm: &str, commit: bool) {
        self.branch_span(xid, Some(rm), commit);
    }

    /// The engine reports a presumed abort per transaction, without its RM.
    fn rolled_back(&self, xid: &Xid, _heuristic: Option<HeuristicOutcome>) {
        self.branch_span(xid, None, false);
    }

    /// Only the context of a recovered decision (its `DCD2` record) or of a handed-over
    /// session's transaction is known here, so this answers for their phase two: a presumed
    /// abort has no decision, hence no known trace, in an embedded coordinator.
    fn log_scope(&self, xid: &Xid) -> Option<tracing::Span> {
        self.trace.as_ref()?;
        let context = self.shared.client_trace(xid)?.to_span_context()?;
        Some(trace::log_scope(&context))
    }
}
