//! The state server's configuration: a TOML file, overridable field by field.
//!
//! Example (every field but `log_dir` and one listener has a default):
//!
//! ```toml
//! node = 1
//! log_dir = "/var/lib/decree"
//! engine = "journal"          # journal, slots-fsync, slots-mmap, file, volatile
//! rpo_ms = 0                  # 0: acknowledge after fdatasync
//! unix = "/run/decree/decree.sock"
//! tcp = "127.0.0.1:7411"
//! allow_remote = false        # a non-loopback tcp address needs true, and [tls]
//! insecure_plaintext = false  # true: a non-loopback tcp listener without TLS (warned)
//! metrics = "127.0.0.1:9411"  # Prometheus text at /metrics; off when absent
//!
//! [limits]
//! connections_max = 1024
//! inflight_per_connection_max = 64
//! inflight_total_max = 8192
//! frame_bytes_max = 65536
//! handshake_timeout_ms = 10000  # a connection must complete its Hello within this
//! idle_timeout_ms = 0           # 0: idle sessions stay open; N: closed after N ms silent
//! close_drain_ms = 1000         # a session the server closes is read to its end this long
//!
//! [tls]                         # on the tcp listener; mutual TLS 1.3
//! cert = "/etc/decree/server.pem"       # the server's chain, leaf first
//! key = "/etc/decree/server.key"        # its private key (PKCS#8, PKCS#1 or SEC1 PEM)
//! client_ca = "/etc/decree/clients-ca.pem"  # client certificates must chain to this
//! clients_allowed = ["app-1"]   # names a client certificate must carry; [] = any of the CA
//!
//! [recovery]
//! periodic_pass_ms = 60000      # a pass at least this often
//! recheck_after_close_ms = 1000 # first recheck after a session closes
//! rechecks_after_close = 5      # rechecks, each delay doubled: 1, 2, 4, 8, 16 s
//!
//! [tracing]                     # OpenTelemetry spans over OTLP/HTTP; off when absent
//! endpoint = "http://127.0.0.1:4318"  # the collector's base URL (spans to /v1/traces);
//!                               # https:// for TLS, checked against ca_file (PEM) or,
//!                               # without it, the system's CA bundle; cert_file and
//!                               # key_file (PEM, both or neither): the client
//!                               # certificate a collector asking for one gets
//! sampling = 1.0                # share of the server's own traces (recovery passes);
//!                               # a client's sampled flag decides for its transactions
//! xid_contexts_max = 65536      # client span contexts kept for recovery's links
//!
//! [[rm]]
//! name = "pg-a"
//! kind = "postgres"
//! dsn = "host=/run/postgresql dbname=a"
//! ```
//!
//! [`ServerConfig::validate`] refuses configurations that cannot work or that would expose
//! the server by accident: a non-loopback address needs `allow_remote`, and TLS (`[tls]`)
//! unless `insecure_plaintext = true` says otherwise (then every start warns).
//!
//! The two timeouts of `[limits]` protect the connection slots (`connections_max`):
//! - `handshake_timeout_ms` (10,000 by default, 1 to 3,600,000; 0 is refused) closes a
//!   connection that has not delivered a complete `Hello` that long after it was accepted,
//!   however slowly it trickles bytes, so that silent or half-open connections cannot keep
//!   legitimate clients out. It cannot be turned off: a client that means to talk says
//!   Hello at once, and the bound only matters against those that do not; raise it for
//!   very slow links instead.
//! - `idle_timeout_ms` (0, off, by default; otherwise 100 to 4,294,967,295) closes a
//!   session that has sent no request for that long and has none in flight. Closing a
//!   session rolls back its prepared branches that have no decision (presumed abort), so a
//!   client that merely paused would lose its transactions: that is why it is off unless
//!   the operator opts in. The value is announced in `HelloOk` to clients that negotiate a
//!   protocol version (decree-client then keeps its sessions alive with `Ping`); it applies
//!   to version-1 clients too, who are not told, since the operator chose it.
//!
//! `[recovery]` says when the recovery worker lists the resource managers' prepared
//! branches (see [`RecoveryConfig`]): at start, when a session closes, and at least every
//! `periodic_pass_ms`. The branches a dead client prepared without a decision are rolled
//! back by the pass at its session's close, within moments. But a `PREPARE` the client
//! sent may still be running in the database then, and land after that pass: so each
//! close also asks for `rechecks_after_close` more passes, the first
//! `recheck_after_close_ms` after it and each later one twice as long after it as the one
//! before (1, 2, 4, 8 and 16 s by default). A recheck due `d` after a close runs between
//! `d` and `1.5 d` after it (rechecks of sessions that close close together share one
//! pass). A branch whose `PREPARE` lands within 16 s of the close is thus rolled back by
//! default at most about 24 s after the close, and one that lands later at the next
//! periodic pass.

use decree_core::testing::DummyFactory;
use decree_core::RmFactory;
use decree_log::{EngineKind, LogConfig, SyncPolicy};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The TCP address `decree serve` suggests when none is configured (loopback only).
pub const DEFAULT_TCP_ADDR: &str = "127.0.0.1:7411";

/// Why a configuration was refused; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("server configuration: {0}")]
pub struct ConfigError(pub String);

/// Limits on what clients can make the server hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Open connections at once; more are refused with a `Busy` error frame.
    pub connections_max: u32,
    /// Requests one connection may have in flight (the client is told in `HelloOk`).
    pub inflight_per_connection_max: u32,
    /// Requests in flight over all connections.
    pub inflight_total_max: u32,
    /// Largest frame accepted, header included (at most 64 KiB).
    pub frame_bytes_max: u32,
    /// Finished transactions whose outcome is remembered (durably, in `outcomes.dat` of
    /// the log directory) for `Outcome` questions; the oldest is forgotten first.
    pub outcomes_remembered_max: u32,
    /// Milliseconds a new connection has to deliver a complete `Hello`, counted from
    /// accept; past it the server closes the connection, which frees its slot of
    /// `connections_max` (silent or trickling peers would otherwise hold them all).
    pub handshake_timeout_ms: u32,
    /// Milliseconds a session may send nothing, with no request in flight, before the
    /// server closes it; 0 never closes an idle session (the default, since closing rolls
    /// back the session's undecided prepared branches). Announced in `HelloOk`.
    pub idle_timeout_ms: u32,
    /// Milliseconds the server keeps reading a session it closes itself (idle timeout,
    /// protocol error) for the client to close its end: a `OnePhase` notice may still be
    /// unread. Past it, the session's undecided Xids are answered unknown, never rolled
    /// back (docs/protocol.md, session rule 9).
    pub close_drain_ms: u32,
}

/// Longest accepted `close_drain_ms`: a minute; the connection slot stays taken meanwhile.
pub const CLOSE_DRAIN_MS_MAX: u32 = 60_000;

/// Shortest accepted `idle_timeout_ms` (0 aside): a client pings at about a third of it,
/// and a shorter bound would turn the keep-alive into a stream of requests.
pub const IDLE_TIMEOUT_MS_MIN: u32 = 100;

/// Longest accepted `handshake_timeout_ms`: one hour, already far beyond any real hello.
pub const HANDSHAKE_TIMEOUT_MS_MAX: u32 = 3_600_000;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections_max: 1024,
            inflight_per_connection_max: 64,
            inflight_total_max: 8192,
            frame_bytes_max: decree_proto::FRAME_BYTES_MAX as u32,
            outcomes_remembered_max: 65536,
            handshake_timeout_ms: 10_000,
            idle_timeout_ms: 0,
            close_drain_ms: 1000,
        }
    }
}

impl Limits {
    /// Checks the two timeouts: a handshake bound of 0 would reopen the slot exhaustion
    /// it exists to close, and a tiny idle bound would make keep-alives a flood.
    fn validate_timeouts(&self) -> Result<(), ConfigError> {
        if self.handshake_timeout_ms == 0 || self.handshake_timeout_ms > HANDSHAKE_TIMEOUT_MS_MAX {
            return Err(ConfigError(format!(
                "limits.handshake_timeout_ms = {} must be between 1 and {HANDSHAKE_TIMEOUT_MS_MAX} (it cannot \
                 be turned off: silent connections would hold every connection slot)",
                self.handshake_timeout_ms
            )));
        }
        if self.idle_timeout_ms != 0 && self.idle_timeout_ms < IDLE_TIMEOUT_MS_MIN {
            return Err(ConfigError(format!(
                "limits.idle_timeout_ms = {} must be 0 (off) or at least {IDLE_TIMEOUT_MS_MIN}",
                self.idle_timeout_ms
            )));
        }
        if self.close_drain_ms > CLOSE_DRAIN_MS_MAX {
            return Err(ConfigError(format!(
                "limits.close_drain_ms = {} must be at most {CLOSE_DRAIN_MS_MAX} (the connection slot stays \
                 taken while the server reads a closed session to its end)",
                self.close_drain_ms
            )));
        }
        Ok(())
    }

    /// How long a session the server closes is read to its end.
    pub fn close_drain(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.close_drain_ms.into())
    }

    /// The handshake bound as a duration.
    pub fn handshake_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.handshake_timeout_ms.into())
    }

    /// The idle bound as a duration, `None` when idle sessions are never closed.
    pub fn idle_timeout(&self) -> Option<std::time::Duration> {
        match self.idle_timeout_ms {
            0 => None,
            ms => Some(std::time::Duration::from_millis(ms.into())),
        }
    }
}

/// Longest delay of the last recheck after a close (`recheck_after_close_ms` doubled
/// `rechecks_after_close - 1` times) and longest periodic pass: one day. Longer is a typo,
/// not a policy: a branch would hold its locks for days.
pub const RECOVERY_DELAY_MS_MAX: u64 = 86_400_000;

/// Most rechecks one session's close may ask for.
pub const RECHECKS_AFTER_CLOSE_MAX: u32 = 16;

/// When the recovery worker lists prepared branches to finish or roll back (see the
/// module comment): the periodic pass, and the rechecks that follow each session's close
/// so that a `PREPARE` landing after the close's own pass does not wait for the periodic
/// one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RecoveryConfig {
    /// Longest time between two passes (1 ms to one day). The periodic pass is the last
    /// resort for a branch nothing else looked at again: a branch prepared after every
    /// recheck of its session's close (or by a client of a server that restarted since).
    pub periodic_pass_ms: u64,
    /// Delay of the first recheck after a session closes (1 ms to one day); each next
    /// recheck comes twice as long after the close as the one before.
    pub recheck_after_close_ms: u64,
    /// Rechecks after each close (0 to [`RECHECKS_AFTER_CLOSE_MAX`]; 0: only the periodic
    /// pass looks again).
    pub rechecks_after_close: u32,
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        RecoveryConfig { periodic_pass_ms: 60_000, recheck_after_close_ms: 1_000, rechecks_after_close: 5 }
    }
}

impl RecoveryConfig {
    /// The longest time between two passes.
    pub fn periodic_pass(&self) -> Duration {
        Duration::from_millis(self.periodic_pass_ms)
    }

    /// The delay of the first recheck after a close.
    pub fn recheck_after_close(&self) -> Duration {
        Duration::from_millis(self.recheck_after_close_ms)
    }

    /// The delay of the last recheck after a close, if any (saturating: validation keeps
    /// it within [`RECOVERY_DELAY_MS_MAX`]).
    pub fn last_recheck_after_close(&self) -> Option<Duration> {
        let doublings = self.rechecks_after_close.checked_sub(1)?;
        let factor = 1u64.checked_shl(doublings).unwrap_or(u64::MAX);
        Some(Duration::from_millis(self.recheck_after_close_ms.saturating_mul(factor)))
    }

    /// Refuses values that cannot work, naming the field.
    fn validate(&self) -> Result<(), ConfigError> {
        for (name, v) in [
            ("periodic_pass_ms", self.periodic_pass_ms),
            ("recheck_after_close_ms", self.recheck_after_close_ms),
        ] {
            if v == 0 || v > RECOVERY_DELAY_MS_MAX {
                return Err(ConfigError(format!(
                    "recovery.{name} = {v} must be between 1 and {RECOVERY_DELAY_MS_MAX} (one day)"
                )));
            }
        }
        let n = self.rechecks_after_close;
        if n > RECHECKS_AFTER_CLOSE_MAX {
            return Err(ConfigError(format!(
                "recovery.rechecks_after_close = {n} must be between 0 and {RECHECKS_AFTER_CLOSE_MAX}"
            )));
        }
        if let Some(last) = self.last_recheck_after_close() {
            if last.as_millis() > RECOVERY_DELAY_MS_MAX as u128 {
                return Err(ConfigError(format!(
                    "recovery.rechecks_after_close = {n} with recovery.recheck_after_close_ms = {} puts the \
                     last recheck {} ms after a close; at most {RECOVERY_DELAY_MS_MAX} (one day)",
                    self.recheck_after_close_ms,
                    last.as_millis()
                )));
            }
        }
        Ok(())
    }
}

/// TLS on the TCP listener (see the `tls` module): the server's certificate and key, and
/// the CA every client certificate must chain to.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM file of the server's certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM file of the server's private key.
    pub key: PathBuf,
    /// PEM file of the CA certificates a client's certificate must chain to.
    pub client_ca: PathBuf,
    /// Names (DNS subject-alternative name or common name) of the clients allowed to open
    /// a session; empty: every client with a certificate of the CA.
    #[serde(default)]
    pub clients_allowed: Vec<String>,
}

/// This server as a member of a primary + backup pair (docs/replication.md): it starts as
/// a backup and leads only once `decree promote` says so.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairConfig {
    /// This member's id in the pair (1 to 255; the two members differ, the node id is the
    /// same): the low bits of the epochs it mints.
    pub member: u8,
    /// Where this member listens for its primary's link while it is a backup.
    pub link: SocketAddr,
    /// The other member's link address, which this member dials while it leads.
    pub peer_link: SocketAddr,
    /// The other member's client address (`unix:/path`, `tcp:host:port`), named in the
    /// `NotPrimary` answer this member gives clients while it is a backup.
    #[serde(default)]
    pub peer_clients: Option<String>,
    /// When the backup acknowledges a batch of the primary's records.
    #[serde(default)]
    pub ack: PairAck,
    /// TLS on the link, both members proving themselves by certificate; needed when either
    /// link address is not a loopback address (unless `insecure_plaintext`).
    #[serde(default)]
    pub tls: Option<PairTlsConfig>,
    /// A file of at least 32 secret bytes (mode 0600), the same on both members: without
    /// `tls`, each member proves it holds it before any link frame is read, so that no
    /// other local user can speak on the link. One of the two is required.
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
    /// While a backup, keep the link's reader awake this many microseconds after each frame
    /// (0, the default: it sleeps at once). The primary's next batch is then read without
    /// waking a sleeping CPU, at the cost of up to one CPU of the backup while decisions
    /// flow: for a backup with a core to spare. At most 10,000.
    #[serde(default)]
    pub busy_poll_us: u64,
    /// How long either end of the link waits for the other with nothing heard before it
    /// ends the link, which the primary then dials again (decree-pair's `link::stall`): the
    /// primary while it waits for the backup's hello or an acknowledgement, the backup
    /// while it waits for the primary's hello or the end of its catch-up. 5,000 by
    /// default, 100 to 3,600,000. Liveness only: a frame lost within a connection (a
    /// middlebox, a bug) or a stopped peer process holds the link no longer than this.
    #[serde(default = "link_stall_ms_default")]
    pub link_stall_ms: u64,
    /// The pair elects its primary on etcd (issue 33): without it, `decree promote` does.
    #[serde(default)]
    pub etcd: Option<crate::etcd_config::PairEtcdConfig>,
}

/// `pair.link_stall_ms` unless given: decree-pair's default.
pub const LINK_STALL_MS_DEFAULT: u64 = decree_pair::link::stall::LINK_STALL_DEFAULT.as_millis() as u64;

fn link_stall_ms_default() -> u64 {
    LINK_STALL_MS_DEFAULT
}

/// The bounds of `pair.link_stall_ms`: below 100 ms a busy backup's disk would end links,
/// above an hour a stalled link is as good as lost.
pub const LINK_STALL_MS_RANGE: std::ops::RangeInclusive<u64> = 100..=3_600_000;

impl PairConfig {
    /// How long either end of the link waits for the other with nothing heard.
    pub fn link_stall(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.link_stall_ms)
    }
}

/// The longest `pair.busy_poll_us` accepted: the backup's own limit.
pub const BUSY_POLL_US_MAX: u64 = decree_pair::link::follower::BUSY_POLL_MAX.as_micros() as u64;

/// When a backup acknowledges the records of a batch, which is when the primary may answer
/// the decisions in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PairAck {
    /// After the backup's write under its own sync policy: an acknowledged decision
    /// survives the loss of either machine, power loss of both included (with rpo = 0).
    #[default]
    Durable,
    /// Once the records are in the backup's memory (X Platform's model): faster, and an
    /// acknowledged decision survives the loss of either machine, but not a power loss of
    /// both at once.
    Received,
}

/// The certificates of the pair's link: each member has one of the pair's CA that names
/// it, and accepts only a peer whose certificate names the other member.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairTlsConfig {
    /// PEM file of this member's certificate chain, leaf first (used both ways: as the
    /// backup's server certificate and as the primary's client certificate).
    pub cert: PathBuf,
    /// PEM file of this member's private key.
    pub key: PathBuf,
    /// PEM file of the CA certificates of the pair's members.
    pub ca: PathBuf,
    /// The name (DNS subject-alternative name) the other member's certificate carries.
    pub peer_name: String,
}

/// Longest list of `tls.clients_allowed`.
pub const CLIENTS_ALLOWED_MAX: usize = 1024;

/// One resource manager the server may have to finish phase two on (kept as data: the
/// embedding program maps `kind` to an [`decree_core::RmFactory`]).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RmConfig {
    /// The name decision records use for this resource.
    pub name: String,
    /// What kind of resource (postgres, mariadb, dummy, ...).
    pub kind: String,
    /// How to connect to it.
    #[serde(default)]
    pub dsn: String,
}

/// Everything `decree serve` needs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// The node id minted into every Xid of this server's sessions.
    #[serde(default = "default_node")]
    pub node: u32,
    /// The log directory (owned and locked while the server runs).
    pub log_dir: PathBuf,
    /// The log engine's name (see `decree_log::EngineKind`).
    #[serde(default = "default_engine")]
    pub engine: String,
    /// The sync policy: 0 acknowledges after fdatasync, N after the write (synced within N ms).
    #[serde(default)]
    pub rpo_ms: u64,
    /// Lets the journal write rpo=0 decisions with O_DIRECT | O_DSYNC (see `LogConfig`).
    #[serde(default = "default_direct_io")]
    pub direct_io: bool,
    /// Unix socket path (created with mode 0600; a stale file is removed at start).
    #[serde(default)]
    pub unix: Option<PathBuf>,
    /// TCP listen address.
    #[serde(default)]
    pub tcp: Option<SocketAddr>,
    /// Allows a non-loopback TCP address (which needs `tls` or `insecure_plaintext` too).
    #[serde(default)]
    pub allow_remote: bool,
    /// Lets a non-loopback TCP listener run without TLS: anyone who reaches the port can
    /// record and read decisions. Warned at every start.
    #[serde(default)]
    pub insecure_plaintext: bool,
    /// TLS on the TCP listener, with client certificates (mutual TLS).
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    /// Membership of a primary + backup pair; absent: a single server.
    #[serde(default)]
    pub pair: Option<PairConfig>,
    /// Loopback address of the Prometheus text endpoint; off when absent.
    #[serde(default)]
    pub metrics: Option<SocketAddr>,
    /// Limits on connections, requests and frames.
    #[serde(default)]
    pub limits: Limits,
    /// When the recovery worker looks for branches to finish or roll back.
    #[serde(default)]
    pub recovery: RecoveryConfig,
    /// Resource managers for phase two of dead sessions and recovery.
    #[serde(default)]
    pub rm: Vec<RmConfig>,
    /// OpenTelemetry spans, exported over OTLP/HTTP; off when absent.
    #[serde(default)]
    pub tracing: Option<decree_otel::TracingConfig>,
}

fn default_node() -> u32 {
    1
}

fn default_engine() -> String {
    EngineKind::Journal.name().to_string()
}

fn default_direct_io() -> bool {
    true
}

impl ServerConfig {
    /// One connection factory per `[[rm]]` entry, the single place where a kind name
    /// becomes a resource manager (`decree serve` and `decree recover` both use it):
    /// postgres and mariadb through `decree-rm`, `dummy` in memory for benchmarks.
    pub fn rm_factories(&self) -> Result<Vec<Arc<dyn RmFactory>>, ConfigError> {
        let mut factories: Vec<Arc<dyn RmFactory>> = Vec::with_capacity(self.rm.len());
        for rm in &self.rm {
            let kind = match rm.kind.to_ascii_lowercase().as_str() {
                "dummy" => {
                    factories.push(DummyFactory::named(&rm.name, 0).arc());
                    continue;
                }
                "postgres" | "postgresql" | "pg" => decree_rm::RmKind::Postgres,
                "mariadb" | "mysql" => decree_rm::RmKind::Mariadb,
                other => {
                    return Err(ConfigError(format!(
                        "rm {:?}: unknown kind {other:?}; expected postgres, mariadb or dummy",
                        rm.name
                    )))
                }
            };
            let entry = decree_rm::RmConfig { name: rm.name.clone(), kind, dsn: rm.dsn.clone() };
            let factory = decree_rm::factory_from_config(&entry)
                .map_err(|e| ConfigError(format!("rm {:?}: {e}", rm.name)))?;
            factories.push(factory);
        }
        Ok(factories)
    }

    /// A configuration with defaults, listening nowhere yet.
    pub fn new(log_dir: impl Into<PathBuf>, engine: EngineKind) -> Self {
        ServerConfig {
            node: default_node(),
            log_dir: log_dir.into(),
            engine: engine.name().to_string(),
            rpo_ms: 0,
            direct_io: default_direct_io(),
            unix: None,
            tcp: None,
            allow_remote: false,
            insecure_plaintext: false,
            tls: None,
            pair: None,
            metrics: None,
            limits: Limits::default(),
            recovery: RecoveryConfig::default(),
            rm: Vec::new(),
            tracing: None,
        }
    }

    /// Parses TOML text and validates it.
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        let config: ServerConfig = toml::from_str(text).map_err(|e| ConfigError(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// Reads, parses and validates a TOML file.
    pub fn from_toml_file(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("cannot read {}: {e}", path.display())))?;
        Self::from_toml_str(&text).map_err(|e| ConfigError(format!("{}: {}", path.display(), e.0)))
    }

    /// The engine named by `engine`.
    pub fn engine_kind(&self) -> Result<EngineKind, ConfigError> {
        self.engine.parse().map_err(|e: String| ConfigError(format!("engine: {e}")))
    }

    /// The log configuration this server opens.
    pub fn log_config(&self) -> Result<LogConfig, ConfigError> {
        let mut config =
            LogConfig::new(&self.log_dir, self.engine_kind()?, SyncPolicy::from_rpo_ms(self.rpo_ms));
        config.record_bytes_max = self.limits.frame_bytes_max;
        config.direct_io = self.direct_io;
        Ok(config)
    }

    /// Whether the TCP listener runs without TLS on a non-loopback address (allowed only by
    /// `insecure_plaintext`; the server warns at every start).
    pub fn plaintext_exposed(&self) -> bool {
        self.tls.is_none() && self.tcp.is_some_and(|addr| !addr.ip().is_loopback())
    }

    /// Refuses a TCP listener reachable from other machines unless the operator said so
    /// (`allow_remote`) and either gave it TLS or said plaintext is meant.
    fn validate_exposure(&self) -> Result<(), ConfigError> {
        if let Some(tls) = &self.tls {
            if self.tcp.is_none() {
                return Err(ConfigError(
                    "[tls] is set but there is no tcp listener to put it on (the Unix socket needs no TLS: \
                     its file mode is the authorisation)"
                        .into(),
                ));
            }
            if tls.clients_allowed.len() > CLIENTS_ALLOWED_MAX {
                return Err(ConfigError(format!(
                    "tls.clients_allowed: more than {CLIENTS_ALLOWED_MAX} names"
                )));
            }
            if tls.clients_allowed.iter().any(|name| name.is_empty()) {
                return Err(ConfigError("tls.clients_allowed holds an empty name".into()));
            }
        }
        let Some(addr) = self.tcp else { return Ok(()) };
        if addr.ip().is_loopback() {
            return Ok(());
        }
        if !self.allow_remote {
            return Err(ConfigError(format!(
                "tcp address {addr} is not a loopback address; set `allow_remote = true` and a [tls] \
                 section to accept connections from other machines"
            )));
        }
        if self.tls.is_none() && !self.insecure_plaintext {
            return Err(ConfigError(format!(
                "tcp address {addr} accepts other machines without TLS: add a [tls] section with `cert = \
                 \"server.pem\"`, `key = \"server.key\"` and `client_ca = \"clients-ca.pem\"` (clients then \
                 connect with tls:host:port and a certificate of that CA), or set `insecure_plaintext = true` \
                 to accept anyone who reaches the port"
            )));
        }
        Ok(())
    }

    /// Refuses a pair membership that cannot work or that would put the link, which has no
    /// TLS yet, on another machine's reach.
    fn validate_pair(&self) -> Result<(), ConfigError> {
        let Some(pair) = &self.pair else { return Ok(()) };
        if pair.member == 0 {
            return Err(ConfigError("pair.member must be between 1 and 255 (0 means no epoch)".into()));
        }
        if pair.link == pair.peer_link {
            return Err(ConfigError(format!(
                "pair.link and pair.peer_link are the same address {}",
                pair.link
            )));
        }
        for (name, addr) in [("link", pair.link), ("peer_link", pair.peer_link)] {
            if !addr.ip().is_loopback() && pair.tls.is_none() && !self.insecure_plaintext {
                return Err(ConfigError(format!(
                    "pair.{name} {addr} is not a loopback address and the link has no TLS: add a [pair.tls] \
                     section with `cert = \"member-a.pem\"`, `key = \"member-a.key\"`, `ca = \"pair-ca.pem\"` and \
                     `peer_name = \"<the name in the other member's certificate>\"`, or set `insecure_plaintext = \
                     true` on a network you trust entirely"
                )));
            }
        }
        match (&pair.tls, &pair.secret_file) {
            (None, None) => {
                return Err(ConfigError(
                    "[pair] has neither secret_file nor [pair.tls]: the link must be authenticated, or any \
                     local user could depose the primary or inject decisions. On one machine, make a secret \
                     with `head -c 32 /dev/urandom | base64 > pair.secret && chmod 600 pair.secret`, give both \
                     members the same file and set `secret_file = \"pair.secret\"`; across machines, use \
                     [pair.tls]"
                        .into(),
                ));
            }
            (Some(_), Some(_)) => {
                return Err(ConfigError(
                    "[pair] has both secret_file and [pair.tls]: the certificates authenticate the link, \
                     remove secret_file"
                        .into(),
                ));
            }
            _ => {}
        }
        if pair.busy_poll_us > BUSY_POLL_US_MAX {
            return Err(ConfigError(format!(
                "pair.busy_poll_us = {} is above {BUSY_POLL_US_MAX} (10 ms): a longer busy poll only burns the backup's CPU",
                pair.busy_poll_us
            )));
        }
        if !LINK_STALL_MS_RANGE.contains(&pair.link_stall_ms) {
            return Err(ConfigError(format!(
                "pair.link_stall_ms = {} must be between {} and {}",
                pair.link_stall_ms,
                LINK_STALL_MS_RANGE.start(),
                LINK_STALL_MS_RANGE.end()
            )));
        }
        if pair.tls.as_ref().is_some_and(|tls| tls.peer_name.is_empty()) {
            return Err(ConfigError(
                "pair.tls.peer_name is empty: name the other member's certificate".into(),
            ));
        }
        if self.engine_kind()? == EngineKind::Volatile {
            return Err(ConfigError("a pair member needs a durable engine, not volatile".into()));
        }
        if let Some(etcd) = &pair.etcd {
            etcd.validate(self.insecure_plaintext)?;
            if !cfg!(feature = "etcd") {
                return Err(ConfigError(
                    "[pair.etcd] is set but this decree was built without etcd support: build it with                      `cargo build --release -p decree-cli --features etcd` (needs protoc: Debian's                      protobuf-compiler)"
                        .into(),
                ));
            }
        }
        Ok(())
    }

    /// Checks that the configuration can work; call again after overriding fields.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.engine_kind()?;
        if self.unix.is_none() && self.tcp.is_none() {
            return Err(ConfigError("no listener: set `unix` (a socket path) or `tcp` (an address)".into()));
        }
        self.validate_exposure()?;
        self.validate_pair()?;
        if let Some(tracing) = &self.tracing {
            tracing.validate().map_err(|e| ConfigError(e.to_string()))?;
        }
        if let Some(addr) = self.metrics {
            if !addr.ip().is_loopback() {
                return Err(ConfigError(format!("metrics address {addr} must be a loopback address")));
            }
        }
        if self.node == 0 {
            return Err(ConfigError("node must be at least 1 (0 means 'any node' in Hello)".into()));
        }
        let l = &self.limits;
        if l.frame_bytes_max < 1024 || l.frame_bytes_max as usize > decree_proto::FRAME_BYTES_MAX {
            return Err(ConfigError(format!(
                "limits.frame_bytes_max = {} must be between 1024 and {}",
                l.frame_bytes_max,
                decree_proto::FRAME_BYTES_MAX
            )));
        }
        for (name, v) in [
            ("connections_max", l.connections_max),
            ("inflight_per_connection_max", l.inflight_per_connection_max),
            ("inflight_total_max", l.inflight_total_max),
            ("outcomes_remembered_max", l.outcomes_remembered_max),
        ] {
            if v == 0 || v > 1 << 20 {
                return Err(ConfigError(format!("limits.{name} = {v} must be between 1 and {}", 1 << 20)));
            }
        }
        l.validate_timeouts()?;
        self.recovery.validate()?;
        let mut names = std::collections::HashSet::new();
        for rm in &self.rm {
            if rm.name.is_empty() {
                return Err(ConfigError(
                    "an rm name is empty: decision records name each branch's rm".into(),
                ));
            }
            decree_core::check_rm_name(&rm.name).map_err(|e| ConfigError(format!("[[rm]] entry: {e}")))?;
            if !names.insert(&rm.name) {
                return Err(ConfigError(format!("rm name {:?} appears twice", rm.name)));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_file_parses_and_defaults_fill_the_rest() {
        let c = ServerConfig::from_toml_str(
            r#"
            node = 7
            log_dir = "/tmp/x"
            engine = "volatile"
            unix = "/tmp/x.sock"
            [limits]
            inflight_per_connection_max = 8
            [[rm]]
            name = "pg-a"
            kind = "postgres"
            dsn = "dbname=a"
            "#,
        )
        .unwrap();
        assert_eq!(c.node, 7);
        assert_eq!(c.engine_kind().unwrap(), EngineKind::Volatile);
        assert_eq!(c.limits.inflight_per_connection_max, 8);
        assert_eq!(c.limits.connections_max, Limits::default().connections_max);
        assert_eq!(c.rm[0].kind, "postgres");
    }

    #[test]
    fn the_timeouts_default_to_a_bounded_handshake_and_no_idle_timeout() {
        let c = ServerConfig::from_toml_str("log_dir = \"/x\"\nunix = \"/s\"").unwrap();
        assert_eq!(c.limits.handshake_timeout_ms, 10_000);
        assert_eq!(c.limits.handshake_timeout(), std::time::Duration::from_secs(10));
        assert_eq!(c.limits.idle_timeout_ms, 0);
        assert_eq!(c.limits.idle_timeout(), None);
        let c = ServerConfig::from_toml_str(
            "log_dir = \"/x\"\nunix = \"/s\"\n[limits]\nhandshake_timeout_ms = 300\nidle_timeout_ms = 60000",
        )
        .unwrap();
        assert_eq!(c.limits.handshake_timeout_ms, 300);
        assert_eq!(c.limits.idle_timeout_ms, 60_000);
        assert_eq!(c.limits.idle_timeout(), Some(std::time::Duration::from_secs(60)));
        assert_eq!(c.limits.connections_max, Limits::default().connections_max);
    }

    #[test]
    fn a_disabled_handshake_timeout_and_a_tiny_idle_timeout_are_refused_by_name() {
        let with = |limits: &str| {
            ServerConfig::from_toml_str(&format!("log_dir = \"/x\"\nunix = \"/s\"\n[limits]\n{limits}"))
        };
        let e = with("handshake_timeout_ms = 0").unwrap_err();
        assert!(e.0.contains("handshake_timeout_ms = 0"), "{e}");
        let e = with("handshake_timeout_ms = 3600001").unwrap_err();
        assert!(e.0.contains("handshake_timeout_ms"), "{e}");
        let e = with("idle_timeout_ms = 99").unwrap_err();
        assert!(e.0.contains("idle_timeout_ms = 99"), "{e}");
        assert!(with("idle_timeout_ms = 100").is_ok());
        assert!(with("idle_timeout_ms = 0").is_ok());
        let e = with("idle_timeout_ms = -1").unwrap_err();
        assert!(e.0.contains("idle_timeout_ms"), "{e}");
        let e = with("idle_timeout = 5").unwrap_err();
        assert!(e.0.contains("idle_timeout"), "{e}");
    }

    #[test]
    fn rm_names_are_held_to_the_decision_records_limit() {
        let with = |name: &str| {
            ServerConfig::from_toml_str(&format!(
                "log_dir = \"/x\"\nunix = \"/s\"\n[[rm]]\nname = \"{name}\"\nkind = \"dummy\""
            ))
        };
        assert!(with(&"n".repeat(decree_core::RM_NAME_BYTES_MAX)).is_ok());
        // 255 bytes used to pass here, and the decision record cut longer ones.
        let e = with(&"n".repeat(255)).unwrap_err();
        assert!(e.0.contains("name of 255 bytes exceeds RM_NAME_BYTES_MAX = 64"), "{e}");
        let e = with("").unwrap_err();
        assert!(e.0.contains("empty"), "{e}");
    }

    #[test]
    fn remote_addresses_unknown_engines_and_typos_are_refused_by_name() {
        let e = ServerConfig::from_toml_str("log_dir = \"/x\"\ntcp = \"0.0.0.0:7411\"").unwrap_err();
        assert!(e.0.contains("allow_remote"), "{e}");
        // Today's `allow_remote = true` alone is refused, and the error says what to add.
        let remote = "log_dir = \"/x\"\ntcp = \"0.0.0.0:7411\"\nallow_remote = true\n";
        let e = ServerConfig::from_toml_str(remote).unwrap_err();
        for needed in
            ["without TLS", "[tls]", "cert = ", "key = ", "client_ca = ", "insecure_plaintext = true"]
        {
            assert!(e.0.contains(needed), "{needed:?} missing from: {e}");
        }
        let plaintext = ServerConfig::from_toml_str(&format!("{remote}insecure_plaintext = true")).unwrap();
        assert!(plaintext.plaintext_exposed());
        let tls = "[tls]\ncert = \"s.pem\"\nkey = \"s.key\"\nclient_ca = \"ca.pem\"\n";
        let secured = ServerConfig::from_toml_str(&format!("{remote}{tls}")).unwrap();
        assert!(!secured.plaintext_exposed());
        assert_eq!(secured.tls.as_ref().unwrap().clients_allowed, Vec::<String>::new());
        // TLS without a TCP listener, an empty allowed name and an unknown field are refused.
        let e = ServerConfig::from_toml_str(&format!("log_dir = \"/x\"\nunix = \"/s\"\n{tls}")).unwrap_err();
        assert!(e.0.contains("no tcp listener"), "{e}");
        let e = ServerConfig::from_toml_str(&format!("{remote}{tls}clients_allowed = [\"\"]")).unwrap_err();
        assert!(e.0.contains("empty name"), "{e}");
        let e = ServerConfig::from_toml_str(&format!("{remote}{tls}client_cert = \"x\"")).unwrap_err();
        assert!(e.0.contains("client_cert"), "{e}");
        // Loopback stays as it is: no TLS needed, none refused.
        assert!(!ServerConfig::from_toml_str("log_dir = \"/x\"\ntcp = \"127.0.0.1:7411\"")
            .unwrap()
            .plaintext_exposed());
        let e = ServerConfig::from_toml_str("log_dir = \"/x\"\nunix=\"/s\"\nengine = \"fast\"").unwrap_err();
        assert!(e.0.contains("unknown log engine"), "{e}");
        let e = ServerConfig::from_toml_str("log_dir = \"/x\"\nunix=\"/s\"\nrpo = 3").unwrap_err();
        assert!(e.0.contains("rpo"), "{e}");
        let e = ServerConfig::from_toml_str("log_dir = \"/x\"").unwrap_err();
        assert!(e.0.contains("no listener"), "{e}");
    }

    #[test]
    fn the_recovery_section_has_defaults_takes_values_and_refuses_bad_ones_by_name() {
        let base = "log_dir = \"/x\"\nunix = \"/s\"\n";
        let c = ServerConfig::from_toml_str(base).unwrap();
        assert_eq!(c.recovery, RecoveryConfig::default());
        assert_eq!(c.recovery.periodic_pass(), Duration::from_secs(60));
        assert_eq!(c.recovery.recheck_after_close(), Duration::from_secs(1));
        assert_eq!(c.recovery.last_recheck_after_close(), Some(Duration::from_secs(16)));

        let explicit = format!(
            "{base}[recovery]\nperiodic_pass_ms = 600000\nrecheck_after_close_ms = 500\nrechecks_after_close = 4\n"
        );
        let c = ServerConfig::from_toml_str(&explicit).unwrap();
        assert_eq!(
            c.recovery,
            RecoveryConfig {
                periodic_pass_ms: 600_000,
                recheck_after_close_ms: 500,
                rechecks_after_close: 4
            }
        );
        assert_eq!(c.recovery.last_recheck_after_close(), Some(Duration::from_secs(4)));
        let partial = format!("{base}[recovery]\nrechecks_after_close = 0\n");
        let c = ServerConfig::from_toml_str(&partial).unwrap();
        assert_eq!(c.recovery.last_recheck_after_close(), None);
        assert_eq!(c.recovery.periodic_pass_ms, 60_000, "unset fields keep their defaults");

        for (section, field) in [
            ("periodic_pass_ms = 0", "recovery.periodic_pass_ms"),
            ("periodic_pass_ms = 86400001", "recovery.periodic_pass_ms"),
            ("recheck_after_close_ms = 0", "recovery.recheck_after_close_ms"),
            ("rechecks_after_close = 17", "recovery.rechecks_after_close"),
            ("recheck_after_close_ms = 3600000\nrechecks_after_close = 6", "last recheck"),
            ("period_ms = 1", "period_ms"),
        ] {
            let text = format!("{base}[recovery]\n{section}\n");
            let e = ServerConfig::from_toml_str(&text).unwrap_err();
            assert!(e.0.contains(field), "{section}: {e}");
        }
        // The largest allowed ladder: 16 rechecks, the last one day after the close.
        let ok = format!("{base}[recovery]\nrecheck_after_close_ms = 2636\nrechecks_after_close = 16\n");
        assert!(ServerConfig::from_toml_str(&ok).is_ok());
    }

    #[test]
    fn a_pair_link_beyond_loopback_needs_its_tls_and_says_what_to_add() {
        let base = "log_dir = \"/x\"\nunix = \"/s\"\n[pair]\nmember = 1\n";
        let remote = format!("{base}link = \"10.0.0.1:7421\"\npeer_link = \"10.0.0.2:7421\"\n");
        let e = ServerConfig::from_toml_str(&remote).unwrap_err().to_string();
        for needle in [
            "pair.link 10.0.0.1:7421",
            "[pair.tls]",
            "cert = ",
            "ca = ",
            "peer_name = ",
            "insecure_plaintext",
        ] {
            assert!(e.contains(needle), "{needle:?} missing from: {e}");
        }
        let tls =
            "[pair.tls]\ncert = \"a.pem\"\nkey = \"a.key\"\nca = \"ca.pem\"\npeer_name = \"decree-b\"\n";
        let secured = ServerConfig::from_toml_str(&format!("{remote}{tls}")).unwrap();
        let pair = secured.pair.unwrap();
        assert_eq!(pair.tls.unwrap().peer_name, "decree-b");
        assert_eq!(pair.ack, PairAck::Durable, "durable unless said otherwise");
        // Plaintext on a trusted network still proves the pair's secret.
        let e = ServerConfig::from_toml_str(&format!("insecure_plaintext = true\n{remote}")).unwrap_err();
        assert!(e.to_string().contains("neither secret_file nor [pair.tls]"), "{e}");
        let insecure = ServerConfig::from_toml_str(&format!(
            "insecure_plaintext = true\n{remote}secret_file = \"p.secret\"\n"
        ))
        .unwrap();
        assert!(insecure.pair.unwrap().tls.is_none());
        let e = ServerConfig::from_toml_str(&format!("{remote}{}", tls.replace("decree-b", ""))).unwrap_err();
        assert!(e.to_string().contains("pair.tls.peer_name is empty"), "{e}");
        let e = ServerConfig::from_toml_str(&format!("{remote}{tls}peer = \"x\"\n")).unwrap_err();
        assert!(e.to_string().contains("peer"), "unknown fields are refused: {e}");
        let loopback = format!("{base}link = \"127.0.0.1:7421\"\npeer_link = \"127.0.0.1:7422\"\n");
        // The link is authenticated on loopback too (issue 32, defect 11), by one means.
        let e = ServerConfig::from_toml_str(&loopback).unwrap_err().to_string();
        for needle in ["neither secret_file nor [pair.tls]", "head -c 32 /dev/urandom", "chmod 600"] {
            assert!(e.contains(needle), "{needle:?} missing from: {e}");
        }
        let e =
            ServerConfig::from_toml_str(&format!("{loopback}secret_file = \"p.secret\"\n{tls}")).unwrap_err();
        assert!(e.to_string().contains("both secret_file and [pair.tls]"), "{e}");
        let local = format!("{loopback}secret_file = \"p.secret\"\nack = \"received\"\n");
        assert_eq!(ServerConfig::from_toml_str(&local).unwrap().pair.unwrap().ack, PairAck::Received);
        let e = ServerConfig::from_toml_str(&local.replace("received", "sometimes")).unwrap_err();
        assert!(e.to_string().contains("sometimes"), "{e}");
    }

    #[test]
    fn a_pair_link_stall_is_five_seconds_unless_asked_and_bounded() {
        let base = "log_dir = \"/x\"\nunix = \"/s\"\n[pair]\nmember = 1\n\
                    link = \"127.0.0.1:7421\"\npeer_link = \"127.0.0.1:7422\"\nsecret_file = \"p.secret\"\n";
        let pair = ServerConfig::from_toml_str(base).unwrap().pair.unwrap();
        assert_eq!(pair.link_stall(), std::time::Duration::from_secs(5));
        let asked = ServerConfig::from_toml_str(&format!("{base}link_stall_ms = 250\n")).unwrap();
        assert_eq!(asked.pair.unwrap().link_stall(), std::time::Duration::from_millis(250));
        for refused in [0, 99, 3_600_001] {
            let e = ServerConfig::from_toml_str(&format!("{base}link_stall_ms = {refused}\n")).unwrap_err();
            assert!(
                e.to_string().contains(&format!("pair.link_stall_ms = {refused} must be between")),
                "{e}"
            );
        }
    }

    #[test]
    fn a_pair_busy_poll_is_off_unless_asked_and_bounded() {
        let base = "log_dir = \"/x\"\nunix = \"/s\"\n[pair]\nmember = 1\n\
                    link = \"127.0.0.1:7421\"\npeer_link = \"127.0.0.1:7422\"\nsecret_file = \"p.secret\"\n";
        assert_eq!(ServerConfig::from_toml_str(base).unwrap().pair.unwrap().busy_poll_us, 0);
        let asked = format!("{base}busy_poll_us = {BUSY_POLL_US_MAX}\n");
        assert_eq!(ServerConfig::from_toml_str(&asked).unwrap().pair.unwrap().busy_poll_us, BUSY_POLL_US_MAX);
        let e = ServerConfig::from_toml_str(&format!("{base}busy_poll_us = {}\n", BUSY_POLL_US_MAX + 1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("pair.busy_poll_us = 10001") && e.contains("10 ms"), "{e}");
        let e = ServerConfig::from_toml_str(&format!("{base}busy_poll_us = -1\n")).unwrap_err();
        assert!(e.to_string().contains("busy_poll_us"), "{e}");
    }
}
