//! The locks of the code that loom checks ([`crate::state_cell`]): loom's with the `loom`
//! feature, which explores every interleaving of the threads of a test, and parking_lot's
//! otherwise. (A feature, not `--cfg loom`: that flag would rebuild every dependency, and
//! tokio reads it.)

#[cfg(feature = "loom")]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(feature = "loom"))]
pub(crate) use parking_lot::{Mutex, MutexGuard};

/// Locks `mutex` (loom's lock returns a `Result` for poisoning, which no test here causes).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    #[cfg(feature = "loom")]
    return mutex.lock().expect("no test thread panics while holding a lock");
    #[cfg(not(feature = "loom"))]
    return mutex.lock();
}
