//! Ownership of a log directory: one process at a time, and a new incarnation per open.
//!
//! The lock is an advisory `flock` on `LOCK` in the directory, held for the life of the
//! open log; a second owner gets [`LogError::Locked`] at once instead of corrupting the log.
//! The incarnation is a counter in `INCARNATION`, a single framed record rewritten and
//! synced (with its directory) on every open, so that it only ever grows.

use crate::io::Storage;
use crate::record::{self, Decoded, RecordKind};
use crate::LogError;
use parking_lot::{Condvar, Mutex};
use std::fs::{File, OpenOptions};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The exclusive lock on a log directory; released when dropped (or when the process dies).
#[derive(Debug)]
pub struct DirLock {
    /// Its `flock`; `None` only inside `drop`, which closes it before telling waiters.
    file: Option<File>,
    path: PathBuf,
    dir: PathBuf,
}

/// The directories this process holds locked, so that it can wait for one of its own logs
/// to finish closing ([`wait_released`]).
static HELD: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
/// Notified each time a directory leaves [`HELD`].
static RELEASED: Condvar = Condvar::new();

/// Waits until no log of this process holds `dir` any more, for at most `timeout`; says
/// whether it is free. A log is closed by whoever drops its last reference, which can be a
/// callback still finishing on one of the log's own threads after its owner stopped (a
/// state server's decision callback holds the server's state): an owner that reopens the
/// directory in the same process waits here first.
pub fn wait_released(dir: &Path, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let mut held = HELD.lock();
    while held.iter().any(|d| d == dir) {
        if RELEASED.wait_until(&mut held, deadline).timed_out() {
            return !held.iter().any(|d| d == dir);
        }
    }
    true
}

impl Drop for DirLock {
    fn drop(&mut self) {
        drop(self.file.take()); // the flock is released before a waiter can try again.
        let mut held = HELD.lock();
        if let Some(i) = held.iter().position(|d| d == &self.dir) {
            held.swap_remove(i);
        }
        RELEASED.notify_all();
    }
}

impl DirLock {
    /// Takes the lock on `dir` (which must exist), failing at once if someone holds it.
    pub fn acquire(dir: &Path) -> Result<DirLock, LogError> {
        let path = dir.join("LOCK");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| LogError::io(&path, e))?;
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Err(LogError::Locked { path: dir.to_path_buf() });
            }
            return Err(LogError::io(&path, err));
        }
        HELD.lock().push(dir.to_path_buf());
        Ok(DirLock { file: Some(file), path, dir: dir.to_path_buf() })
    }

    /// The lock file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Reads the previous incarnation of `dir`, stores the next one durably and returns it.
pub fn bump_incarnation(storage: &dyn Storage, dir: &Path) -> Result<u64, LogError> {
    let path = dir.join("INCARNATION");
    let tmp = dir.join("INCARNATION.tmp");
    let mut previous = 0u64;
    if storage.list(dir).map_err(|e| LogError::io(dir, e))?.iter().any(|p| p == &path) {
        let file = storage.open(&path, false).map_err(|e| LogError::io(&path, e))?;
        let len = file.len().map_err(|e| LogError::io(&path, e))? as usize;
        let mut buf = vec![0u8; len];
        file.read_exact_at(&mut buf, 0).map_err(|e| LogError::io(&path, e))?;
        match record::decode(&buf, 64) {
            Decoded::Frame(f, _) if f.payload.len() == 8 => {
                previous = u64::from_le_bytes(f.payload.try_into().unwrap());
            }
            other => {
                return Err(LogError::Corrupted {
                    path,
                    offset: 0,
                    reason: format!("incarnation record unreadable: {other:?}"),
                })
            }
        }
    }
    let next = previous + 1;
    let mut buf = Vec::new();
    record::encode(&mut buf, RecordKind::Data, 0, &next.to_le_bytes());
    // Write a new file and rename it over the old one, so that a crash leaves either.
    let _ = storage.remove(&tmp);
    let file = storage.open(&tmp, true).map_err(|e| LogError::io(&tmp, e))?;
    file.write_all_at(&buf, 0).map_err(|e| LogError::io(&tmp, e))?;
    file.sync_all().map_err(|e| LogError::SyncFailed { path: tmp.clone(), message: e.to_string() })?;
    storage.rename(&tmp, &path).map_err(|e| LogError::io(&path, e))?;
    storage
        .sync_dir(dir)
        .map_err(|e| LogError::SyncFailed { path: dir.to_path_buf(), message: e.to_string() })?;
    assert!(next > previous);
    Ok(next)
}
