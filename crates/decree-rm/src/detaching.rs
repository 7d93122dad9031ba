//! Prepared MariaDB branches whose preparing connection this process closed (or lost), and
//! which connection that was, so that no other connection finishes them too early.
//!
//! Why (seen on MariaDB 10.11, see `mariadb.rs`): when a connection holding a prepared
//! branch closes, the server first makes the branch visible to other sessions and only
//! afterwards detaches the InnoDB transaction from the closing thread. An `XA COMMIT` by
//! name that lands in between answers OK, deletes the branch from the server's XA list,
//! and commits nothing: the InnoDB transaction stays prepared, holding its locks, invisible
//! to `XA RECOVER` until the server restarts and then listed as prepared with no decision
//! left in decree's log, so presumed abort would roll back one side of a committed
//! transaction. A probe that closed the preparer and committed by name at once lost
//! commits this way. The coordinator does exactly that when it retries a failed phase two
//! on a new connection, and recovery may, after this process closed a connection.
//!
//! So every connection that goes away while it holds a prepared branch is registered
//! here with its server-side id, and `XA COMMIT`/`XA ROLLBACK` by name of that branch
//! first waits until the server has finished with the old connection (see
//! `XaConnection::wait_detached`). The registry is bounded: past [`DETACHING_MAX`] entries
//! the oldest is dropped with a warning (its branch then relies on the server having long
//! finished). Invariant: an entry is removed only by the wait that saw its connection
//! gone, or by eviction.

use std::collections::VecDeque;
use std::time::Instant;

use decree_core::Xid;
use parking_lot::Mutex;

/// Most branches remembered at once; each entry is a few dozen bytes.
pub const DETACHING_MAX: usize = 4096;

/// A prepared branch whose preparing connection went away.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detaching {
    /// The server, as `describe` prints it (host, port, database, user).
    pub address: String,
    /// The branch.
    pub xid: Xid,
    /// `CONNECTION_ID()` of the connection that prepared it.
    pub connection_id: u32,
    /// When the connection was closed or found lost.
    pub since: Instant,
}

static REGISTRY: Mutex<VecDeque<Detaching>> = Mutex::new(VecDeque::new());

/// Remembers that `xid`'s preparing connection `connection_id` on `address` went away.
pub fn register(address: &str, xid: Xid, connection_id: u32) {
    let mut registry = REGISTRY.lock();
    registry.retain(|d| !(d.address == address && d.xid == xid));
    if registry.len() >= DETACHING_MAX {
        if let Some(oldest) = registry.pop_front() {
            tracing::warn!(
                xid = %oldest.xid,
                connection = oldest.connection_id,
                "too many MariaDB branches waiting to detach; no longer waiting for this one"
            );
        }
    }
    registry.push_back(Detaching { address: address.to_string(), xid, connection_id, since: Instant::now() });
}

/// Takes the entry of `xid` on `address`, if its preparing connection went away here.
pub fn take(address: &str, xid: &Xid) -> Option<Detaching> {
    let mut registry = REGISTRY.lock();
    let index = registry.iter().position(|d| d.address == address && d.xid == *xid)?;
    registry.remove(index)
}

/// Puts back an entry whose wait gave up, so that the next attempt waits again.
pub fn put_back(entry: Detaching) {
    let mut registry = REGISTRY.lock();
    if !registry.iter().any(|d| d.address == entry.address && d.xid == entry.xid) {
        if registry.len() >= DETACHING_MAX {
            registry.pop_front();
        }
        registry.push_back(entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xid(n: u8) -> Xid {
        Xid::new(0x4443_5245, &[b'd', n], &[n]).unwrap()
    }

    #[test]
    fn an_entry_is_taken_once_and_only_for_its_own_server() {
        register("server-a", xid(1), 7);
        assert_eq!(take("server-b", &xid(1)), None, "another server's branch of the same name");
        let entry = take("server-a", &xid(1)).expect("registered");
        assert_eq!(entry.connection_id, 7);
        assert_eq!(take("server-a", &xid(1)), None, "taken already");
        put_back(entry.clone());
        put_back(entry);
        assert!(take("server-a", &xid(1)).is_some());
        assert_eq!(take("server-a", &xid(1)), None, "put back once, not twice");
    }

    #[test]
    fn registering_again_replaces_the_connection() {
        register("server-c", xid(2), 1);
        register("server-c", xid(2), 2);
        assert_eq!(take("server-c", &xid(2)).map(|d| d.connection_id), Some(2));
        assert_eq!(take("server-c", &xid(2)), None);
    }
}
