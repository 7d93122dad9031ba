//! An in-memory resource manager for benchmarks and fault injection.
//!
//! [`DummyRm`] answers every XA call at once (or after a configured delay) and can be told
//! to misbehave on a chosen call with a given probability: vote no, fail (the RM is
//! unavailable), fail after doing the work (the reply is lost), "crash" the connection, or
//! abort the whole process for kill tests. Prepared branches live in a table shared by all
//! connections of one [`DummyFactory`], playing the part of the RM's durable state: they
//! survive a connection (and a coordinator) going away, `recover` lists them, and any
//! connection can commit them. It is not a database: there is no data, only branch states.
//!
//! The hot path takes one sharded lock at prepare and one at commit, and allocates nothing
//! once warm: the benchmark calls it millions of times per second.

use crate::rm::{HeuristicOutcome, ResourceManager, RmError, RmFactory, Vote};
use crate::xid::Xid;
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Shards of the prepared-branch table (a power of two).
const SHARDS: usize = 64;

/// The XA calls of [`ResourceManager`], to aim delays and faults at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Call {
    /// `open`.
    Open,
    /// `close`.
    Close,
    /// `start`.
    Start,
    /// `end`.
    End,
    /// `prepare`.
    Prepare,
    /// `commit` (one-phase or two-phase).
    Commit,
    /// `rollback`.
    Rollback,
    /// `recover`.
    Recover,
    /// `forget`.
    Forget,
}

impl Call {
    /// Every call, in counter order.
    pub const ALL: [Call; 9] = [
        Call::Open,
        Call::Close,
        Call::Start,
        Call::End,
        Call::Prepare,
        Call::Commit,
        Call::Rollback,
        Call::Recover,
        Call::Forget,
    ];

    fn index(self) -> usize {
        self as usize
    }
}

/// What a fault rule does when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// Refuse. On prepare: vote no (`RmError::RolledBack`, the branch is rolled back); on
    /// commit: roll the branch back and say so (`RmError::RolledBack`); on any other call:
    /// `RmError::Protocol`.
    VoteNo,
    /// On prepare: vote read-only (the branch is finished, nothing to commit).
    VoteReadOnly,
    /// `RmError::Unavailable` without doing the work.
    Fail,
    /// Do the work, then answer `RmError::Unavailable` (the reply was lost).
    FailAfter,
    /// `RmError::Unavailable` without doing the work, and the connection stays broken
    /// (every later call fails) until `open` is called again: the connection's state is
    /// lost, while prepared branches survive in the shared table like on a real RM's disk.
    Crash,
    /// `std::process::abort()`: for kill tests that run the dummy in a child process.
    Abort,
    /// On commit or rollback: finish the branch with this outcome and report it.
    Heuristic(HeuristicOutcome),
}

/// One fault to inject: on `call`, with `probability`, at most `times_max` times in total
/// across all connections of the factory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultRule {
    /// The call the fault is aimed at.
    pub call: Call,
    /// What happens when it fires.
    pub action: FaultAction,
    /// Chance of firing on each eligible call, in [0, 1].
    pub probability: f64,
    /// Total firings allowed (`u64::MAX` for no limit).
    pub times_max: u64,
}

impl FaultRule {
    /// A rule that fires on the first `times` calls of `call`, always.
    pub fn first(call: Call, action: FaultAction, times: u64) -> Self {
        FaultRule { call, action, probability: 1.0, times_max: times }
    }

    /// A rule that fires on `call` with `probability`, without limit.
    pub fn sometimes(call: Call, action: FaultAction, probability: f64) -> Self {
        FaultRule { call, action, probability, times_max: u64::MAX }
    }
}

/// How a dummy resource behaves.
#[derive(Debug, Clone)]
pub struct DummyConfig {
    /// The resource's name (decision records name it; recovery finds the factory by it).
    pub name: String,
    /// Delays added to calls, to imitate a network round trip.
    pub delays: Vec<(Call, Duration)>,
    /// Faults to inject.
    pub rules: Vec<FaultRule>,
    /// Seed of the fault dice; connection `n` uses `seed + n`, so runs are reproducible.
    pub seed: u64,
    /// Branch outcomes remembered for tests (0: none, the benchmark setting).
    pub history_max: usize,
    /// Report `prefers_parallel` (to exercise the parallel prepare path).
    pub parallel: bool,
}

impl DummyConfig {
    /// A well-behaved resource named `name`: no delay, no fault, no history.
    pub fn new(name: impl Into<String>) -> Self {
        DummyConfig {
            name: name.into(),
            delays: Vec::new(),
            rules: Vec::new(),
            seed: 0,
            history_max: 0,
            parallel: false,
        }
    }
}

/// What became of a branch, as the dummy's history remembers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BranchOutcome {
    /// Committed (one-phase or after prepare).
    Committed,
    /// Rolled back (by rollback, or by voting no).
    RolledBack,
    /// Finished by the RM's own heuristic decision.
    Heuristic(HeuristicOutcome),
}

/// Totals of calls made to all connections of one factory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallCounts {
    /// Counts indexed like [`Call::ALL`].
    pub calls: [u64; 9],
}

impl CallCounts {
    /// Calls of one kind.
    pub fn get(&self, call: Call) -> u64 {
        self.calls[call.index()]
    }
}

/// A small, fast hasher for the branch table (FxHash); Xids are not attacker-chosen here.
#[derive(Default, Clone, Copy)]
struct FxHasher(u64);

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.write_u64(u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]));
        }
        for &b in chunks.remainder() {
            self.write_u64(b as u64);
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.write_u64(i as u64);
    }
    fn write_u32(&mut self, i: u32) {
        self.write_u64(i as u64);
    }
    fn write_i32(&mut self, i: i32) {
        self.write_u64(i as u32 as u64);
    }
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type BranchTable = HashMap<Xid, (), BuildHasherDefault<FxHasher>>;

/// Per-connection counters; one writer each, so plain loads and stores suffice.
#[derive(Default)]
struct ConnCounters {
    calls: [AtomicU64; 9],
}

/// A fault rule with its shared firing count.
struct RuleState {
    rule: FaultRule,
    fired: AtomicU64,
}

/// What every connection of one factory shares.
struct Shared {
    name: Arc<str>,
    parallel: bool,
    delays: [Duration; 9],
    seed: u64,
    prepared: Vec<Mutex<BranchTable>>,
    rules: Mutex<Arc<Vec<RuleState>>>,
    rules_version: AtomicU64,
    /// Counters of the live connections; a connection folds its own into `retired` and
    /// leaves this list when it is dropped, so the list follows the live connections.
    counters: Mutex<Vec<Arc<ConnCounters>>>,
    /// Calls of connections already dropped (changed under the `counters` lock only).
    retired: [AtomicU64; 9],
    connections: AtomicU64,
    history_max: usize,
    history: Mutex<HashMap<Xid, BranchOutcome>>,
    history_dropped: AtomicU64,
}

impl Shared {
    fn shard(&self, xid: &Xid) -> &Mutex<BranchTable> {
        let bq = xid.branch_number().unwrap_or(0) as u64;
        let h = (xid.log_key() ^ bq.rotate_left(32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        &self.prepared[(h >> 58) as usize % SHARDS]
    }

    fn record(&self, xid: &Xid, outcome: BranchOutcome) {
        if self.history_max == 0 {
            return;
        }
        let mut history = self.history.lock();
        if history.len() < self.history_max || history.contains_key(xid) {
            history.insert(*xid, outcome);
        } else {
            self.history_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Makes connections to one dummy resource and inspects its state (tests, benchmarks).
#[derive(Clone)]
pub struct DummyFactory {
    shared: Arc<Shared>,
}

impl DummyFactory {
    /// A dummy resource behaving as `config` says.
    pub fn new(config: DummyConfig) -> Self {
        let mut delays = [Duration::ZERO; 9];
        for (call, d) in &config.delays {
            delays[call.index()] = *d;
        }
        let shared = Shared {
            name: Arc::from(config.name.as_str()),
            parallel: config.parallel,
            delays,
            seed: config.seed,
            prepared: (0..SHARDS).map(|_| Mutex::new(BranchTable::default())).collect(),
            rules: Mutex::new(Arc::new(Vec::new())),
            rules_version: AtomicU64::new(0),
            counters: Mutex::new(Vec::new()),
            retired: Default::default(),
            connections: AtomicU64::new(0),
            history_max: config.history_max,
            history: Mutex::new(HashMap::new()),
            history_dropped: AtomicU64::new(0),
        };
        let factory = DummyFactory { shared: Arc::new(shared) };
        factory.set_rules(config.rules);
        factory
    }

    /// A well-behaved dummy named `name` that remembers up to `history_max` outcomes.
    pub fn named(name: &str, history_max: usize) -> Self {
        DummyFactory::new(DummyConfig { history_max, ..DummyConfig::new(name) })
    }

    /// Replaces the fault rules; every connection sees the new ones at its next call.
    pub fn set_rules(&self, rules: Vec<FaultRule>) {
        let states = rules.into_iter().map(|rule| RuleState { rule, fired: AtomicU64::new(0) }).collect();
        *self.shared.rules.lock() = Arc::new(states);
        self.shared.rules_version.fetch_add(1, Ordering::Release);
    }

    /// A new connection, not yet opened (the coordinator's session opens it).
    pub fn connection(&self) -> DummyRm {
        let n = self.shared.connections.fetch_add(1, Ordering::Relaxed);
        let counters = Arc::new(ConnCounters::default());
        self.shared.counters.lock().push(counters.clone());
        let rules = self.shared.rules.lock().clone();
        DummyRm {
            shared: self.shared.clone(),
            rules,
            rules_version: self.shared.rules_version.load(Ordering::Acquire),
            rng: StdRng::seed_from_u64(self.shared.seed.wrapping_add(n)),
            counters,
            broken: false,
        }
    }

    /// The branches currently prepared, in no particular order.
    pub fn prepared(&self) -> Vec<Xid> {
        self.shared.prepared.iter().flat_map(|s| s.lock().keys().copied().collect::<Vec<_>>()).collect()
    }

    /// What became of branch `xid` (needs `history_max > 0`).
    pub fn outcome(&self, xid: &Xid) -> Option<BranchOutcome> {
        self.shared.history.lock().get(xid).copied()
    }

    /// Every remembered outcome.
    pub fn history(&self) -> HashMap<Xid, BranchOutcome> {
        self.shared.history.lock().clone()
    }

    /// Calls made so far, summed over all connections.
    pub fn counts(&self) -> CallCounts {
        let mut total = CallCounts::default();
        let live = self.shared.counters.lock();
        for (t, v) in total.calls.iter_mut().zip(self.shared.retired.iter()) {
            *t += v.load(Ordering::Relaxed);
        }
        for c in live.iter() {
            for (t, v) in total.calls.iter_mut().zip(c.calls.iter()) {
                *t += v.load(Ordering::Relaxed);
            }
        }
        total
    }

    /// The factory as the coordinator wants it.
    pub fn arc(&self) -> Arc<dyn RmFactory> {
        Arc::new(self.clone())
    }
}

impl RmFactory for DummyFactory {
    fn name(&self) -> &str {
        &self.shared.name
    }

    fn connect(&self) -> Result<Box<dyn ResourceManager>, RmError> {
        let mut rm = self.connection();
        rm.open()?;
        Ok(Box::new(rm))
    }
}

/// One connection to a dummy resource.
pub struct DummyRm {
    shared: Arc<Shared>,
    rules: Arc<Vec<RuleState>>,
    rules_version: u64,
    rng: StdRng,
    counters: Arc<ConnCounters>,
    broken: bool,
}

impl Drop for DummyRm {
    fn drop(&mut self) {
        // Under the lock, so that `counts` sees these calls exactly once.
        let mut live = self.shared.counters.lock();
        for (t, v) in self.shared.retired.iter().zip(self.counters.calls.iter()) {
            t.fetch_add(v.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        if let Some(i) = live.iter().position(|c| Arc::ptr_eq(c, &self.counters)) {
            live.swap_remove(i);
        }
    }
}

/// What a call should do after the dice.
enum Act {
    Normal,
    Fault(FaultAction),
}

impl DummyRm {
    /// Counts the call, sleeps its delay, and rolls the fault dice.
    fn enter(&mut self, call: Call) -> Act {
        let c = &self.counters.calls[call.index()];
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        let delay = self.shared.delays[call.index()];
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let version = self.shared.rules_version.load(Ordering::Acquire);
        if version != self.rules_version {
            self.rules = self.shared.rules.lock().clone();
            self.rules_version = version;
        }
        for state in self.rules.iter() {
            let rule = &state.rule;
            if rule.call != call || !(rule.probability >= 1.0 || self.rng.gen::<f64>() < rule.probability) {
                continue;
            }
            let fired = state.fired.fetch_add(1, Ordering::Relaxed);
            if fired < rule.times_max {
                return Act::Fault(rule.action);
            }
        }
        Act::Normal
    }

    fn unavailable(&self, what: &str) -> RmError {
        RmError::Unavailable(format!("dummy {}: {what}", self.shared.name))
    }

    /// Applies the generic part of a fault; returns the error to answer, or `None` when
    /// the call should go on (possibly failing after the work: see `lost_reply`).
    fn fault(&mut self, act: &Act) -> Option<RmError> {
        if self.broken {
            return Some(self.unavailable("connection crashed earlier"));
        }
        match act {
            Act::Normal => None,
            Act::Fault(FaultAction::Fail) => Some(self.unavailable("injected failure")),
            Act::Fault(FaultAction::Crash) => {
                self.broken = true;
                Some(self.unavailable("injected crash"))
            }
            Act::Fault(FaultAction::Abort) => std::process::abort(),
            Act::Fault(_) => None,
        }
    }

    fn lost_reply(&self, act: &Act) -> Result<(), RmError> {
        match act {
            Act::Fault(FaultAction::FailAfter) => Err(self.unavailable("injected lost reply")),
            _ => Ok(()),
        }
    }

    fn simple(&mut self, call: Call) -> Result<(), RmError> {
        let act = self.enter(call);
        if let Some(e) = self.fault(&act) {
            return Err(e);
        }
        if let Act::Fault(FaultAction::VoteNo) = act {
            return Err(RmError::Protocol(format!(
                "dummy {}: injected refusal of {call:?}",
                self.shared.name
            )));
        }
        self.lost_reply(&act)
    }

    /// Finishes a prepared (or active) branch with `outcome`.
    fn finish(&self, xid: &Xid, outcome: BranchOutcome) -> bool {
        let was_prepared = self.shared.shard(xid).lock().remove(xid).is_some();
        self.shared.record(xid, outcome);
        was_prepared
    }
}

impl ResourceManager for DummyRm {
    fn name(&self) -> &str {
        &self.shared.name
    }

    fn open(&mut self) -> Result<(), RmError> {
        self.broken = false;
        self.simple(Call::Open)
    }

    fn close(&mut self) -> Result<(), RmError> {
        self.simple(Call::Close)
    }

    fn start(&mut self, _xid: &Xid) -> Result<(), RmError> {
        self.simple(Call::Start)
    }

    fn end(&mut self, _xid: &Xid) -> Result<(), RmError> {
        self.simple(Call::End)
    }

    fn prepare(&mut self, xid: &Xid) -> Result<Vote, RmError> {
        let act = self.enter(Call::Prepare);
        if let Some(e) = self.fault(&act) {
            return Err(e);
        }
        match act {
            Act::Fault(FaultAction::VoteNo) => {
                self.shared.record(xid, BranchOutcome::RolledBack);
                return Err(RmError::RolledBack(format!("dummy {}: injected no vote", self.shared.name)));
            }
            Act::Fault(FaultAction::VoteReadOnly) => return Ok(Vote::ReadOnly),
            _ => {}
        }
        self.shared.shard(xid).lock().insert(*xid, ());
        self.lost_reply(&act)?;
        Ok(Vote::Commit)
    }

    fn commit(&mut self, xid: &Xid, one_phase: bool) -> Result<(), RmError> {
        let act = self.enter(Call::Commit);
        if let Some(e) = self.fault(&act) {
            return Err(e);
        }
        match act {
            Act::Fault(FaultAction::Heuristic(h)) => {
                self.finish(xid, BranchOutcome::Heuristic(h));
                return Err(RmError::Heuristic(h));
            }
            Act::Fault(FaultAction::VoteNo) => {
                self.finish(xid, BranchOutcome::RolledBack);
                return Err(RmError::RolledBack(format!("dummy {}: injected rollback", self.shared.name)));
            }
            _ => {}
        }
        if one_phase {
            self.shared.record(xid, BranchOutcome::Committed);
        } else if !self.finish(xid, BranchOutcome::Committed) {
            return Err(RmError::UnknownXid(format!("dummy {}: {xid} is not prepared", self.shared.name)));
        }
        self.lost_reply(&act)
    }

    fn rollback(&mut self, xid: &Xid) -> Result<(), RmError> {
        let act = self.enter(Call::Rollback);
        if let Some(e) = self.fault(&act) {
            return Err(e);
        }
        if let Act::Fault(FaultAction::Heuristic(h)) = act {
            self.finish(xid, BranchOutcome::Heuristic(h));
            return Err(RmError::Heuristic(h));
        }
        self.finish(xid, BranchOutcome::RolledBack);
        self.lost_reply(&act)
    }

    fn recover(&mut self) -> Result<Vec<Xid>, RmError> {
        let act = self.enter(Call::Recover);
        if let Some(e) = self.fault(&act) {
            return Err(e);
        }
        let mut out = Vec::new();
        for shard in &self.shared.prepared {
            out.extend(shard.lock().keys().copied());
        }
        Ok(out)
    }

    fn forget(&mut self, _xid: &Xid) -> Result<(), RmError> {
        self.simple(Call::Forget)
    }

    fn prefers_parallel(&self) -> bool {
        self.shared.parallel
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xid::Origin;

    fn xid(n: u64) -> Xid {
        Xid::decree(Origin { node: 1, incarnation: 1, session: 1, sequence: n }).branch(0)
    }

    #[test]
    fn prepared_branches_are_shared_between_connections() {
        let f = DummyFactory::named("d", 100);
        let mut a = f.connection();
        let mut b = f.connection();
        assert_eq!(a.prepare(&xid(1)), Ok(Vote::Commit));
        assert_eq!(b.recover().unwrap(), vec![xid(1)]);
        assert_eq!(b.commit(&xid(1), false), Ok(()));
        assert!(f.prepared().is_empty());
        assert!(matches!(a.commit(&xid(1), false), Err(RmError::UnknownXid(_))));
        assert_eq!(f.outcome(&xid(1)), Some(BranchOutcome::Committed));
        assert_eq!(f.counts().get(Call::Commit), 2);
    }

    #[test]
    fn dropped_connections_keep_their_counts_and_leave_the_live_list() {
        let f = DummyFactory::named("d", 0);
        for n in 0..100 {
            let mut c = f.connection();
            c.open().unwrap();
            c.prepare(&xid(n)).unwrap();
            c.commit(&xid(n), false).unwrap();
        }
        let live = f.connection();
        assert_eq!(f.shared.counters.lock().len(), 1, "only the live connection is listed");
        let counts = f.counts();
        assert_eq!((counts.get(Call::Open), counts.get(Call::Commit)), (100, 100));
        drop(live);
        assert_eq!(f.counts(), counts);
        assert!(f.shared.counters.lock().is_empty());
    }

    #[test]
    fn rules_fire_at_most_times_max_and_crash_breaks_the_connection() {
        let f = DummyFactory::named("d", 0);
        f.set_rules(vec![FaultRule::first(Call::Commit, FaultAction::Fail, 2)]);
        let mut a = f.connection();
        a.prepare(&xid(1)).unwrap();
        assert!(matches!(a.commit(&xid(1), false), Err(RmError::Unavailable(_))));
        assert!(matches!(a.commit(&xid(1), false), Err(RmError::Unavailable(_))));
        assert_eq!(a.commit(&xid(1), false), Ok(()));

        f.set_rules(vec![FaultRule::first(Call::Start, FaultAction::Crash, 1)]);
        assert!(a.start(&xid(2)).is_err());
        assert!(a.end(&xid(2)).is_err(), "a crashed connection stays broken");
        a.open().unwrap();
        assert_eq!(a.start(&xid(2)), Ok(()));
    }

    #[test]
    fn lost_reply_does_the_work() {
        let f = DummyFactory::named("d", 10);
        f.set_rules(vec![FaultRule::first(Call::Commit, FaultAction::FailAfter, 1)]);
        let mut a = f.connection();
        a.prepare(&xid(3)).unwrap();
        assert!(matches!(a.commit(&xid(3), false), Err(RmError::Unavailable(_))));
        assert_eq!(f.outcome(&xid(3)), Some(BranchOutcome::Committed));
        assert!(f.prepared().is_empty());
    }
}
