//! What the transaction benchmark drives: a client with the four TX calls.
//!
//! [`BenchClient`] is the TX interface of one application thread (open, begin, commit,
//! close); a [`BenchTarget`] makes one client per benchmark thread and owns what they
//! share (the log, the coordinator, or a connection factory for a state server). The
//! driver in [`crate::tx`] knows nothing else, so the state-server modes plug in as new
//! targets without touching the workload or the reports.

use crate::BenchError;
use decree_server::PairAck;
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

/// How many servers hold each decision: one, or a primary + backup pair with how its
/// backup acknowledges, whether its link runs TLS and whether its backup busy-polls the
/// link. Written `1`, `2` (durable, plain link), `2-received`, `2-tls`, `2-received-tls`,
/// each pair optionally followed by `-poll`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replicas {
    /// Servers: 1, or 2 for a pair the benchmark starts itself.
    pub count: usize,
    /// When a pair's backup acknowledges.
    pub ack: PairAck,
    /// A pair's link runs TLS with throwaway member certificates.
    pub link_tls: bool,
    /// A pair's backup busy-polls its link for [`BUSY_POLL_US`] after each frame
    /// (`pair.busy_poll_us`).
    pub busy_poll: bool,
}

/// The `pair.busy_poll_us` of a `-poll` pair: about two batches apart at 10,000 decisions
/// a second, so that a steady flow keeps the backup's reader awake.
pub const BUSY_POLL_US: u64 = 200;

impl Replicas {
    /// One server.
    pub const SINGLE: Replicas =
        Replicas { count: 1, ack: PairAck::Durable, link_tls: false, busy_poll: false };
    /// A pair whose backup acknowledges after its durable write, over a plain link.
    pub const PAIR: Replicas =
        Replicas { count: 2, ack: PairAck::Durable, link_tls: false, busy_poll: false };

    /// What a pair adds to the mode's name: `-pair`, then `-received`, `-tls` and `-poll`.
    fn suffix(&self) -> String {
        match self.count {
            1 => String::new(),
            2 => {
                let ack = if self.ack == PairAck::Received { "-received" } else { "" };
                let tls = if self.link_tls { "-tls" } else { "" };
                format!("-pair{ack}{tls}{}", if self.busy_poll { "-poll" } else { "" })
            }
            n => format!("-x{n}"),
        }
    }
}

impl fmt::Display for Replicas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.count {
            1 => f.write_str("1"),
            n => write!(f, "{n}{}", self.suffix().trim_start_matches("-pair")),
        }
    }
}

impl FromStr for Replicas {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || {
            BenchError::Option(format!(
                "--replicas {s}: expected 1 (a single server) or 2 (a primary + backup pair), the pair \
                 optionally followed by -received (its backup acknowledges from memory) and -tls (TLS on \
                 its link), then -poll (its backup busy-polls the link): 2, 2-received, 2-tls, \
                 2-received-tls, 2-received-poll"
            ))
        };
        let mut parts = s.split('-');
        let mut replicas = match parts.next() {
            Some("1") => Replicas::SINGLE,
            Some("2") => Replicas::PAIR,
            _ => return Err(bad()),
        };
        let mut last = "";
        for part in parts {
            match (replicas.count, last, part) {
                (2, "", "received") => replicas.ack = PairAck::Received,
                (2, "" | "received", "tls") => replicas.link_tls = true,
                (2, "" | "received" | "tls", "poll") => replicas.busy_poll = true,
                _ => return Err(bad()),
            }
            last = part;
        }
        Ok(replicas)
    }
}

/// What one run measures: a mode and the servers that hold the decisions (one, or a
/// primary + backup pair), so that `--mode` and `--replicas` lists alternate as one list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    /// Where the transaction manager runs.
    pub mode: Mode,
    /// The servers holding each decision.
    pub replicas: Replicas,
}

impl Variant {
    /// A single server (or the embedded mode).
    pub fn single(mode: Mode) -> Self {
        Variant { mode, replicas: Replicas::SINGLE }
    }

    /// The name in reports: the mode's for one server, `unix-pair` for a pair (with
    /// `-received` and `-tls` after it for those pairs).
    pub fn name(&self) -> String {
        format!("{}{}", self.mode.name(), self.replicas.suffix())
    }
}

impl Variant {
    /// A short name for the run's directory: the pair's control socket lives in its log
    /// directory, and a Unix socket's path is limited to 107 bytes (`unix-prt` for
    /// `unix-pair-received-tls`).
    pub fn dir_name(&self) -> String {
        match self.replicas.count {
            2 => {
                let ack = if self.replicas.ack == PairAck::Received { "r" } else { "" };
                format!("{}-p{ack}{}", self.mode.name(), if self.replicas.link_tls { "t" } else { "" })
            }
            _ => self.name(),
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
        match s.split_once("-pair") {
            Some((mode, rest)) => Ok(Variant { mode: mode.parse()?, replicas: format!("2{rest}").parse()? }),
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
        let pair = Variant { mode: Mode::Unix, replicas: Replicas::PAIR };
        assert_eq!((Variant::single(Mode::Unix).name(), pair.name()), ("unix".into(), "unix-pair".into()));
        let received_tls = Replicas { ack: PairAck::Received, link_tls: true, ..Replicas::PAIR };
        let received_tls = Variant { mode: Mode::Unix, replicas: received_tls };
        assert_eq!(received_tls.name(), "unix-pair-received-tls");
        for variant in [
            pair,
            Variant::single(Mode::Tcp),
            Variant { mode: Mode::Tcp, replicas: Replicas::PAIR },
            received_tls,
        ] {
            assert_eq!(variant.to_string().parse::<Variant>().unwrap(), variant);
        }
        assert!("ssl-pair".parse::<Variant>().is_err());
    }

    #[test]
    fn replicas_parse_as_written_and_refuse_the_rest() {
        for text in ["1", "2", "2-received", "2-tls", "2-received-tls"] {
            assert_eq!(text.parse::<Replicas>().unwrap().to_string(), text);
        }
        assert_eq!("2-tls".parse::<Replicas>().unwrap(), Replicas { link_tls: true, ..Replicas::PAIR });
        let polled = "2-received-tls-poll".parse::<Replicas>().unwrap();
        assert_eq!(
            polled,
            Replicas { ack: PairAck::Received, link_tls: true, busy_poll: true, ..Replicas::PAIR }
        );
        assert_eq!(polled.to_string(), "2-received-tls-poll");
        assert_eq!(polled.suffix(), "-pair-received-tls-poll");
        for bad in ["1-poll", "2-poll-tls", "2-poll-poll", "2-received-poll-received"] {
            assert!(bad.parse::<Replicas>().is_err(), "{bad} was accepted");
        }
        for bad in ["0", "3", "1-received", "2-tls-received", "2-received-received", "2-", "two"] {
            let e = bad.parse::<Replicas>().unwrap_err().to_string();
            assert!(e.contains("2-received-tls"), "{bad}: {e}");
        }
    }
}
