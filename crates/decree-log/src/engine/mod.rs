//! The engines behind [`crate::Log`], one module each, and the choice between them.

pub mod file;
pub mod journal;
pub mod owner;
pub mod slots;
pub mod volatile;
pub mod watermark;
pub(crate) mod worker;

use crate::io::{StdStorage, Storage};
use crate::{EngineKind, Log, LogConfig, LogError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The totals behind [`Log::stats`], kept the same way by every engine (relaxed atomics:
/// they are reports, not synchronisation).
#[derive(Debug, Default)]
pub(crate) struct StatCounters {
    pub(crate) appended: AtomicU64,
    pub(crate) completions: AtomicU64,
    pub(crate) flushes: AtomicU64,
    pub(crate) bytes_written: AtomicU64,
    /// Synced writes on the commit path, by duration (kept by the journal under `rpo = 0`).
    pub(crate) write_times: crate::write_times::WriteTimeCounters,
}

impl StatCounters {
    /// The totals as [`crate::LogStats`].
    pub(crate) fn snapshot(&self) -> crate::LogStats {
        crate::LogStats {
            records_appended: self.appended.load(Ordering::Relaxed),
            completions: self.completions.load(Ordering::Relaxed),
            flushes: self.flushes.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
        }
    }
}

/// Opens the engine named in `config` on the real file system, holding the directory lock
/// for as long as the returned log lives.
pub fn open(config: &LogConfig) -> Result<Box<dyn Log>, LogError> {
    if config.engine == EngineKind::Volatile {
        return open_with_storage(config, Arc::new(StdStorage));
    }
    std::fs::create_dir_all(&config.dir).map_err(|e| LogError::io(&config.dir, e))?;
    let lock = owner::DirLock::acquire(&config.dir)?;
    let inner = open_with_storage(config, Arc::new(StdStorage))?;
    Ok(Box::new(Owned { inner, _lock: lock }))
}

/// A log together with the lock on its directory.
struct Owned {
    inner: Box<dyn Log>,
    _lock: owner::DirLock,
}

impl Log for Owned {
    fn append(&self, txn: crate::TxnKey, payload: &[u8]) -> Result<(), LogError> {
        self.inner.append(txn, payload)
    }
    fn append_with(&self, txn: crate::TxnKey, payload: &[u8], done: crate::DurableCallback) {
        self.inner.append_with(txn, payload, done)
    }
    fn complete(&self, txn: crate::TxnKey) -> Result<(), LogError> {
        self.inner.complete(txn)
    }
    fn take_recovered(&self) -> Vec<crate::LiveRecord> {
        self.inner.take_recovered()
    }
    fn incarnation(&self) -> u64 {
        self.inner.incarnation()
    }
    fn sync(&self) -> Result<(), LogError> {
        self.inner.sync()
    }
    fn stats(&self) -> crate::LogStats {
        self.inner.stats()
    }
    fn write_times(&self) -> crate::WriteTimes {
        self.inner.write_times()
    }
    fn open_warnings(&self) -> Vec<String> {
        self.inner.open_warnings()
    }
}

/// Opens the engine named in `config` on the given storage (tests inject faults here);
/// takes no directory lock. Durable engines call [`owner::bump_incarnation`] in their open.
pub fn open_with_storage(config: &LogConfig, storage: Arc<dyn Storage>) -> Result<Box<dyn Log>, LogError> {
    match config.engine {
        EngineKind::Volatile => Ok(Box::new(volatile::VolatileLog::new())),
        EngineKind::Journal => Ok(Box::new(journal::JournalLog::open(config, storage)?)),
        EngineKind::SlotsFsync | EngineKind::SlotsMmap => {
            Ok(Box::new(slots::SlotsLog::open(config, storage)?))
        }
        EngineKind::File => Ok(Box::new(file::FileLog::open(config, storage)?)),
    }
}
