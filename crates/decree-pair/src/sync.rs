//! The locks of [`crate::state_cell`]: parking_lot's here. crates/decree-pair-loom compiles
//! the same state_cell.rs over loom's locks (its own `sync` module), to check every
//! interleaving of its callers.

pub(crate) use parking_lot::{Mutex, MutexGuard};

/// Locks `mutex` (a function, as loom's lock is in decree-pair-loom: state_cell.rs calls
/// the same name in both crates).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock()
}
