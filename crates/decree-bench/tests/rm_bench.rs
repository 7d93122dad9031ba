//! The real-database benchmark against the throwaway PostgreSQL of `scripts/test-dbs.sh`.
//!
//! A tiny run (1 and 2 threads, 20 transfers each) must run both modes, move exactly one
//! unit from A to B per transfer counted (so the total over both databases is unchanged),
//! and leave no decree branch prepared. Each test run uses a table of its own, so that
//! parallel runs and other suites sharing the databases do not disturb the totals.

use decree_bench::rm_bench::{self, RmBenchSpec, RmStep};
use decree_bench::tx::Stop;
use decree_core::Xid;
use decree_log::EngineKind;
use indicatif::ProgressBar;

const PG_A: &str = "DECREE_TEST_PG_A";
const PG_B: &str = "DECREE_TEST_PG_B";
const TRANSFERS_PER_THREAD: u64 = 20;

/// The DSNs of the test databases, or None (a skip) outside CI when they are not set.
fn dsns() -> Option<(String, String)> {
    match (std::env::var(PG_A), std::env::var(PG_B)) {
        (Ok(a), Ok(b)) if !a.is_empty() && !b.is_empty() => Some((a, b)),
        _ => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{PG_A} and {PG_B} must be set in CI (scripts/test-dbs.sh start; eval \"$(scripts/test-dbs.sh env)\")"
            );
            println!("skipped: run scripts/test-dbs.sh start");
            None
        }
    }
}

fn drop_table(dsn: &str, table: &str) {
    let mut client = postgres::Client::connect(dsn, postgres::NoTls).expect("connect for cleanup");
    client.batch_execute(&format!("DROP TABLE IF EXISTS {table}")).expect("drop the test table");
}

#[test]
fn both_modes_transfer_and_nothing_is_left_prepared() {
    let Some((dsn_a, dsn_b)) = dsns() else { return };
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_nanos();
    let table = format!("decree_bench_t{}_{}", std::process::id(), nanos % 1_000_000);
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = RmBenchSpec {
        dsn_a: dsn_a.clone(),
        dsn_b: dsn_b.clone(),
        table: table.clone(),
        accounts: 100,
        threads: vec![1, 2],
        stop: Stop::Cycles(TRANSFERS_PER_THREAD),
        engine: EngineKind::Journal,
        rpo_ms: 0,
        dir: dir.path().to_path_buf(),
        seed: 7,
        node: rm_bench::node_id(),
    };
    // Setup is idempotent: running it first and again inside run_all changes nothing.
    rm_bench::setup(&dsn_a, &table, spec.accounts).expect("setup A");
    rm_bench::setup(&dsn_b, &table, spec.accounts).expect("setup B");
    let start = (rm_bench::total(&dsn_a, &table).expect("A"), rm_bench::total(&dsn_b, &table).expect("B"));
    let expected_start = i64::from(spec.accounts) * rm_bench::BALANCE_START;
    assert_eq!(start, (expected_start, expected_start));

    let mut steps = Vec::new();
    let outcome = rm_bench::run_all(&spec, &ProgressBar::hidden(), |step| steps.push(step));
    let end = (rm_bench::total(&dsn_a, &table), rm_bench::total(&dsn_b, &table));
    drop_table(&dsn_a, &table);
    drop_table(&dsn_b, &table);
    let points = outcome.expect("the benchmark runs and its checks pass");
    let end = (end.0.expect("A after"), end.1.expect("B after"));

    assert_eq!(points.len(), 4, "two modes per thread count: {points:?}");
    let mut moved = 0;
    for (p, (threads, mode)) in
        points.iter().zip([(1, "independent"), (1, "2pc"), (2, "independent"), (2, "2pc")])
    {
        assert_eq!((p.threads, p.mode), (threads, mode));
        assert_eq!(p.transfers, TRANSFERS_PER_THREAD * threads as u64, "{p:?}");
        assert!(p.tps > 0.0 && p.p50_us > 0.0 && p.p99_us >= p.p50_us, "{p:?}");
        moved += p.transfers as i64;
    }
    assert_eq!(end.0 + end.1, start.0 + start.1, "the total over both databases is unchanged");
    assert_eq!((end.0, end.1), (start.0 - moved, start.1 + moved), "one unit moved per transfer");
    let ratios: Vec<usize> =
        steps.iter().filter_map(|s| if let RmStep::Ratio(r) = s { Some(r.threads) } else { None }).collect();
    assert_eq!(ratios, vec![1, 2]);
    // Other suites may hold prepared branches of their own: only this run's node counts.
    for dsn in [&dsn_a, &dsn_b] {
        let mut client = postgres::Client::connect(dsn, postgres::NoTls).expect("connect");
        let rows = client
            .query(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND gid LIKE 'decree:%'",
                &[],
            )
            .expect("list prepared");
        let ours: Vec<String> = rows
            .iter()
            .map(|row| row.get::<_, String>(0))
            .filter(|gid| {
                Xid::from_gid(gid).ok().and_then(|x| x.origin()).is_some_and(|o| o.node == spec.node)
            })
            .collect();
        assert!(ours.is_empty(), "left prepared: {ours:?}");
    }
}

#[test]
fn an_unreachable_database_is_an_error_not_a_hang() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = RmBenchSpec {
        dsn_a: "host=127.0.0.1 port=1 user=nobody dbname=none connect_timeout=2".into(),
        dsn_b: "host=127.0.0.1 port=1 user=nobody dbname=none connect_timeout=2".into(),
        table: rm_bench::TABLE_DEFAULT.into(),
        accounts: 10,
        threads: vec![1],
        stop: Stop::Cycles(1),
        engine: EngineKind::Journal,
        rpo_ms: 0,
        dir: dir.path().to_path_buf(),
        seed: 1,
        node: rm_bench::node_id(),
    };
    let err =
        rm_bench::run_all(&spec, &ProgressBar::hidden(), |_| {}).expect_err("nothing listens on port 1");
    assert!(err.to_string().contains("connecting to database"), "{err}");
}
