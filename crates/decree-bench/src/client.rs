//! What the transaction benchmark drives: a client with the four TX calls.
//!
//! [`BenchClient`] is the TX interface of one application thread (open, begin, commit,
//! close); a [`BenchTarget`] makes one client per benchmark thread and owns what they
//! share (the log, the coordinator, or a connection factory for a state server). The
//! driver in [`crate::tx`] knows nothing else, so the state-server modes plug in as new
//! targets without touching the workload or the reports.

use crate::BenchError;
use std::fmt;
use std::str::FromStr;

/// The TX calls of one application thread, in the order the workload makes them.
pub trait BenchClient: Send {
    /// tx_open: connect to the transaction manager and the resource managers.
    fn open(&mut self) -> Result<(), BenchError>;
    /// tx_begin: start a global transaction and its branches.
    fn begin(&mut self) -> Result<(), BenchError>;
    /// tx_commit: two-phase commit of the transaction started by `begin`.
    fn commit(&mut self) -> Result<(), BenchError>;
    /// tx_close: disconnect.
    fn close(&mut self) -> Result<(), BenchError>;
}

/// One configured system under test, shared by the benchmark threads of one run.
pub trait BenchTarget: Send + Sync {
    /// A new client for benchmark thread `thread` (not yet opened).
    fn client(&self, thread: usize) -> Result<Box<dyn BenchClient>, BenchError>;
    /// Checks that every transaction the run committed was recorded as complete.
    fn finish(&self) -> Result<(), BenchError> {
        Ok(())
    }
    /// The log's totals now, where the target owns the log (embedded): read before and
    /// after a run to report what its commits cost the log.
    fn log_use(&self) -> Option<crate::log_use::LogUse> {
        None
    }
}

/// Where the transaction manager runs relative to the application.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The coordinator and its log live in the benchmark process.
    Embedded,
    /// A state server on a Unix socket.
    Unix,
    /// A state server over TCP.
    Tcp,
}

impl Mode {
    /// The name on the command line and in reports.
    pub fn name(&self) -> &'static str {
        match self {
            Mode::Embedded => "embedded",
            Mode::Unix => "unix",
            Mode::Tcp => "tcp",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Mode {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "embedded" => Ok(Mode::Embedded),
            "unix" => Ok(Mode::Unix),
            "tcp" => Ok(Mode::Tcp),
            other => {
                Err(BenchError::Option(format!("unknown mode {other:?}; expected embedded, unix or tcp")))
            }
        }
    }
}
