//! The slots engine (not yet written: opening it returns a configuration error).

use crate::io::Storage;
use crate::{LogConfig, LogError};
use std::sync::Arc;

/// Placeholder until the engine lands.
pub struct SlotsLog;

impl SlotsLog {
    /// Opens the engine.
    pub fn open(
        _config: &LogConfig,
        _storage: Arc<dyn Storage>,
    ) -> Result<crate::engine::volatile::VolatileLog, LogError> {
        Err(LogError::Config("engine slots is not implemented yet".into()))
    }
}
