//! The TX-style API: X/Open TX's `tx_open`, `tx_begin`, `tx_commit`, `tx_rollback`,
//! `tx_close` and `tx_info` on a per-thread context.
//!
//! A [`TxContext`] is a [`Session`] whose every connection takes part in every transaction
//! (TX's static registration). Misuse (commit without begin, begin twice, begin after close,
//! close with a transaction open) returns a [`TmError`] and leaves the context usable; it
//! never panics. After a failed commit the transaction is over either way: the context is
//! ready for the next `begin`.

use crate::error::TmError;
use crate::rm::ResourceManager;
use crate::session::{CommitReport, Session};
use crate::tm::TransactionManager;
use crate::xid::Xid;
use std::sync::Arc;

/// Where a TX context stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxState {
    /// Open, no transaction.
    Idle,
    /// A transaction is begun.
    Active,
    /// Closed: only `info` is allowed (and `reopen` after [`TxContext::close_keep_session`]).
    Closed,
}

/// The answer of [`TxContext::info`] (TX's tx_info).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxInfo {
    /// The current transaction, if any.
    pub xid: Option<Xid>,
    /// The context's state.
    pub state: TxState,
    /// The session id of the context.
    pub session: u64,
}

/// One thread's TX context.
pub struct TxContext {
    session: Session,
}

impl TxContext {
    /// Opens every resource manager (tx_open).
    pub fn open(tm: &Arc<TransactionManager>, rms: Vec<Box<dyn ResourceManager>>) -> Result<Self, TmError> {
        Ok(TxContext { session: Session::open(tm, rms)? })
    }

    /// Begins a global transaction on every resource manager (tx_begin).
    pub fn begin(&mut self) -> Result<Xid, TmError> {
        self.session.begin_xid()?;
        let begun = |s: &Session| s.current_xid().expect("a transaction was just begun");
        if let Err(e) = self.session.enlist_all() {
            let xid = begun(&self.session);
            if let Err(rollback_error) = self.session.rollback_current() {
                tracing::warn!(%xid, error = %rollback_error, "rollback after a failed begin");
            }
            return Err(e);
        }
        Ok(begun(&self.session))
    }

    /// Commits the current transaction (tx_commit).
    pub fn commit(&mut self) -> Result<CommitReport, TmError> {
        if !self.session.is_open() {
            return Err(TmError::Closed { call: "commit" });
        }
        self.session.commit_current()
    }

    /// Rolls back the current transaction (tx_rollback).
    pub fn rollback(&mut self) -> Result<(), TmError> {
        if !self.session.is_open() {
            return Err(TmError::Closed { call: "rollback" });
        }
        self.session.rollback_current()
    }

    /// Closes every resource manager (tx_close); refused while a transaction is open.
    pub fn close(&mut self) -> Result<(), TmError> {
        self.session.close()
    }

    /// tx_close that keeps the context for a later [`TxContext::reopen`]: every resource
    /// manager is closed (xa_close), but the session, its store session (one state-server
    /// connection) and its buffers stay, so a thread that loops on tx_open/tx_close
    /// allocates nothing and opens no new connection to the coordinator per cycle.
    pub fn close_keep_session(&mut self) -> Result<(), TmError> {
        self.session.close_rms()
    }

    /// tx_open again after [`TxContext::close_keep_session`]: opens every resource manager
    /// (xa_open) of the same session.
    pub fn reopen(&mut self) -> Result<(), TmError> {
        self.session.reopen_rms()
    }

    /// The current transaction and state (tx_info).
    pub fn info(&self) -> TxInfo {
        let state = match (self.session.is_open() && !self.session.rms_closed(), self.session.current()) {
            (false, _) => TxState::Closed,
            (true, Some(_)) => TxState::Active,
            (true, None) => TxState::Idle,
        };
        TxInfo { xid: self.session.current(), state, session: self.session.id() }
    }

    /// Connection `index`, to do the application's work on it.
    pub fn rm_mut(&mut self, index: usize) -> Option<&mut (dyn ResourceManager + 'static)> {
        self.session.rm_mut(index)
    }

    /// Replaces connection `index` by a fresh one from its factory (after a crash of the
    /// RM or of the connection); refused while a transaction is active.
    pub fn reconnect(&mut self, index: usize) -> Result<(), TmError> {
        self.session.reconnect(index)
    }

    /// The session underneath (object API on the same connections).
    pub fn session_mut(&mut self) -> &mut Session {
        &mut self.session
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rm::RmFactory;
    use crate::testing::dummy::{Call, DummyFactory};
    use crate::tm::TmConfig;
    use crate::TmError;

    #[test]
    fn close_keep_session_closes_the_rms_and_reopen_opens_them_in_the_same_session() {
        let (a, b) = (DummyFactory::named("a", 0), DummyFactory::named("b", 0));
        let log: Arc<dyn decree_log::Log> = Arc::new(decree_log::engine::volatile::VolatileLog::new());
        let factories: Vec<Arc<dyn RmFactory>> = vec![a.arc(), b.arc()];
        let tm = TransactionManager::embedded(log.clone(), TmConfig::default(), factories).unwrap();
        let rms: Vec<Box<dyn ResourceManager>> = vec![Box::new(a.connection()), Box::new(b.connection())];
        let mut tx = TxContext::open(&tm, rms).unwrap();
        let session = tx.info().session;
        tx.begin().unwrap();
        assert!(matches!(tx.close_keep_session(), Err(TmError::TransactionOpen { .. })));
        tx.commit().unwrap();
        // Recovery at start may have opened and closed a connection of its own.
        let (close0, open0) = (a.counts().get(Call::Close), a.counts().get(Call::Open));
        for cycle in 1..=3u64 {
            tx.close_keep_session().unwrap();
            assert_eq!(tx.info().state, TxState::Closed);
            assert!(matches!(tx.begin(), Err(TmError::Closed { call: "begin" })));
            assert!(tx.close_keep_session().is_err(), "closing twice is refused");
            tx.reopen().unwrap();
            assert!(tx.reopen().is_err(), "opening twice is refused");
            assert_eq!(tx.info(), TxInfo { xid: None, state: TxState::Idle, session });
            let xid = tx.begin().unwrap();
            assert_eq!(xid.origin().map(|o| o.session), Some(session));
            tx.commit().unwrap();
            assert_eq!(
                (a.counts().get(Call::Close), a.counts().get(Call::Open)),
                (close0 + cycle, open0 + cycle)
            );
        }
        tx.close_keep_session().unwrap();
        tx.close().unwrap();
        // The final close does not close the RMs a second time.
        assert_eq!(a.counts().get(Call::Close), close0 + 4);
        assert_eq!(log.stats().records_appended, 4);
    }
}
