//! Where a live decision is held, and the two ways that changes or is read: a live
//! session's map of decided transactions, then the server's orphans once the session
//! closes. A pair's live set is a snapshot of both, and a decision moved between its two
//! reads must be in it (issue 32, defect 2: read the other way, it was in neither, and the
//! backup's catch-up forgot its copy).
//!
//! The locks come from `crate::sync`: parking_lot's in the server, loom's when
//! `decree-pair-loom` compiles this same file to explore every interleaving of a close and
//! a snapshot. The runtime calls these functions; it keeps no copy of their order.

use crate::sync::{lock, Mutex};
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

/// Ends session `id`: every decision of its `decided` map moves into `orphans` (merged
/// with one already there under the same key) with both locks held, so nobody sees the
/// move half done; `closed` runs under the session's lock (the session is marked closed
/// there); `before_leaving` runs after the move and before the session leaves `sessions`.
/// Returns how many decisions moved.
#[allow(clippy::too_many_arguments)] // each closure is one of the caller's steps, in order
pub(crate) fn close<S, K: Eq + Hash, D>(
    sessions: &Mutex<HashMap<u64, Arc<S>>>,
    id: u64,
    decided: &Mutex<HashMap<u64, D>>,
    orphans: &Mutex<HashMap<K, D>>,
    key: impl Fn(&D) -> K,
    merge: impl Fn(&mut D, D),
    closed: impl FnOnce(),
    before_leaving: impl FnOnce(),
) -> usize {
    let moved;
    {
        // Into the orphans before out of the session: a snapshot reads the sessions first.
        let mut decided = lock(decided);
        closed();
        moved = decided.len();
        let mut orphans = lock(orphans);
        for (_, d) in decided.drain() {
            match orphans.get_mut(&key(&d)) {
                Some(existing) => merge(existing, d),
                None => {
                    orphans.insert(key(&d), d);
                }
            }
        }
    }
    before_leaving();
    lock(sessions).remove(&id);
    moved
}

/// Every live decision, read through `read`: the sessions' maps first, then the orphans,
/// the order in which [`close`] moves them, so that a decision moved between the two reads
/// is read twice (the caller removes the copy) and never missed.
pub(crate) fn snapshot<S, K, D, T>(
    sessions: &Mutex<HashMap<u64, Arc<S>>>,
    decided_of: impl Fn(&S) -> &Mutex<HashMap<u64, D>>,
    orphans: &Mutex<HashMap<K, D>>,
    read: impl Fn(&D) -> T,
) -> Vec<T> {
    let sessions: Vec<Arc<S>> = lock(sessions).values().cloned().collect();
    let mut all: Vec<T> = Vec::new();
    for s in sessions {
        all.extend(lock(decided_of(&s)).values().map(&read));
    }
    all.extend(lock(orphans).values().map(&read));
    all
}
