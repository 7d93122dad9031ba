//! The engines behind [`crate::Log`], one module each, and the choice between them.

pub mod file;
pub mod journal;
pub mod slots;
pub mod volatile;

use crate::io::{StdStorage, Storage};
use crate::{EngineKind, Log, LogConfig, LogError};
use std::sync::Arc;

/// Opens the engine named in `config` on the real file system.
pub fn open(config: &LogConfig) -> Result<Box<dyn Log>, LogError> {
    open_with_storage(config, Arc::new(StdStorage))
}

/// Opens the engine named in `config` on the given storage (tests inject faults here).
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
