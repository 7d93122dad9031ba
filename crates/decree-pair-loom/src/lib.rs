//! decree-pair's [`state_cell`] (the member's `PAIR` record and the one way to change it),
//! the same source file compiled a second time over loom's locks instead of parking_lot's,
//! so that `tests.rs` explores every interleaving of its two callers.
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

#[cfg(test)]
mod tests;
