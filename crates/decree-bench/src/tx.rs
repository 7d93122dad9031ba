//! The LIXA-style transaction benchmark (`decree bench`).
//!
//! Every thread loops: think t1; open; think t1; begin; think t2; commit; think t1; close.
//! Each TX call is timed on its own and the four are summed per cycle ("total latency
//! added by the TM"); think times are never part of a latency. Throughput is the number of
//! completed cycles divided by the wall time of the run, from the moment all threads are
//! released together until the last one ends. One run per thread count, each on a fresh
//! log directory, for every combination of engine and RPO asked for, and per mode: with
//! several modes or rounds, every thread count runs `rounds` rounds of every mode, each
//! round starting with the next mode (as `rm_bench` does), and [`crate::compare`] sets the
//! modes side by side after the last round. `--replicas 1,2` multiplies the modes: each
//! mode runs on a single server and on a primary + backup pair ([`crate::pair`]), the
//! [`Variant`]s alternating in every round like the modes.

use crate::client::{BenchTarget, Mode, Replicas, Variant};
use crate::compare::{self, ModeSummary};
use crate::embedded::{EmbeddedTarget, RMS_MAX};
use crate::handshake::Handshake;
use crate::log_use::{LogUse, LogWrites};
use crate::pair::Promotion;
use crate::rate::Schedule;
use crate::remote::{RemoteSpec, RemoteTarget};
use crate::round_trip::RoundTripPoint;
use crate::stats::{Latencies, Summary};
use crate::think::ThinkRange;
use crate::write_floor::WriteFloor;
use crate::BenchError;
use decree_client::ClientTlsFiles;
use decree_log::{EngineKind, LogConfig, SyncPolicy};
use indicatif::ProgressBar;
use rand::SeedableRng;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// The most threads one run may start.
pub const THREADS_MAX: usize = 4096;

/// The most rounds per thread count (a bound on a typo, not on patience).
pub const ROUNDS_MAX: usize = crate::rm_bench::ROUNDS_MAX;

/// When every thread of a run stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// After this many cycles per thread (LIXA's `-C`).
    Cycles(u64),
    /// When this much time has passed since the start (checked before each cycle).
    Duration(Duration),
}

/// One run: how many threads, how long, which think times.
#[derive(Debug, Clone, Copy)]
pub struct RunSpec {
    /// Concurrent application threads.
    pub threads: usize,
    /// When to stop.
    pub stop: Stop,
    /// Application think time before open, begin and close.
    pub t1: ThinkRange,
    /// Resource-manager work between begin and commit.
    pub t2: ThinkRange,
    /// Seed of the think-time generators (thread i uses seed + i), for repeatable runs.
    pub seed: u64,
    /// Fixed-rate mode: transactions per second over all threads (see [`crate::rate`]);
    /// `None` runs every thread as fast as it can (saturation or think times).
    pub rate: Option<f64>,
}

/// Per-call latencies of one run, merged over its threads.
#[derive(Debug, Clone, Default)]
pub struct RunLatencies {
    /// tx_open.
    pub open: Latencies,
    /// tx_begin.
    pub begin: Latencies,
    /// tx_commit.
    pub commit: Latencies,
    /// tx_close.
    pub close: Latencies,
    /// open + begin + commit + close of each cycle.
    pub total: Latencies,
    /// Fixed-rate mode only: from each commit's scheduled time to its end (includes the
    /// time spent behind schedule, so coordinated omission does not hide stalls).
    pub commit_scheduled: Latencies,
}

impl RunLatencies {
    fn merge(&mut self, other: &RunLatencies) {
        self.open.merge(&other.open);
        self.begin.merge(&other.begin);
        self.commit.merge(&other.commit);
        self.close.merge(&other.close);
        self.total.merge(&other.total);
        self.commit_scheduled.merge(&other.commit_scheduled);
    }
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// Threads of the run.
    pub threads: usize,
    /// Cycles completed by all threads together.
    pub cycles: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// The latencies.
    pub latencies: RunLatencies,
    /// What the run cost the log, where the target owns it.
    pub log_use: Option<LogUse>,
}

impl RunResult {
    /// Completed cycles per second of wall time.
    pub fn tps(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs <= 0.0 {
            return 0.0;
        }
        self.cycles as f64 / secs
    }
}

/// Cycles between two updates of the progress bar (it reads the clock on each update).
const PROGRESS_EVERY: u64 = 256;

/// Runs `call` and records its latency; returns the time it ended. The caller passes the
/// time the call starts, usually the end of the previous call, so that a cycle without
/// think times reads the clock five times, not eight.
fn timed(
    latencies: &mut Latencies,
    start: Instant,
    call: impl FnOnce() -> Result<(), BenchError>,
) -> Result<(Duration, Instant), BenchError> {
    call()?;
    let end = Instant::now();
    let elapsed = end.saturating_duration_since(start);
    latencies.record(elapsed);
    Ok((elapsed, end))
}

/// Thinks for a time drawn from `range`, then returns the time to start the next call from.
fn think(range: &ThinkRange, rng: &mut rand::rngs::StdRng, now: Instant) -> Instant {
    if range.is_zero() {
        return now;
    }
    range.think(rng);
    Instant::now()
}

fn thread_loop(
    target: &dyn BenchTarget,
    index: usize,
    spec: &RunSpec,
    start: Instant,
    failed: &AtomicBool,
    progress: &ProgressBar,
) -> Result<(u64, RunLatencies), BenchError> {
    let mut client = target.client(index)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(spec.seed.wrapping_add(index as u64));
    let mut lat = RunLatencies::default();
    let mut schedule = match spec.rate {
        Some(rate) => Some(Schedule::new(rate, spec.threads, index, start)?),
        None => None,
    };
    let mut cycles = 0u64;
    let mut now = start;
    loop {
        let more = match spec.stop {
            Stop::Cycles(n) => cycles < n,
            Stop::Duration(d) => now.saturating_duration_since(start) < d,
        };
        if !more || failed.load(Ordering::Relaxed) {
            break;
        }
        now = think(&spec.t1, &mut rng, now);
        let (open, now_open) = timed(&mut lat.open, now, || client.open())?;
        now = think(&spec.t1, &mut rng, now_open);
        let (begin, now_begin) = timed(&mut lat.begin, now, || client.begin())?;
        now = think(&spec.t2, &mut rng, now_begin);
        // In fixed-rate mode the commit is the scheduled event: it starts at its slot, or
        // at once when the thread is behind; its latency is counted from the slot.
        let scheduled = schedule.as_mut().map(|s| s.wait_next());
        if scheduled.is_some() {
            now = Instant::now();
        }
        let (commit, now_commit) = timed(&mut lat.commit, now, || client.commit())?;
        if let Some(slot) = scheduled {
            lat.commit_scheduled.record(now_commit.saturating_duration_since(slot));
        }
        now = think(&spec.t1, &mut rng, now_commit);
        let (close, now_close) = timed(&mut lat.close, now, || client.close())?;
        now = now_close;
        lat.total.record(open + begin + commit + close);
        cycles += 1;
        if cycles.is_multiple_of(PROGRESS_EVERY) {
            progress.inc(PROGRESS_EVERY);
        }
    }
    progress.inc(cycles % PROGRESS_EVERY);
    Ok((cycles, lat))
}

/// What each thread of [`run_together`] returned (or its panic), in thread order.
pub(crate) type ThreadOutcomes<T> = Vec<std::thread::Result<Result<T, BenchError>>>;

/// Starts `threads` threads running `body(index, start, failed)` at once (released by a
/// barrier) and returns their outcomes with the wall time around them. A thread that
/// fails sets `failed`, which tells the others to stop early.
pub(crate) fn run_together<T: Send>(
    threads: usize,
    body: impl Fn(usize, Instant, &AtomicBool) -> Result<T, BenchError> + Sync,
) -> (ThreadOutcomes<T>, Instant, Instant) {
    let barrier = Barrier::new(threads + 1);
    let failed = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|index| {
                let (barrier, failed, body) = (&barrier, &failed, &body);
                scope.spawn(move || {
                    barrier.wait();
                    let outcome = body(index, Instant::now(), failed);
                    if outcome.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    outcome
                })
            })
            .collect();
        // Taken before the threads are released, so that the wall time covers every
        // thread's own run and a duration-bound run never reports less than its duration.
        let start = Instant::now();
        barrier.wait();
        let outcomes: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
        (outcomes, start, Instant::now())
    })
}

/// Runs `spec.threads` threads against `target` and merges what they measured.
pub fn run(
    target: &dyn BenchTarget,
    spec: &RunSpec,
    progress: &ProgressBar,
) -> Result<RunResult, BenchError> {
    if spec.threads == 0 || spec.threads > THREADS_MAX {
        return Err(BenchError::Option(format!("--threads {}: expected 1 to {THREADS_MAX}", spec.threads)));
    }
    let log_before = target.log_use();
    let (outcomes, start, end) = run_together(spec.threads, |index, start, failed| {
        thread_loop(target, index, spec, start, failed, progress)
    });
    let mut result = RunResult {
        threads: spec.threads,
        cycles: 0,
        elapsed: end.saturating_duration_since(start),
        latencies: RunLatencies::default(),
        log_use: None,
    };
    for outcome in outcomes {
        let (cycles, lat) = outcome.map_err(|panic| BenchError::Panicked(panic_message(&panic)))??;
        result.cycles += cycles;
        result.latencies.merge(&lat);
    }
    target.finish()?;
    result.log_use = log_before.zip(target.log_use()).map(|(before, after)| after.since(&before));
    Ok(result)
}

pub(crate) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic payload".into()
    }
}

/// Everything `decree bench` was asked to do.
#[derive(Debug, Clone)]
pub struct BenchSpec {
    /// Engines to compare (every combination with `rpos_ms` runs).
    pub engines: Vec<EngineKind>,
    /// RPO values in milliseconds (0 = sync before acknowledging).
    pub rpos_ms: Vec<u64>,
    /// Thread counts, one run each.
    pub threads: Vec<usize>,
    /// When each run stops.
    pub stop: Stop,
    /// Think time t1.
    pub t1: ThinkRange,
    /// Think time t2.
    pub t2: ThinkRange,
    /// Dummy resource managers per transaction.
    pub rms: usize,
    /// Where the transaction manager runs; with several, they alternate in every round so
    /// that they are compared under the same drift of a noisy machine.
    pub modes: Vec<Mode>,
    /// Servers per state-server run: one, or a primary + backup pair the benchmark starts
    /// itself (`--mode unix`; durable or received acknowledgements, TLS on its link or
    /// not); with several, every mode runs with each, alternated in every round and
    /// compared to the first ([`BenchSpec::variants`]).
    pub replicas: Vec<Replicas>,
    /// Rounds of every mode per thread count (1 to [`ROUNDS_MAX`]).
    pub rounds: usize,
    /// Parent of the per-run log directories (each is created fresh and removed after).
    pub dir: PathBuf,
    /// Seed of the think-time generators.
    pub seed: u64,
    /// A running state server (`unix:/path`, `tcp:host:port` or `tls:host:port`) for the
    /// mode of the same name, instead of starting one per run.
    pub connect: Option<String>,
    /// The client's CA, certificate and key for `connect` = `tls:host:port` (all three or
    /// none); the server the benchmark starts itself gets a throwaway CA.
    pub tls_files: ClientTlsFiles,
    /// Fixed-rate mode: transactions per second over all threads (no think times).
    pub rate: Option<f64>,
    /// Where each run's threads run (a pair's backup on a CPU of its own, or not).
    pub cpus: crate::cpus::CpuPlacement,
}

impl BenchSpec {
    /// What each round runs, in order: every mode with every replica count (`--mode unix
    /// --replicas 1,2`: unix, then unix-pair); the first is the reference of the ratios.
    pub fn variants(&self) -> Vec<Variant> {
        self.modes
            .iter()
            .flat_map(|&mode| self.replicas.iter().map(move |&replicas| Variant { mode, replicas }))
            .collect()
    }
}

/// The fixed-rate figures of a run (see [`crate::rate`] for the two latencies).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RatePoint {
    /// The rate asked for, transactions per second.
    pub rate_target: f64,
    /// The rate achieved: completed cycles per second of wall time.
    pub rate_achieved: f64,
    /// Median commit latency from its scheduled time (coordinated-omission aware), in us.
    pub commit_p50_us: f64,
    /// 99th percentile of the same, in us.
    pub commit_p99_us: f64,
    /// 99.9th percentile of the same, in us.
    pub commit_p999_us: f64,
    /// Median service time of tx_commit (from the call's own start), in us.
    pub commit_service_p50_us: f64,
    /// 99th percentile of the service time, in us.
    pub commit_service_p99_us: f64,
    /// 99.9th percentile of the service time, in us.
    pub commit_service_p999_us: f64,
}

impl RatePoint {
    /// The fixed-rate figures of `run` at target `rate`.
    pub fn new(rate: f64, run: &RunResult) -> Self {
        let (scheduled, service) = (&run.latencies.commit_scheduled, &run.latencies.commit);
        RatePoint {
            rate_target: rate,
            rate_achieved: run.tps(),
            commit_p50_us: scheduled.quantile_us(0.50),
            commit_p99_us: scheduled.quantile_us(0.99),
            commit_p999_us: scheduled.quantile_us(0.999),
            commit_service_p50_us: service.quantile_us(0.50),
            commit_service_p99_us: service.quantile_us(0.99),
            commit_service_p999_us: service.quantile_us(0.999),
        }
    }
}

/// One line of the report: one engine, RPO and thread count.
#[derive(Debug, Clone, Serialize)]
pub struct BenchPoint {
    /// Log engine.
    pub engine: String,
    /// Recovery point objective in milliseconds.
    pub rpo_ms: u64,
    /// Where the TM ran: the mode, `-pair` after it for a primary + backup pair.
    pub mode: String,
    /// Servers holding each decision (2 for a pair; 1 otherwise, the embedded mode too).
    pub replicas: usize,
    /// Where the run's threads ran (`shared`, or `split`: a pair's backup on a CPU of its own).
    pub cpus: &'static str,
    /// Dummy resource managers per transaction.
    pub rms: usize,
    /// Threads of the run.
    pub threads: usize,
    /// Cycles completed by all threads.
    pub cycles: u64,
    /// Wall time of the run in seconds.
    pub elapsed_s: f64,
    /// Completed cycles per second.
    pub tps: f64,
    /// tx_open latency.
    pub open: Summary,
    /// tx_begin latency.
    pub begin: Summary,
    /// tx_commit latency.
    pub commit: Summary,
    /// tx_close latency.
    pub close: Summary,
    /// Sum of the four per cycle.
    pub total: Summary,
    /// Fixed-rate mode only.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub rate: Option<RatePoint>,
    /// The disk's raw synced writes measured in the same invocation (runs at rpo 0 on a
    /// durable engine), see [`crate::write_floor`].
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub disk_floor: Vec<WriteFloor>,
    /// A bare round trip over the run's transport at its rate and thread count, measured
    /// right after it (fixed-rate runs through a local state server), see
    /// [`crate::round_trip`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub round_trip_floor: Option<RoundTripPoint>,
    /// Synced log writes per committed cycle and their times, embedded mode only.
    #[serde(flatten)]
    pub log_writes: Option<LogWrites>,
    /// Which round of its thread count the run was (1-based).
    pub round: usize,
    /// The time to open one connection to the run's server, measured just before the run
    /// (state-server modes only), see [`crate::handshake`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handshake: Option<Handshake>,
    /// A pair's run only: what promoting its member 1 took before the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub promotion: Option<Promotion>,
}

impl BenchPoint {
    /// Builds the report line of a run.
    pub fn new(engine: EngineKind, rpo_ms: u64, mode: Mode, rms: usize, run: &RunResult) -> Self {
        BenchPoint {
            engine: engine.name().into(),
            rpo_ms,
            mode: mode.name().into(),
            replicas: 1,
            cpus: crate::cpus::CpuPlacement::Shared.name(),
            rms,
            threads: run.threads,
            cycles: run.cycles,
            elapsed_s: run.elapsed.as_secs_f64(),
            tps: run.tps(),
            open: run.latencies.open.summary(),
            begin: run.latencies.begin.summary(),
            commit: run.latencies.commit.summary(),
            close: run.latencies.close.summary(),
            total: run.latencies.total.summary(),
            rate: None,
            disk_floor: Vec::new(),
            round_trip_floor: None,
            log_writes: run.log_use.as_ref().and_then(|used| used.per_commit(run.cycles)),
            round: 1,
            handshake: None,
            promotion: None,
        }
    }

    /// The name of the series this point belongs to in charts ("journal rpo=0ms", with the
    /// mode after it for a state server: "journal rpo=0ms tls").
    pub fn series(&self) -> String {
        match self.mode.as_str() {
            "embedded" => format!("{} rpo={}ms", self.engine, self.rpo_ms),
            mode => format!("{} rpo={}ms {mode}", self.engine, self.rpo_ms),
        }
    }
}

/// An engine and RPO that could not be measured, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// The engine.
    pub engine: String,
    /// The RPO in milliseconds.
    pub rpo_ms: u64,
    /// The thread count of the run that failed or could not start.
    pub threads: usize,
    /// True when a run started and failed (a bug to report), false when the engine could
    /// not be opened at all (for example, not implemented yet).
    pub failed: bool,
    /// Why (the error that stopped it).
    pub reason: String,
    /// The mode of the run, where the benchmark has modes (`decree bench`).
    pub mode: Option<String>,
}

impl Skipped {
    /// Describes why `engine` at `rpo_ms` stopped at `threads` threads.
    pub fn new(engine: EngineKind, rpo_ms: u64, threads: usize, error: &BenchError) -> Self {
        Skipped {
            engine: engine.name().into(),
            rpo_ms,
            threads,
            failed: !matches!(error, BenchError::EngineUnavailable { .. }),
            reason: error.to_string(),
            mode: None,
        }
    }

    /// The same, naming the mode of the run too (`unix-pair` for a pair).
    pub fn in_mode(self, variant: Variant) -> Self {
        Skipped { mode: Some(variant.name()), ..self }
    }
}

/// The outcome of one engine/RPO/thread-count step, reported as soon as it is known.
#[derive(Debug, Clone)]
pub enum Step {
    /// A run finished.
    Measured(Box<BenchPoint>),
    /// The engine could not be opened or a run failed; its remaining thread counts are
    /// skipped too.
    Skipped(Skipped),
    /// The rounds of one thread count finished (several modes or rounds only): one mode's
    /// medians and its ratios to the first mode.
    Compared(Box<ModeSummary>),
}

/// Creates `parent/name` fresh (removing leftovers of an earlier run).
pub(crate) fn fresh_dir(parent: &Path, name: &str) -> Result<PathBuf, BenchError> {
    let dir = parent.join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir)
            .map_err(|e| BenchError::io("cannot remove old run directory", &dir, e))?;
    }
    std::fs::create_dir_all(&dir).map_err(|e| BenchError::io("cannot create run directory", &dir, e))?;
    Ok(dir)
}

/// Rejects a spec that cannot run, before any run starts.
pub fn check(spec: &BenchSpec) -> Result<(), BenchError> {
    check_modes(spec)?;
    check_replicas(spec)?;
    if let Some(rate) = spec.rate {
        if !(rate.is_finite() && rate > 0.0 && rate <= crate::rate::RATE_MAX) {
            return Err(BenchError::Option(format!(
                "--rate {rate}: expected more than 0 and at most {}",
                crate::rate::RATE_MAX
            )));
        }
    }
    if let Some(t) = spec.threads.iter().find(|&&t| t == 0 || t > THREADS_MAX) {
        return Err(BenchError::Option(format!("--threads {t}: expected 1 to {THREADS_MAX}")));
    }
    if spec.rms == 0 || spec.rms > RMS_MAX {
        return Err(BenchError::Option(format!("--rms {}: expected 1 to {RMS_MAX}", spec.rms)));
    }
    if spec.rounds == 0 || spec.rounds > ROUNDS_MAX {
        return Err(BenchError::Option(format!("--rounds {}: expected 1 to {ROUNDS_MAX}", spec.rounds)));
    }
    match spec.stop {
        Stop::Cycles(0) => Err(BenchError::Option("--cycles 0: expected at least 1".into())),
        Stop::Duration(d) if d.is_zero() => Err(BenchError::Option("--duration must be positive".into())),
        _ => Ok(()),
    }
}

/// The modes, `--connect` and the TLS files must fit together: one mode per address, of
/// the address's kind, and the three TLS files together, for a `tls:` address only.
fn check_modes(spec: &BenchSpec) -> Result<(), BenchError> {
    let refuse = |message: String| Err(BenchError::Option(message));
    let Some(first) = spec.modes.first() else { return refuse("--mode: expected at least one mode".into()) };
    if let Some(twice) =
        spec.modes.iter().enumerate().find_map(|(i, m)| spec.modes[..i].contains(m).then_some(m))
    {
        return refuse(format!("--mode lists {twice} twice"));
    }
    let files = &spec.tls_files;
    let flags = [("--tls-ca", &files.ca), ("--tls-cert", &files.cert), ("--tls-key", &files.key)];
    let missing: Vec<&str> = flags.iter().filter(|(_, f)| f.is_none()).map(|(flag, _)| *flag).collect();
    if !missing.is_empty() && missing.len() < flags.len() {
        return refuse(format!(
            "--tls-ca, --tls-cert and --tls-key go together (the server's CA, this client's certificate \
             and its key): {} missing",
            missing.join(" and ")
        ));
    }
    let tls_files = missing.is_empty();
    let tls_connect = spec.connect.as_deref().is_some_and(|a| a.starts_with("tls:"));
    if tls_files && !tls_connect {
        return refuse(
            "--tls-ca, --tls-cert and --tls-key are for --connect tls:host:port (the server the \
             benchmark starts itself gets a throwaway CA)"
                .into(),
        );
    }
    let Some(address) = &spec.connect else { return Ok(()) };
    if spec.modes.len() > 1 {
        return refuse(format!("--connect {address} takes one --mode, the server's transport"));
    }
    let Some(scheme) = first.scheme() else {
        return refuse("--connect needs --mode unix, tcp or tls".into());
    };
    if !address.starts_with(scheme) {
        return refuse(format!("--connect {address} does not fit --mode {first}: expected {scheme}..."));
    }
    if tls_connect && !tls_files {
        return refuse(format!(
            "--connect {address} needs --tls-ca, --tls-cert and --tls-key (the server's CA, this \
             client's certificate and its key)"
        ));
    }
    Ok(())
}

/// The replica counts: each 1 or 2, none twice, and a pair only where the benchmark starts
/// it itself on a durable log and reaches it over the Unix socket.
fn check_replicas(spec: &BenchSpec) -> Result<(), BenchError> {
    let refuse = |message: String| Err(BenchError::Option(message));
    if spec.replicas.is_empty() {
        return refuse("--replicas: expected at least one count".into());
    }
    if let Some(twice) =
        spec.replicas.iter().enumerate().find_map(|(i, r)| spec.replicas[..i].contains(r).then_some(r))
    {
        return refuse(format!("--replicas lists {twice} twice"));
    }
    let Some(pair) = spec.replicas.iter().find(|r| r.count == 2) else { return Ok(()) };
    if let Some(mode) = spec.modes.iter().find(|&&m| m != Mode::Unix) {
        return refuse(format!(
            "--replicas {pair} runs a pair over the Unix socket only: drop --mode {mode} (use --mode unix)"
        ));
    }
    if spec.connect.is_some() {
        return refuse(format!("--replicas {pair} starts its own pair: drop --connect"));
    }
    if let Some(engine) = spec.engines.iter().find(|&&e| e == EngineKind::Volatile) {
        return refuse(format!(
            "--replicas {pair} needs a durable engine: a pair member cannot run {engine}"
        ));
    }
    Ok(())
}

/// Runs every combination of `spec`, calling `report` after each step. An engine that
/// cannot be opened, or whose run fails, is reported as skipped (with `failed` telling the
/// two apart) and the other combinations go on; bad options and errors of the harness's
/// own directories stop everything.
pub fn run_all(
    spec: &BenchSpec,
    progress: &ProgressBar,
    mut report: impl FnMut(Step),
) -> Result<(), BenchError> {
    check(spec)?;
    for &engine in &spec.engines {
        for &rpo_ms in &spec.rpos_ms {
            for &threads in &spec.threads {
                if !run_rounds(spec, engine, rpo_ms, threads, progress, &mut report)? {
                    break;
                }
            }
        }
    }
    Ok(())
}

/// Every round of every mode at one engine, RPO and thread count, each round starting with
/// the next mode, then the modes side by side (with several modes or rounds). False when a
/// run failed or could not start: the engine's remaining thread counts are skipped.
fn run_rounds(
    spec: &BenchSpec,
    engine: EngineKind,
    rpo_ms: u64,
    threads: usize,
    progress: &ProgressBar,
    report: &mut impl FnMut(Step),
) -> Result<bool, BenchError> {
    let variants = spec.variants();
    let mut points = Vec::with_capacity(spec.rounds * variants.len());
    for round in 1..=spec.rounds {
        for index in compare::round_order(round - 1, variants.len()) {
            let variant = variants[index];
            let counter =
                if spec.rounds > 1 { format!(" round {round}/{}", spec.rounds) } else { String::new() };
            progress.set_message(format!("{engine} rpo={rpo_ms}ms threads={threads} {variant}{counter}"));
            match run_one(spec, engine, rpo_ms, threads, variant, progress)? {
                Ok(mut point) => {
                    point.round = round;
                    progress.set_message(format!(
                        "{engine} rpo={rpo_ms}ms threads={threads} {variant}: bare round trip"
                    ));
                    point.round_trip_floor = crate::round_trip::floor_of(spec, &point)?;
                    points.push((*point).clone());
                    report(Step::Measured(point));
                }
                Err(skipped) => {
                    report(Step::Skipped(skipped));
                    return Ok(false);
                }
            }
        }
    }
    if spec.rounds > 1 || variants.len() > 1 {
        for summary in compare::summaries(&variants, &points) {
            report(Step::Compared(Box::new(summary)));
        }
    }
    Ok(true)
}

/// One run of `variant` on a fresh log directory (a pair's two logs below it), removed
/// after it: its report line, or why it was skipped; bad options and the harness's own
/// directory errors are errors.
fn run_one(
    spec: &BenchSpec,
    engine: EngineKind,
    rpo_ms: u64,
    threads: usize,
    variant: Variant,
    progress: &ProgressBar,
) -> Result<Result<Box<BenchPoint>, Skipped>, BenchError> {
    let dir = fresh_dir(&spec.dir, &format!("{engine}-rpo{rpo_ms}-t{threads}-{}", variant.dir_name()))?;
    let config = LogConfig::new(&dir, engine, SyncPolicy::from_rpo_ms(rpo_ms));
    let (t1, t2) = match spec.rate {
        Some(_) => (ThinkRange::ZERO, ThinkRange::ZERO),
        None => (spec.t1, spec.t2),
    };
    let run_spec = RunSpec { threads, stop: spec.stop, t1, t2, seed: spec.seed, rate: spec.rate };
    // The target (log, server and coordinator) is dropped before its directory is removed.
    let outcome = run_target(spec, variant, &config, &run_spec, progress);
    let removed =
        std::fs::remove_dir_all(&dir).map_err(|e| BenchError::io("cannot remove run directory", &dir, e));
    match outcome {
        Ok((result, handshake, promotion)) => {
            removed?;
            let mut point = BenchPoint::new(engine, rpo_ms, variant.mode, spec.rms, &result);
            (point.mode, point.replicas, point.cpus) =
                (variant.name(), variant.replicas.count, spec.cpus.name());
            point.rate = spec.rate.map(|rate| RatePoint::new(rate, &result));
            point.handshake = handshake;
            point.promotion = promotion;
            Ok(Ok(Box::new(point)))
        }
        Err(e @ (BenchError::Option(_) | BenchError::Io { .. })) => Err(e),
        Err(e) => {
            removed?;
            Ok(Err(Skipped::new(engine, rpo_ms, threads, &e).in_mode(variant)))
        }
    }
}

/// What a run measured besides its own figures: the connection times of a state server,
/// and what promoting a pair's primary took.
type RunExtras = (RunResult, Option<Handshake>, Option<Promotion>);

/// Opens the target of `variant` on the log `config` describes and runs one run on it; for
/// a state server, times opening a connection to it first.
fn run_target(
    spec: &BenchSpec,
    variant: Variant,
    config: &LogConfig,
    run_spec: &RunSpec,
    progress: &ProgressBar,
) -> Result<RunExtras, BenchError> {
    // Every thread of the run (its server's, its clients') inherits this placement.
    let _placed = spec.cpus.for_run()?;
    match variant.mode {
        Mode::Embedded => EmbeddedTarget::open(config, spec.rms)
            .and_then(|target| run(&target, run_spec, progress))
            .map(|result| (result, None, None)),
        mode @ (Mode::Unix | Mode::Tcp | Mode::Tls) => {
            let remote = RemoteSpec {
                mode,
                connect: spec.connect.clone(),
                tls_files: spec.tls_files.clone(),
                rms: spec.rms,
                threads: run_spec.threads,
                replicas: variant.replicas,
                cpus: spec.cpus,
            };
            let target = RemoteTarget::open(config, &remote)?;
            let handshake = target.handshakes()?;
            let result = run(&target, run_spec, progress)?;
            let promotion = target.promotion();
            target.shutdown()?;
            Ok((result, Some(handshake), promotion))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unavailable_engines_are_skipped_and_broken_runs_failed() {
        let unavailable = BenchError::EngineUnavailable {
            engine: "journal".into(),
            source: decree_log::LogError::Config("engine journal is not implemented yet".into()),
        };
        let skipped = Skipped::new(EngineKind::Journal, 0, 4, &unavailable);
        assert!(!skipped.failed);
        assert!(skipped.reason.contains("not implemented yet"), "{skipped:?}");
        let broken = BenchError::Log {
            context: "commit".into(),
            source: decree_log::LogError::Full("no slot".into()),
        };
        let failed = Skipped::new(EngineKind::SlotsFsync, 10, 16, &broken);
        assert!(failed.failed);
        assert_eq!((failed.engine.as_str(), failed.rpo_ms, failed.threads), ("slots-fsync", 10, 16));
        assert!(crate::report::skipped_line(&failed)
            .starts_with("FAILED: engine slots-fsync rpo=10ms threads=16"));
    }

    #[test]
    fn tps_is_cycles_over_wall_time() {
        let run = RunResult {
            threads: 2,
            cycles: 500,
            elapsed: Duration::from_millis(250),
            latencies: RunLatencies::default(),
            log_use: None,
        };
        assert!((run.tps() - 2000.0).abs() < 1e-9);
        assert_eq!(RunResult { elapsed: Duration::ZERO, ..run }.tps(), 0.0);
    }
}
