//! The state-server modes: the coordinator runs in the benchmark process, its decisions go
//! to a decree state server over a Unix socket, TCP, or TCP with mutual TLS.
//!
//! Unless an address is given ([`RemoteSpec::connect`]), the target starts its own server
//! in-process (`decree_server::start`) on a fresh log with the run's engine and RPO, on a
//! socket in a private temporary directory or on a free loopback port, with the metrics
//! endpoint on. In the tls mode that directory holds a throwaway CA instead
//! (`decree_server::testing::TestCa`), with the server's certificate for 127.0.0.1 and one
//! client certificate; the server asks every client for it, as a real deployment would.
//! Against a server given by address, the tls mode reads the client's CA, certificate and
//! key from [`RemoteSpec::tls_files`]. The coordinator's store is one [`RemoteDecisions`];
//! every benchmark thread is one TX context, that is one coordinator session and one
//! server connection for the whole run (as the client library is designed), while tx_open
//! and tx_close still open and close the dummy resource managers every cycle. The dummy
//! RMs' factories are given to the server as well, so it could finish the phase two of a
//! client that died. [`RemoteTarget::handshakes`] times opening a connection, which the
//! runs never see (see [`crate::handshake`]).
//!
//! With `replicas: 2` (`--replicas 2`, Unix socket only) the target starts a primary +
//! backup pair instead ([`crate::pair`]), promotes its member 1 and runs through it.
//!
//! [`BenchTarget::finish`] checks, through the server's metrics, that the server made
//! exactly one decision durable and completed exactly one transaction per commit (with two
//! or more RMs; a pair's primary also counts its promotion's one probe). Against a server
//! given by address, whose counters other clients share, it checks nothing.

use crate::client::{BenchClient, BenchTarget, Mode, Replicas};
use crate::embedded::{TmClient, RMS_MAX};
use crate::handshake::{self, Connector, Handshake, HANDSHAKE_CONNECTIONS};
use crate::pair::{self, Promotion, PROBE_DECISIONS};
use crate::BenchError;
use decree_client::{ClientOptions, ClientTlsFiles, Endpoint, RemoteDecisions};
use decree_core::testing::DummyFactory;
use decree_core::{DecisionStore, RmFactory, TmConfig, TransactionManager};
use decree_log::LogConfig;
use decree_server::testing::{TestCa, Validity};
use decree_server::{ServerConfig, ServerError, ServerHandle, TlsConfig};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long `finish` waits for the coordinator's phase-two work and the server's counters.
const SETTLE_WAIT: Duration = Duration::from_secs(10);

/// Connections the started server accepts beyond one per benchmark thread.
const CONNECTIONS_SPARE: u32 = 16;

/// Largest metrics response read.
const METRICS_BYTES_MAX: u64 = 1 << 20;

/// What a state-server run needs besides the log configuration.
#[derive(Debug, Clone)]
pub struct RemoteSpec {
    /// Unix, Tcp or Tls.
    pub mode: Mode,
    /// A running server (`unix:/path`, `tcp:host:port` or `tls:host:port`) instead of
    /// starting one.
    pub connect: Option<String>,
    /// The client's CA, certificate and key for a tls server given by `connect` (the server
    /// the target starts gets a throwaway CA instead).
    pub tls_files: ClientTlsFiles,
    /// Dummy resource managers per transaction.
    pub rms: usize,
    /// Benchmark threads, each holding one connection.
    pub threads: usize,
    /// Servers holding each decision: one, or a primary + backup pair (the benchmark's
    /// own server, over the Unix socket, only).
    pub replicas: Replicas,
    /// Where the threads run: a pair's backup is started on CPU 1 when split.
    pub cpus: crate::cpus::CpuPlacement,
}

/// A coordinator over a state server, shared by the clients of one run.
pub struct RemoteTarget {
    // Fields drop in order: the coordinator (and its sessions) before the server.
    tm: Arc<TransactionManager>,
    factories: Vec<DummyFactory>,
    rms: usize,
    committed: Arc<AtomicU64>,
    metrics: Option<SocketAddr>,
    connector: Connector,
    /// Decisions the server counted before the run (a pair's promotion probe).
    probe_decisions: u64,
    promotion: Option<Promotion>,
    // The single server, or the pair's primary (stopped before its backup).
    server: Option<ServerHandle>,
    backup: Option<ServerHandle>,
    // The socket or the throwaway CA's files, removed after the server stopped.
    _dir: Option<tempfile::TempDir>,
}

/// A failure talking to a state server, with what was being done.
pub(crate) fn client_error(context: &str, e: impl std::fmt::Display) -> BenchError {
    BenchError::Client { context: context.into(), message: e.to_string() }
}

impl RemoteTarget {
    /// Starts a server on the log of `log` (unless `spec.connect` names one) and a
    /// coordinator with `spec.rms` dummy RMs that sends its decisions there.
    pub fn open(log: &LogConfig, spec: &RemoteSpec) -> Result<Self, BenchError> {
        if spec.rms == 0 || spec.rms > RMS_MAX {
            return Err(BenchError::Option(format!("--rms {}: expected 1 to {RMS_MAX}", spec.rms)));
        }
        let factories: Vec<DummyFactory> =
            (0..spec.rms).map(|i| DummyFactory::named(&format!("dummy-{i}"), 0)).collect();
        let shared: Vec<Arc<dyn RmFactory>> = factories.iter().map(DummyFactory::arc).collect();
        let started = match &spec.connect {
            Some(address) => Started {
                endpoint: address.clone(),
                tls_files: (spec.mode == Mode::Tls).then(|| spec.tls_files.clone()),
                ..Started::default()
            },
            None => start_server(log, spec, shared.clone())?,
        };
        let metrics =
            started.metrics.or_else(|| started.server.as_ref().and_then(ServerHandle::metrics_addr));
        let connector = connector(&started)?;
        let store: Arc<dyn DecisionStore> = Arc::new(
            RemoteDecisions::connect_with(connector.endpoint.clone(), connector.options.clone()).map_err(
                |e| client_error(&format!("connecting to the state server at {}", started.endpoint), e),
            )?,
        );
        let tm = TransactionManager::with_store(store, TmConfig::default(), shared)
            .map_err(|e| client_error("starting the coordinator", e))?;
        Ok(RemoteTarget {
            tm,
            factories,
            rms: spec.rms,
            committed: Arc::new(AtomicU64::new(0)),
            metrics,
            connector,
            probe_decisions: if started.promotion.is_some() { PROBE_DECISIONS } else { 0 },
            promotion: started.promotion,
            server: started.server,
            backup: started.backup,
            _dir: started.dir,
        })
    }

    /// What promoting the pair's member 1 took; `None` for a single server.
    pub fn promotion(&self) -> Option<Promotion> {
        self.promotion
    }

    /// Times opening a connection to the server the way the run's clients do (see
    /// [`crate::handshake`]); sessions are long-lived, so the runs never pay it.
    pub fn handshakes(&self) -> Result<Handshake, BenchError> {
        handshake::measure(&self.connector, HANDSHAKE_CONNECTIONS)
    }

    /// Stops the server this target started, if any (a pair's primary, then its backup),
    /// and reports how it stopped.
    pub fn shutdown(mut self) -> Result<(), BenchError> {
        for (server, what) in
            [(self.server.take(), "the state server"), (self.backup.take(), "the pair's backup")]
        {
            if let Some(server) = server {
                server.shutdown().map_err(|e| client_error(&format!("stopping {what}"), e))?;
            }
        }
        Ok(())
    }
}

/// Where the run's server is and what the clients need to reach it.
#[derive(Default)]
struct Started {
    endpoint: String,
    server: Option<ServerHandle>,
    dir: Option<tempfile::TempDir>,
    /// The client's TLS files in the tls mode.
    tls_files: Option<ClientTlsFiles>,
    /// A pair's backup (`server` is its primary).
    backup: Option<ServerHandle>,
    /// The metrics endpoint, where the server's handle does not know it (a pair's).
    metrics: Option<SocketAddr>,
    /// What promoting a pair's primary took.
    promotion: Option<Promotion>,
}

/// The endpoint and client options of `started` (its TLS files read once, shared by every
/// connection of the run).
fn connector(started: &Started) -> Result<Connector, BenchError> {
    let context = format!("connecting to the state server at {}", started.endpoint);
    let endpoint: Endpoint = started.endpoint.parse().map_err(|e| client_error(&context, e))?;
    let tls = match &started.tls_files {
        Some(files) => files.load().map_err(|e| client_error(&context, e))?,
        None => None,
    };
    let options = ClientOptions { tls, ..ClientOptions::default() };
    Ok(Connector { endpoint, options, tls_files: started.tls_files.clone() })
}

/// A throwaway CA in `dir`: the server's TLS configuration (its certificate for 127.0.0.1,
/// any client of the CA allowed) and the files of one client certificate.
fn throwaway_pki(dir: &Path) -> (TlsConfig, ClientTlsFiles) {
    let ca = TestCa::new("decree-bench CA");
    let ca_file = ca.write_ca(&dir.join("ca.pem"));
    let server = ca.server(dir, "server", Validity::Current);
    let client = ca.client(dir, "decree-bench", Validity::Current);
    let tls = TlsConfig {
        cert: server.cert,
        key: server.key,
        client_ca: ca_file.clone(),
        clients_allowed: Vec::new(),
    };
    (tls, ClientTlsFiles { ca: Some(ca_file), cert: Some(client.cert), key: Some(client.key) })
}

fn start_server(
    log: &LogConfig,
    spec: &RemoteSpec,
    factories: Vec<Arc<dyn RmFactory>>,
) -> Result<Started, BenchError> {
    let mut config = ServerConfig::new(&log.dir, log.engine);
    config.rpo_ms = log.sync.rpo_ms();
    config.metrics = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    config.limits.connections_max = config
        .limits
        .connections_max
        .max(u32::try_from(spec.threads).unwrap_or(u32::MAX).saturating_add(CONNECTIONS_SPARE));
    // The socket or the certificates live in a private directory of the system's temporary
    // directory: a socket path must be short (108 bytes) and the log directory's path may
    // be long.
    let private_dir = || {
        tempfile::Builder::new()
            .prefix("decree-bench-")
            .tempdir()
            .map_err(|e| BenchError::io("cannot create a private directory", std::env::temp_dir(), e))
    };
    let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
    if spec.replicas.count != 1 && (spec.mode, spec.replicas.count) != (Mode::Unix, 2) {
        return Err(BenchError::Option(format!(
            "replicas {} in the {} mode: a pair (2) runs over the Unix socket only",
            spec.replicas, spec.mode
        )));
    }
    let (dir, tls_files) = match spec.mode {
        Mode::Unix if spec.replicas.count == 2 => {
            let dir = private_dir()?;
            let started = pair::start(&config, dir.path(), factories, spec.replicas, spec.cpus)?;
            return Ok(Started {
                endpoint: started.endpoint,
                server: Some(started.primary),
                dir: Some(dir),
                backup: Some(started.backup),
                metrics: Some(started.metrics),
                promotion: Some(started.promotion),
                ..Started::default()
            });
        }
        Mode::Unix => {
            let dir = private_dir()?;
            config.unix = Some(dir.path().join("decree.sock"));
            (Some(dir), None)
        }
        Mode::Tcp => {
            config.tcp = Some(loopback);
            (None, None)
        }
        Mode::Tls => {
            let dir = private_dir()?;
            let (tls, files) = throwaway_pki(dir.path());
            (config.tcp, config.tls) = (Some(loopback), Some(tls));
            (Some(dir), Some(files))
        }
        Mode::Embedded => return Err(BenchError::Option("the embedded mode has no server".into())),
    };
    let server = decree_server::start(config, factories).map_err(|e| match e {
        ServerError::Log(source) => {
            BenchError::EngineUnavailable { engine: log.engine.name().into(), source }
        }
        other => client_error("starting the state server", other),
    })?;
    let endpoint = match (server.unix_path(), server.tcp_addr()) {
        (Some(path), _) => format!("unix:{}", path.display()),
        (None, Some(addr)) if tls_files.is_some() => format!("tls:{addr}"),
        (None, Some(addr)) => format!("tcp:{addr}"),
        (None, None) => return Err(client_error("starting the state server", "it listens nowhere")),
    };
    Ok(Started { endpoint, server: Some(server), dir, tls_files, ..Started::default() })
}

impl BenchTarget for RemoteTarget {
    fn client(&self, _thread: usize) -> Result<Box<dyn BenchClient>, BenchError> {
        Ok(Box::new(TmClient::new(self.tm.clone(), self.factories.clone(), self.committed.clone())))
    }

    fn finish(&self) -> Result<(), BenchError> {
        if !self.tm.wait_idle(SETTLE_WAIT) {
            return Err(client_error(
                "after the run",
                format!("{} phase-two jobs still pending after {SETTLE_WAIT:?}", self.tm.pending()),
            ));
        }
        let Some(metrics) = self.metrics else { return Ok(()) };
        let committed = self.committed.load(Ordering::Relaxed);
        let expected = if self.rms >= 2 { committed } else { 0 } + self.probe_decisions;
        // Completions travel after the replies (buffered by the client, flushed when a
        // session closes): wait until the server has seen them all.
        let deadline = Instant::now() + SETTLE_WAIT;
        loop {
            let counters = ServerCounters::scrape(metrics)?;
            // Decisions are counted before their replies, so only completions can lag.
            let settled = counters.completions >= expected;
            if settled || Instant::now() >= deadline {
                if counters.decisions != expected || counters.completions != expected {
                    return Err(client_error(
                        "checking the state server after the run",
                        format!(
                            "{committed} commits with {} RMs (and {} probe), expected {expected} decisions, but \
                             the server counted {} decisions and {} completions",
                            self.rms, self.probe_decisions, counters.decisions, counters.completions
                        ),
                    ));
                }
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// The server counters the benchmark checks, from its Prometheus endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerCounters {
    /// Decisions made durable (`decree_commits_total`).
    pub decisions: u64,
    /// Transactions completed (`decree_completions_total`).
    pub completions: u64,
    /// Connected sessions (`decree_sessions_live`).
    pub sessions_live: u64,
}

impl ServerCounters {
    /// Reads the counters from the metrics endpoint at `address`.
    pub fn scrape(address: SocketAddr) -> Result<Self, BenchError> {
        let context = format!("reading the state server's metrics at {address}");
        let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(5))
            .map_err(|e| client_error(&context, e))?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| client_error(&context, e))?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .map_err(|e| client_error(&context, e))?;
        let mut text = String::new();
        stream.take(METRICS_BYTES_MAX).read_to_string(&mut text).map_err(|e| client_error(&context, e))?;
        Self::parse(&text).ok_or_else(|| client_error(&context, "decree_commits_total or friends missing"))
    }

    /// Picks the counters out of Prometheus text; `None` when one is missing.
    pub fn parse(text: &str) -> Option<Self> {
        let value = |name: &str| {
            text.lines().find_map(|line| {
                let rest = line.strip_prefix(name)?.strip_prefix(' ')?;
                rest.trim().parse::<f64>().ok().map(|v| v as u64)
            })
        };
        Some(ServerCounters {
            decisions: value("decree_commits_total")?,
            completions: value("decree_completions_total")?,
            sessions_live: value("decree_sessions_live")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_read_from_prometheus_text() {
        let text = "# HELP decree_commits_total x\n# TYPE decree_commits_total counter\n\
                    decree_commits_total 42\ndecree_commits_totalx 9\ndecree_completions_total 40\n\
                    decree_sessions_live 3\n";
        let c = ServerCounters::parse(text).expect("all present");
        assert_eq!(c, ServerCounters { decisions: 42, completions: 40, sessions_live: 3 });
        assert_eq!(ServerCounters::parse("decree_commits_total 1\n"), None);
    }
}
