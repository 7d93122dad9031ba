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
    /// A state server over TCP with mutual TLS 1.3: what encryption and client
    /// certificates cost next to [`Mode::Tcp`].
    Tls,
}

impl Mode {
    /// The name on the command line and in reports.
    pub fn name(&self) -> &'static str {
        match self {
            Mode::Embedded => "embedded",
            Mode::Unix => "unix",
            Mode::Tcp => "tcp",
            Mode::Tls => "tls",
        }
    }

    /// The prefix of this mode's `--connect` address (`unix:`, `tcp:`, `tls:`); `None` for
    /// the embedded mode, which has no server to connect to.
    pub fn scheme(&self) -> Option<&'static str> {
        match self {
            Mode::Embedded => None,
            Mode::Unix => Some("unix:"),
            Mode::Tcp => Some("tcp:"),
            Mode::Tls => Some("tls:"),
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
            "tls" => Ok(Mode::Tls),
            other => Err(BenchError::Option(format!(
                "unknown mode {other:?}; expected embedded, unix, tcp or tls"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_from_their_names() {
        for mode in [Mode::Embedded, Mode::Unix, Mode::Tcp, Mode::Tls] {
            assert_eq!(mode.name().parse::<Mode>().unwrap(), mode);
            assert_eq!(mode.to_string(), mode.name());
        }
        assert_eq!(Mode::Tls.scheme(), Some("tls:"));
        assert_eq!(Mode::Embedded.scheme(), None);
        let e = "ssl".parse::<Mode>().unwrap_err().to_string();
        assert!(e.contains("expected embedded, unix, tcp or tls"), "{e}");
    }
}
