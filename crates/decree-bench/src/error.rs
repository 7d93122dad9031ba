//! Errors of the benchmarks; each says which run and which step failed.

use std::path::PathBuf;

/// Why a benchmark could not run or finish.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// An option value is malformed or out of range (the message names the option).
    #[error("invalid option: {0}")]
    Option(String),
    /// A file or directory operation of the harness itself failed.
    #[error("{what} {path}: {message}")]
    Io {
        /// What was being done ("cannot create", ...).
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The operating system's message.
        message: String,
    },
    /// The engine could not be opened (not implemented yet, or its directory is unusable):
    /// its runs are skipped, not failed.
    #[error("engine {engine} unavailable: {source}")]
    EngineUnavailable {
        /// The engine's name.
        engine: String,
        /// Why opening failed.
        source: decree_log::LogError,
    },
    /// The log failed while the benchmark ran.
    #[error("log error in {context}: {source}")]
    Log {
        /// The run and call that failed.
        context: String,
        /// The log's error.
        source: decree_log::LogError,
    },
    /// The transaction manager under test failed a call.
    #[error("transaction manager error in {context}: {message}")]
    Client {
        /// The call or check that failed.
        context: String,
        /// What the transaction manager said.
        message: String,
    },
    /// Writing a chart failed.
    #[error("cannot draw chart {path}: {message}")]
    Chart {
        /// The SVG file.
        path: PathBuf,
        /// What plotters said.
        message: String,
    },
    /// A same-run reference measurement (such as the raw round trip) failed.
    #[error("reference measurement failed: {0}")]
    Reference(String),
    /// A benchmark thread panicked (a bug in the harness or the code under test).
    #[error("benchmark thread panicked: {0}")]
    Panicked(String),
}

impl BenchError {
    /// Wraps an IO error with what was being done and on which path.
    pub fn io(what: &'static str, path: impl Into<PathBuf>, err: std::io::Error) -> Self {
        BenchError::Io { what, path: path.into(), message: err.to_string() }
    }
}
