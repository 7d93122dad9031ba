//! The log benchmark (`decree bench-log`): each engine against the disk's own limit.
//!
//! First the reference: one thread writing records with `pwrite` at increasing offsets
//! into a pre-allocated, zero-filled file, each followed by `fdatasync` (engine
//! `raw-fdatasync`), which is the most durable appends per second one thread can get
//! without batching; then the same file written with `O_DIRECT | O_DSYNC`, one page per
//! record at increasing page offsets (engine `raw-direct`), the way the journal writes at
//! rpo=0, when the file system allows it. Ratios are to `raw-fdatasync`. Then, for every engine, RPO and thread count, a fresh log in its own
//! subdirectory: every thread appends a record under its own transaction key, waits for it
//! to be durable (`Log::append`), then completes it, as fast as it can for the duration.
//! Only the append is timed. An engine that cannot be opened is reported as skipped.

use crate::stats::Latencies;
use crate::tx::{fresh_dir, panic_message, Skipped, THREADS_MAX};
use crate::BenchError;
use decree_log::{record, EngineKind, Log, LogConfig, SyncPolicy};
use indicatif::ProgressBar;
use serde::Serialize;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The engine name of the reference measurement.
pub const RAW_ENGINE: &str = "raw-fdatasync";
/// The engine name of the direct-write reference (not measured where O_DIRECT is refused).
pub const RAW_DIRECT_ENGINE: &str = "raw-direct";
/// Bytes of one direct write: a page, as the journal writes.
const DIRECT_BYTES: usize = 4096;

/// Default size of the reference's pre-allocated file; writes wrap around to its start
/// when they reach the end, so the file never grows and `fdatasync` never flushes metadata.
pub const RAW_FILE_BYTES: u64 = 64 << 20;

/// The largest record the benchmark writes (the log's default record limit).
pub const RECORD_BYTES_MAX: usize = 64 << 10;

/// The longest run accepted.
pub const DURATION_MAX: Duration = Duration::from_secs(3600);

/// Everything `decree bench-log` was asked to do.
#[derive(Debug, Clone)]
pub struct LogBenchSpec {
    /// Engines to measure, in order.
    pub engines: Vec<EngineKind>,
    /// Thread counts, one run each.
    pub threads: Vec<usize>,
    /// RPO values in milliseconds.
    pub rpos_ms: Vec<u64>,
    /// How long each run lasts.
    pub duration: Duration,
    /// Payload bytes of each record.
    pub record_bytes: usize,
    /// Parent of the per-run directories (on the file system to measure).
    pub dir: PathBuf,
    /// Whether to measure the raw-fdatasync reference first.
    pub reference: bool,
    /// Size of the reference's pre-allocated file (normally [`RAW_FILE_BYTES`]).
    pub raw_file_bytes: u64,
    /// Lets the journal write with O_DIRECT | O_DSYNC (`LogConfig::direct_io`), to compare.
    pub direct_io: bool,
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LogPoint {
    /// Engine name, or `raw-fdatasync` for the reference.
    pub engine: String,
    /// Threads appending.
    pub threads: usize,
    /// RPO in milliseconds (the reference syncs every write: 0).
    pub rpo_ms: u64,
    /// Durable appends per second, all threads together.
    pub records_per_sec: f64,
    /// Median append latency in microseconds.
    pub p50_us: f64,
    /// 95th percentile append latency in microseconds.
    pub p95_us: f64,
    /// 99th percentile append latency in microseconds.
    pub p99_us: f64,
    /// 99.9th percentile append latency in microseconds.
    pub p999_us: f64,
}

impl LogPoint {
    fn new(
        engine: &str,
        threads: usize,
        rpo_ms: u64,
        records: u64,
        elapsed: Duration,
        lat: &Latencies,
    ) -> Self {
        let secs = elapsed.as_secs_f64();
        LogPoint {
            engine: engine.into(),
            threads,
            rpo_ms,
            records_per_sec: if secs > 0.0 { records as f64 / secs } else { 0.0 },
            p50_us: lat.quantile_us(0.5),
            p95_us: lat.quantile_us(0.95),
            p99_us: lat.quantile_us(0.99),
            p999_us: lat.quantile_us(0.999),
        }
    }
}

/// The outcome of one step, reported as soon as it is known.
#[derive(Debug, Clone)]
pub enum LogStep {
    /// A run finished.
    Measured(LogPoint),
    /// An engine could not be opened or failed a run; its other thread counts are skipped.
    Skipped(Skipped),
}

/// The number of runs `spec` makes (for a progress bar).
pub fn run_count(spec: &LogBenchSpec) -> u64 {
    (spec.engines.len() * spec.threads.len() * spec.rpos_ms.len()) as u64 + 2 * u64::from(spec.reference)
}

fn check(spec: &LogBenchSpec) -> Result<(), BenchError> {
    if spec.record_bytes == 0 || spec.record_bytes > RECORD_BYTES_MAX {
        return Err(BenchError::Option(format!(
            "--record-size {}: expected 1 to {RECORD_BYTES_MAX} bytes",
            spec.record_bytes
        )));
    }
    if spec.duration.is_zero() || spec.duration > DURATION_MAX {
        return Err(BenchError::Option(format!(
            "--duration {:?}: expected more than 0 and at most {} s",
            spec.duration,
            DURATION_MAX.as_secs()
        )));
    }
    if let Some(t) = spec.threads.iter().find(|&&t| t == 0 || t > THREADS_MAX) {
        return Err(BenchError::Option(format!("--threads {t}: expected 1 to {THREADS_MAX}")));
    }
    Ok(())
}

/// Measures the reference and then every engine, RPO and thread count, calling `report`
/// after each step. Errors of the harness itself (the directory, the reference file) stop
/// the benchmark; an engine's errors only skip that engine.
pub fn run_all(
    spec: &LogBenchSpec,
    progress: &ProgressBar,
    mut report: impl FnMut(LogStep),
) -> Result<(), BenchError> {
    check(spec)?;
    std::fs::create_dir_all(&spec.dir).map_err(|e| BenchError::io("cannot create", &spec.dir, e))?;
    if spec.reference {
        progress.set_message(RAW_ENGINE);
        let dir = fresh_dir(&spec.dir, RAW_ENGINE)?;
        let outcome = raw_fdatasync(&dir, spec.record_bytes, spec.raw_file_bytes, spec.duration);
        progress.inc(1);
        progress.set_message(RAW_DIRECT_ENGINE);
        let direct = match &outcome {
            Ok(_) => raw_direct(&dir, spec.raw_file_bytes, spec.duration),
            Err(_) => Ok(None),
        };
        let removed = std::fs::remove_dir_all(&dir);
        report(LogStep::Measured(outcome?));
        if let Some(point) = direct? {
            report(LogStep::Measured(point));
        }
        removed.map_err(|e| BenchError::io("cannot remove run directory", &dir, e))?;
        progress.inc(1);
    }
    for &engine in &spec.engines {
        for &rpo_ms in &spec.rpos_ms {
            let mut skipped = false;
            for &threads in &spec.threads {
                if skipped {
                    progress.inc(1);
                    continue;
                }
                progress.set_message(format!("{engine} rpo={rpo_ms}ms threads={threads}"));
                let dir = fresh_dir(&spec.dir, &format!("{engine}-rpo{rpo_ms}-t{threads}"))?;
                let outcome = run_engine(&dir, engine, rpo_ms, threads, spec);
                let removed = std::fs::remove_dir_all(&dir);
                match outcome {
                    Ok(point) => report(LogStep::Measured(point)),
                    Err(e) => {
                        skipped = true;
                        report(LogStep::Skipped(Skipped::new(engine, rpo_ms, threads, &e)));
                    }
                }
                removed.map_err(|e| BenchError::io("cannot remove run directory", &dir, e))?;
                progress.inc(1);
            }
        }
    }
    Ok(())
}

/// The reference: `pwrite` + `fdatasync` of `record_bytes` at increasing offsets into a
/// pre-allocated file in `dir`, one thread, for `duration`.
pub fn raw_fdatasync(
    dir: &Path,
    record_bytes: usize,
    file_bytes: u64,
    duration: Duration,
) -> Result<LogPoint, BenchError> {
    if file_bytes < record_bytes as u64 {
        return Err(BenchError::Option(format!(
            "reference file of {file_bytes} bytes cannot hold a record of {record_bytes} bytes"
        )));
    }
    let path = dir.join("raw-fdatasync.dat");
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| BenchError::io("cannot create", &path, e))?;
    // Reserve the blocks, then write zeros over them so that they are not "unwritten
    // extents" either (whose first write would still change metadata), and sync once.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, file_bytes as libc::off_t) };
    if rc != 0 {
        return Err(BenchError::io("cannot pre-allocate", &path, std::io::Error::from_raw_os_error(rc)));
    }
    let zeros = vec![0u8; 1 << 20];
    let mut offset = 0u64;
    while offset < file_bytes {
        let n = ((file_bytes - offset) as usize).min(zeros.len());
        file.write_all_at(&zeros[..n], offset).map_err(|e| BenchError::io("cannot zero-fill", &path, e))?;
        offset += n as u64;
    }
    file.sync_all().map_err(|e| BenchError::io("cannot fsync", &path, e))?;
    if let Ok(parent) = std::fs::File::open(dir) {
        let _ = parent.sync_all();
    }

    let record = vec![0xA5u8; record_bytes];
    let mut lat = Latencies::new();
    let mut records = 0u64;
    let mut offset = 0u64;
    let start = Instant::now();
    while start.elapsed() < duration {
        if offset + record_bytes as u64 > file_bytes {
            offset = 0;
        }
        let t0 = Instant::now();
        file.write_all_at(&record, offset).map_err(|e| BenchError::io("cannot write", &path, e))?;
        file.sync_data().map_err(|e| BenchError::io("cannot fdatasync", &path, e))?;
        lat.record(t0.elapsed());
        offset += record_bytes as u64;
        records += 1;
    }
    let elapsed = start.elapsed();
    Ok(LogPoint::new(RAW_ENGINE, 1, 0, records, elapsed, &lat))
}

/// The direct-write reference: `O_DIRECT | O_DSYNC` writes of one page at increasing page
/// offsets into the reference file `raw_fdatasync` left in `dir`, one thread, for
/// `duration`. `None` when the file system refuses O_DIRECT (tmpfs).
pub fn raw_direct(dir: &Path, file_bytes: u64, duration: Duration) -> Result<Option<LogPoint>, BenchError> {
    raw_direct_paced(dir, file_bytes, duration, Duration::ZERO, RAW_DIRECT_ENGINE)
}

/// As [`raw_direct`], with the thread idle for `idle` before each write (not counted in
/// the latency), reported under `name`: on the development VM a synced write after an
/// idle millisecond is markedly slower than one right after another.
pub fn raw_direct_paced(
    dir: &Path,
    file_bytes: u64,
    duration: Duration,
    idle: Duration,
    name: &str,
) -> Result<Option<LogPoint>, BenchError> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join("raw-fdatasync.dat");
    let file = match OpenOptions::new().write(true).custom_flags(libc::O_DIRECT | libc::O_DSYNC).open(&path) {
        Ok(file) => file,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(None),
        Err(e) => return Err(BenchError::io("cannot open for direct writes", &path, e)),
    };
    let pages = file_bytes / DIRECT_BYTES as u64;
    if pages == 0 {
        return Err(BenchError::Option(format!("reference file of {file_bytes} bytes holds no page")));
    }
    // O_DIRECT needs a page-aligned buffer: take the aligned page out of a larger one.
    let mut staging = vec![0xA5u8; 2 * DIRECT_BYTES];
    let start = staging.as_ptr().align_offset(DIRECT_BYTES);
    let page = &mut staging[start..start + DIRECT_BYTES];
    page.fill(0xA5);
    let mut lat = Latencies::new();
    let mut records = 0u64;
    let began = Instant::now();
    while began.elapsed() < duration {
        let offset = (records % pages) * DIRECT_BYTES as u64;
        if !idle.is_zero() {
            std::thread::sleep(idle);
        }
        let t0 = Instant::now();
        file.write_all_at(page, offset).map_err(|e| BenchError::io("cannot write (O_DIRECT)", &path, e))?;
        lat.record(t0.elapsed());
        records += 1;
    }
    Ok(Some(LogPoint::new(name, 1, 0, records, began.elapsed(), &lat)))
}

fn log_config(
    dir: &Path,
    engine: EngineKind,
    rpo_ms: u64,
    record_bytes: usize,
    direct_io: bool,
) -> LogConfig {
    let mut config = LogConfig::new(dir, engine, SyncPolicy::from_rpo_ms(rpo_ms));
    let frame = record::frame_len(record_bytes) as u32;
    if frame > config.slot_bytes {
        config.slot_bytes = frame.next_power_of_two();
    }
    config.record_bytes_max = config.record_bytes_max.max(record_bytes as u32);
    config.direct_io = direct_io;
    config
}

/// One engine, RPO and thread count for `spec.duration`.
pub fn run_engine(
    dir: &Path,
    engine: EngineKind,
    rpo_ms: u64,
    threads: usize,
    spec: &LogBenchSpec,
) -> Result<LogPoint, BenchError> {
    let config = log_config(dir, engine, rpo_ms, spec.record_bytes, spec.direct_io);
    let log = decree_log::open(&config)
        .map_err(|source| BenchError::EngineUnavailable { engine: engine.name().into(), source })?;
    let log: &dyn Log = log.as_ref();
    let (outcomes, start, end) = crate::tx::run_together(threads, |index, _start, failed| {
        append_loop(log, index, spec.record_bytes, spec.duration, failed)
    });
    let mut lat = Latencies::new();
    let mut records = 0u64;
    for outcome in outcomes {
        let (n, thread_lat) = outcome.map_err(|panic| BenchError::Panicked(panic_message(&panic)))??;
        records += n;
        lat.merge(&thread_lat);
    }
    let stats = log.stats();
    if stats.records_appended != records {
        return Err(BenchError::Client {
            context: format!("engine {engine} after the run"),
            message: format!("{records} appends returned but the log counted {}", stats.records_appended),
        });
    }
    Ok(LogPoint::new(engine.name(), threads, rpo_ms, records, end.saturating_duration_since(start), &lat))
}

fn append_loop(
    log: &dyn Log,
    index: usize,
    record_bytes: usize,
    duration: Duration,
    failed: &AtomicBool,
) -> Result<(u64, Latencies), BenchError> {
    let mut payload = vec![0u8; record_bytes];
    let mut lat = Latencies::new();
    let mut records = 0u64;
    let start = Instant::now();
    while start.elapsed() < duration && !failed.load(Ordering::Relaxed) {
        // Each thread owns the keys with its index in the top 24 bits.
        let key = ((index as u64) << 40) | records;
        payload[..8.min(record_bytes)].copy_from_slice(&key.to_le_bytes()[..8.min(record_bytes)]);
        let t0 = Instant::now();
        log.append(key, &payload)
            .map_err(|source| BenchError::Log { context: format!("append by thread {index}"), source })?;
        lat.record(t0.elapsed());
        log.complete(key)
            .map_err(|source| BenchError::Log { context: format!("complete by thread {index}"), source })?;
        records += 1;
    }
    Ok((records, lat))
}
