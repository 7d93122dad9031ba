//! A client over several independent pairs (issue 34): each pair (or single server) has its
//! own node id and its own log, and the client spreads its sessions over them, round robin,
//! so that the pairs share the load. A transaction lives on one pair: its Xid carries that
//! pair's node id, its decision goes to that pair, and the outcome of an Xid is asked of the
//! pair whose node id it carries (the rules are [`crate::route`]'s, pure).
//!
//! [`Pairs`] holds one [`PairStore`] per pair (a [`RemoteDecisions`] over the pair's
//! members, which follows a backup's `NotPrimary` to the other member), connected at start
//! and again when its pair restarted or failed over; [`PairsCoordinator`] runs one
//! [`TransactionManager`] per pair over those stores and opens each [`Session`] on the next
//! pair that serves. The coordinator itself is unchanged: each of its managers sees one
//! store with one node id and one incarnation, as in a single-pair client.

use crate::route::{self, RouteError};
use crate::{ClientOptions, Endpoint, RemoteDecisions};
use decree_core::{
    Decision, DecisionStore, HeuristicOutcome, Outcome, ResourceManager, RmFactory, Session, StoreError,
    TmConfig, TmError, TraceContext, TransactionManager, Xid,
};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a pair that failed to open a session is tried only after the others: a dead
/// pair then costs new sessions one failed connection a second, not one each.
pub const PAIR_DOWN_FOR: Duration = Duration::from_secs(1);

/// One pair's [`DecisionStore`]: its [`RemoteDecisions`], and the server sessions opened
/// ahead for the coordinator (see [`PairsCoordinator::open_session`]), which
/// [`DecisionStore::open_session`] hands out first.
pub struct PairStore {
    index: usize,
    remote: RemoteDecisions,
    reserved: Mutex<Vec<u64>>,
}

impl PairStore {
    /// The pair's index in the list the client was given (pair 1 is index 0).
    pub fn pair(&self) -> usize {
        self.index
    }

    /// The pair's store itself (its outcome queries, its endpoint).
    pub fn remote(&self) -> &RemoteDecisions {
        &self.remote
    }

    /// Opens a server session now and keeps it for the next [`DecisionStore::open_session`]:
    /// whether the pair serves is learnt before the coordinator takes the application's
    /// connections, so that a pair that does not serve costs it nothing.
    fn reserve(&self) -> Result<(), StoreError> {
        let id = self.remote.open_session()?;
        self.reserved.lock().push(id);
        Ok(())
    }

    /// Closes one reserved session that nobody took (the coordinator refused the session
    /// before it opened it in the store).
    fn release_one(&self) {
        let left = self.reserved.lock().pop();
        if let Some(id) = left {
            self.remote.close_session(id);
        }
    }
}

impl DecisionStore for PairStore {
    fn node(&self) -> u32 {
        self.remote.node()
    }
    fn incarnation(&self) -> u64 {
        self.remote.incarnation()
    }
    fn open_session(&self) -> Result<u64, StoreError> {
        let reserved = self.reserved.lock().pop();
        match reserved {
            Some(id) => Ok(id),
            None => self.remote.open_session(),
        }
    }
    fn close_session(&self, session: u64) {
        self.remote.close_session(session)
    }
    fn decide(&self, decision: &Decision) -> Result<(), StoreError> {
        self.remote.decide(decision)
    }
    fn complete(&self, xid: &Xid) -> Result<(), StoreError> {
        self.remote.complete(xid)
    }
    fn complete_heuristic(&self, xid: &Xid, outcome: HeuristicOutcome) -> Result<(), StoreError> {
        self.remote.complete_heuristic(xid, outcome)
    }
    fn one_phase(&self, xid: &Xid) -> Result<bool, StoreError> {
        self.remote.one_phase(xid)
    }
    fn decide_traced(&self, decision: &Decision, trace: Option<&TraceContext>) -> Result<(), StoreError> {
        self.remote.decide_traced(decision, trace)
    }
    fn complete_traced(
        &self,
        xid: &Xid,
        heuristic: Option<HeuristicOutcome>,
        trace: Option<&TraceContext>,
    ) -> Result<(), StoreError> {
        self.remote.complete_traced(xid, heuristic, trace)
    }
    fn complete_heuristic_kept(
        &self,
        xid: &Xid,
        outcome: HeuristicOutcome,
        trace: Option<&TraceContext>,
    ) -> Result<bool, StoreError> {
        self.remote.complete_heuristic_kept(xid, outcome, trace)
    }
    fn one_phase_traced(&self, xid: &Xid, trace: Option<&TraceContext>) -> Result<bool, StoreError> {
        self.remote.one_phase_traced(xid, trace)
    }
}

/// One pair as the client knows it.
struct Slot {
    members: Vec<Endpoint>,
    /// Its store, `None` until a member first served (and while it does not).
    store: Mutex<Option<Arc<PairStore>>>,
    /// When it last failed to open a session; cleared when it serves again.
    down_since: Mutex<Option<Instant>>,
}

/// Several independent pairs (or single servers), each with its own node id: sessions go
/// round robin to the pairs that serve, outcomes to the pair whose node id the Xid carries.
pub struct Pairs {
    slots: Vec<Slot>,
    options: ClientOptions,
    /// Each pair's node id, learnt at its first connection and kept (a pair that is down
    /// still answers for its Xids once it is back, and is named when asked meanwhile).
    nodes: Mutex<Vec<Option<u32>>>,
    turn: AtomicUsize,
}

impl Pairs {
    /// Connects to a pair list in [`route::parse_pairs`]'s syntax
    /// (`tcp:a1:7411,tcp:a2:7411;tcp:b1:7411,tcp:b2:7411`) with default options.
    pub fn connect(spec: &str) -> Result<Pairs, StoreError> {
        Self::connect_with(route::parse_pairs(spec)?, ClientOptions::default())
    }

    /// Connects to every pair of `pairs` (each a list of its members' endpoints); succeeds
    /// when at least one serves (the others are tried again as sessions open), and fails
    /// naming every pair and why when none does. `options.node_expected` must be 0: each
    /// pair's node id is learnt at its first connection, then expected at every later one.
    pub fn connect_with(pairs: Vec<Vec<Endpoint>>, options: ClientOptions) -> Result<Pairs, StoreError> {
        route::check_pairs(&pairs)?;
        if options.node_expected != 0 {
            return Err(StoreError::Unreachable(format!(
                "node_expected = {} cannot hold for several pairs, each with its own node id: leave it 0",
                options.node_expected
            )));
        }
        let count = pairs.len();
        let slots = pairs
            .into_iter()
            .map(|members| Slot { members, store: Mutex::new(None), down_since: Mutex::new(None) })
            .collect();
        let this = Pairs { slots, options, nodes: Mutex::new(vec![None; count]), turn: AtomicUsize::new(0) };
        let mut failures = Vec::new();
        for index in 0..count {
            if let Err(e) = this.store(index) {
                tracing::warn!(pair = index + 1, error = %e, "pair not reached at connect");
                *this.slots[index].down_since.lock() = Some(Instant::now());
                failures.push((index, e));
            }
        }
        if failures.len() == count {
            return Err(this.none_serves(failures));
        }
        Ok(this)
    }

    /// How many pairs the client was given.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether the list is empty (never: [`Pairs::connect_with`] refuses an empty list).
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The members of pair `index` (0-based), as given.
    pub fn members(&self, index: usize) -> &[Endpoint] {
        &self.slots[index].members
    }

    /// Each pair's node id, `None` for a pair never reached.
    pub fn nodes(&self) -> Vec<Option<u32>> {
        self.nodes.lock().clone()
    }

    /// Pair `index`'s store, connected now if it has none.
    pub fn store(&self, index: usize) -> Result<Arc<PairStore>, StoreError> {
        let mut store = self.slots[index].store.lock();
        if let Some(s) = &*store {
            return Ok(s.clone());
        }
        let fresh = Arc::new(self.connect_pair(index)?);
        *store = Some(fresh.clone());
        Ok(fresh)
    }

    /// Pair `index`'s store connected again, unless another thread already replaced
    /// `stale`; the stale store keeps serving the sessions it holds.
    fn reconnect(&self, index: usize, stale: &Arc<PairStore>) -> Result<Arc<PairStore>, StoreError> {
        let mut store = self.slots[index].store.lock();
        if let Some(s) = &*store {
            if !Arc::ptr_eq(s, stale) {
                return Ok(s.clone());
            }
        }
        *store = None;
        let fresh = Arc::new(self.connect_pair(index)?);
        *store = Some(fresh.clone());
        Ok(fresh)
    }

    /// A new store on pair `index`, whose node id must be the one it had and no other
    /// pair's.
    fn connect_pair(&self, index: usize) -> Result<PairStore, StoreError> {
        let members = &self.slots[index].members;
        let known = self.nodes.lock()[index];
        let options = ClientOptions { node_expected: known.unwrap_or(0), ..self.options.clone() };
        let remote = RemoteDecisions::connect_any(members.clone(), options)?;
        let node = remote.node();
        let mut nodes = self.nodes.lock();
        if let Some(other) = route::node_taken(&nodes, index, node) {
            return Err(StoreError::Unreachable(format!(
                "pair {} ({}) has node id {node}, as pair {} ({}) has: every pair needs its own node id",
                index + 1,
                names(members),
                other + 1,
                names(&self.slots[other].members)
            )));
        }
        nodes[index] = Some(node);
        Ok(PairStore { index, remote, reserved: Mutex::new(Vec::new()) })
    }

    /// Runs `open` (which opens something on a pair's store) on the next pair that serves,
    /// round robin; a pair whose store fails with [`StoreError::Unreachable`] (down, or its
    /// primary restarted or changed: a new incarnation) is connected again once and, if it
    /// still fails, left for the next pair. Other errors are returned at once.
    fn on_next_pair<T>(
        &self,
        open: impl Fn(&PairStore) -> Result<T, StoreError>,
    ) -> Result<(Arc<PairStore>, T), StoreError> {
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        let down: Vec<bool> = self
            .slots
            .iter()
            .map(|s| s.down_since.lock().is_some_and(|t| t.elapsed() < PAIR_DOWN_FOR))
            .collect();
        let mut failures = Vec::new();
        for index in route::session_order(turn, &down) {
            match self.try_pair(index, &open) {
                Ok(done) => {
                    *self.slots[index].down_since.lock() = None;
                    return Ok(done);
                }
                Err(StoreError::Unreachable(why)) => {
                    tracing::debug!(pair = index + 1, %why, "pair does not serve; trying the next");
                    *self.slots[index].down_since.lock() = Some(Instant::now());
                    failures.push((index, StoreError::Unreachable(why)));
                }
                Err(e) => return Err(e),
            }
        }
        Err(self.none_serves(failures))
    }

    /// `open` on pair `index`'s store, and once more on a store connected again.
    fn try_pair<T>(
        &self,
        index: usize,
        open: &impl Fn(&PairStore) -> Result<T, StoreError>,
    ) -> Result<(Arc<PairStore>, T), StoreError> {
        let store = self.store(index)?;
        match open(&store) {
            Ok(t) => Ok((store, t)),
            Err(StoreError::Unreachable(_)) => {
                let fresh = self.reconnect(index, &store)?;
                let t = open(&fresh)?;
                Ok((fresh, t))
            }
            Err(e) => Err(e),
        }
    }

    /// The error when no pair serves: every pair, its members and why.
    fn none_serves(&self, failures: Vec<(usize, StoreError)>) -> StoreError {
        let each: Vec<String> = failures
            .iter()
            .map(|(i, e)| format!("pair {} ({}): {e}", i + 1, names(&self.slots[*i].members)))
            .collect();
        StoreError::Unreachable(format!("no pair serves: {}", each.join("; ")))
    }

    /// Opens a server session on the next pair that serves; returns that pair's store
    /// (mint the session's Xids with its node and incarnation) and the session id.
    pub fn open_session(&self) -> Result<(Arc<PairStore>, u64), StoreError> {
        self.on_next_pair(|store| store.remote.open_session())
    }

    /// The pair that answers for `xid` (0-based): the one whose node id it carries. Pairs
    /// never reached are tried first when no known pair has it. An Xid of no pair is
    /// refused ([`StoreError::Malformed`]), or [`StoreError::Unreachable`] while a pair
    /// whose node id is unknown cannot be reached.
    pub fn pair_of(&self, xid: &Xid) -> Result<usize, StoreError> {
        match route::pair_of_xid(&self.nodes(), xid) {
            Ok(index) => return Ok(index),
            Err(RouteError::UnknownNode { unlearned, .. }) => {
                for index in unlearned {
                    if let Err(e) = self.store(index) {
                        tracing::debug!(pair = index + 1, error = %e, "pair not reached to learn its node id");
                    }
                }
            }
            Err(e) => return Err(route_error(xid, e)),
        }
        route::pair_of_xid(&self.nodes(), xid).map_err(|e| route_error(xid, e))
    }

    /// What became of `xid`, asked of the pair whose node id it carries (the answers of
    /// [`RemoteDecisions::outcome`]); never of another pair.
    pub fn outcome(&self, xid: &Xid) -> Result<Outcome, StoreError> {
        let index = self.pair_of(xid)?;
        let store = self.store(index).map_err(|e| self.pair_error(index, e))?;
        store.remote.outcome(xid).map_err(|e| self.pair_error(index, e))
    }

    /// `e`, saying which pair it came from.
    fn pair_error(&self, index: usize, e: StoreError) -> StoreError {
        let pair = format!("pair {} ({})", index + 1, names(&self.slots[index].members));
        match e {
            StoreError::Unreachable(why) => StoreError::Unreachable(format!("{pair}: {why}")),
            other => other,
        }
    }
}

/// Why no pair answers for `xid`: [`StoreError::Unreachable`] while a pair whose node id
/// is unknown cannot be reached (the Xid may be its), else [`StoreError::Malformed`].
fn route_error(xid: &Xid, e: RouteError) -> StoreError {
    match &e {
        RouteError::UnknownNode { unlearned, .. } if !unlearned.is_empty() => {
            StoreError::Unreachable(format!("{xid}: {e}"))
        }
        _ => StoreError::Malformed(format!("{xid}: {e}")),
    }
}

/// A pair's members as written in a pair list.
fn names(members: &[Endpoint]) -> String {
    members.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
}

/// A pair's coordinator and the store it runs on.
type PairManager = (Arc<PairStore>, Arc<TransactionManager>);

/// One coordinator per pair over [`Pairs`]: each [`Session`] opens on the next pair that
/// serves and mints its Xids with that pair's node id and incarnation, so each transaction
/// lives on one pair. A pair that restarted or failed over gets a new coordinator (the old
/// one lives on with the sessions it holds, which end as a single-pair client's do).
pub struct PairsCoordinator {
    pairs: Pairs,
    config: TmConfig,
    factories: Vec<Arc<dyn RmFactory>>,
    /// Each pair's coordinator and the store it runs on.
    managers: Vec<Mutex<Option<PairManager>>>,
}

impl PairsCoordinator {
    /// Coordinators over `pairs`, with the same configuration and resource-manager
    /// factories on every pair (each pair's server needs the same `[[rm]]` names).
    pub fn new(
        pairs: Pairs,
        config: TmConfig,
        factories: Vec<Arc<dyn RmFactory>>,
    ) -> Result<PairsCoordinator, TmError> {
        let managers = (0..pairs.len()).map(|_| Mutex::new(None)).collect();
        let this = PairsCoordinator { pairs, config, factories, managers };
        // A configuration the coordinator refuses is refused here, not at the first session.
        for index in 0..this.pairs.len() {
            let store = this.pairs.slots[index].store.lock().clone();
            if let Some(store) = store {
                this.manager(&store)?;
            }
        }
        Ok(this)
    }

    /// The pairs (their stores, node ids and outcome queries).
    pub fn pairs(&self) -> &Pairs {
        &self.pairs
    }

    /// The coordinator running on `store`, made when the pair has none or one on an older
    /// store.
    fn manager(&self, store: &Arc<PairStore>) -> Result<Arc<TransactionManager>, TmError> {
        let mut slot = self.managers[store.index].lock();
        if let Some((s, tm)) = &*slot {
            if Arc::ptr_eq(s, store) {
                return Ok(tm.clone());
            }
        }
        let as_store: Arc<dyn DecisionStore> = store.clone();
        let tm = TransactionManager::with_store(as_store, self.config.clone(), self.factories.clone())?;
        *slot = Some((store.clone(), tm.clone()));
        Ok(tm)
    }

    /// Pair `index`'s current coordinator, if it has one (for its `pending()`, heuristics).
    pub fn manager_of(&self, index: usize) -> Option<Arc<TransactionManager>> {
        self.managers[index].lock().as_ref().map(|(_, tm)| tm.clone())
    }

    /// Opens a session over `rms` on the next pair that serves (round robin). The server
    /// session is opened first, so the connections are opened once, on a pair that serves;
    /// when none serves, the error names every pair and why.
    pub fn open_session(&self, rms: Vec<Box<dyn ResourceManager>>) -> Result<Session, TmError> {
        let (store, ()) = self.pairs.on_next_pair(PairStore::reserve)?;
        let opened = self.manager(&store).and_then(|tm| Session::open(&tm, rms));
        // Refused before it took the reserved session (a resource manager's failed open
        // comes after, and closes the session itself).
        if matches!(opened, Err(ref e) if !matches!(e, TmError::Rm { .. })) {
            store.release_one();
        }
        opened
    }

    /// What became of `xid`, asked of the pair whose node id it carries.
    pub fn outcome(&self, xid: &Xid) -> Result<Outcome, StoreError> {
        self.pairs.outcome(xid)
    }
}
