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
//! This file holds the spec, the result types and the runner (every thread count, round
//! and mode, with the invariants checked after each run). Its parts sit in one file per
//! job: what differs per kind of database is behind [`Database`] (`database.rs`), with one
//! file per kind ([`postgres`] and [`mariadb`]); `threads.rs` starts a run's threads and
//! merges what they measured; `local.rs` holds the two modes without decree and
//! `two_phase.rs` the decree mode; `checks.rs` the spec check and the invariants;
//! `report.rs` the table and the JSON lines.

mod checks;
mod database;
mod local;
mod mariadb;
mod postgres;
mod report;
mod threads;
mod two_phase;

pub use checks::check;
pub use database::{prepared_of_node, setup, total};
pub use report::{
    durability_json, durability_line, point_json, ratio_json, ratio_line, summary_json, summary_line,
    table_header, table_row,
};

use crate::host_cpu::HostCpu;
use crate::log_use::LogWrites;
use crate::tx::{fresh_dir, Stop};
use crate::BenchError;
use checks::{check_nothing_prepared, check_totals};
use database::{db_error, open, Database};
use decree_core::BranchCalls;
use decree_log::EngineKind;
use indicatif::ProgressBar;
use local::{independent_loop, native_loop};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;
use threads::run_threads;
use two_phase::two_phase_run;

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
    /// The state server the 2PC runs send their decisions to (`unix:` or `tcp:`), instead of
    /// an embedded log: the reference for a client that must cross that socket (decree-jta).
    pub connect: Option<decree_client::Endpoint>,
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
    let mut node = spec.node;
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
            let (run, used) = outcome?;
            removed.map_err(|e| BenchError::io("cannot remove run directory", &dir, e))?;
            log_use = used;
            node = run.node;
            (run.out, run.elapsed)
        }
    };
    let cpu = process_cpu().saturating_sub(cpu_before);
    let host = host_before.zip(HostCpu::now()).map(|(before, now)| now.since(&before));
    let after = (dbs[0].total()?, dbs[1].total()?);
    check_totals(mode, threads, before, after, out.transfers)?;
    check_nothing_prepared(dbs, node, mode, threads)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sides_debit_a_and_credit_b() {
        assert_eq!(Side::BOTH.map(Side::operator), ['-', '+']);
        assert_eq!(Side::BOTH.map(Side::verb), ["debit", "credit"]);
        assert_ne!(Side::A.rm_name(), Side::B.rm_name(), "recovery tells the two RMs apart by name");
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
}
