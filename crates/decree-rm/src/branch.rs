//! What one connection knows about the branch it is working on.
//!
//! Each resource-manager value is one database connection; the state here says which Xid,
//! if any, that connection is associated with, so that `prepare`, `commit` and `rollback`
//! can tell "the branch whose work runs on this connection" (finished with `COMMIT`,
//! `ROLLBACK`, `XA END`...) from "a prepared branch named by its Xid" (finished by name,
//! from any connection). Invariant: at most one branch per connection, as in XA.

use decree_core::{RmError, Xid};
use parking_lot::{Mutex, MutexGuard};

/// Takes a connection shared by the RM value and the application's handle without waiting:
/// the coordinator and the application take turns on one connection, so a held lock means a
/// client guard was kept across a coordinator call, which is a usage error to report, not
/// something to wait for (waiting would deadlock the thread that holds the guard).
pub(crate) fn lock_connection<'a, C>(
    name: &str,
    shared: &'a Mutex<C>,
    op: &str,
) -> Result<MutexGuard<'a, C>, RmError> {
    shared.try_lock().ok_or_else(|| {
        RmError::Protocol(format!(
            "{name}: {op}: the connection is in use (a client guard is still alive or another \
             thread holds it); drop the client guard before calling the coordinator"
        ))
    })
}

/// The branch a connection is associated with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BranchState {
    /// No branch: the connection may start one or finish prepared branches by name.
    Idle,
    /// Started: the application's work on this connection belongs to the Xid.
    Active(Xid),
    /// Ended (MariaDB `XA END`): no more work, waiting for prepare, commit or rollback.
    Ended(Xid),
    /// Prepared and still attached to this connection (MariaDB keeps a prepared branch
    /// with the session that prepared it until that session finishes it or disconnects).
    Prepared(Xid),
    /// A prepare was sent but its answer was lost: the branch may or may not be prepared.
    InDoubt(Xid),
    /// The connection died while the branch was open (before any prepare): the server
    /// rolled its work back. Kept so that `prepare` says so instead of preparing a new,
    /// empty transaction on a fresh connection.
    Lost(Xid),
}

impl BranchState {
    /// The Xid the connection is tied to, if any.
    pub(crate) fn xid(&self) -> Option<Xid> {
        match *self {
            BranchState::Idle => None,
            BranchState::Active(x)
            | BranchState::Ended(x)
            | BranchState::Prepared(x)
            | BranchState::InDoubt(x)
            | BranchState::Lost(x) => Some(x),
        }
    }

    /// Refuses to start `xid` while another branch holds the connection.
    pub(crate) fn check_can_start(&self, rm: &str, xid: &Xid) -> Result<(), RmError> {
        match *self {
            BranchState::Idle | BranchState::InDoubt(_) | BranchState::Lost(_) => Ok(()),
            BranchState::Active(x) | BranchState::Ended(x) | BranchState::Prepared(x) => {
                Err(RmError::Protocol(format!(
                    "{rm}: cannot start branch {xid}: this connection still holds branch {x} \
                     (finish it with prepare/commit/rollback first)"
                )))
            }
        }
    }
}

impl BranchState {
    /// Before handing the connection to the application's SQL: a connection found gone
    /// (`connected` false) loses the open branch, and a lost branch is refused, because
    /// the server rolled its work back (the state stays Lost, so that prepare votes no).
    pub(crate) fn check_usable(&mut self, connected: bool, rm: &str, address: &str) -> Result<(), RmError> {
        if !connected {
            self.lose_open_branch();
        }
        match *self {
            BranchState::Lost(x) => Err(RmError::RolledBack(format!(
                "{rm}: connection to {address} lost while branch {x} was open: the server rolled \
                 its work back"
            ))),
            _ => Ok(()),
        }
    }

    /// Records that the connection is gone: an open branch is lost with it.
    pub(crate) fn lose_open_branch(&mut self) {
        if let BranchState::Active(x) | BranchState::Ended(x) = *self {
            *self = BranchState::Lost(x);
        }
    }

    /// Checks that `xid` is the branch open on this connection, before `prepare`,
    /// one-phase commit or `end`. A lost branch is reported (once) as rolled back.
    pub(crate) fn check_open(&mut self, rm: &str, xid: &Xid, what: &str) -> Result<(), RmError> {
        match *self {
            BranchState::Active(x) | BranchState::Ended(x) if x == *xid => Ok(()),
            BranchState::Lost(x) if x == *xid => {
                *self = BranchState::Idle;
                Err(RmError::RolledBack(format!(
                    "{rm}: {what} {xid}: the connection was lost while the branch was open; the \
                     server rolled its work back"
                )))
            }
            other => Err(RmError::Protocol(format!(
                "{rm}: {what} {xid}: that branch is not open on this connection (state {other:?})"
            ))),
        }
    }
}

/// Quotes `text` as an SQL string literal (single quotes doubled).
pub(crate) fn sql_literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('\'');
    for c in text.chars() {
        if c == '\'' {
            out.push('\'');
        }
        out.push(c);
    }
    out.push('\'');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_double_quotes_and_states_guard_start() {
        assert_eq!(sql_literal("decree:1:ab:"), "'decree:1:ab:'");
        assert_eq!(sql_literal("o'brien"), "'o''brien'");
        let x = Xid::new(1, b"g", b"b").expect("valid xid");
        let y = Xid::new(1, b"h", b"b").expect("valid xid");
        assert!(BranchState::Idle.check_can_start("rm", &x).is_ok());
        assert!(BranchState::InDoubt(y).check_can_start("rm", &x).is_ok());
        let err = BranchState::Active(y).check_can_start("rm", &x).unwrap_err();
        assert!(matches!(err, RmError::Protocol(ref m) if m.contains("still holds")), "{err:?}");
        assert_eq!(BranchState::Prepared(y).xid(), Some(y));
        let mut state = BranchState::Active(x);
        state.lose_open_branch();
        assert_eq!(state, BranchState::Lost(x));
        let refused = state.check_usable(true, "rm", "host").unwrap_err();
        assert!(matches!(refused, RmError::RolledBack(ref m) if m.contains("host")), "{refused:?}");
        assert_eq!(state, BranchState::Lost(x), "still lost, so that prepare votes no");
        let mut open = BranchState::Active(y);
        assert!(open.check_usable(true, "rm", "host").is_ok());
        assert!(open.check_usable(false, "rm", "host").is_err(), "a gone connection loses the branch");
        let lost = state.check_open("rm", &x, "prepare").unwrap_err();
        assert!(matches!(lost, RmError::RolledBack(_)), "{lost:?}");
        assert_eq!(state, BranchState::Idle);
        let mut prepared = BranchState::Prepared(x);
        prepared.lose_open_branch();
        assert_eq!(prepared, BranchState::Prepared(x), "only open branches are lost");
        assert_eq!(BranchState::Idle.xid(), None);
    }
}
