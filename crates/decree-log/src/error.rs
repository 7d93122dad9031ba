//! Errors of the log; each names what is wrong and where.

use std::path::PathBuf;

/// Why a log operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LogError {
    /// An IO call failed (not a sync: see `SyncFailed`).
    #[error("log IO error on {path}: {message}")]
    Io { path: PathBuf, message: String },
    /// A sync failed earlier or now: the log is stopped and accepts nothing more.
    #[error("log stopped after a failed sync of {path}: {message} (fail-stop: restart to recover)")]
    SyncFailed { path: PathBuf, message: String },
    /// A record in the middle of the log is damaged while valid records follow it.
    #[error("corrupted log record in {path} at offset {offset}: {reason}; valid records follow it, refusing to open")]
    Corrupted { path: PathBuf, offset: u64, reason: String },
    /// Records that were durable are gone (a zero-filled or truncated file, a missing
    /// segment), as the watermark of the last clean close or checkpoint shows.
    #[error("durable log data lost in {path} at offset {offset}: {reason}; refusing to open (restore the log directory from a copy: on an empty log, recovery would roll back the branches of the lost decisions)")]
    Lost { path: PathBuf, offset: u64, reason: String },
    /// Another process (or another open in this one) owns the directory.
    #[error("log directory {path} is locked by another owner (is another decree process running?)")]
    Locked { path: PathBuf },
    /// The payload is larger than the configured maximum or the slot size.
    #[error("record of {len} bytes exceeds the limit of {max} bytes")]
    RecordTooLarge { len: usize, max: usize },
    /// The log has no room left for live records.
    #[error("log is full: {0}")]
    Full(String),
    /// The configuration cannot work.
    #[error("invalid log configuration: {0}")]
    Config(String),
}

impl LogError {
    /// Wraps an `std::io::Error` with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, err: std::io::Error) -> Self {
        LogError::Io { path: path.into(), message: err.to_string() }
    }
}
