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
    /// Closed: only `info` is allowed.
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
        let xid = self.session.begin_xid()?;
        for i in 0..self.session.rm_count() {
            if let Err(e) = self.session.enlist(i) {
                if let Err(rollback_error) = self.session.rollback_current() {
                    tracing::warn!(%xid, error = %rollback_error, "rollback after a failed begin");
                }
                return Err(e);
            }
        }
        Ok(xid)
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

    /// The current transaction and state (tx_info).
    pub fn info(&self) -> TxInfo {
        let state = match (self.session.is_open(), self.session.current()) {
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
