//! The cost of atomicity with real databases (`decree bench --rm postgres|mariadb`).
//!
//! Two databases of one kind, A and B, each hold `<table>(id int primary key, balance
//! bigint)` with `accounts` rows. A transfer debits one random account in A by 1 and
//! credits one random account in B by 1 (uniform ids: low contention). Per thread count,
//! three runs do the same transfers:
//! - "independent": a local transaction (begin, UPDATE, COMMIT) on A, then the same on B:
//!   two local commits, no atomicity (a crash between them loses the credit);
//! - "native-2pc": the databases' own two-phase statements issued by the benchmark thread
//!   itself (PostgreSQL `BEGIN` ... `PREPARE TRANSACTION` ... `COMMIT PREPARED`, MariaDB
//!   `XA START` ... `XA END; XA PREPARE` ... `XA COMMIT`), in the order decree issues them,
//!   without a coordinator or a decision log: what two-phase commit costs the databases
//!   and their client, i.e. what a coordinator that cost nothing would reach (it is not
//!   atomic across a crash: nothing records the decision);
//! - "2pc": both updates in one decree transaction over the embedded coordinator (its
//!   decisions go to a fresh log of the chosen engine and RPO): begin, the updates through
//!   the RM handles, commit = prepare both, durable decision, commit both prepared branches.
//!
//! The ratio of the 2PC and independent throughputs is the cost of atomicity; the native
//! run splits it into the databases' share and decree's. Nothing asserts on them. With
//! `rounds` > 1 the three runs are repeated, each round starting with the next mode (so no
//! mode always runs first or last), and a summary gives the median and range of the rounds'
//! ratios: on a shared or virtual machine the speed drifts by tens of percent within a
//! minute, and runs that follow each other closely see the same drift.
//! Invariants checked after every run (an error, never a silent pass): every transfer
//! updated exactly one row in each database, the total over both databases is unchanged,
//! B gained exactly the number of transfers counted, every 2PC commit took the two-phase
//! path and wrote one decision, and no branch of this benchmark's coordinator node is
//! left prepared in either database. Statements are prepared once per connection, in both
//! modes, so neither pays an extra parse round trip. The independent and native modes send
//! `BEGIN` (`XA START`) as a statement of its own and wait for it, as an application on the
//! `postgres` or `mysql` client does; decree's PostgreSQL RM queues its `BEGIN` behind the
//! first UPDATE instead (see `decree_rm::postgres`), so on PostgreSQL the 2PC mode saves
//! that round trip and can pass the native "ceiling" when round trips, not CPU, limit.
//!
//! This module holds everything the kinds share: the spec, the runner and its two loops,
//! the invariants and the reports. What differs per kind (connecting, setup, the sum, the
//! prepared-branch listing, the local transaction, the RM and its statement) sits behind
//! [`Database`], one file per kind: [`postgres`] and [`mariadb`].

mod mariadb;
mod postgres;

use crate::host_cpu::HostCpu;
use crate::log_use::{LogUse, LogWrites};
use crate::stats::Latencies;
use crate::tx::{fresh_dir, panic_message, Stop, THREADS_MAX};
use crate::BenchError;
use decree_core::{
    BranchCalls, CommitKind, ResourceManager, RmFactory, TmConfig, TransactionManager, TxContext,
};
use decree_log::{EngineKind, Log, LogConfig, SyncPolicy};
use indicatif::ProgressBar;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The accounts table used when none is named.
pub const TABLE_DEFAULT: &str = "decree_bench_accounts";
/// Accounts per database used when none is given.
pub const ACCOUNTS_DEFAULT: u32 = 10_000;
/// The most accounts setup creates per database.
pub const ACCOUNTS_MAX: u32 = 1_000_000;
/// Longest table name accepted (PostgreSQL's identifier limit; MariaDB's is 64).
pub const TABLE_BYTES_MAX: usize = 63;
/// Balance of every account created by setup (far from overflow and from zero).
pub const BALANCE_START: i64 = 1_000_000_000;
/// Most rounds of the three runs per thread count.
pub const ROUNDS_MAX: usize = 100;
/// Prepared branches listed in full in the leftover error; the rest are counted.
const LEFTOVER_LISTED_MAX: usize = 10;
/// How long to wait for background phase-two work after a 2PC run.
const IDLE_WAIT: Duration = Duration::from_secs(30);
/// Transfers between two updates of the progress bar.
const PROGRESS_EVERY: u64 = 64;
/// Transaction names of the native two-phase mode; never a decree gid (`decree:`), so
/// decree's recovery and leftover checks leave them alone.
const NATIVE_GID_PREFIX: &str = "decree-bench-native-";

/// Which kind of database both A and B are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbKind {
    /// PostgreSQL (`PREPARE TRANSACTION`), DSNs in libpq's `key=value` form.
    Postgres,
    /// MariaDB (`XA` statements), DSNs as `mysql://user:password@host:port/db`.
    MariaDb,
}

impl DbKind {
    /// The name used by `--rm` and in reports.
    pub fn name(self) -> &'static str {
        match self {
            DbKind::Postgres => "postgres",
            DbKind::MariaDb => "mariadb",
        }
    }
}

/// Which database of the pair: A is debited, B is credited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The debited database.
    A,
    /// The credited database.
    B,
}

impl Side {
    /// Both sides, in the order of every transfer.
    pub const BOTH: [Side; 2] = [Side::A, Side::B];

    /// "A" or "B", for messages.
    pub fn name(self) -> &'static str {
        match self {
            Side::A => "A",
            Side::B => "B",
        }
    }

    /// The resource-manager name of this side's connections (also in recovery's logs).
    fn rm_name(self) -> &'static str {
        match self {
            Side::A => "bench-a",
            Side::B => "bench-b",
        }
    }

    /// What the transfer does to this side's account, for messages.
    fn verb(self) -> &'static str {
        match self {
            Side::A => "debit",
            Side::B => "credit",
        }
    }

    /// The operator of this side's `SET balance = balance <op> 1`.
    fn operator(self) -> char {
        match self {
            Side::A => '-',
            Side::B => '+',
        }
    }

    /// "<step> on database A", the context of an error on this side.
    fn context(self, step: impl std::fmt::Display) -> String {
        format!("{step} on database {}", self.name())
    }

    /// This side's UPDATE of one account, with the kind's parameter `placeholder`.
    fn update_sql(self, table: &str, placeholder: &str) -> String {
        format!("UPDATE {table} SET balance = balance {} 1 WHERE id = {placeholder}", self.operator())
    }

    /// The error of a failed connection to this side (the address carries no password).
    fn connect_error(self, address: &str, purpose: &str, e: impl std::fmt::Display) -> BenchError {
        db_error(format!("connecting to database {} ({address}) {purpose}", self.name()), e)
    }
}

/// What the benchmark runs against and how long.
#[derive(Debug, Clone)]
pub struct RmBenchSpec {
    /// Kind of both databases.
    pub kind: DbKind,
    /// DSN of database A (debited).
    pub dsn_a: String,
    /// DSN of database B (credited).
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
    /// How the coordinator calls the two branches at prepare and commit.
    pub branch_calls: BranchCalls,
    /// Rounds of the three runs per thread count (1 to [`ROUNDS_MAX`]).
    pub rounds: usize,
}

/// How the two updates of a transfer are committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RmMode {
    /// Two local commits, no atomicity.
    Independent,
    /// The databases' own prepare and commit-prepared statements, no coordinator.
    Native,
    /// One decree two-phase commit over both databases.
    TwoPhase,
}

impl RmMode {
    /// The name in reports ("independent" or "2pc").
    pub fn name(self) -> &'static str {
        match self {
            RmMode::Independent => "independent",
            RmMode::Native => "native-2pc",
            RmMode::TwoPhase => "2pc",
        }
    }
}

/// What one run measured (one JSON line).
#[derive(Debug, Clone, Serialize)]
pub struct RmPoint {
    /// Threads of the run.
    pub threads: usize,
    /// "independent", "native-2pc" or "2pc".
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
    /// CPU time (user + system) of this process, the application side with decree in it,
    /// per transfer, in us: what atomicity costs the application's machine, apart from the
    /// databases' own work.
    pub cpu_us_per_transfer: f64,
    /// Busy CPU time of the whole machine per transfer, in us: the databases' work too when
    /// they run on this host, which then bounds tps (`None` without `/proc/stat`).
    pub host_cpu_us_per_transfer: Option<f64>,
    /// Share of the run's CPU time the hypervisor gave to other guests (steal), in percent
    /// of the busy time: a high value marks a run slowed from outside the machine.
    pub steal_pct: Option<f64>,
    /// 2PC only: synced writes of decree's log per transfer and their times.
    #[serde(flatten)]
    pub log_writes: Option<LogWrites>,
}

/// The cost of atomicity at one thread count (one JSON line).
#[derive(Debug, Clone, Serialize)]
pub struct RmRatio {
    /// Threads of both runs.
    pub threads: usize,
    /// Which round of the thread count this is (1-based).
    pub round: usize,
    /// 2PC tps divided by independent tps (1.0 = atomicity is free).
    pub ratio: f64,
    /// Native two-phase tps divided by independent tps: the databases' own price of
    /// two-phase commit, the ceiling of `ratio` on this machine.
    pub native_ratio: f64,
    /// 2PC tps divided by native two-phase tps: the share of that ceiling decree reaches.
    pub of_native: f64,
    /// 2PC application CPU per transfer divided by the independent one (0 when the kernel
    /// accounted no CPU time to a run, which short runs can see).
    pub cpu_ratio: f64,
    /// 2PC machine CPU per transfer divided by the independent one (0 when unknown).
    pub host_cpu_ratio: f64,
}

/// The rounds of one thread count taken together (one JSON line, `rounds` > 1 only).
#[derive(Debug, Clone, Serialize)]
pub struct RmSummary {
    /// Threads of the runs.
    pub threads: usize,
    /// Rounds summarised.
    pub rounds: usize,
    /// Median of the rounds' 2PC/independent tps ratios.
    pub ratio_median: f64,
    /// Lowest round's ratio.
    pub ratio_min: f64,
    /// Highest round's ratio.
    pub ratio_max: f64,
    /// Median of the rounds' native-2pc/independent ratios (the ceiling).
    pub native_ratio_median: f64,
    /// Median of the rounds' 2PC/native-2pc ratios (the share of the ceiling reached).
    pub of_native_median: f64,
    /// Median of the rounds' machine CPU ratios (0 when unknown).
    pub host_cpu_ratio_median: f64,
}

impl RmSummary {
    /// Summarises the ratios of one thread count's rounds; `None` without any.
    pub fn of(ratios: &[RmRatio]) -> Option<RmSummary> {
        let first = ratios.first()?;
        let median = |get: fn(&RmRatio) -> f64| {
            let mut values: Vec<f64> = ratios.iter().map(get).collect();
            values.sort_by(f64::total_cmp);
            let mid = values.len() / 2;
            if values.len() % 2 == 1 {
                values[mid]
            } else {
                (values[mid - 1] + values[mid]) / 2.0
            }
        };
        let ratio = ratios.iter().map(|r| r.ratio);
        Some(RmSummary {
            threads: first.threads,
            rounds: ratios.len(),
            ratio_median: median(|r| r.ratio),
            ratio_min: ratio.clone().fold(f64::INFINITY, f64::min),
            ratio_max: ratio.fold(f64::NEG_INFINITY, f64::max),
            native_ratio_median: median(|r| r.native_ratio),
            of_native_median: median(|r| r.of_native),
            host_cpu_ratio_median: median(|r| r.host_cpu_ratio),
        })
    }
}

/// One result, reported as soon as it is known.
#[derive(Debug, Clone)]
pub enum RmStep {
    /// A run finished.
    Measured(RmPoint),
    /// The three runs of a round finished.
    Ratio(RmRatio),
    /// Every round of a thread count finished (`rounds` > 1).
    Summary(RmSummary),
    /// A database's durability settings, read before the runs.
    Durability(DbDurability),
}

/// How durable one database's local commits are, read from its settings.
#[derive(Debug, Clone, Serialize)]
pub struct DbDurability {
    /// "A" or "B".
    pub side: &'static str,
    /// The settings read, as `name=value` pairs.
    pub settings: String,
    /// True when a local COMMIT returns only after the database's log is on disk.
    pub durable: bool,
}

/// The line, printed before the table, that says how durable a database's local commits are.
pub fn durability_line(d: &DbDurability) -> String {
    if d.durable {
        format!("database {}: {}: local commits are durable", d.side, d.settings)
    } else {
        format!(
            "database {}: {}: local commits are NOT durable, so the independent runs skip a cost the \
             2PC runs pay (decree syncs its decision): the ratio then counts durability as well as \
             atomicity; run the databases durable to measure atomicity alone",
            d.side, d.settings
        )
    }
}

/// One JSON line for a database's durability.
pub fn durability_json(d: &DbDurability) -> String {
    serde_json::to_string(d).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// One database of the pair, as the runner sees it; one implementation per kind. Every
/// call opens its own connection: the runner calls the first three once per run, the
/// last two once per thread and run.
trait Database: Sync {
    /// Creates the table and rows 1..=accounts if missing; existing rows keep their balance.
    fn setup(&self, accounts: u32) -> Result<(), BenchError>;
    /// The sum of all balances of the table.
    fn total(&self) -> Result<i64, BenchError>;
    /// The settings that make a local commit durable, as `name=value` pairs, and whether
    /// they do.
    fn durability(&self) -> Result<(String, bool), BenchError>;
    /// Decree branches minted by coordinator `node` still prepared where this database
    /// can see them, printable.
    fn prepared_of_node(&self, node: u32) -> Result<Vec<String>, BenchError>;
    /// The coordinator's factory for this database (recovery and phase-two retries).
    fn rm_factory(&self) -> Arc<dyn RmFactory>;
    /// A plain connection with this side's UPDATE prepared, for the independent and
    /// native two-phase modes.
    fn local(&self) -> Result<Box<dyn LocalUpdate>, BenchError>;
    /// A resource manager for the coordinator and, on the same connection, this side's
    /// UPDATE prepared, for the 2PC mode.
    fn branch(&self) -> Result<BranchPair, BenchError>;
}

/// A branch connection as the coordinator takes it, and the application's side of it.
type BranchPair = (Box<dyn ResourceManager>, Box<dyn BranchUpdate>);

/// One thread's plain connection in the independent mode.
trait LocalUpdate {
    /// Starts a local transaction.
    fn begin(&mut self) -> Result<(), BenchError>;
    /// Runs the prepared UPDATE on account `id`; returns the rows it changed.
    fn update(&mut self, id: i32) -> Result<u64, BenchError>;
    /// Commits the local transaction.
    fn commit(&mut self) -> Result<(), BenchError>;
    /// Starts a transaction that will be prepared as `gid` (native mode).
    fn begin_native(&mut self, gid: &str) -> Result<(), BenchError>;
    /// Prepares the open transaction as `gid` (native mode).
    fn prepare_native(&mut self, gid: &str) -> Result<(), BenchError>;
    /// Commits the prepared transaction `gid` (native mode).
    fn commit_native(&mut self, gid: &str) -> Result<(), BenchError>;
    /// Rolls back `gid` whether it is open or prepared, best effort, after a failure, so
    /// that no prepared transaction keeps its locks after the benchmark.
    fn abandon_native(&mut self, gid: &str);
}

/// One thread's application view of a branch connection in the 2PC mode.
trait BranchUpdate {
    /// Runs the prepared UPDATE on account `id` inside the open branch; returns the rows
    /// it changed.
    fn update(&mut self, id: i32) -> Result<u64, BenchError>;
}

/// Opens one side of the pair (checks the DSN; connects only when asked to work).
fn open(kind: DbKind, side: Side, dsn: &str, table: &str) -> Result<Box<dyn Database>, BenchError> {
    Ok(match kind {
        DbKind::Postgres => Box::new(postgres::PgDatabase::new(side, dsn, table)?),
        DbKind::MariaDb => Box::new(mariadb::MariaDbDatabase::new(side, dsn, table)?),
    })
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
    if spec.rounds == 0 || spec.rounds > ROUNDS_MAX {
        return Err(BenchError::Option(format!("--rounds {}: expected 1 to {ROUNDS_MAX}", spec.rounds)));
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
/// existing rows keep their balances). `side` only names the database in messages.
pub fn setup(kind: DbKind, side: Side, dsn: &str, table: &str, accounts: u32) -> Result<(), BenchError> {
    open(kind, side, dsn, table)?.setup(accounts)
}

/// The sum of all balances of `table` in one database.
pub fn total(kind: DbKind, side: Side, dsn: &str, table: &str) -> Result<i64, BenchError> {
    open(kind, side, dsn, table)?.total()
}

/// Branches minted by coordinator `node` that are still prepared in one database
/// (PostgreSQL: this database; MariaDB: the whole server, as `XA RECOVER` lists them).
pub fn prepared_of_node(kind: DbKind, side: Side, dsn: &str, node: u32) -> Result<Vec<String>, BenchError> {
    open(kind, side, dsn, TABLE_DEFAULT)?.prepared_of_node(node)
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
    let dbs = [
        open(spec.kind, Side::A, &spec.dsn_a, &spec.table)?,
        open(spec.kind, Side::B, &spec.dsn_b, &spec.table)?,
    ];
    let dbs = [dbs[0].as_ref(), dbs[1].as_ref()];
    for (db, side) in dbs.into_iter().zip(Side::BOTH) {
        db.setup(spec.accounts)?;
        let (settings, durable) = db.durability()?;
        report(RmStep::Durability(DbDurability { side: side.name(), settings, durable }));
    }
    let mut points = Vec::new();
    let modes = [RmMode::Independent, RmMode::Native, RmMode::TwoPhase];
    for &threads in &spec.threads {
        let mut ratios = Vec::with_capacity(spec.rounds);
        for round in 0..spec.rounds {
            let (mut tps, mut cpu, mut host_cpu) = ([0.0; 3], [0.0; 3], [0.0; 3]);
            for slot in round_order(round) {
                let mode = modes[slot];
                let counter = if spec.rounds > 1 {
                    format!(" round {}/{}", round + 1, spec.rounds)
                } else {
                    String::new()
                };
                progress.set_message(format!(
                    "{} {} threads={threads}{counter}",
                    spec.kind.name(),
                    mode.name()
                ));
                let point = run_one(spec, dbs, mode, threads, progress)?;
                (tps[slot], cpu[slot]) = (point.tps, point.cpu_us_per_transfer);
                host_cpu[slot] = point.host_cpu_us_per_transfer.unwrap_or(0.0);
                report(RmStep::Measured(point.clone()));
                points.push(point);
            }
            let over = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
            let ratio = RmRatio {
                threads,
                round: round + 1,
                ratio: over(tps[2], tps[0]),
                cpu_ratio: over(cpu[2], cpu[0]),
                host_cpu_ratio: over(host_cpu[2], host_cpu[0]),
                native_ratio: over(tps[1], tps[0]),
                of_native: over(tps[2], tps[1]),
            };
            report(RmStep::Ratio(ratio.clone()));
            ratios.push(ratio);
        }
        if spec.rounds > 1 {
            if let Some(summary) = RmSummary::of(&ratios) {
                report(RmStep::Summary(summary));
            }
        }
    }
    Ok(points)
}

/// The order of the three modes (independent, native, 2PC) in round `round`: each round
/// starts one mode further, so that every mode takes each place equally often.
pub fn round_order(round: usize) -> [usize; 3] {
    let first = round % 3;
    [first, (first + 1) % 3, (first + 2) % 3]
}

/// One run of one mode at one thread count, with the invariants checked after it.
fn run_one(
    spec: &RmBenchSpec,
    dbs: [&dyn Database; 2],
    mode: RmMode,
    threads: usize,
    progress: &ProgressBar,
) -> Result<RmPoint, BenchError> {
    let before = (dbs[0].total()?, dbs[1].total()?);
    let cpu_before = process_cpu();
    let host_before = HostCpu::now();
    let mut log_use = None;
    let (out, elapsed) = match mode {
        RmMode::Independent => run_threads(threads, |index, start, failed| {
            independent_loop(spec, dbs, index, start, failed, progress)
        })?,
        RmMode::Native => run_threads(threads, |index, start, failed| {
            native_loop(spec, dbs, index, start, failed, progress)
        })?,
        RmMode::TwoPhase => {
            let dir = fresh_dir(&spec.dir, &format!("rm-2pc-t{threads}"))?;
            let outcome = two_phase_run(spec, dbs, threads, &dir, progress);
            let removed = std::fs::remove_dir_all(&dir);
            let (out, elapsed, used) = outcome?;
            removed.map_err(|e| BenchError::io("cannot remove run directory", &dir, e))?;
            log_use = Some(used);
            (out, elapsed)
        }
    };
    let cpu = process_cpu().saturating_sub(cpu_before);
    let host = host_before.zip(HostCpu::now()).map(|(before, now)| now.since(&before));
    let after = (dbs[0].total()?, dbs[1].total()?);
    check_totals(mode, threads, before, after, out.transfers)?;
    check_nothing_prepared(dbs, spec.node, mode, threads)?;
    let secs = elapsed.as_secs_f64();
    Ok(RmPoint {
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
        cpu_us_per_transfer: if out.transfers > 0 {
            cpu.as_secs_f64() * 1e6 / out.transfers as f64
        } else {
            0.0
        },
        host_cpu_us_per_transfer: host
            .filter(|_| out.transfers > 0)
            .map(|h| h.busy.as_secs_f64() * 1e6 / out.transfers as f64),
        steal_pct: host
            .filter(|h| !h.busy.is_zero())
            .map(|h| h.steal.as_secs_f64() * 100.0 / h.busy.as_secs_f64()),
        log_writes: log_use.and_then(|used| used.per_commit(out.transfers)),
    })
}

/// CPU time this process has used so far, user and system (zero if the kernel refuses).
fn process_cpu() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one rusage into the pointer it is given, which is valid and
    // zero-initialised; its result is read only when the call succeeded.
    let usage = unsafe {
        if libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) != 0 {
            return Duration::ZERO;
        }
        usage.assume_init()
    };
    let time = |t: libc::timeval| Duration::new(t.tv_sec.max(0) as u64, (t.tv_usec.max(0) as u32) * 1000);
    time(usage.ru_utime) + time(usage.ru_stime)
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

/// No branch of this benchmark's coordinator node may stay prepared in either database
/// (listed once even when both sides see the same server's list).
fn check_nothing_prepared(
    dbs: [&dyn Database; 2],
    node: u32,
    mode: RmMode,
    threads: usize,
) -> Result<(), BenchError> {
    let mut left = dbs[0].prepared_of_node(node)?;
    left.extend(dbs[1].prepared_of_node(node)?);
    left.sort_unstable();
    left.dedup();
    if left.is_empty() {
        return Ok(());
    }
    let listed: Vec<&str> = left.iter().take(LEFTOVER_LISTED_MAX).map(String::as_str).collect();
    Err(db_error(
        format!("checking for prepared branches after the {} run at {threads} threads", mode.name()),
        format!("{} branch(es) of node {node:#x} left prepared: {}", left.len(), listed.join(", ")),
    ))
}

/// Starts `threads` threads running `body` together; merges what they measured and
/// returns it with the wall time from their release to the end of the last one.
fn run_threads(
    threads: usize,
    body: impl Fn(usize, Instant, &AtomicBool) -> Result<ThreadOut, BenchError> + Sync,
) -> Result<(ThreadOut, Duration), BenchError> {
    let (outcomes, start, end) = crate::tx::run_together(threads, body);
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

fn one_row(changed: u64, side: Side, id: i32) -> Result<(), BenchError> {
    if changed != 1 {
        return Err(db_error(
            format!("updating account {id} in database {}", side.name()),
            format!("{changed} rows changed, expected 1 (was setup run with fewer accounts?)"),
        ));
    }
    Ok(())
}

/// The account-id generator of benchmark thread `index` (seed + index, so every mode
/// draws the same transfers).
fn thread_rng(spec: &RmBenchSpec, index: usize) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(spec.seed.wrapping_add(index as u64))
}

/// The accounts of one transfer: the one debited in A, the one credited in B.
fn ids(rng: &mut rand::rngs::StdRng, accounts: u32) -> [i32; 2] {
    let top = i32::try_from(accounts).unwrap_or(i32::MAX);
    [rng.gen_range(1..=top), rng.gen_range(1..=top)]
}

/// Records one finished transfer and moves the progress bar now and then.
fn count(out: &mut ThreadOut, commit: Duration, transfer: Duration, progress: &ProgressBar) {
    out.commit.record(commit);
    out.transfer.record(transfer);
    out.transfers += 1;
    if out.transfers.is_multiple_of(PROGRESS_EVERY) {
        progress.inc(PROGRESS_EVERY);
    }
}

/// One thread of the independent mode: a local transaction on A, then one on B.
fn independent_loop(
    spec: &RmBenchSpec,
    dbs: [&dyn Database; 2],
    index: usize,
    start: Instant,
    failed: &AtomicBool,
    progress: &ProgressBar,
) -> Result<ThreadOut, BenchError> {
    let mut locals = [dbs[0].local()?, dbs[1].local()?];
    let mut rng = thread_rng(spec, index);
    let mut out = ThreadOut::default();
    while more(spec.stop, out.transfers, start, failed) {
        let ids = ids(&mut rng, spec.accounts);
        let begun = Instant::now();
        let mut commit_time = Duration::ZERO;
        for ((local, id), side) in locals.iter_mut().zip(ids).zip(Side::BOTH) {
            local.begin()?;
            one_row(local.update(id)?, side, id)?;
            let committing = Instant::now();
            local.commit()?;
            commit_time += committing.elapsed();
        }
        count(&mut out, commit_time, begun.elapsed(), progress);
    }
    Ok(out)
}

/// One thread of the native two-phase mode: both transactions begun, updated, prepared,
/// then both committed, in decree's order, by this thread alone.
fn native_loop(
    spec: &RmBenchSpec,
    dbs: [&dyn Database; 2],
    index: usize,
    start: Instant,
    failed: &AtomicBool,
    progress: &ProgressBar,
) -> Result<ThreadOut, BenchError> {
    let mut locals = [dbs[0].local()?, dbs[1].local()?];
    let mut rng = thread_rng(spec, index);
    let mut out = ThreadOut::default();
    // One name per side: PostgreSQL wants a gid unique in the cluster, and A and B may share one.
    let mut gids = [String::new(), String::new()];
    let outcome = (|| {
        while more(spec.stop, out.transfers, start, failed) {
            let ids = ids(&mut rng, spec.accounts);
            for (gid, side) in gids.iter_mut().zip(Side::BOTH) {
                gid.clear();
                let _ = write!(
                    gid,
                    "{NATIVE_GID_PREFIX}{:08x}-{index}-{}-{}",
                    spec.node,
                    out.transfers,
                    side.name()
                );
            }
            let begun = Instant::now();
            for (local, gid) in locals.iter_mut().zip(&gids) {
                local.begin_native(gid)?;
            }
            for ((local, id), side) in locals.iter_mut().zip(ids).zip(Side::BOTH) {
                one_row(local.update(id)?, side, id)?;
            }
            let committing = Instant::now();
            for (local, gid) in locals.iter_mut().zip(&gids) {
                local.prepare_native(gid)?;
            }
            for (local, gid) in locals.iter_mut().zip(&gids) {
                local.commit_native(gid)?;
            }
            let end = Instant::now();
            count(
                &mut out,
                end.saturating_duration_since(committing),
                end.saturating_duration_since(begun),
                progress,
            );
        }
        Ok(())
    })();
    if outcome.is_err() {
        for (local, gid) in locals.iter_mut().zip(&gids) {
            local.abandon_native(gid);
        }
    }
    outcome.map(|()| out)
}

/// One 2PC run: a coordinator over a fresh log in `dir`, `threads` sessions on it. Also
/// returns the log's synced writes and their times during the run.
fn two_phase_run(
    spec: &RmBenchSpec,
    dbs: [&dyn Database; 2],
    threads: usize,
    dir: &std::path::Path,
    progress: &ProgressBar,
) -> Result<(ThreadOut, Duration, LogUse), BenchError> {
    let config = LogConfig::new(dir, spec.engine, SyncPolicy::from_rpo_ms(spec.rpo_ms));
    let log: Arc<dyn Log> = Arc::from(
        decree_log::open(&config)
            .map_err(|source| BenchError::EngineUnavailable { engine: spec.engine.name().into(), source })?,
    );
    let factories = dbs.iter().map(|db| db.rm_factory()).collect();
    let tm = TransactionManager::embedded(
        log.clone(),
        TmConfig { node: spec.node, branch_calls: spec.branch_calls, ..TmConfig::default() },
        factories,
    )
    .map_err(|e| db_error("starting the coordinator", e))?;
    let log_before = LogUse::of(&*log);
    let (out, elapsed) = run_threads(threads, |index, start, failed| {
        two_phase_loop(spec, &tm, dbs, index, start, failed, progress)
    })?;
    let used = LogUse::of(&*log).since(&log_before);
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
    Ok((out, elapsed, used))
}

/// One thread of the 2PC mode: a TX context over one connection to each database.
fn two_phase_loop(
    spec: &RmBenchSpec,
    tm: &Arc<TransactionManager>,
    dbs: [&dyn Database; 2],
    index: usize,
    start: Instant,
    failed: &AtomicBool,
    progress: &ProgressBar,
) -> Result<ThreadOut, BenchError> {
    let (rm_a, update_a) = dbs[0].branch()?;
    let (rm_b, update_b) = dbs[1].branch()?;
    let mut updates = [update_a, update_b];
    let mut tx = TxContext::open(tm, vec![rm_a, rm_b]).map_err(|e| db_error("tx_open", e))?;
    let mut rng = thread_rng(spec, index);
    let mut out = ThreadOut::default();
    let outcome = (|| {
        while more(spec.stop, out.transfers, start, failed) {
            let ids = ids(&mut rng, spec.accounts);
            let begun = Instant::now();
            tx.begin().map_err(|e| db_error("tx_begin", e))?;
            for ((update, id), side) in updates.iter_mut().zip(ids).zip(Side::BOTH) {
                one_row(update.update(id)?, side, id)?;
            }
            let committing = Instant::now();
            let report = tx.commit().map_err(|e| db_error("tx_commit", e))?;
            let end = Instant::now();
            if report.kind != CommitKind::TwoPhase {
                return Err(db_error(
                    "tx_commit",
                    format!("took the {:?} path, expected two-phase", report.kind),
                ));
            }
            count(
                &mut out,
                end.saturating_duration_since(committing),
                end.saturating_duration_since(begun),
                progress,
            );
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
        "{:>7} {:<12} {:>10} {:>10} {:>9} {:>9} {:>9} {:>12} {:>12} {:>12} {:>13} {:>6}\n{}",
        "threads",
        "mode",
        "transfers",
        "tps",
        "p50_us",
        "p95_us",
        "p99_us",
        "xfer_p50_us",
        "xfer_p99_us",
        "cpu_us/xfer",
        "host_us/xfer",
        "steal%",
        "-".repeat(131)
    )
}

/// One table row (commit latency percentiles, then the whole transfer's), followed for a
/// 2PC run by what its decisions cost the disk.
pub fn table_row(p: &RmPoint) -> String {
    let unknown = || "-".to_string();
    let mut row = format!(
        "{:>7} {:<12} {:>10} {:>10.1} {:>9.1} {:>9.1} {:>9.1} {:>12.1} {:>12.1} {:>12.1} {:>13} {:>6}",
        p.threads,
        p.mode,
        p.transfers,
        p.tps,
        p.p50_us,
        p.p95_us,
        p.p99_us,
        p.transfer_p50_us,
        p.transfer_p99_us,
        p.cpu_us_per_transfer,
        p.host_cpu_us_per_transfer.map_or_else(unknown, |us| format!("{us:.1}")),
        p.steal_pct.map_or_else(unknown, |pct| format!("{pct:.1}")),
    );
    if let Some(writes) = &p.log_writes {
        let _ = write!(row, "\n{:>7} {:<12} {}", "", "  log", writes.describe("transfer"));
    }
    row
}

/// The ratio lines under a thread count's three rows.
pub fn ratio_line(r: &RmRatio) -> String {
    format!(
        "{:>7} {:<12} native-2pc/independent tps = {:.2}x: the databases' own price, the ceiling\n\
         {:>7} {:<12} 2pc/independent tps = {:.2}x ({:.2} of the native ceiling), CPU per transfer = {:.2}x \
         (application) {:.2}x (machine)",
        r.threads,
        "ceiling",
        r.native_ratio,
        r.threads,
        "ratio",
        r.ratio,
        r.of_native,
        r.cpu_ratio,
        r.host_cpu_ratio
    )
}

/// The summary line under a thread count's rounds.
pub fn summary_line(s: &RmSummary) -> String {
    format!(
        "{:>7} {:<12} 2pc/independent tps over {} rounds: median {:.2}x (lowest {:.2}x, highest {:.2}x); \
         medians: native ceiling {:.2}x, {:.2} of it, machine CPU per transfer {:.2}x",
        s.threads,
        "median",
        s.rounds,
        s.ratio_median,
        s.ratio_min,
        s.ratio_max,
        s.native_ratio_median,
        s.of_native_median,
        s.host_cpu_ratio_median
    )
}

/// One JSON line for a summary.
pub fn summary_json(s: &RmSummary) -> String {
    serde_json::to_string(s).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
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
            kind: DbKind::Postgres,
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
            branch_calls: BranchCalls::Auto,
            rounds: 1,
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
            RmBenchSpec { rounds: 0, ..spec() },
            RmBenchSpec { rounds: ROUNDS_MAX + 1, ..spec() },
            RmBenchSpec { kind: DbKind::MariaDb, table: "a-b".into(), ..spec() },
        ];
        for s in bad {
            assert!(matches!(check(&s), Err(BenchError::Option(_))), "{s:?} accepted");
        }
    }

    #[test]
    fn a_dsn_of_the_wrong_kind_is_refused_before_connecting() {
        let err = open(DbKind::MariaDb, Side::B, "host=127.0.0.1 user=x", "t").err().expect("not a URL");
        assert!(err.to_string().contains("database B"), "{err}");
        let err = open(DbKind::Postgres, Side::A, "host=x port=notaport", "t").err().expect("bad port");
        assert!(err.to_string().contains("database A"), "{err}");
    }

    #[test]
    fn sides_debit_a_and_credit_b() {
        assert_eq!(Side::BOTH.map(Side::operator), ['-', '+']);
        assert_eq!(Side::BOTH.map(Side::verb), ["debit", "credit"]);
        assert_ne!(Side::A.rm_name(), Side::B.rm_name(), "recovery tells the two RMs apart by name");
    }

    #[test]
    fn totals_must_balance() {
        assert!(check_totals(RmMode::TwoPhase, 1, (100, 50), (90, 60), 10).is_ok());
        assert!(check_totals(RmMode::TwoPhase, 1, (100, 50), (90, 59), 10).is_err(), "lost a credit");
        assert!(check_totals(RmMode::Independent, 1, (100, 50), (91, 59), 10).is_err(), "miscounted");
    }

    #[test]
    fn rounds_rotate_the_modes_and_summarise_to_medians() {
        let orders: Vec<[usize; 3]> = (0..4).map(round_order).collect();
        assert_eq!(orders, vec![[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]);
        for place in 0..3 {
            let firsts: Vec<usize> = (0..3).map(|r| round_order(r)[place]).collect();
            assert_eq!(firsts.iter().copied().collect::<std::collections::BTreeSet<_>>().len(), 3);
        }
        let round = |n: usize, ratio: f64, native: f64| RmRatio {
            threads: 16,
            round: n,
            ratio,
            native_ratio: native,
            of_native: ratio / native,
            cpu_ratio: 2.0,
            host_cpu_ratio: 1.0 / ratio,
        };
        assert!(RmSummary::of(&[]).is_none());
        let odd =
            RmSummary::of(&[round(1, 0.40, 0.6), round(2, 0.55, 0.7), round(3, 0.50, 0.5)]).expect("some");
        assert_eq!((odd.threads, odd.rounds), (16, 3));
        assert_eq!((odd.ratio_median, odd.ratio_min, odd.ratio_max), (0.50, 0.40, 0.55));
        assert_eq!(odd.native_ratio_median, 0.6);
        assert_eq!(odd.host_cpu_ratio_median, 1.0 / 0.50);
        let even = RmSummary::of(&[round(1, 0.40, 0.6), round(2, 0.60, 0.7)]).expect("some");
        assert!((even.ratio_median - 0.50).abs() < 1e-12, "{even:?}");
        let line = summary_line(&odd);
        assert!(line.contains("over 3 rounds: median 0.50x (lowest 0.40x, highest 0.55x)"), "{line}");
        let v: serde_json::Value = serde_json::from_str(&summary_json(&odd)).expect("JSON");
        assert_eq!((v["rounds"].as_u64(), v["ratio_median"].as_f64()), (Some(3), Some(0.5)));
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
            cpu_us_per_transfer: 6.0,
            host_cpu_us_per_transfer: Some(12.5),
            steal_pct: None,
            log_writes: Some(LogWrites {
                log_writes_per_commit: 0.75,
                log_write_p50_us: Some(180),
                log_write_p95_us: Some(320),
            }),
        };
        let v: serde_json::Value = serde_json::from_str(&point_json(&p)).expect("valid JSON");
        assert_eq!(v["log_writes_per_commit"].as_f64(), Some(0.75));
        assert_eq!(v["host_cpu_us_per_transfer"].as_f64(), Some(12.5));
        assert!(v["steal_pct"].is_null(), "unknown steal is null: {v}");
        assert!(
            table_row(&p).lines().next().is_some_and(|l| l.ends_with("6.0          12.5      -")),
            "{p:?}"
        );
        assert!(table_row(&p)
            .ends_with("0.75 synced log writes per transfer, each p50 180 / p95 320 us under this load"));
        let independent = RmPoint { mode: RmMode::Independent.name(), log_writes: None, ..p.clone() };
        assert!(serde_json::from_str::<serde_json::Value>(&point_json(&independent))
            .expect("JSON")
            .get("log_writes_per_commit")
            .is_none());
        assert!(!table_row(&independent).contains('\n'), "one line for a run without a log");
        for key in ["threads", "mode", "tps", "p50_us", "p95_us", "p99_us"] {
            assert!(v.get(key).is_some(), "{key} missing in {v}");
        }
        assert_eq!(v["mode"], "2pc");
        let ratio = RmRatio {
            threads: 4,
            round: 1,
            ratio: 0.5,
            cpu_ratio: 2.25,
            native_ratio: 0.625,
            of_native: 0.8,
            host_cpu_ratio: 1.5,
        };
        let r: serde_json::Value = serde_json::from_str(&ratio_json(&ratio)).expect("valid JSON");
        assert_eq!((r["ratio"].as_f64(), r["cpu_ratio"].as_f64()), (Some(0.5), Some(2.25)));
        assert_eq!((r["native_ratio"].as_f64(), r["of_native"].as_f64()), (Some(0.625), Some(0.8)));
        assert_eq!(r["host_cpu_ratio"].as_f64(), Some(1.5));
        let line = ratio_line(&ratio);
        assert!(line.contains("native-2pc/independent tps = 0.62x"), "{line}");
        assert!(
            line.ends_with(
                "tps = 0.50x (0.80 of the native ceiling), CPU per transfer = 2.25x (application) 1.50x (machine)"
            ),
            "{line}"
        );
    }
}
