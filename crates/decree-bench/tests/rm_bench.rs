//! The real-database benchmark against the throwaway PostgreSQL and MariaDB of
//! `scripts/test-dbs.sh`.
//!
//! For each kind, a tiny run (1 and 2 threads, 20 transfers each) must run all three modes
//! (independent, native two-phase, decree 2PC), move exactly one unit from A to B per
//! transfer counted (so the total over both databases is unchanged), report the ratios per
//! thread count and leave no decree branch and no native prepared transaction behind, as
//! seen by this test's own queries. The checks must also be able to fail: a
//! branch of the benchmark's node planted (prepared) before the run must make it fail
//! after its first 2PC run. Each test uses tables of its own, so that parallel runs and
//! other suites sharing the databases do not disturb the totals.

use decree_bench::rm_bench::{self, DbKind, RmBenchSpec, RmStep, Side};
use decree_bench::tx::Stop;
use decree_core::{BranchCalls, Origin, Xid};
use decree_log::EngineKind;
use indicatif::ProgressBar;
use mysql::prelude::Queryable;
use std::path::Path;

const PG_A: &str = "DECREE_TEST_PG_A";
const PG_B: &str = "DECREE_TEST_PG_B";
const MARIADB_A: &str = "DECREE_TEST_MARIADB";
const MARIADB_B: &str = "DECREE_TEST_MARIADB_B";
const TRANSFERS_PER_THREAD: u64 = 20;

/// The DSNs of the test databases of `kind`, or None (a skip) outside CI when they are
/// not set.
fn dsns(kind: DbKind) -> Option<(String, String)> {
    let (var_a, var_b) = match kind {
        DbKind::Postgres => (PG_A, PG_B),
        DbKind::MariaDb => (MARIADB_A, MARIADB_B),
    };
    match (std::env::var(var_a), std::env::var(var_b)) {
        (Ok(a), Ok(b)) if !a.is_empty() && !b.is_empty() => Some((a, b)),
        _ => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{var_a} and {var_b} must be set in CI (scripts/test-dbs.sh start; eval \"$(scripts/test-dbs.sh env)\")"
            );
            println!("skipped: {var_a} and {var_b} are not set; run scripts/test-dbs.sh start");
            None
        }
    }
}

/// A table name of this test run's own.
fn unique_table(tag: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_nanos();
    format!("decree_bench_{tag}{}_{}", std::process::id(), nanos % 1_000_000)
}

/// A short run's spec; its logs go under `dir` (one per test: tests run in parallel).
/// The branches are called in parallel, so that the helper threads meet real databases
/// whatever the machine's load (the automatic policy would go sequential on a busy one).
fn spec(kind: DbKind, dsn_a: &str, dsn_b: &str, table: &str, threads: Vec<usize>, dir: &Path) -> RmBenchSpec {
    RmBenchSpec {
        kind,
        dsn_a: dsn_a.into(),
        dsn_b: dsn_b.into(),
        table: table.into(),
        accounts: 100,
        threads,
        stop: Stop::Cycles(TRANSFERS_PER_THREAD),
        engine: EngineKind::Journal,
        rpo_ms: 0,
        dir: dir.to_path_buf(),
        seed: 7,
        node: rm_bench::node_id(),
        branch_calls: BranchCalls::Parallel,
        rounds: 1,
        connect: None,
    }
}

/// Runs SQL statements on one database of `kind`, outside the benchmark's code.
fn execute(kind: DbKind, dsn: &str, sql: &str) {
    match kind {
        DbKind::Postgres => {
            let mut client = postgres::Client::connect(dsn, postgres::NoTls).expect("connect");
            client.batch_execute(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
        DbKind::MariaDb => {
            let mut conn = mysql::Conn::new(mysql::Opts::from_url(dsn).expect("DSN")).expect("connect");
            conn.query_drop(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
    }
}

/// Names of prepared transactions of the native mode of `node` seen by one database.
fn native_prepared_of(kind: DbKind, dsn: &str, node: u32) -> Vec<String> {
    let prefix = format!("decree-bench-native-{node:08x}-");
    let names: Vec<String> = match kind {
        DbKind::Postgres => {
            let mut client = postgres::Client::connect(dsn, postgres::NoTls).expect("connect");
            let rows = client.query("SELECT gid FROM pg_prepared_xacts", &[]).expect("list prepared");
            rows.iter().map(|row| row.get::<_, String>(0)).collect()
        }
        DbKind::MariaDb => {
            let mut conn = mysql::Conn::new(mysql::Opts::from_url(dsn).expect("DSN")).expect("connect");
            let rows: Vec<(i32, usize, usize, Vec<u8>)> = conn.query("XA RECOVER").expect("XA RECOVER");
            rows.iter().map(|(_, _, _, data)| String::from_utf8_lossy(data).into_owned()).collect()
        }
    };
    names.into_iter().filter(|name| name.starts_with(&prefix)).collect()
}

/// Prepared decree branches of `node` seen by one database, read here with the test's own
/// query rather than the benchmark's.
fn prepared_of(kind: DbKind, dsn: &str, node: u32) -> Vec<Xid> {
    let xids: Vec<Xid> = match kind {
        DbKind::Postgres => {
            let mut client = postgres::Client::connect(dsn, postgres::NoTls).expect("connect");
            let rows = client
                .query("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()", &[])
                .expect("list prepared");
            rows.iter().filter_map(|row| Xid::from_gid(&row.get::<_, String>(0)).ok()).collect()
        }
        DbKind::MariaDb => {
            let mut conn = mysql::Conn::new(mysql::Opts::from_url(dsn).expect("DSN")).expect("connect");
            let rows: Vec<(i32, usize, usize, Vec<u8>)> = conn.query("XA RECOVER").expect("XA RECOVER");
            rows.iter()
                .filter(|(_, g, b, data)| g + b == data.len())
                .filter_map(|(f, g, _, data)| Xid::new(*f, &data[..*g], &data[*g..]).ok())
                .collect()
        }
    };
    xids.into_iter().filter(|x| x.origin().is_some_and(|o| o.node == node)).collect()
}

fn all_modes_transfer_and_nothing_is_left_prepared(kind: DbKind) {
    let Some((dsn_a, dsn_b)) = dsns(kind) else { return };
    let table = unique_table("t");
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = RmBenchSpec { rounds: 2, ..spec(kind, &dsn_a, &dsn_b, &table, vec![1, 2], dir.path()) };
    // Setup is idempotent: running it first and again inside run_all changes nothing.
    rm_bench::setup(kind, Side::A, &dsn_a, &table, spec.accounts).expect("setup A");
    rm_bench::setup(kind, Side::B, &dsn_b, &table, spec.accounts).expect("setup B");
    rm_bench::setup(kind, Side::B, &dsn_b, &table, spec.accounts).expect("setup B again");
    let total = |side, dsn: &str| rm_bench::total(kind, side, dsn, &table);
    let start = (total(Side::A, &dsn_a).expect("A"), total(Side::B, &dsn_b).expect("B"));
    let expected_start = i64::from(spec.accounts) * rm_bench::BALANCE_START;
    assert_eq!(start, (expected_start, expected_start));

    let mut steps = Vec::new();
    let outcome = rm_bench::run_all(&spec, &ProgressBar::hidden(), |step| steps.push(step));
    let end = (total(Side::A, &dsn_a), total(Side::B, &dsn_b));
    execute(kind, &dsn_a, &format!("DROP TABLE IF EXISTS {table}"));
    execute(kind, &dsn_b, &format!("DROP TABLE IF EXISTS {table}"));
    let points = outcome.expect("the benchmark runs and its checks pass");
    let end = (end.0.expect("A after"), end.1.expect("B after"));

    assert_eq!(points.len(), 12, "three modes per round, two rounds per thread count: {points:?}");
    let mut moved = 0;
    // The second round of each thread count starts one mode further.
    let round_one = ["independent", "native-2pc", "2pc"];
    let round_two = ["native-2pc", "2pc", "independent"];
    let expected = [1, 2].into_iter().flat_map(|t| round_one.iter().chain(&round_two).map(move |&m| (t, m)));
    for (p, (threads, mode)) in points.iter().zip(expected) {
        assert_eq!((p.threads, p.mode), (threads, mode));
        assert_eq!(p.transfers, TRANSFERS_PER_THREAD * threads as u64, "{p:?}");
        assert!(p.tps > 0.0 && p.p50_us > 0.0 && p.p99_us >= p.p50_us, "{p:?}");
        // The kernel accounts CPU time in ticks: a short run may show none, never less.
        assert!(p.cpu_us_per_transfer.is_finite() && p.cpu_us_per_transfer >= 0.0, "{p:?}");
        // The machine ran at least this process (and on Linux its counters are readable).
        let host = p.host_cpu_us_per_transfer.expect("/proc/stat read on Linux");
        assert!(host.is_finite() && host >= 0.0, "{p:?}");
        moved += p.transfers as i64;
    }
    assert_eq!(end.0 + end.1, start.0 + start.1, "the total over both databases is unchanged");
    assert_eq!((end.0, end.1), (start.0 - moved, start.1 + moved), "one unit moved per transfer");
    let ratios: Vec<_> =
        steps.iter().filter_map(|s| if let RmStep::Ratio(r) = s { Some(r.clone()) } else { None }).collect();
    assert_eq!(
        ratios.iter().map(|r| (r.threads, r.round)).collect::<Vec<_>>(),
        vec![(1, 1), (1, 2), (2, 1), (2, 2)]
    );
    let durability: Vec<_> = steps
        .iter()
        .filter_map(|s| if let RmStep::Durability(d) = s { Some(d.clone()) } else { None })
        .collect();
    assert_eq!(durability.iter().map(|d| d.side).collect::<Vec<_>>(), vec!["A", "B"], "{durability:?}");
    if kind == DbKind::Postgres {
        // Read here with the test's own query: the verdict must follow the server's settings.
        let mut client = postgres::Client::connect(&dsn_a, postgres::NoTls).expect("connect");
        let row = client
            .query_one("SELECT current_setting('fsync'), current_setting('synchronous_commit')", &[])
            .expect("settings");
        let (fsync, sync_commit): (String, String) = (row.get(0), row.get(1));
        assert_eq!(durability[0].durable, fsync == "on" && sync_commit != "off", "{durability:?}");
        assert!(durability[0].settings.contains(&format!("fsync={fsync}")), "{durability:?}");
    }
    let summaries: Vec<_> = steps
        .iter()
        .filter_map(|s| if let RmStep::Summary(x) = s { Some(x.clone()) } else { None })
        .collect();
    assert_eq!(summaries.iter().map(|x| (x.threads, x.rounds)).collect::<Vec<_>>(), vec![(1, 2), (2, 2)]);
    for (x, pair) in summaries.iter().zip(ratios.chunks(2)) {
        let (low, high) = (pair[0].ratio.min(pair[1].ratio), pair[0].ratio.max(pair[1].ratio));
        assert_eq!((x.ratio_min, x.ratio_max), (low, high), "{x:?}");
        assert!((x.ratio_median - (low + high) / 2.0).abs() < 1e-9, "{x:?}");
    }
    for r in &ratios {
        assert!(r.ratio > 0.0 && r.native_ratio > 0.0, "{r:?}");
        assert!((r.of_native - r.ratio / r.native_ratio).abs() < 1e-9, "{r:?}");
    }
    // Other suites may hold prepared branches of their own: only this run's node counts.
    for dsn in [&dsn_a, &dsn_b] {
        let ours = prepared_of(kind, dsn, spec.node);
        assert!(ours.is_empty(), "left prepared: {ours:?}");
        let native = native_prepared_of(kind, dsn, spec.node);
        assert!(native.is_empty(), "native transactions left prepared: {native:?}");
    }
}

#[test]
fn postgres_all_modes_transfer_and_nothing_is_left_prepared() {
    all_modes_transfer_and_nothing_is_left_prepared(DbKind::Postgres);
}

#[test]
fn mariadb_all_modes_transfer_and_nothing_is_left_prepared() {
    all_modes_transfer_and_nothing_is_left_prepared(DbKind::MariaDb);
}

/// Prepares a branch of `node` that changed one row of `scratch`, on a connection that is
/// then closed (so that any connection can roll it back). A future incarnation keeps the
/// benchmark's coordinator from rolling it back at start, as it would a dead one's.
fn plant_prepared_branch(kind: DbKind, dsn: &str, node: u32, scratch: &str) -> Xid {
    let origin = Origin { node, incarnation: u64::MAX, session: 1, sequence: 1 };
    let xid = Xid::decree(origin).branch(1);
    match kind {
        DbKind::Postgres => {
            execute(kind, dsn, &format!("CREATE TABLE {scratch} (id int PRIMARY KEY)"));
            let gid = xid.to_gid();
            execute(
                kind,
                dsn,
                &format!("BEGIN; INSERT INTO {scratch} VALUES (1); PREPARE TRANSACTION '{gid}'"),
            );
        }
        DbKind::MariaDb => {
            execute(kind, dsn, &format!("CREATE TABLE {scratch} (id INT PRIMARY KEY) ENGINE=InnoDB"));
            let x = decree_rm::mariadb::xid_sql(&xid).expect("decree format id is positive");
            execute(
                kind,
                dsn,
                &format!("XA START {x}; INSERT INTO {scratch} VALUES (1); XA END {x}; XA PREPARE {x}"),
            );
        }
    }
    xid
}

fn remove_planted_branch(kind: DbKind, dsn: &str, xid: &Xid, scratch: &str) {
    match kind {
        DbKind::Postgres => execute(kind, dsn, &format!("ROLLBACK PREPARED '{}'", xid.to_gid())),
        DbKind::MariaDb => {
            let x = decree_rm::mariadb::xid_sql(xid).expect("decree format id is positive");
            execute(kind, dsn, &format!("XA ROLLBACK {x}"));
        }
    }
    execute(kind, dsn, &format!("DROP TABLE {scratch}"));
}

fn a_prepared_branch_of_the_node_fails_the_run(kind: DbKind) {
    let Some((dsn_a, dsn_b)) = dsns(kind) else { return };
    let table = unique_table("p");
    let scratch = format!("{table}_planted");
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = RmBenchSpec {
        branch_calls: BranchCalls::Sequential,
        ..spec(kind, &dsn_a, &dsn_b, &table, vec![1], dir.path())
    };
    let planted = plant_prepared_branch(kind, &dsn_b, spec.node, &scratch);
    let mut steps = Vec::new();
    let outcome = rm_bench::run_all(&spec, &ProgressBar::hidden(), |step| steps.push(step));
    let still_there = prepared_of(kind, &dsn_b, spec.node);
    remove_planted_branch(kind, &dsn_b, &planted, &scratch);
    execute(kind, &dsn_a, &format!("DROP TABLE IF EXISTS {table}"));
    execute(kind, &dsn_b, &format!("DROP TABLE IF EXISTS {table}"));

    assert_eq!(still_there, vec![planted], "the planted branch, and only it, was left prepared");
    let err = outcome.expect_err("a prepared branch of the node must fail the check");
    let message = err.to_string();
    assert!(message.contains("left prepared") && message.contains(&planted.to_string()), "{message}");
    assert!(message.contains("after the independent run"), "checked after the first run: {message}");
    let runs = steps.iter().filter(|s| matches!(s, RmStep::Measured(_) | RmStep::Ratio(_))).count();
    assert_eq!(runs, 0, "no run reported before the failed check: {steps:?}");
}

#[test]
fn postgres_a_prepared_branch_of_the_node_fails_the_run() {
    a_prepared_branch_of_the_node_fails_the_run(DbKind::Postgres);
}

#[test]
fn mariadb_a_prepared_branch_of_the_node_fails_the_run() {
    a_prepared_branch_of_the_node_fails_the_run(DbKind::MariaDb);
}

#[test]
fn an_unreachable_database_is_an_error_not_a_hang() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (kind, dsn) in [
        (DbKind::Postgres, "host=127.0.0.1 port=1 user=nobody dbname=none connect_timeout=2"),
        (DbKind::MariaDb, "mysql://nobody@127.0.0.1:1/none"),
    ] {
        let spec = RmBenchSpec {
            kind,
            dsn_a: dsn.into(),
            dsn_b: dsn.into(),
            table: rm_bench::TABLE_DEFAULT.into(),
            accounts: 10,
            threads: vec![1],
            stop: Stop::Cycles(1),
            engine: EngineKind::Journal,
            rpo_ms: 0,
            dir: dir.path().to_path_buf(),
            seed: 1,
            node: rm_bench::node_id(),
            branch_calls: BranchCalls::Auto,
            rounds: 1,
            connect: None,
        };
        let err =
            rm_bench::run_all(&spec, &ProgressBar::hidden(), |_| {}).expect_err("nothing listens on port 1");
        assert!(err.to_string().contains("connecting to database A"), "{kind:?}: {err}");
    }
}
