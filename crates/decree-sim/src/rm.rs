//! The resource managers of the simulation: databases that hold prepared branches and
//! record every branch's commit and rollback, shared by both members (whichever leads
//! calls them) and the clients (which prepare branches and run their own phase two).
//!
//! A branch is prepared by its client, then committed or rolled back once; a call on a
//! branch that is finished (or was never prepared) answers "unknown branch" as XA's
//! `XAER_NOTA` does. Every transition is kept as an [`RmEvent`] for the invariants, which
//! read them after each step. A database can be made unavailable for a while.

use decree_core::{ResourceManager, RmError, RmFactory, Vote, Xid};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Where a branch is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BranchState {
    /// Voted to commit; waits for phase two.
    Prepared,
    /// Committed.
    Committed,
    /// Rolled back.
    RolledBack,
}

/// Who called the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Actor {
    /// A client, as its own coordinator (phase one, its own phase two or rollback).
    Client(usize),
    /// A pair member's server (phase two of orphans, presumed abort).
    Member(u8),
}

/// One branch's transition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RmEvent {
    /// The global transaction.
    pub global: Xid,
    /// The database.
    pub rm: String,
    /// The branch number.
    pub branch: u16,
    /// Where it went.
    pub to: BranchState,
    /// Who moved it.
    pub by: Actor,
}

/// The databases, shared.
#[derive(Clone)]
pub struct Databases {
    inner: Arc<Mutex<Inner>>,
}

struct Inner {
    names: Vec<String>,
    down: Vec<bool>,
    /// Every branch ever prepared, by global transaction, then (database, branch).
    branches: BTreeMap<Xid, BTreeMap<(String, u16), BranchState>>,
    events: Vec<RmEvent>,
    reused: Vec<Xid>,
}

impl Databases {
    /// Databases named `names`, empty.
    pub fn new(names: &[String]) -> Databases {
        let inner = Inner {
            names: names.to_vec(),
            down: vec![false; names.len()],
            branches: BTreeMap::new(),
            events: Vec::new(),
            reused: Vec::new(),
        };
        Databases { inner: Arc::new(Mutex::new(inner)) }
    }

    /// The databases' names.
    pub fn names(&self) -> Vec<String> {
        self.inner.lock().names.clone()
    }

    /// What a member's server connects to (its `[[rm]]`s).
    pub fn factories(&self, member: u8) -> Vec<Arc<dyn RmFactory>> {
        self.names()
            .into_iter()
            .map(|name| {
                Arc::new(SimRmFactory { databases: self.clone(), name, member }) as Arc<dyn RmFactory>
            })
            .collect()
    }

    /// Makes database `index` unavailable (or available again).
    pub fn set_down(&self, index: usize, down: bool) {
        self.inner.lock().down[index] = down;
    }

    /// Whether database `rm` answers.
    fn up(&self, rm: &str) -> bool {
        let inner = self.inner.lock();
        inner.names.iter().position(|n| n == rm).is_some_and(|i| !inner.down[i])
    }

    /// A client's phase one: the branch is prepared (false when the database is down, or
    /// when that branch of that Xid existed already: a reused Xid, kept for the oracle).
    pub fn prepare(&self, global: &Xid, rm: &str, branch: u16) -> bool {
        if !self.up(rm) {
            return false;
        }
        let mut inner = self.inner.lock();
        let branches = inner.branches.entry(*global).or_default();
        if branches.contains_key(&(rm.to_string(), branch)) {
            inner.reused.push(*global);
            return false;
        }
        branches.insert((rm.to_string(), branch), BranchState::Prepared);
        true
    }

    /// The Xids a client was handed twice (by two sessions of one incarnation), since the
    /// last call.
    pub fn take_reused(&self) -> Vec<Xid> {
        std::mem::take(&mut self.inner.lock().reused)
    }

    /// Moves a prepared branch to `to`; "unknown branch" when it is not prepared.
    pub fn finish(
        &self,
        global: &Xid,
        rm: &str,
        branch: u16,
        to: BranchState,
        by: Actor,
    ) -> Result<(), RmError> {
        if !self.up(rm) {
            return Err(RmError::Unavailable(format!("{rm} is down")));
        }
        let mut inner = self.inner.lock();
        let state = inner.branches.get_mut(global).and_then(|b| b.get_mut(&(rm.to_string(), branch)));
        match state {
            Some(state) if *state == BranchState::Prepared => {
                *state = to;
                inner.events.push(RmEvent { global: *global, rm: rm.to_string(), branch, to, by });
                Ok(())
            }
            _ => Err(RmError::UnknownXid(global.branch(branch).to_string())),
        }
    }

    /// The transitions since the last call.
    pub fn take_events(&self) -> Vec<RmEvent> {
        std::mem::take(&mut self.inner.lock().events)
    }

    /// The states of every branch of `global`.
    pub fn states(&self, global: &Xid) -> Vec<BranchState> {
        self.inner.lock().branches.get(global).map(|b| b.values().copied().collect()).unwrap_or_default()
    }

    /// Branches still prepared, over all databases.
    pub fn prepared(&self) -> Vec<(Xid, String, u16)> {
        let inner = self.inner.lock();
        let mut out = Vec::new();
        for (global, branches) in &inner.branches {
            for ((rm, branch), state) in branches {
                if *state == BranchState::Prepared {
                    out.push((*global, rm.clone(), *branch));
                }
            }
        }
        out
    }

    /// The prepared branches of database `rm`, as XA's `recover` lists them.
    fn recover(&self, rm: &str) -> Vec<Xid> {
        let inner = self.inner.lock();
        let mut out = Vec::new();
        for (global, branches) in &inner.branches {
            for ((name, branch), state) in branches {
                if name == rm && *state == BranchState::Prepared {
                    out.push(global.branch(*branch));
                }
            }
        }
        out
    }
}

struct SimRmFactory {
    databases: Databases,
    name: String,
    member: u8,
}

impl RmFactory for SimRmFactory {
    fn name(&self) -> &str {
        &self.name
    }

    fn connect(&self) -> Result<Box<dyn ResourceManager>, RmError> {
        if !self.databases.up(&self.name) {
            return Err(RmError::Unavailable(format!("{} is down", self.name)));
        }
        Ok(Box::new(SimRmConnection {
            databases: self.databases.clone(),
            name: self.name.clone(),
            member: self.member,
        }))
    }
}

/// A member's connection to one database: phase two, rollback and recover only (a state
/// server never runs phase one).
struct SimRmConnection {
    databases: Databases,
    name: String,
    member: u8,
}

impl SimRmConnection {
    fn finish(&self, xid: &Xid, to: BranchState) -> Result<(), RmError> {
        let branch =
            xid.branch_number().ok_or_else(|| RmError::Protocol(format!("{xid} names no branch")))?;
        self.databases.finish(&xid.global(), &self.name, branch, to, Actor::Member(self.member))
    }
}

impl ResourceManager for SimRmConnection {
    fn name(&self) -> &str {
        &self.name
    }
    fn open(&mut self) -> Result<(), RmError> {
        Ok(())
    }
    fn close(&mut self) -> Result<(), RmError> {
        Ok(())
    }
    fn start(&mut self, xid: &Xid) -> Result<(), RmError> {
        Err(RmError::Protocol(format!("a state server starts no branch ({xid})")))
    }
    fn end(&mut self, xid: &Xid) -> Result<(), RmError> {
        Err(RmError::Protocol(format!("a state server ends no branch ({xid})")))
    }
    fn prepare(&mut self, xid: &Xid) -> Result<Vote, RmError> {
        Err(RmError::Protocol(format!("a state server prepares no branch ({xid})")))
    }
    fn commit(&mut self, xid: &Xid, one_phase: bool) -> Result<(), RmError> {
        assert!(!one_phase, "a state server commits in two phases");
        self.finish(xid, BranchState::Committed)
    }
    fn rollback(&mut self, xid: &Xid) -> Result<(), RmError> {
        self.finish(xid, BranchState::RolledBack)
    }
    fn recover(&mut self) -> Result<Vec<Xid>, RmError> {
        if !self.databases.up(&self.name) {
            return Err(RmError::Unavailable(format!("{} is down", self.name)));
        }
        Ok(self.databases.recover(&self.name))
    }
    fn forget(&mut self, _xid: &Xid) -> Result<(), RmError> {
        Ok(())
    }
}
