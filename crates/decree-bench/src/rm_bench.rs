//! The cost of atomicity with real databases (`decree bench --rm postgres`).
//!
//! Two PostgreSQL databases, A and B, each hold `<table>(id int primary key, balance
//! bigint)` with `accounts` rows. A transfer debits one random account in A by 1 and
//! credits one random account in B by 1 (uniform ids: low contention). Per thread count,
//! two runs do the same transfers:
//! - "independent": `BEGIN; UPDATE; COMMIT` on A, then the same on B: two local commits,
//!   no atomicity (a crash between them loses the credit);
//! - "2pc": both updates in one decree transaction over the embedded coordinator (its
//!   decisions go to a fresh log of the chosen engine and RPO): begin, the updates through
//!   the RM handles, commit = prepare both, durable decision, commit prepared both.
//!
//! The ratio of the two throughputs is the cost of atomicity; nothing asserts on it.
//! Invariants checked after every run (an error, never a silent pass): every transfer
//! updated exactly one row in each database, the total over both databases is unchanged,
//! B gained exactly the number of transfers counted, every 2PC commit took the two-phase
//! path and wrote one decision, and no branch of this benchmark's coordinator node is
//! left prepared in either database. Statements are prepared once per connection, in both
//! modes, so neither pays an extra parse round trip.

use crate::stats::Latencies;
use crate::tx::{fresh_dir, panic_message, Stop, THREADS_MAX};
use crate::BenchError;
use decree_core::{CommitKind, RmFactory, TmConfig, TransactionManager, TxContext, Xid};
use decree_log::{EngineKind, Log, LogConfig, SyncPolicy};
use decree_rm::PgFactory;
use indicatif::ProgressBar;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// The accounts table used when none is named.
pub const TABLE_DEFAULT: &str = "decree_bench_accounts";
/// Accounts per database used when none is given.
pub const ACCOUNTS_DEFAULT: u32 = 10_000;
/// The most accounts setup creates per database.
pub const ACCOUNTS_MAX: u32 = 1_000_000;
/// Longest table name accepted (PostgreSQL's identifier limit).
pub const TABLE_BYTES_MAX: usize = 63;
/// Balance of every account created by setup (far from overflow and from zero).
pub const BALANCE_START: i64 = 1_000_000_000;
/// Prepared branches listed in full in the leftover error; the rest are counted.
const LEFTOVER_LISTED_MAX: usize = 10;
/// How long to wait for background phase-two work after a 2PC run.
const IDLE_WAIT: Duration = Duration::from_secs(30);
/// Transfers between two updates of the progress bar.
const PROGRESS_EVERY: u64 = 64;

/// What the benchmark runs against and how long.
#[derive(Debug, Clone)]
pub struct RmBenchSpec {
    /// PostgreSQL DSN of database A (debited).
    pub dsn_a: String,
    /// PostgreSQL DSN of database B (credited).
    pub dsn_b: String,
    /// Accounts table in both databases (a-z, 0-9, `_`; created if missing).
    pub table: String,
    /// Accounts per database (rows 1..=accounts are created if missing).
    pub accounts: u32,
    /// Thread counts; each runs both modes.
    pub threads: Vec<usize>,
    /// When each run stops.
    pub stop: Stop,
    /// Engine of the coordinator's log in the 2PC runs.
    pub engine: EngineKind,
    /// RPO of that log in milliseconds (0 = sync before acknowledging).
    pub rpo_ms: u64,
    /// Parent of the per-run log directories (each is created fresh and removed after).
    pub dir: PathBuf,
    /// Seed of the account-id generators (thread i uses seed + i).
    pub seed: u64,
    /// Coordinator node id minted into the 2PC runs' Xids (see [`node_id`]), so that the
    /// leftover check and recovery see only this benchmark's branches.
    pub node: u32,
}

/// How the two updates of a transfer are committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RmMode {
    /// Two local commits, no atomicity.
    Independent,
    /// One decree two-phase commit over both databases.
    TwoPhase,
}

impl RmMode {
    /// The name in reports ("independent" or "2pc").
    pub fn name(self) -> &'static str {
        match self {
            RmMode::Independent => "independent",
            RmMode::TwoPhase => "2pc",
        }
    }
}

/// What one run measured (one JSON line).
#[derive(Debug, Clone, Serialize)]
pub struct RmPoint {
    /// Threads of the run.
    pub threads: usize,
    /// "independent" or "2pc".
    pub mode: &'static str,
    /// Transfers completed by all threads.
    pub transfers: u64,
    /// Wall time of the run in seconds.
    pub elapsed_s: f64,
    /// Transfers per second of wall time.
    pub tps: f64,
    /// Commit latency (both local COMMITs, or decree's commit), median, in us.
    pub p50_us: f64,
    /// Commit latency, 95th percentile, in us.
    pub p95_us: f64,
    /// Commit latency, 99th percentile, in us.
    pub p99_us: f64,
    /// Whole transfer (begin, both updates, commit), median, in us.
    pub transfer_p50_us: f64,
    /// Whole transfer, 99th percentile, in us.
    pub transfer_p99_us: f64,
}

/// The cost of atomicity at one thread count (one JSON line).
#[derive(Debug, Clone, Serialize)]
pub struct RmRatio {
    /// Threads of both runs.
    pub threads: usize,
    /// 2PC tps divided by independent tps (1.0 = atomicity is free).
    pub ratio: f64,
}

/// One result, reported as soon as it is known.
#[derive(Debug, Clone)]
pub enum RmStep {
    /// A run finished.
    Measured(RmPoint),
    /// Both runs of a thread count finished.
    Ratio(RmRatio),
}

/// What the threads of one run measured, merged.
#[derive(Debug, Default)]
struct ThreadOut {
    transfers: u64,
    commit: Latencies,
    transfer: Latencies,
}

fn db_error(context: impl Into<String>, e: impl std::fmt::Display) -> BenchError {
    BenchError::Client { context: context.into(), message: e.to_string() }
}

fn connect(dsn: &str, which: &str) -> Result<postgres::Client, BenchError> {
    postgres::Client::connect(dsn, postgres::NoTls)
        .map_err(|e| db_error(format!("connecting to database {which}"), e))
}

/// Rejects a spec that cannot run, before touching any database.
pub fn check(spec: &RmBenchSpec) -> Result<(), BenchError> {
    let table_ok = !spec.table.is_empty()
        && spec.table.len() <= TABLE_BYTES_MAX
        && spec.table.starts_with(|c: char| c.is_ascii_lowercase())
        && spec.table.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !table_ok {
        return Err(BenchError::Option(format!(
            "table {:?}: expected 1 to {TABLE_BYTES_MAX} of a-z, 0-9, _ starting with a letter",
            spec.table
        )));
    }
    if spec.accounts == 0 || spec.accounts > ACCOUNTS_MAX {
        return Err(BenchError::Option(format!("accounts {}: expected 1 to {ACCOUNTS_MAX}", spec.accounts)));
    }
    if spec.threads.is_empty() {
        return Err(BenchError::Option("--threads: expected at least one thread count".into()));
    }
    if let Some(t) = spec.threads.iter().find(|&&t| t == 0 || t > THREADS_MAX) {
        return Err(BenchError::Option(format!("--threads {t}: expected 1 to {THREADS_MAX}")));
    }
    if spec.dsn_a.trim().is_empty() || spec.dsn_b.trim().is_empty() {
        return Err(BenchError::Option("--dsn: both DSNs must be non-empty".into()));
    }
    match spec.stop {
        Stop::Cycles(0) => Err(BenchError::Option("--cycles 0: expected at least 1".into())),
        Stop::Duration(d) if d.is_zero() => Err(BenchError::Option("--duration must be positive".into())),
        _ => Ok(()),
    }
}

/// Creates the accounts table and its rows in one database if missing (idempotent:
/// existing rows keep their balances).
pub fn setup(dsn: &str, table: &str, accounts: u32) -> Result<(), BenchError> {
    let mut client = connect(dsn, "for setup")?;
    client
        .batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {table} (id int PRIMARY KEY, balance bigint NOT NULL); \
             INSERT INTO {table} SELECT g, {BALANCE_START} FROM generate_series(1, {accounts}) g \
             ON CONFLICT (id) DO NOTHING"
        ))
        .map_err(|e| db_error(format!("creating {table}"), e))
}

/// The sum of all balances of `table` in one database.
pub fn total(dsn: &str, table: &str) -> Result<i64, BenchError> {
    let mut client = connect(dsn, "to read the total")?;
    let row = client
        .query_one(&format!("SELECT COALESCE(SUM(balance), 0)::bigint FROM {table}"), &[])
        .map_err(|e| db_error(format!("summing {table}"), e))?;
    row.try_get(0).map_err(|e| db_error(format!("summing {table}"), e))
}

/// Branches minted by coordinator `node` that are still prepared in one database.
pub fn prepared_of_node(dsn: &str, node: u32) -> Result<Vec<String>, BenchError> {
    let mut client = connect(dsn, "to list prepared branches")?;
    let rows = client
        .query(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND gid LIKE 'decree:%'",
            &[],
        )
        .map_err(|e| db_error("listing pg_prepared_xacts", e))?;
    let mut ours = Vec::new();
    for row in rows {
        let gid: String = row.try_get(0).map_err(|e| db_error("reading pg_prepared_xacts", e))?;
        let mine = Xid::from_gid(&gid).ok().and_then(|x| x.origin()).is_some_and(|o| o.node == node);
        if mine {
            ours.push(gid);
        }
    }
    Ok(ours)
}

/// A coordinator node id of this process's own, so that the leftover check and the
/// coordinator's recovery never touch another process's branches.
pub fn node_id() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    0x5000_0000 | ((std::process::id().wrapping_mul(7919) ^ nanos) & 0x0fff_ffff)
}

/// Runs every thread count in both modes, calling `report` after each run and each
/// ratio; returns every point. Fails on bad options, unreachable databases, a failed
/// transfer, or a broken invariant (see the module documentation).
pub fn run_all(
    spec: &RmBenchSpec,
    progress: &ProgressBar,
    mut report: impl FnMut(RmStep),
) -> Result<Vec<RmPoint>, BenchError> {
    check(spec)?;
    setup(&spec.dsn_a, &spec.table, spec.accounts)?;
    setup(&spec.dsn_b, &spec.table, spec.accounts)?;
    let node = spec.node;
    let factory_a = Arc::new(PgFactory::new("bench-a", &spec.dsn_a).map_err(|e| db_error("--dsn A", e))?);
    let factory_b = Arc::new(PgFactory::new("bench-b", &spec.dsn_b).map_err(|e| db_error("--dsn B", e))?);
    let mut points = Vec::new();
    for &threads in &spec.threads {
        let mut tps = [0.0; 2];
        for (slot, mode) in [RmMode::Independent, RmMode::TwoPhase].into_iter().enumerate() {
            progress.set_message(format!("{} threads={threads}", mode.name()));
            let before = (total(&spec.dsn_a, &spec.table)?, total(&spec.dsn_b, &spec.table)?);
            let (out, elapsed) = match mode {
                RmMode::Independent => run_threads(threads, |index, start, failed| {
                    independent_loop(spec, index, start, failed, progress)
                })?,
                RmMode::TwoPhase => {
                    let dir = fresh_dir(&spec.dir, &format!("rm-2pc-t{threads}"))?;
                    let outcome =
                        two_phase_run(spec, threads, node, &dir, [&factory_a, &factory_b], progress);
                    let removed = std::fs::remove_dir_all(&dir);
                    let result = outcome?;
                    removed.map_err(|e| BenchError::io("cannot remove run directory", &dir, e))?;
                    result
                }
            };
            let after = (total(&spec.dsn_a, &spec.table)?, total(&spec.dsn_b, &spec.table)?);
            check_totals(mode, threads, before, after, out.transfers)?;
            let secs = elapsed.as_secs_f64();
            let point = RmPoint {
                threads,
                mode: mode.name(),
                transfers: out.transfers,
                elapsed_s: secs,
                tps: if secs > 0.0 { out.transfers as f64 / secs } else { 0.0 },
                p50_us: out.commit.quantile_us(0.50),
                p95_us: out.commit.quantile_us(0.95),
                p99_us: out.commit.quantile_us(0.99),
                transfer_p50_us: out.transfer.quantile_us(0.50),
                transfer_p99_us: out.transfer.quantile_us(0.99),
            };
            tps[slot] = point.tps;
            report(RmStep::Measured(point.clone()));
            points.push(point);
        }
        let ratio = if tps[0] > 0.0 { tps[1] / tps[0] } else { 0.0 };
        report(RmStep::Ratio(RmRatio { threads, ratio }));
    }
    let mut left = prepared_of_node(&spec.dsn_a, node)?;
    left.extend(prepared_of_node(&spec.dsn_b, node)?);
    if !left.is_empty() {
        let listed: Vec<&str> = left.iter().take(LEFTOVER_LISTED_MAX).map(String::as_str).collect();
        return Err(db_error(
            "checking pg_prepared_xacts after the runs",
            format!("{} branch(es) of node {node:#x} left prepared: {}", left.len(), listed.join(", ")),
        ));
    }
    Ok(points)
}

/// The total over both databases must not move, and B must have gained one per transfer.
fn check_totals(
    mode: RmMode,
    threads: usize,
    before: (i64, i64),
    after: (i64, i64),
    transfers: u64,
) -> Result<(), BenchError> {
    let gained = after.1 - before.1;
    if before.0 + before.1 != after.0 + after.1 || gained != transfers as i64 {
        return Err(db_error(
            format!("checking balances after the {} run at {threads} threads", mode.name()),
            format!(
                "totals (A, B) went from {before:?} to {after:?} over {transfers} transfers: atomicity \
                 violated, or another process uses the same table"
            ),
        ));
    }
    Ok(())
}

/// Starts `threads` threads running `body` together; merges what they measured and
/// returns it with the wall time from their release to the end of the last one.
fn run_threads(
    threads: usize,
    body: impl Fn(usize, Instant, &AtomicBool) -> Result<ThreadOut, BenchError> + Sync,
) -> Result<(ThreadOut, Duration), BenchError> {
    let barrier = Barrier::new(threads + 1);
    let failed = AtomicBool::new(false);
    let (outcomes, start, end) = std::thread::scope(|scope| {
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
        let start = Instant::now();
        barrier.wait();
        let outcomes: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
        (outcomes, start, Instant::now())
    });
    let mut merged = ThreadOut::default();
    for outcome in outcomes {
        let out = outcome.map_err(|panic| BenchError::Panicked(panic_message(&panic)))??;
        merged.transfers += out.transfers;
        merged.commit.merge(&out.commit);
        merged.transfer.merge(&out.transfer);
    }
    Ok((merged, end.saturating_duration_since(start)))
}

fn more(stop: Stop, done: u64, start: Instant, failed: &AtomicBool) -> bool {
    let left = match stop {
        Stop::Cycles(n) => done < n,
        Stop::Duration(d) => start.elapsed() < d,
    };
    left && !failed.load(Ordering::Relaxed)
}

fn debit_sql(table: &str) -> String {
    format!("UPDATE {table} SET balance = balance - 1 WHERE id = $1")
}

fn credit_sql(table: &str) -> String {
    format!("UPDATE {table} SET balance = balance + 1 WHERE id = $1")
}

fn one_row(changed: u64, which: &str, id: i32) -> Result<(), BenchError> {
    if changed != 1 {
        return Err(db_error(
            format!("updating account {id} in database {which}"),
            format!("{changed} rows changed, expected 1 (was setup run with fewer accounts?)"),
        ));
    }
    Ok(())
}

fn ids(rng: &mut rand::rngs::StdRng, accounts: u32) -> (i32, i32) {
    let top = accounts as i32;
    (rng.gen_range(1..=top), rng.gen_range(1..=top))
}

/// One thread of the independent mode: two local transactions per transfer.
fn independent_loop(
    spec: &RmBenchSpec,
    index: usize,
    start: Instant,
    failed: &AtomicBool,
    progress: &ProgressBar,
) -> Result<ThreadOut, BenchError> {
    let mut a = connect(&spec.dsn_a, "A")?;
    let mut b = connect(&spec.dsn_b, "B")?;
    let debit = a.prepare(&debit_sql(&spec.table)).map_err(|e| db_error("preparing the debit on A", e))?;
    let credit = b.prepare(&credit_sql(&spec.table)).map_err(|e| db_error("preparing the credit on B", e))?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(spec.seed.wrapping_add(index as u64));
    let mut out = ThreadOut::default();
    while more(spec.stop, out.transfers, start, failed) {
        let (id_a, id_b) = ids(&mut rng, spec.accounts);
        let begun = Instant::now();
        let mut tx = a.transaction().map_err(|e| db_error("BEGIN on A", e))?;
        one_row(tx.execute(&debit, &[&id_a]).map_err(|e| db_error("debit on A", e))?, "A", id_a)?;
        let commit_a = Instant::now();
        tx.commit().map_err(|e| db_error("COMMIT on A", e))?;
        let mut commit_time = commit_a.elapsed();
        let mut tx = b.transaction().map_err(|e| db_error("BEGIN on B", e))?;
        one_row(tx.execute(&credit, &[&id_b]).map_err(|e| db_error("credit on B", e))?, "B", id_b)?;
        let commit_b = Instant::now();
        tx.commit().map_err(|e| db_error("COMMIT on B", e))?;
        let end = Instant::now();
        commit_time += end.saturating_duration_since(commit_b);
        out.commit.record(commit_time);
        out.transfer.record(end.saturating_duration_since(begun));
        out.transfers += 1;
        if out.transfers.is_multiple_of(PROGRESS_EVERY) {
            progress.inc(PROGRESS_EVERY);
        }
    }
    Ok(out)
}

/// One 2PC run: a coordinator over a fresh log in `dir`, `threads` sessions on it.
fn two_phase_run(
    spec: &RmBenchSpec,
    threads: usize,
    node: u32,
    dir: &std::path::Path,
    factories: [&Arc<PgFactory>; 2],
    progress: &ProgressBar,
) -> Result<(ThreadOut, Duration), BenchError> {
    let config = LogConfig::new(dir, spec.engine, SyncPolicy::from_rpo_ms(spec.rpo_ms));
    let log: Arc<dyn Log> = Arc::from(
        decree_log::open(&config)
            .map_err(|source| BenchError::EngineUnavailable { engine: spec.engine.name().into(), source })?,
    );
    let shared: Vec<Arc<dyn RmFactory>> =
        factories.iter().map(|f| Arc::clone(*f) as Arc<dyn RmFactory>).collect();
    let tm = TransactionManager::embedded(log.clone(), TmConfig { node, ..TmConfig::default() }, shared)
        .map_err(|e| db_error("starting the coordinator", e))?;
    let (out, elapsed) = run_threads(threads, |index, start, failed| {
        two_phase_loop(spec, &tm, factories, index, start, failed, progress)
    })?;
    if !tm.wait_idle(IDLE_WAIT) {
        return Err(db_error(
            "after the 2PC run",
            format!("{} phase-two jobs still pending after {IDLE_WAIT:?}", tm.pending()),
        ));
    }
    let appended = log.stats().records_appended;
    if appended != out.transfers {
        return Err(db_error(
            "checking the log after the 2PC run",
            format!("{} transfers committed but the log holds {appended} decisions", out.transfers),
        ));
    }
    Ok((out, elapsed))
}

/// One thread of the 2PC mode: a TX context over one connection to each database.
fn two_phase_loop(
    spec: &RmBenchSpec,
    tm: &Arc<TransactionManager>,
    factories: [&Arc<PgFactory>; 2],
    index: usize,
    start: Instant,
    failed: &AtomicBool,
    progress: &ProgressBar,
) -> Result<ThreadOut, BenchError> {
    let a = factories[0].connect_pg().map_err(|e| db_error("connecting to database A", e))?;
    let b = factories[1].connect_pg().map_err(|e| db_error("connecting to database B", e))?;
    let debit = a
        .client()
        .and_then(|mut c| {
            c.prepare(&debit_sql(&spec.table)).map_err(|e| decree_core::RmError::Protocol(e.to_string()))
        })
        .map_err(|e| db_error("preparing the debit on A", e))?;
    let credit = b
        .client()
        .and_then(|mut c| {
            c.prepare(&credit_sql(&spec.table)).map_err(|e| decree_core::RmError::Protocol(e.to_string()))
        })
        .map_err(|e| db_error("preparing the credit on B", e))?;
    let (ha, hb) = (a.handle(), b.handle());
    let mut tx = TxContext::open(tm, vec![Box::new(a), Box::new(b)]).map_err(|e| db_error("tx_open", e))?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(spec.seed.wrapping_add(index as u64));
    let mut out = ThreadOut::default();
    let outcome = (|| {
        while more(spec.stop, out.transfers, start, failed) {
            let (id_a, id_b) = ids(&mut rng, spec.accounts);
            let begun = Instant::now();
            tx.begin().map_err(|e| db_error("tx_begin", e))?;
            let changed = ha
                .client()
                .map_err(|e| db_error("debit on A", e))?
                .execute(&debit, &[&id_a])
                .map_err(|e| db_error("debit on A", e))?;
            one_row(changed, "A", id_a)?;
            let changed = hb
                .client()
                .map_err(|e| db_error("credit on B", e))?
                .execute(&credit, &[&id_b])
                .map_err(|e| db_error("credit on B", e))?;
            one_row(changed, "B", id_b)?;
            let committing = Instant::now();
            let report = tx.commit().map_err(|e| db_error("tx_commit", e))?;
            let end = Instant::now();
            if report.kind != CommitKind::TwoPhase {
                return Err(db_error(
                    "tx_commit",
                    format!("took the {:?} path, expected two-phase", report.kind),
                ));
            }
            out.commit.record(end.saturating_duration_since(committing));
            out.transfer.record(end.saturating_duration_since(begun));
            out.transfers += 1;
            if out.transfers.is_multiple_of(PROGRESS_EVERY) {
                progress.inc(PROGRESS_EVERY);
            }
        }
        Ok(())
    })();
    if outcome.is_err() {
        // A transaction left open by the failure is rolled back, not left for recovery.
        let _ = tx.rollback();
    }
    let closed = tx.close().map_err(|e| db_error("tx_close", e));
    outcome?;
    closed?;
    Ok(out)
}

/// The table's header line.
pub fn table_header() -> String {
    format!(
        "{:>7} {:<12} {:>10} {:>10} {:>9} {:>9} {:>9} {:>12} {:>12}\n{}",
        "threads",
        "mode",
        "transfers",
        "tps",
        "p50_us",
        "p95_us",
        "p99_us",
        "xfer_p50_us",
        "xfer_p99_us",
        "-".repeat(97)
    )
}

/// One table row (commit latency percentiles, then the whole transfer's).
pub fn table_row(p: &RmPoint) -> String {
    format!(
        "{:>7} {:<12} {:>10} {:>10.1} {:>9.1} {:>9.1} {:>9.1} {:>12.1} {:>12.1}",
        p.threads,
        p.mode,
        p.transfers,
        p.tps,
        p.p50_us,
        p.p95_us,
        p.p99_us,
        p.transfer_p50_us,
        p.transfer_p99_us
    )
}

/// The ratio line under a thread count's two rows.
pub fn ratio_line(r: &RmRatio) -> String {
    format!("{:>7} {:<12} 2pc/independent tps = {:.2}x", r.threads, "ratio", r.ratio)
}

/// One JSON line for a run.
pub fn point_json(p: &RmPoint) -> String {
    serde_json::to_string(p).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// One JSON line for a ratio.
pub fn ratio_json(r: &RmRatio) -> String {
    serde_json::to_string(r).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> RmBenchSpec {
        RmBenchSpec {
            dsn_a: "host=x".into(),
            dsn_b: "host=y".into(),
            table: TABLE_DEFAULT.into(),
            accounts: ACCOUNTS_DEFAULT,
            threads: vec![1, 4, 16],
            stop: Stop::Duration(Duration::from_secs(3)),
            engine: EngineKind::Journal,
            rpo_ms: 0,
            dir: PathBuf::from("."),
            seed: 1,
            node: node_id(),
        }
    }

    #[test]
    fn bad_specs_are_option_errors() {
        assert!(check(&spec()).is_ok());
        let bad = [
            RmBenchSpec { table: "x; DROP TABLE y".into(), ..spec() },
            RmBenchSpec { table: "1abc".into(), ..spec() },
            RmBenchSpec { accounts: 0, ..spec() },
            RmBenchSpec { threads: vec![], ..spec() },
            RmBenchSpec { threads: vec![0], ..spec() },
            RmBenchSpec { stop: Stop::Cycles(0), ..spec() },
            RmBenchSpec { dsn_b: " ".into(), ..spec() },
        ];
        for s in bad {
            assert!(matches!(check(&s), Err(BenchError::Option(_))), "{s:?} accepted");
        }
    }

    #[test]
    fn totals_must_balance() {
        assert!(check_totals(RmMode::TwoPhase, 1, (100, 50), (90, 60), 10).is_ok());
        assert!(check_totals(RmMode::TwoPhase, 1, (100, 50), (90, 59), 10).is_err(), "lost a credit");
        assert!(check_totals(RmMode::Independent, 1, (100, 50), (91, 59), 10).is_err(), "miscounted");
    }

    #[test]
    fn json_has_the_documented_fields() {
        let p = RmPoint {
            threads: 4,
            mode: RmMode::TwoPhase.name(),
            transfers: 10,
            elapsed_s: 1.0,
            tps: 10.0,
            p50_us: 1.0,
            p95_us: 2.0,
            p99_us: 3.0,
            transfer_p50_us: 4.0,
            transfer_p99_us: 5.0,
        };
        let v: serde_json::Value = serde_json::from_str(&point_json(&p)).expect("valid JSON");
        for key in ["threads", "mode", "tps", "p50_us", "p95_us", "p99_us"] {
            assert!(v.get(key).is_some(), "{key} missing in {v}");
        }
        assert_eq!(v["mode"], "2pc");
        let r: serde_json::Value =
            serde_json::from_str(&ratio_json(&RmRatio { threads: 4, ratio: 0.5 })).expect("valid JSON");
        assert_eq!(r["ratio"], 0.5);
    }
}
