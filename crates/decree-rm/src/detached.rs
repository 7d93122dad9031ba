//! Prepared MariaDB branches whose preparing connection the server was seen to have let go
//! of, so that finishing them by name needs no further wait.
//!
//! A by-name `XA COMMIT` or `XA ROLLBACK` of a branch first waits until the connection
//! named in it ([`crate::xa_name`]) holds it no more (`XaConnection::wait_detached` in
//! `mariadb.rs`). One look at the server's transactions answers that for every branch
//! `XA RECOVER` listed before the look, so the answers are kept here and a recovery that
//! finishes many branches pays the wait once. Once detached, a prepared branch stays so
//! until it is finished: an entry can go stale only by eviction, which costs a wait.
//!
//! Keyed by the server and the branch's full name (its gtrid is unique), never by the
//! connection id alone: MariaDB numbers connections anew after a restart. Bounded: past
//! [`DETACHED_MAX`] entries the oldest is dropped.

use std::collections::VecDeque;

use decree_core::Xid;
use parking_lot::Mutex;

/// Most branches remembered at once; each entry is a few hundred bytes.
pub const DETACHED_MAX: usize = 4096;

static SEEN: Mutex<VecDeque<(String, Xid)>> = Mutex::new(VecDeque::new());

/// Remembers that the branch named `name` on `address` is no longer held by its preparer.
pub fn remember(address: &str, name: &Xid) {
    let mut seen = SEEN.lock();
    if seen.iter().any(|(a, n)| a == address && n == name) {
        return;
    }
    if seen.len() >= DETACHED_MAX {
        seen.pop_front();
    }
    seen.push_back((address.to_string(), *name));
    assert!(seen.len() <= DETACHED_MAX);
}

/// Whether the branch named `name` on `address` was seen detached.
pub fn is_known(address: &str, name: &Xid) -> bool {
    SEEN.lock().iter().any(|(a, n)| a == address && n == name)
}

/// Forgets a branch that was finished.
pub fn forget(address: &str, name: &Xid) {
    SEEN.lock().retain(|(a, n)| !(a == address && n == name));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(n: u8) -> Xid {
        Xid::new(0x4443_5245, &[b'd', n], &[n]).unwrap()
    }

    #[test]
    fn a_branch_is_known_only_on_its_own_server_until_forgotten() {
        remember("server-a", &name(1));
        remember("server-a", &name(1));
        assert!(is_known("server-a", &name(1)));
        assert!(!is_known("server-b", &name(1)), "another server's branch of the same name");
        forget("server-a", &name(1));
        assert!(!is_known("server-a", &name(1)), "forgotten once, gone");
    }

    #[test]
    fn the_oldest_entry_goes_first_past_the_limit() {
        let server = "server-full";
        for n in 0..=DETACHED_MAX {
            let gtrid = (n as u64).to_be_bytes();
            remember(server, &Xid::new(7, &gtrid, b"").unwrap());
        }
        assert!(!is_known(server, &Xid::new(7, &0u64.to_be_bytes(), b"").unwrap()), "evicted");
        assert!(is_known(server, &Xid::new(7, &(DETACHED_MAX as u64).to_be_bytes(), b"").unwrap()));
        assert!(SEEN.lock().len() <= DETACHED_MAX);
    }
}
