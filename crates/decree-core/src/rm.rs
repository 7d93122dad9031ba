//! The interface a resource manager offers the coordinator, mirroring XA.
//!
//! One [`ResourceManager`] value is one connection to one resource (XA's "thread of
//! control"): the coordinator owns it for the life of a session. Calls take `&mut self`
//! so that an implementation can keep its connection without locks. Phase-two calls
//! (`commit`, `rollback`) may be made from a different value of the same resource than the
//! one that prepared the branch, as recovery does.

use crate::xid::Xid;

/// A branch's answer to prepare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vote {
    /// Prepared: the branch will commit or roll back as told, even after a crash.
    Commit,
    /// The branch changed nothing: it is finished and leaves phase two.
    ReadOnly,
}

/// What went wrong in a resource-manager call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RmError {
    /// The branch voted no or was rolled back by the RM (XA_RB*); it is finished.
    #[error("rolled back by the resource manager: {0}")]
    RolledBack(String),
    /// The RM could not be reached or failed; the call may be retried later (XAER_RMFAIL).
    #[error("resource manager unavailable: {0}")]
    Unavailable(String),
    /// The RM does not know this Xid (XAER_NOTA): already finished, or never prepared.
    #[error("unknown transaction branch {0}")]
    UnknownXid(String),
    /// The RM decided on its own (XA_HEUR*): the outcome the coordinator must report.
    #[error("heuristic outcome: {0:?}")]
    Heuristic(HeuristicOutcome),
    /// The call was not valid in the branch's state (XAER_PROTO) or its arguments were bad.
    #[error("protocol error: {0}")]
    Protocol(String),
}

/// An outcome the resource manager chose without the coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeuristicOutcome {
    /// The branch was committed.
    Committed,
    /// The branch was rolled back.
    RolledBack,
    /// Part of the branch committed and part rolled back.
    Mixed,
}

/// A call a session makes on several branches of one transaction at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BranchCall {
    /// Starting a branch (XA xa_start).
    Start,
    /// Phase one.
    Prepare,
    /// Phase two of a prepared branch.
    Commit,
}

/// A branch's answer to a [`BranchCall`].
#[derive(Debug)]
pub enum BranchAnswer {
    /// The answer to [`BranchCall::Prepare`].
    Vote(Result<Vote, RmError>),
    /// The answer to [`BranchCall::Start`] and [`BranchCall::Commit`].
    Ack(Result<(), RmError>),
}

impl BranchAnswer {
    /// The vote; an acknowledgement where a vote was expected is a protocol error.
    pub fn into_vote(self) -> Result<Vote, RmError> {
        match self {
            BranchAnswer::Vote(v) => v,
            BranchAnswer::Ack(_) => {
                Err(RmError::Protocol("a commit answer where a vote was expected".into()))
            }
        }
    }

    /// The acknowledgement; a vote where one was expected is a protocol error.
    pub fn into_ack(self) -> Result<(), RmError> {
        match self {
            BranchAnswer::Ack(a) => a,
            BranchAnswer::Vote(_) => {
                Err(RmError::Protocol("a vote where a commit answer was expected".into()))
            }
        }
    }
}

/// One connection to a resource that can take part in two-phase commit.
pub trait ResourceManager: Send {
    /// A short name for reports and errors (from the configuration).
    fn name(&self) -> &str;
    /// Connects (XA xa_open).
    fn open(&mut self) -> Result<(), RmError>;
    /// Disconnects (XA xa_close).
    fn close(&mut self) -> Result<(), RmError>;
    /// Starts work on a branch: the application's changes from now on belong to `xid`.
    fn start(&mut self, xid: &Xid) -> Result<(), RmError>;
    /// Ends the association of the work with `xid` before prepare or rollback.
    fn end(&mut self, xid: &Xid) -> Result<(), RmError>;
    /// Phase one: make the branch's changes durable without committing them.
    fn prepare(&mut self, xid: &Xid) -> Result<Vote, RmError>;
    /// Phase two (or one-phase commit when `one_phase` is set, without a prepare).
    fn commit(&mut self, xid: &Xid, one_phase: bool) -> Result<(), RmError>;
    /// Rolls the branch back, prepared or not.
    fn rollback(&mut self, xid: &Xid) -> Result<(), RmError>;
    /// The branches this RM holds prepared (any transaction manager's; callers filter).
    fn recover(&mut self) -> Result<Vec<Xid>, RmError>;
    /// Forgets a heuristically completed branch.
    fn forget(&mut self, xid: &Xid) -> Result<(), RmError>;
    /// Whether start, prepare and commit gain from overlapping with other branches' calls
    /// (network RMs, where each call waits for a round trip): they then overlap through
    /// split-phase calls or helper threads; in-memory RMs are faster in sequence.
    fn prefers_parallel(&self) -> bool {
        false
    }
    /// The database's `db.system.name` in OpenTelemetry's semantic conventions
    /// (`postgresql`, `mariadb`, ...), for the branch's spans.
    fn db_system(&self) -> &'static str {
        "other_sql"
    }
    /// Split-phase calls, first half: sends `call`'s request and returns without waiting
    /// for the answer, so that one thread keeps every branch's request in flight at once
    /// (no helper threads, no hand-offs). Returns false, having sent nothing, when this RM
    /// has no split-phase calls; after true the caller must take the answer with
    /// [`ResourceManager::receive`] before any other call.
    fn send(&mut self, _call: BranchCall, _xid: &Xid) -> bool {
        false
    }
    /// Split-phase calls, second half: waits for the answer to the request
    /// [`ResourceManager::send`] left in flight.
    fn receive(&mut self) -> BranchAnswer {
        BranchAnswer::Ack(Err(RmError::Protocol("receive without a request in flight".into())))
    }
}

/// Makes new connections to one resource: recovery and phase-two retries use it.
pub trait RmFactory: Send + Sync {
    /// The resource's name.
    fn name(&self) -> &str;
    /// A new, opened connection.
    fn connect(&self) -> Result<Box<dyn ResourceManager>, RmError>;
}
