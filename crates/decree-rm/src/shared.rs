//! The resource-manager facade both databases share: one connection, owned by the
//! coordinator as a [`ResourceManager`] and reachable by the application through a handle.
//!
//! Each database module implements [`BranchConnection`] for its connection type (the XA
//! statements and their error mapping); [`SharedRm`] and [`SharedHandle`] add what does not
//! depend on the database: the lock the coordinator and the application take turns on
//! (never waited for, see `lock_connection`), the application's client guard, and the
//! delegation of every XA call. Invariant: every call goes through the lock, so a client
//! guard kept across a coordinator call is reported instead of deadlocking.

use std::sync::Arc;

use decree_core::{BranchAnswer, BranchCall, ResourceManager, RmError, Vote, Xid};
use parking_lot::{MappedMutexGuard, Mutex, MutexGuard};

use crate::branch::lock_connection;

/// One database connection and the branch it works on, as each database drives it.
pub trait BranchConnection: Send + 'static {
    /// The database client the application runs its SQL on.
    type Client;
    /// The database's `db.system.name` (OpenTelemetry semantic conventions).
    const DB_SYSTEM: &'static str;
    /// The server address for messages (never the password).
    fn address(&self) -> &str;
    /// The client for the application's SQL: reconnects when no branch is open, fails when
    /// the connection was lost while a branch was open.
    fn client_for_application(&mut self) -> Result<&mut Self::Client, RmError>;
    /// The client if connected (after `client_for_application` succeeded).
    fn client_mut(&mut self) -> Option<&mut Self::Client>;
    /// XA xa_open.
    fn open_rm(&mut self) -> Result<(), RmError>;
    /// XA xa_close.
    fn close(&mut self) -> Result<(), RmError>;
    /// XA xa_start.
    fn start(&mut self, xid: &Xid) -> Result<(), RmError>;
    /// XA xa_end.
    fn end(&mut self, xid: &Xid) -> Result<(), RmError>;
    /// XA xa_prepare.
    fn prepare(&mut self, xid: &Xid) -> Result<Vote, RmError>;
    /// XA xa_commit.
    fn commit(&mut self, xid: &Xid, one_phase: bool) -> Result<(), RmError>;
    /// XA xa_rollback.
    fn rollback(&mut self, xid: &Xid) -> Result<(), RmError>;
    /// XA xa_recover, filtered to decree's Xids.
    fn recover(&mut self) -> Result<Vec<Xid>, RmError>;
    /// Split-phase calls' first half ([`ResourceManager::send`]); none by default.
    fn send(&mut self, _call: BranchCall, _xid: &Xid) -> bool {
        false
    }
    /// Split-phase calls' second half ([`ResourceManager::receive`]).
    fn receive(&mut self) -> BranchAnswer {
        BranchAnswer::Ack(Err(RmError::Protocol("receive without a request in flight".into())))
    }
}

/// One connection taking part in two-phase commit; see the database modules' aliases
/// (`PgRm`, `MariaDbRm`).
pub struct SharedRm<C> {
    name: String,
    address: String,
    shared: Arc<Mutex<C>>,
}

/// A second owner of a [`SharedRm`]'s connection, for the application's SQL while the
/// coordinator holds the RM itself.
pub struct SharedHandle<C> {
    name: String,
    shared: Arc<Mutex<C>>,
}

impl<C> Clone for SharedHandle<C> {
    fn clone(&self) -> Self {
        SharedHandle { name: self.name.clone(), shared: self.shared.clone() }
    }
}

fn lock_client<'a, C: BranchConnection>(
    name: &str,
    shared: &'a Mutex<C>,
) -> Result<MappedMutexGuard<'a, C::Client>, RmError> {
    let mut guard = lock_connection(name, shared, "client")?;
    guard.client_for_application()?;
    MutexGuard::try_map(guard, |c| c.client_mut())
        .map_err(|_| RmError::Unavailable(format!("{name}: not connected")))
}

impl<C: BranchConnection> SharedRm<C> {
    /// Wraps a connected connection; `name` identifies the RM in errors.
    pub(crate) fn new(name: String, connection: C) -> Self {
        let address = connection.address().to_string();
        SharedRm { name, address, shared: Arc::new(Mutex::new(connection)) }
    }

    /// The connection, for the application's SQL: between `start` and `prepare` its
    /// statements are the branch's work. Reconnects when no branch is open; fails when the
    /// connection was lost while a branch was open (the server rolled that work back).
    pub fn client(&self) -> Result<MappedMutexGuard<'_, C::Client>, RmError> {
        lock_client(&self.name, &self.shared)
    }

    /// A handle on the same connection, to keep when the RM is handed to the coordinator.
    pub fn handle(&self) -> SharedHandle<C> {
        SharedHandle { name: self.name.clone(), shared: self.shared.clone() }
    }

    /// The server address, without the password.
    pub fn address(&self) -> &str {
        &self.address
    }

    pub(crate) fn conn(&self, op: &str) -> Result<MutexGuard<'_, C>, RmError> {
        lock_connection(&self.name, &self.shared, op)
    }
}

impl<C: BranchConnection> SharedHandle<C> {
    /// The connection, as [`SharedRm::client`].
    pub fn client(&self) -> Result<MappedMutexGuard<'_, C::Client>, RmError> {
        lock_client(&self.name, &self.shared)
    }
}

impl<C: BranchConnection> ResourceManager for SharedRm<C> {
    fn name(&self) -> &str {
        &self.name
    }
    fn open(&mut self) -> Result<(), RmError> {
        self.conn("open")?.open_rm()
    }
    fn close(&mut self) -> Result<(), RmError> {
        self.conn("close")?.close()
    }
    fn start(&mut self, xid: &Xid) -> Result<(), RmError> {
        self.conn("start")?.start(xid)
    }
    fn end(&mut self, xid: &Xid) -> Result<(), RmError> {
        self.conn("end")?.end(xid)
    }
    fn prepare(&mut self, xid: &Xid) -> Result<Vote, RmError> {
        self.conn("prepare")?.prepare(xid)
    }
    fn commit(&mut self, xid: &Xid, one_phase: bool) -> Result<(), RmError> {
        self.conn("commit")?.commit(xid, one_phase)
    }
    fn rollback(&mut self, xid: &Xid) -> Result<(), RmError> {
        self.conn("rollback")?.rollback(xid)
    }
    fn recover(&mut self) -> Result<Vec<Xid>, RmError> {
        self.conn("recover")?.recover()
    }
    fn forget(&mut self, _xid: &Xid) -> Result<(), RmError> {
        // Neither PostgreSQL nor MariaDB completes a prepared branch on its own: nothing
        // heuristic to forget.
        Ok(())
    }
    fn send(&mut self, call: BranchCall, xid: &Xid) -> bool {
        // A connection that cannot be locked sends nothing: the blocking call then reports
        // why.
        self.conn("send").is_ok_and(|mut c| c.send(call, xid))
    }
    fn receive(&mut self) -> BranchAnswer {
        match self.conn("receive") {
            Ok(mut c) => c.receive(),
            Err(e) => BranchAnswer::Ack(Err(e)),
        }
    }
    fn db_system(&self) -> &'static str {
        C::DB_SYSTEM
    }
    fn prefers_parallel(&self) -> bool {
        // Each call waits for a network round trip (and prepare/commit for a log flush),
        // so the branches of one transaction are best driven at the same time.
        true
    }
}
