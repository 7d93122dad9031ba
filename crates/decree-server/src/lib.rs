//! The decree state server: owns the decision log and serves clients over a Unix socket
//! and/or TCP with the protocol of `decree-proto`.
//!
//! Application processes run the coordinator themselves and send only their decisions
//! here (see `decree-client`). Each connection is one session; decisions of all sessions
//! share the log's group commit through `Log::append_with`, whose callback completes the
//! reply, so no runtime thread ever blocks on the disk. When a connection closes, the
//! server finishes the phase two of its decided transactions with the configured resource
//! managers and rolls back prepared branches that have no decision (presumed abort); at
//! start it does the same for the decisions it finds in the log.
//!
//! Entry points: [`run`] / [`run_with`] block until SIGTERM or SIGINT (what `decree serve`
//! calls); [`start`] returns a [`ServerHandle`] for tests and embedding.

pub mod admin;
pub mod config;
mod connection;
mod crash_points;
#[cfg(feature = "etcd")]
mod election;
pub mod etcd_config;
mod fence;
mod link_secret;
mod link_tls;
mod live_set;
mod metrics;
mod pair;
mod pair_election;
mod recheck;
mod recovery;
mod rm_calls;
mod rules;
#[cfg(feature = "sim")]
pub mod sim_api;
mod state;
/// The locks [`live_set`] is written over: parking_lot's here (decree-pair-loom gives
/// loom's, to check every interleaving of the same file).
mod sync {
    pub(crate) use parking_lot::Mutex;

    /// Locks `mutex`.
    pub(crate) fn lock<T>(mutex: &Mutex<T>) -> parking_lot::MutexGuard<'_, T> {
        mutex.lock()
    }
}
#[cfg(feature = "testing")]
pub mod testing;
pub mod tls;
mod trace;
#[cfg(feature = "etcd")]
mod watchdog;

pub use config::{
    ConfigError, Limits, PairAck, PairConfig, PairTlsConfig, RecoveryConfig, RmConfig, ServerConfig,
    TlsConfig, DEFAULT_TCP_ADDR,
};
pub use pair::{control_request, CONTROL_SOCKET};
pub use pair_election::etcd_cluster;

use connection::Peer;
use decree_core::{RecoveredDecisions, RmFactory};
use decree_log::outcomes::OutcomeMemory;
use state::State;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tls::{TlsListener, Upgraded};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{watch, Semaphore};

/// Why the server could not start or stopped with an error.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ServerError {
    /// The configuration was refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The log could not be opened or synced.
    #[error("decision log: {0}")]
    Log(#[from] decree_log::LogError),
    /// A listener or the runtime could not be set up; names what and where.
    #[error("{0}")]
    Io(String),
    /// The log holds a record that is not a decision this server can read (written by a
    /// newer server, say): it stops rather than leave that transaction to presumed abort.
    #[error(
        "the log holds a record this server cannot read (log key {key:#x}: {reason}); it stops rather than \
         presume abort for a transaction it may have decided: run the server version that wrote it"
    )]
    UnreadableRecord {
        /// The record's key in the log.
        key: u64,
        /// Why it is not a decision.
        reason: String,
    },
    /// This pair member led, and a member of a newer epoch deposed it (it touched nothing
    /// since; `decree serve` then rejoins the pair as a backup in the same process).
    #[error("deposed by epoch {0}: this member rejoins the pair as a backup")]
    Deposed(String),
}

/// Where a started server listens.
#[derive(Debug, Clone, Default)]
struct Bound {
    unix: Option<PathBuf>,
    tcp: Option<SocketAddr>,
    metrics: Option<SocketAddr>,
}

/// A running server; dropping it shuts the server down gracefully.
pub struct ServerHandle {
    stop: Arc<watch::Sender<bool>>,
    thread: Option<std::thread::JoinHandle<Result<(), ServerError>>>,
    bound: Bound,
    node: u32,
    incarnation: u64,
    tls: Option<Arc<TlsListener>>,
}

impl ServerHandle {
    /// The Unix socket path, when configured.
    pub fn unix_path(&self) -> Option<&Path> {
        self.bound.unix.as_deref()
    }
    /// The bound TCP address (the real port when the configuration said port 0).
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.bound.tcp
    }
    /// The bound metrics address.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.bound.metrics
    }
    /// The node id clients get in `HelloOk`.
    pub fn node(&self) -> u32 {
        self.node
    }
    /// The incarnation of the log this run opened.
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }
    /// Rereads the TLS certificate, key and client CA (what SIGHUP does); on an error the
    /// files in use stay. New connections get the new files, open ones keep theirs.
    pub fn reload_tls(&self) -> Result<(), ServerError> {
        match &self.tls {
            Some(tls) => Ok(tls.reload()?),
            None => Err(ServerError::Io("this server has no [tls] to reload".into())),
        }
    }
    /// Stops accepting, finishes in-flight requests, syncs the log and waits for the end.
    pub fn shutdown(mut self) -> Result<(), ServerError> {
        self.stop_and_join()
    }
    /// Blocks until the server stops by itself (a signal, when started by [`run_with`]).
    pub fn wait(mut self) -> Result<(), ServerError> {
        self.wait_thread()
    }
    fn stop_and_join(&mut self) -> Result<(), ServerError> {
        let _ = self.stop.send(true);
        self.wait_thread()
    }
    fn wait_thread(&mut self) -> Result<(), ServerError> {
        match self.thread.take() {
            Some(t) => t.join().unwrap_or_else(|_| Err(ServerError::Io("server thread panicked".into()))),
            None => Ok(()),
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        if let Err(e) = self.stop_and_join() {
            tracing::error!(error = %e, "server stopped with an error");
        }
    }
}

/// Runs the server with no resource managers until SIGTERM or SIGINT.
pub fn run(config: ServerConfig) -> Result<(), ServerError> {
    run_with(config, Vec::new())
}

/// Runs the server until SIGTERM or SIGINT; `factories` finish the phase two of dead
/// sessions and recover prepared branches (one per configured `[[rm]]`, by name).
///
/// A deposed pair member rejoins as a backup in the same process (its log reopened, a new
/// run id), as a restart would make it: its clients are answered `NotPrimary` naming the
/// peer instead of finding nobody listening (issue 32, defect 10), and under an election
/// it is ready to lead again. It drops what the new primary does not send, which no
/// member acknowledged in strict mode (docs/replication.md, the operator's procedure).
pub fn run_with(config: ServerConfig, factories: Vec<Arc<dyn RmFactory>>) -> Result<(), ServerError> {
    loop {
        match start_inner(config.clone(), factories.clone(), true, None)?.wait() {
            Err(ServerError::Deposed(epoch)) if config.pair.is_some() => {
                tracing::warn!(%epoch, "stepped down: rejoining the pair as a backup");
            }
            other => return other,
        }
    }
}

/// How long a stopped server waits for its log to close before its thread ends anyway.
const LOG_CLOSE_WAIT: Duration = Duration::from_secs(30);

/// Ends a stopped server's thread once its log has closed, so that whoever waits for the
/// thread (a restart in the same process, a deposed member rejoining) can open the log
/// again: the last holder of the server's state, which owns the log, may be a decision's
/// callback still finishing on one of the log's own threads, or a task the runtime drops
/// last. Gives up after [`LOG_CLOSE_WAIT`], saying so.
fn log_closed(
    runtime: tokio::runtime::Runtime,
    log_dir: &Path,
    served: Result<(), ServerError>,
) -> Result<(), ServerError> {
    drop(runtime);
    if !decree_log::engine::owner::wait_released(log_dir, LOG_CLOSE_WAIT) {
        tracing::error!(dir = %log_dir.display(), "the log is still open {LOG_CLOSE_WAIT:?} after the server stopped");
    }
    served
}

/// Starts the server on its own threads and returns once it listens.
pub fn start(config: ServerConfig, factories: Vec<Arc<dyn RmFactory>>) -> Result<ServerHandle, ServerError> {
    start_inner(config, factories, false, None)
}

/// Starts the server with its log and outcome memory on `storage` instead of the file
/// system (no directory lock): crash tests inject failed syncs and power loss here.
pub fn start_on_storage(
    config: ServerConfig,
    storage: Arc<dyn decree_log::io::Storage>,
    factories: Vec<Arc<dyn RmFactory>>,
) -> Result<ServerHandle, ServerError> {
    start_inner(config, factories, false, Some(storage))
}

fn start_inner(
    config: ServerConfig,
    factories: Vec<Arc<dyn RmFactory>>,
    stop_on_signals: bool,
    storage: Option<Arc<dyn decree_log::io::Storage>>,
) -> Result<ServerHandle, ServerError> {
    config.validate()?;
    for rm in &config.rm {
        if !factories.iter().any(|f| f.name() == rm.name) {
            tracing::warn!(rm = %rm.name, "no factory for a configured resource manager");
        }
    }
    let log_config = config.log_config()?;
    let tls = config.tls.as_ref().map(TlsListener::load).transpose()?.map(Arc::new);
    if config.plaintext_exposed() {
        tracing::warn!(
            tcp = ?config.tcp,
            "insecure_plaintext: the tcp listener accepts other machines without TLS; anyone who reaches \
             it can record decisions and ask about every transaction"
        );
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    let stop = Arc::new(stop_tx);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let stop_inner = stop.clone();
    let tls_inner = tls.clone();
    let thread = std::thread::Builder::new()
        .name("decree-server".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("decree-server-io")
                .enable_all()
                .build()
                .map_err(|e| ServerError::Io(format!("cannot start the tokio runtime: {e}")))?;
            let listeners = Listeners { tls: tls_inner, stop_on_signals, bound: Prebound::default() };
            if config.pair.is_some() {
                if storage.is_some() {
                    return Err(ServerError::Io("a pair member runs on the file system only".into()));
                }
                let log_dir = log_config.dir.clone();
                let served =
                    runtime.block_on(pair::run(config, factories, stop_inner, stop_rx, ready_tx, listeners));
                return log_closed(runtime, &log_dir, served);
            }
            let state = Arc::new(open_state(&config, &log_config, factories, storage, None)?);
            let served = runtime.block_on(serve(config, state, stop_inner, stop_rx, ready_tx, listeners));
            log_closed(runtime, &log_config.dir, served)
        })
        .map_err(|e| ServerError::Io(format!("cannot start the server thread: {e}")))?;
    match ready_rx.recv() {
        Ok((bound, node, incarnation)) => {
            Ok(ServerHandle { stop, thread: Some(thread), bound, node, incarnation, tls })
        }
        Err(_) => {
            // The thread ended before listening: its result says why.
            let result =
                thread.join().unwrap_or_else(|_| Err(ServerError::Io("server thread panicked".into())));
            Err(result.err().unwrap_or_else(|| ServerError::Io("server stopped before listening".into())))
        }
    }
}

/// How long an outcome entry may wait for its batch's sync: finished transactions'
/// outcomes are off the commit path, and batching them keeps their syncs few.
pub(crate) const OUTCOME_FLUSH_DELAY: Duration = Duration::from_millis(5);

/// Opens the log and the outcome memory beside it and builds the state of this run from
/// what they hold; `incarnation` overrides the log's (a pair's primary uses its epoch).
fn open_state(
    config: &ServerConfig,
    log_config: &decree_log::LogConfig,
    factories: Vec<Arc<dyn RmFactory>>,
    storage: Option<Arc<dyn decree_log::io::Storage>>,
    incarnation: Option<u64>,
) -> Result<State, ServerError> {
    let log: Arc<dyn decree_log::Log> = match &storage {
        Some(storage) => Arc::from(decree_log::engine::open_with_storage(log_config, storage.clone())?),
        None => Arc::from(decree_log::open(log_config)?),
    };
    let capacity = config.limits.outcomes_remembered_max;
    let outcomes = open_outcomes(log_config, storage, capacity, OUTCOME_FLUSH_DELAY)?;
    state_over(config, log, outcomes, factories, incarnation)
}

/// The state of a run over `log` (just opened: its recovered decisions become orphans)
/// and `outcomes`, minting Xids of `incarnation` (the log's own when `None`). The pair's
/// simulator (`decree-sim`) opens a member's state here too.
/// A record that is not a readable decision stops the start
/// ([`ServerError::UnreadableRecord`]): it may be a decision of a newer format, and a run
/// that skipped it would roll that transaction's prepared branches back as presumed
/// abort while its decision says commit.
pub(crate) fn state_over(
    config: &ServerConfig,
    log: Arc<dyn decree_log::Log>,
    outcomes: OutcomeMemory,
    factories: Vec<Arc<dyn RmFactory>>,
    incarnation: Option<u64>,
) -> Result<State, ServerError> {
    let recovered = RecoveredDecisions::from_records(log.take_recovered());
    if let Some((key, e)) = recovered.undecodable.first() {
        return Err(ServerError::UnreadableRecord { key: *key, reason: e.to_string() });
    }
    let incarnation = incarnation.unwrap_or_else(|| log.incarnation());
    Ok(State::new(log, outcomes, config, factories, recovered, incarnation))
}

/// The outcome memory beside the log of `log_config`: in its directory, on `storage` (the
/// file system when `None`), or in memory only for the volatile engine.
pub(crate) fn open_outcomes(
    log_config: &decree_log::LogConfig,
    storage: Option<Arc<dyn decree_log::io::Storage>>,
    capacity: u32,
    flush_delay: Duration,
) -> Result<OutcomeMemory, decree_log::LogError> {
    if log_config.engine == decree_log::EngineKind::Volatile {
        return Ok(OutcomeMemory::volatile(capacity));
    }
    let storage = storage.unwrap_or_else(|| Arc::new(decree_log::io::StdStorage));
    OutcomeMemory::open(storage, &log_config.dir, capacity, flush_delay)
}

/// How the listeners are secured and whether the process's signals are the server's.
struct Listeners {
    /// TLS on the TCP listener.
    tls: Option<Arc<TlsListener>>,
    /// SIGTERM/SIGINT stop the server and SIGHUP reloads TLS (`decree serve`).
    stop_on_signals: bool,
    /// Client listeners already bound, taken instead of binding anew.
    bound: Prebound,
}

/// Client listeners bound before `serve` runs: a pair member's backup phase hands its own
/// over, so that the clients' address is never unbound (nor a status `primary` while it
/// is) between the two roles; connections waiting in the backlog meet the primary.
#[derive(Default)]
struct Prebound {
    unix: Option<UnixListener>,
    tcp: Option<TcpListener>,
}

impl Prebound {
    /// The Unix listener handed over, or one bound now at `path`.
    fn take_unix(&mut self, path: &Path) -> Result<UnixListener, ServerError> {
        match self.unix.take() {
            Some(listener) => Ok(listener),
            None => bind_unix(path),
        }
    }

    /// The TCP listener handed over, or one bound now on `addr`.
    async fn take_tcp(&mut self, addr: SocketAddr) -> Result<TcpListener, ServerError> {
        match self.tcp.take() {
            Some(listener) => Ok(listener),
            None => TcpListener::bind(addr)
                .await
                .map_err(|e| ServerError::Io(format!("cannot listen on tcp {addr}: {e}"))),
        }
    }
}

async fn serve(
    config: ServerConfig,
    state: Arc<State>,
    stop: Arc<watch::Sender<bool>>,
    mut stop_rx: watch::Receiver<bool>,
    ready: std::sync::mpsc::Sender<(Bound, u32, u64)>,
    mut listeners: Listeners,
) -> Result<(), ServerError> {
    let signals = if listeners.stop_on_signals { install_signals() } else { None };
    if listeners.stop_on_signals {
        // Installed before the first listener too: SIGHUP's default action kills.
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(hangups) => {
                tokio::spawn(reload_on_sighup(listeners.tls.clone(), hangups));
            }
            Err(e) => tracing::error!(error = %e, "cannot install the SIGHUP handler"),
        }
    }
    let recovered = state.in_doubt();
    let mut bound = Bound::default();
    let connections = Arc::new(Semaphore::new(state.limits.connections_max as usize));
    let total = Arc::new(Semaphore::new(state.limits.inflight_total_max as usize));
    let gate = Gate { state: state.clone(), connections: connections.clone(), total, stop: stop_rx.clone() };
    let mut tasks = Vec::new();
    if let Some(path) = &config.unix {
        let listener = listeners.bound.take_unix(path)?;
        bound.unix = Some(path.clone());
        tasks.push(tokio::spawn(accept_unix(listener, gate.clone())));
    }
    if let Some(addr) = config.tcp {
        let listener = listeners.bound.take_tcp(addr).await?;
        bound.tcp = listener.local_addr().ok();
        tasks.push(tokio::spawn(accept_tcp(listener, gate.clone(), listeners.tls.clone())));
    }
    if let Some(addr) = config.metrics {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| ServerError::Io(format!("cannot listen for metrics on {addr}: {e}")))?;
        bound.metrics = listener.local_addr().ok();
        tasks.push(tokio::spawn(metrics::serve(listener, metrics::of_state(state.clone()))));
    }
    let worker_stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let (state, worker_stop) = (state.clone(), worker_stop.clone());
        std::thread::Builder::new()
            .name("decree-recovery".into())
            .spawn(move || recovery::worker(state, worker_stop))
            .map_err(|e| ServerError::Io(format!("cannot start the recovery thread: {e}")))?
    };
    tracing::info!(
        node = state.node,
        incarnation = state.incarnation,
        recovered,
        unix = ?bound.unix,
        tcp = ?bound.tcp,
        "decree server listening"
    );
    let _ = ready.send((bound.clone(), state.node, state.incarnation));

    let mut signals = signals;
    wait_for_stop(&mut stop_rx, &mut signals).await;
    let _ = stop.send(true);
    // Answers a member's fence holds are never sent now: their connections may end.
    if let Some(fence) = state.fence() {
        fence.end();
    }
    for task in &tasks {
        task.abort();
    }
    if let Some(path) = &bound.unix {
        let _ = std::fs::remove_file(path);
    }
    if let Some(link) = state.pair() {
        // Decides waiting for a backup that may never answer would hold their
        // connections open forever: nobody answers them (their clients ask Outcome).
        link.abandon_pending();
    }
    // Every connection holds a permit until its in-flight requests are answered.
    let _ = connections.acquire_many(state.limits.connections_max).await;
    worker_stop.store(true, Ordering::SeqCst);
    state.wake_recovery();
    let _ = tokio::task::spawn_blocking(move || worker.join()).await;
    let synced = tokio::task::spawn_blocking({
        let state = state.clone();
        // Outcomes first: their syncs complete decisions in the log, which the log's sync
        // then makes durable.
        move || state.outcomes.sync().and_then(|()| state.log.sync())
    })
    .await
    .map_err(|e| ServerError::Io(format!("log sync task failed: {e}")))?;
    tracing::info!("decree server stopped");
    synced.map_err(ServerError::Log)
}

/// What every accepted connection needs: the state, the connection slots, the server-wide
/// in-flight bound and the shutdown signal.
#[derive(Clone)]
struct Gate {
    state: Arc<State>,
    connections: Arc<Semaphore>,
    total: Arc<Semaphore>,
    stop: watch::Receiver<bool>,
}

/// The Unix socket's accept loop.
async fn accept_unix(listener: UnixListener, gate: Gate) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let (r, w) = stream.into_split();
                accept(r, w, &gate, Peer::plaintext());
            }
            Err(e) => accept_failed(e).await,
        }
    }
}

/// The TCP listener's accept loop, with TLS when configured.
async fn accept_tcp(listener: TcpListener, gate: Gate, tls: Option<Arc<TlsListener>>) {
    loop {
        match listener.accept().await {
            Ok((stream, from)) => {
                let _ = stream.set_nodelay(true);
                match &tls {
                    Some(tls) => accept_tls(stream, from, tls, &gate),
                    None => {
                        let (r, w) = stream.into_split();
                        accept(r, w, &gate, Peer::plaintext());
                    }
                }
            }
            Err(e) => accept_failed(e).await,
        }
    }
}

/// Starts serving an accepted connection, or refuses it over the connection limit.
fn accept<R, W>(reader: R, writer: W, gate: &Gate, peer: Peer)
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let Ok(permit) = gate.connections.clone().try_acquire_owned() else {
        gate.state.metrics.connections_refused.fetch_add(1, Ordering::Relaxed);
        let why = format!("the server already has {} connections", gate.state.limits.connections_max);
        tokio::spawn(connection::refuse(writer, why));
        return;
    };
    let Gate { state, total, stop, .. } = gate.clone();
    tokio::spawn(async move {
        connection::serve(reader, writer, state, total, stop, peer).await;
        drop(permit);
    });
}

/// Starts serving a connection of the TLS listener: within the handshake bound, tells TLS
/// from plaintext, runs the TLS handshake and checks the client's name, then serves it
/// like any other. Over the connection limit it is closed at once, without the handshake
/// a `Busy` frame would need (handshakes cost CPU, which a flood would spend).
fn accept_tls(stream: tokio::net::TcpStream, from: SocketAddr, tls: &Arc<TlsListener>, gate: &Gate) {
    let Ok(permit) = gate.connections.clone().try_acquire_owned() else {
        gate.state.metrics.connections_refused.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(%from, "TLS connection over connections_max closed");
        return;
    };
    let tls = tls.clone();
    let Gate { state, total, stop, .. } = gate.clone();
    tokio::spawn(async move {
        let accepted = tokio::time::Instant::now();
        let bound = accepted + state.limits.handshake_timeout();
        let upgraded = tokio::time::timeout_at(bound, tls.upgrade(stream)).await;
        if !matches!(upgraded, Ok(Ok(Upgraded::Tls(..)))) {
            state.metrics.tls_refused.fetch_add(1, Ordering::Relaxed);
        }
        let (stream, identity) = match upgraded {
            Err(_) => {
                tracing::debug!(%from, "TLS handshake not completed within handshake_timeout_ms");
                return;
            }
            Ok(Err(e)) => {
                let reason = tls::explain_handshake(&e);
                tracing::warn!(%from, error = %e, "TLS handshake failed, connection refused: {reason}");
                return;
            }
            Ok(Ok(Upgraded::Closed)) => return,
            Ok(Ok(Upgraded::Plaintext(stream))) => {
                tracing::warn!(%from, "a plaintext client on the TLS listener; answered TlsRequired");
                let why = "this listener requires TLS: connect with tls:host:port and a client certificate";
                tls::refuse_plaintext(stream, why.into()).await;
                return;
            }
            Ok(Ok(Upgraded::Tls(stream, identity))) => (stream, identity),
        };
        if !tls.allows(&identity) {
            state.metrics.tls_refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%from, names = ?identity.names, "client certificate names no one in tls.clients_allowed; refused");
            let why = format!(
                "the client certificate names {:?}, none of which this server's tls.clients_allowed lists",
                identity.names
            );
            tls::refuse_tls(*stream, decree_proto::ErrorCode::NotAllowed, why).await;
            return;
        }
        let peer = Peer { accepted, name: Some(format!("{} ({from})", identity.display_name())) };
        let (reader, writer) = tokio::io::split(*stream);
        connection::serve(reader, writer, state, total, stop, peer).await;
        drop(permit);
    });
}

/// Rereads the TLS files at every SIGHUP (`decree serve` only); a failed reload keeps the
/// files in use and logs why. Without TLS a SIGHUP only says so.
async fn reload_on_sighup(tls: Option<Arc<TlsListener>>, mut hangups: tokio::signal::unix::Signal) {
    while hangups.recv().await.is_some() {
        match tls.as_ref().map(|tls| tls.reload()) {
            None => tracing::info!("SIGHUP: no [tls] to reload"),
            Some(Ok(())) => tracing::warn!("SIGHUP: TLS certificate, key and client CA reloaded"),
            Some(Err(e)) => tracing::error!(error = %e, "SIGHUP: TLS reload failed; the files in use stay"),
        }
    }
}

/// Keeps an accept loop alive through transient errors (out of file descriptors).
async fn accept_failed(e: std::io::Error) {
    tracing::warn!(error = %e, "accept failed");
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// SIGTERM and SIGINT streams, installed before the first listener is bound: a signal
/// that arrives once a client can connect must stop the server cleanly, never kill it.
pub(crate) type Signals = (tokio::signal::unix::Signal, tokio::signal::unix::Signal);

fn install_signals() -> Option<Signals> {
    use tokio::signal::unix::{signal, SignalKind};
    match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(term), Ok(int)) => Some((term, int)),
        _ => {
            tracing::error!("cannot install signal handlers; stop the server with SIGKILL");
            None
        }
    }
}

/// Waits for `stop` or a signal; the signals stay installed for the next wait (a backup
/// waits again after each refused promotion).
async fn wait_for_stop(stop: &mut watch::Receiver<bool>, signals: &mut Option<Signals>) {
    let Some((term, int)) = signals.as_mut() else {
        let _ = stop.wait_for(|s| *s).await;
        return;
    };
    tokio::select! {
        _ = stop.wait_for(|s| *s) => {}
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = int.recv() => tracing::info!("SIGINT: shutting down"),
    }
}

/// Binds the Unix socket with mode 0600: bound under a temporary name, restricted, then
/// renamed into place, so the final path is never reachable with looser permissions. A
/// stale socket file (nobody listening) is removed; anything else at the path is an error.
fn bind_unix(path: &Path) -> Result<UnixListener, ServerError> {
    let io = |what: &str, e: std::io::Error| ServerError::Io(format!("{what} {}: {e}", path.display()));
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(ServerError::Io(format!(
                "{} exists and is not a socket; refusing to replace it",
                path.display()
            )));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(ServerError::Io(format!("another server is listening on {}", path.display())));
        }
        std::fs::remove_file(path).map_err(|e| io("cannot remove the stale socket", e))?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let listener =
        std::os::unix::net::UnixListener::bind(&tmp).map_err(|e| io("cannot bind the socket", e))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| io("cannot restrict the socket", e))?;
    std::fs::rename(&tmp, path).map_err(|e| io("cannot move the socket into place at", e))?;
    listener.set_nonblocking(true).map_err(|e| io("cannot configure the socket", e))?;
    UnixListener::from_std(listener).map_err(|e| io("cannot register the socket", e))
}
