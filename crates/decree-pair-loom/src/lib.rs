//! decree-pair's [`state_cell`] (the member's `PAIR` record and the one way to change it)
//! and decree-server's [`live_set`] (where a live decision is held while sessions close),
//! the same source files compiled a second time over loom's locks instead of parking_lot's,
//! so that `tests.rs` and `live_set_tests.rs` explore every interleaving of their callers.
//!
//! A crate of its own rather than a feature of decree-pair: a feature changes decree-pair's
//! build, and the separate `cargo test -p decree-pair --features loom` rebuilt 31 crates in
//! the CI (1 min 39 s of its 30 minutes, as resolved for one package instead of the
//! workspace). Here the file is built with the workspace's tests, by `cargo test --workspace`.
//! (Not `--cfg loom` either: that flag rebuilds every dependency, and tokio reads it.)

/// The record a state cell holds, as decree-pair defines it (state_cell.rs names it here).
mod state_file {
    pub use decree_pair::state_file::PairState;
}

/// loom's locks, under the names state_cell.rs uses (decree-pair's `sync` module gives
/// parking_lot's).
mod sync {
    pub(crate) use loom::sync::{Mutex, MutexGuard};

    /// Locks `mutex` (loom's lock returns a `Result` for poisoning, which no test causes).
    pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
        mutex.lock().expect("no test thread panics while holding a lock")
    }
}

/// decree-pair's state cell, built over loom's locks.
#[path = "../../decree-pair/src/state_cell.rs"]
pub mod state_cell;

/// decree-server's live set (a closing session's decisions moving to the orphans, and a
/// pair's snapshot of both), built over loom's locks.
#[path = "../../decree-server/src/live_set.rs"]
#[allow(dead_code)] // its functions are the server's (pub(crate)); here only the tests call them
pub mod live_set;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod live_set_tests;
