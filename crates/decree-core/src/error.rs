//! Errors of the coordinator; each names the transaction, the resource manager and the
//! branch concerned, so that an operator can act on the message alone.
//!
//! The variants separate what the caller must tell apart: the transaction was rolled back
//! everywhere ([`TmError::RolledBack`]), its outcome is unknown until recovery runs
//! ([`TmError::OutcomeUnknown`]), a resource manager decided on its own
//! ([`TmError::Heuristic`]), or the API was misused ([`TmError::NoTransaction`] and friends).

use crate::limits::LimitError;
use crate::rm::{HeuristicOutcome, RmError};
use crate::store::StoreError;
use crate::xid::Xid;
use std::fmt;

/// A heuristic outcome one branch reported, kept for the caller and the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeuristicReport {
    /// The global transaction.
    pub xid: Xid,
    /// The resource manager that decided on its own.
    pub rm: String,
    /// The branch number within the transaction.
    pub branch: u16,
    /// What it decided.
    pub outcome: HeuristicOutcome,
}

impl fmt::Display for HeuristicReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "branch {} on {:?} of {}: heuristic {:?}", self.branch, self.rm, self.xid, self.outcome)
    }
}

/// Why a coordinator call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TmError {
    /// Phase one failed: every branch was rolled back (or is being rolled back in the
    /// background) and nothing durable was written.
    #[error("transaction {xid} rolled back: {call} on branch {branch} of {rm:?} failed: {cause}")]
    RolledBack {
        /// The global transaction.
        xid: Box<Xid>,
        /// The resource manager whose call failed.
        rm: String,
        /// Its branch number.
        branch: u16,
        /// The call that failed (`end`, `prepare`, `commit (one-phase)`).
        call: &'static str,
        /// What the resource manager answered.
        cause: RmError,
    },
    /// The decision (or a one-phase commit's notice) could not be sent to the state server:
    /// its session had ended (the server restarted, or closed the session) or the write
    /// failed. Nothing was decided and every branch was rolled back: safe to retry, on a
    /// new connection to the server (the old one is gone).
    #[error("transaction {xid} rolled back: it could not be sent to the state server ({cause}); nothing was decided")]
    NotSent {
        /// The global transaction.
        xid: Box<Xid>,
        /// Why it could not be sent.
        cause: String,
    },
    /// The outcome is not known to this caller: the decision write failed or a one-phase
    /// commit lost its reply. Recovery (or asking the state server) settles it; the
    /// branches stay prepared meanwhile.
    #[error("outcome of transaction {xid} unknown: {cause} (recovery or the state server will settle it)")]
    OutcomeUnknown {
        /// The global transaction (ask the state server or the log about it later).
        xid: Box<Xid>,
        /// Why the outcome is unknown.
        cause: String,
    },
    /// The transaction was decided, but some branch reported a heuristic outcome that
    /// differs from the decision (rolled back or mixed): data may be inconsistent.
    #[error("transaction {xid} committed but resource managers decided on their own: {}", list(reports))]
    Heuristic {
        /// The global transaction.
        xid: Box<Xid>,
        /// Every heuristic outcome reported for it.
        reports: Vec<HeuristicReport>,
    },
    /// A resource-manager call outside the commit protocol failed (open, start, close...).
    #[error("{call} on {rm:?} failed{}: {cause}", on_xid(xid))]
    Rm {
        /// The resource manager.
        rm: String,
        /// The call that failed.
        call: &'static str,
        /// The branch concerned, if any.
        xid: Option<Box<Xid>>,
        /// What the resource manager answered.
        cause: RmError,
    },
    /// The decision store failed outside a commit (opening a session, recovery).
    #[error("decision store: {0}")]
    Store(#[from] StoreError),
    /// commit or rollback was called with no transaction begun.
    #[error("{call} called with no transaction begun")]
    NoTransaction {
        /// The call that was refused.
        call: &'static str,
    },
    /// begin was called while a transaction is already active.
    #[error("begin called while transaction {xid} is active")]
    AlreadyActive {
        /// The transaction already active.
        xid: Box<Xid>,
    },
    /// close was called while a transaction is active: commit or roll it back first.
    #[error("close called while transaction {xid} is active; commit or roll it back first")]
    TransactionOpen {
        /// The transaction still open.
        xid: Box<Xid>,
    },
    /// The context was closed; open a new one.
    #[error("{call} called on a closed transaction context")]
    Closed {
        /// The call that was refused.
        call: &'static str,
    },
    /// The coordinator or session is configured in a way that cannot work.
    #[error("configuration: {0}")]
    Config(String),
    /// A resource manager's name or a transaction's branches are past a limit of the
    /// decision record ([`crate::limits`]); nothing was registered, started or written.
    #[error("{0}")]
    Limit(#[from] LimitError),
}

fn list(reports: &[HeuristicReport]) -> String {
    reports.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

fn on_xid(xid: &Option<Box<Xid>>) -> String {
    match xid {
        Some(x) => format!(" for {x}"),
        None => String::new(),
    }
}
