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

/// The most servers `--replicas` may ask for: one, or a primary + backup pair.
pub const REPLICAS_MAX: usize = 2;

/// What one run measures: a mode and how many servers hold the decisions (1, or 2 for a
/// primary + backup pair), so that `--mode` and `--replicas` lists alternate as one list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    /// Where the transaction manager runs.
    pub mode: Mode,
    /// Servers holding each decision: 1, or 2 for a pair the benchmark starts itself.
    pub replicas: usize,
}

impl Variant {
    /// A single server (or the embedded mode).
    pub fn single(mode: Mode) -> Self {
        Variant { mode, replicas: 1 }
    }

    /// The name in reports: the mode's for one server, `unix-pair` for a pair.
    pub fn name(&self) -> String {
        match self.replicas {
            1 => self.mode.name().to_string(),
            2 => format!("{}-pair", self.mode.name()),
            n => format!("{}-x{n}", self.mode.name()),
        }
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl FromStr for Variant {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.strip_suffix("-pair") {
            Some(mode) => Ok(Variant { mode: mode.parse()?, replicas: 2 }),
            None => Ok(Variant::single(s.parse()?)),
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

    #[test]
    fn variants_are_named_after_their_mode_and_parse_back() {
        let pair = Variant { mode: Mode::Unix, replicas: 2 };
        assert_eq!((Variant::single(Mode::Unix).name(), pair.name()), ("unix".into(), "unix-pair".into()));
        for variant in [pair, Variant::single(Mode::Tcp), Variant { mode: Mode::Tcp, replicas: 2 }] {
            assert_eq!(variant.to_string().parse::<Variant>().unwrap(), variant);
        }
        assert!("ssl-pair".parse::<Variant>().is_err());
    }
}
