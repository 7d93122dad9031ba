//! End-to-end runs of both benchmarks on real logs in temporary directories, small
//! enough for `cargo test`. They check that the counts add up and that the reports and
//! charts have the promised shape; they never assert on speed.

use decree_bench::chart;
use decree_bench::client::{Mode, Replicas};
use decree_bench::cpus::{cpus_of_this_thread, CpuPlacement};
use decree_bench::embedded::EmbeddedTarget;
use decree_bench::log_bench::{self, LogBenchSpec, LogPoint, LogStep, RAW_ENGINE};
use decree_bench::report;
use decree_bench::think::ThinkRange;
use decree_bench::tx::{self, BenchPoint, BenchSpec, RunSpec, Step, Stop};
use decree_client::ClientTlsFiles;
use decree_core::testing::DummyFactory;
use decree_log::{EngineKind, LogConfig, SyncPolicy};
use decree_server::testing::{TestCa, Validity};
use decree_server::{ServerConfig, TlsConfig};
use indicatif::ProgressBar;
use std::time::Duration;

fn bench_spec(dir: &std::path::Path, engines: Vec<EngineKind>, rpos_ms: Vec<u64>) -> BenchSpec {
    BenchSpec {
        engines,
        rpos_ms,
        threads: vec![2],
        stop: Stop::Cycles(20),
        t1: ThinkRange::ZERO,
        t2: ThinkRange::ZERO,
        rms: 2,
        modes: vec![Mode::Embedded],
        replicas: vec![Replicas::SINGLE],
        rounds: 1,
        dir: dir.to_path_buf(),
        seed: 1,
        connect: None,
        tls_files: ClientTlsFiles::default(),
        rate: None,
        cpus: CpuPlacement::Shared,
    }
}

fn run_bench(spec: &BenchSpec) -> (Vec<BenchPoint>, Vec<String>) {
    let (mut points, mut skipped) = (Vec::new(), Vec::new());
    tx::run_all(spec, &ProgressBar::hidden(), |step| match step {
        Step::Measured(p) => points.push(*p),
        Step::Skipped(s) => {
            assert!(!s.failed, "{s:?}");
            skipped.push(s.reason)
        }
        Step::Compared(_) => {}
    })
    .expect("benchmark runs");
    (points, skipped)
}

fn empty_dir(dir: &std::path::Path) -> bool {
    std::fs::read_dir(dir).map(|mut d| d.next().is_none()).unwrap_or(false)
}

#[test]
fn bench_two_threads_twenty_cycles_counts_add_up() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let (points, skipped) = run_bench(&bench_spec(dir.path(), vec![EngineKind::Volatile], vec![0]));
    assert!(skipped.is_empty(), "{skipped:?}");
    assert_eq!(points.len(), 1);
    let p = &points[0];
    assert_eq!((p.threads, p.cycles, p.rms), (2, 40, 2));
    assert!(p.tps > 0.0 && p.elapsed_s > 0.0);
    assert_eq!(p.series(), "volatile rpo=0ms");
    // Every summary is ordered, and the total is at least each of its parts.
    for s in [&p.open, &p.begin, &p.commit, &p.close, &p.total] {
        assert!(s.p25 <= s.p50 && s.p50 <= s.p75 && s.p75 <= s.p95 && s.p95 <= s.p99, "{s:?}");
        assert!(s.avg > 0.0 && s.stddev >= 0.0, "{s:?}");
    }
    assert!(p.total.avg >= p.commit.avg * 0.999);
    assert!(empty_dir(dir.path()), "run directories must be removed");
}

#[test]
fn run_records_one_sample_per_call_and_cycle() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let config = LogConfig::new(dir.path().join("log"), EngineKind::Volatile, SyncPolicy::Immediate);
    let target = EmbeddedTarget::open(&config, 2).unwrap();
    let spec = RunSpec {
        threads: 3,
        stop: Stop::Cycles(7),
        t1: ThinkRange::from_us(10, 30),
        t2: ThinkRange::from_us(10, 30),
        seed: 9,
        rate: None,
    };
    let result = tx::run(&target, &spec, &ProgressBar::hidden()).unwrap();
    assert_eq!(result.cycles, 21);
    let lat = &result.latencies;
    for count in
        [lat.open.count(), lat.begin.count(), lat.commit.count(), lat.close.count(), lat.total.count()]
    {
        assert_eq!(count, 21);
    }
    // Think times are excluded from latencies: the total is the sum of the four calls,
    // so its mean equals the sum of their means (within histogram rounding).
    let parts = lat.open.mean_us() + lat.begin.mean_us() + lat.commit.mean_us() + lat.close.mean_us();
    assert!((lat.total.mean_us() - parts).abs() <= parts * 0.01 + 0.01, "{} vs {parts}", lat.total.mean_us());
}

#[test]
fn duration_stop_counts_match() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let config = LogConfig::new(dir.path().join("log"), EngineKind::Volatile, SyncPolicy::Immediate);
    let target = EmbeddedTarget::open(&config, 3).unwrap();
    let spec = RunSpec {
        threads: 2,
        stop: Stop::Duration(Duration::from_millis(100)),
        t1: ThinkRange::ZERO,
        t2: ThinkRange::ZERO,
        seed: 1,
        rate: None,
    };
    let result = tx::run(&target, &spec, &ProgressBar::hidden()).unwrap();
    assert!(result.cycles > 0);
    assert_eq!(result.latencies.total.count(), result.cycles);
    assert!(result.elapsed >= Duration::from_millis(100));
}

#[test]
fn bad_thread_count_and_rms_are_errors() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let config = LogConfig::new(dir.path().join("log"), EngineKind::Volatile, SyncPolicy::Immediate);
    assert!(EmbeddedTarget::open(&config, 0).is_err());
    assert!(EmbeddedTarget::open(&config, 1000).is_err());
    let target = EmbeddedTarget::open(&config, 2).unwrap();
    let spec = RunSpec {
        threads: 0,
        stop: Stop::Cycles(1),
        t1: ThinkRange::ZERO,
        t2: ThinkRange::ZERO,
        seed: 1,
        rate: None,
    };
    assert!(tx::run(&target, &spec, &ProgressBar::hidden()).is_err());
    for broken in [
        BenchSpec { threads: vec![2, 0], ..bench_spec(dir.path(), vec![EngineKind::Volatile], vec![0]) },
        BenchSpec { rms: 0, ..bench_spec(dir.path(), vec![EngineKind::Volatile], vec![0]) },
        BenchSpec { stop: Stop::Cycles(0), ..bench_spec(dir.path(), vec![EngineKind::Volatile], vec![0]) },
    ] {
        let mut reported = 0;
        assert!(tx::run_all(&broken, &ProgressBar::hidden(), |_| reported += 1).is_err());
        assert_eq!(reported, 0, "a bad spec is rejected before any run");
    }
    let mut embedded_connect = bench_spec(dir.path(), vec![EngineKind::Volatile], vec![0]);
    embedded_connect.connect = Some("unix:/nonexistent.sock".into());
    let err = tx::run_all(&embedded_connect, &ProgressBar::hidden(), |_| {}).unwrap_err().to_string();
    assert!(err.contains("--connect needs --mode unix"), "{err}");
    let mut negative_rate = bench_spec(dir.path(), vec![EngineKind::Volatile], vec![0]);
    negative_rate.rate = Some(-5.0);
    let err = tx::run_all(&negative_rate, &ProgressBar::hidden(), |_| {}).unwrap_err().to_string();
    assert!(err.contains("--rate -5"), "{err}");
}

#[test]
fn bench_json_has_the_promised_shape() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let (points, _) = run_bench(&bench_spec(dir.path(), vec![EngineKind::Volatile], vec![0]));
    let line = report::bench_json(&points[0]);
    assert!(!line.contains('\n'));
    let value: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(value["threads"].as_u64(), Some(2));
    assert!(value["tps"].as_f64().is_some_and(|t| t > 0.0));
    assert_eq!(value["engine"].as_str(), Some("volatile"));
    assert_eq!(value["rpo_ms"].as_u64(), Some(0));
    assert_eq!(value["mode"].as_str(), Some("embedded"));
    for call in ["open", "begin", "commit", "close", "total"] {
        let summary = value[call].as_object().unwrap_or_else(|| panic!("{call} missing in {line}"));
        let mut keys: Vec<&str> = summary.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["avg", "p25", "p50", "p75", "p95", "p99", "stddev"], "{call}");
        assert!(summary.values().all(|v| v.is_f64()), "{call}: {line}");
    }
    let summary = report::bench_summary(&points);
    assert_eq!(summary.lines().count(), 2, "{summary}");
    assert!(summary.lines().nth(1).unwrap_or("").starts_with("volatile"), "{summary}");
    let block = report::bench_block(&points[0]);
    assert_eq!(block.lines().count(), 5);
    assert!(block.lines().last().unwrap_or("").contains("total"));
}

#[test]
fn charts_are_written_with_series_and_axes() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let mut spec = bench_spec(dir.path(), vec![EngineKind::Volatile], vec![0, 10]);
    spec.threads = vec![1, 2];
    spec.stop = Stop::Cycles(5);
    let (points, _) = run_bench(&spec);
    assert_eq!(points.len(), 4);
    let path = dir.path().join("curve.svg");
    let second = chart::write_charts(&path, "test", &points).unwrap();
    assert_eq!(second, dir.path().join("curve-percentiles.svg"));
    for (file, expected) in [
        (
            &path,
            vec![
                "volatile rpo=0ms",
                "volatile rpo=10ms",
                "transactions per second",
                "total latency p95 (ms)",
            ],
        ),
        (&second, vec!["volatile rpo=0ms p25", "volatile rpo=10ms p95", "threads", "total latency (ms)"]),
    ] {
        let svg = std::fs::read_to_string(file).unwrap();
        assert!(svg.trim_start().starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{file:?}");
        assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
        for text in expected {
            assert!(svg.contains(text), "{file:?} lacks {text:?}");
        }
    }
    assert!(chart::write_charts(&dir.path().join("empty.svg"), "t", &[]).is_err());
}

fn log_spec(dir: &std::path::Path, engines: Vec<EngineKind>) -> LogBenchSpec {
    LogBenchSpec {
        engines,
        threads: vec![1],
        rpos_ms: vec![0],
        duration: Duration::from_millis(200),
        record_bytes: 600,
        dir: dir.to_path_buf(),
        reference: true,
        raw_file_bytes: 1 << 20,
        direct_io: true,
    }
}

#[test]
fn bench_log_reference_then_engines() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let spec = log_spec(dir.path(), vec![EngineKind::Journal, EngineKind::Volatile]);
    assert_eq!(log_bench::run_count(&spec), 4, "two references, two engines");
    let (mut points, mut skipped): (Vec<LogPoint>, Vec<String>) = (Vec::new(), Vec::new());
    log_bench::run_all(&spec, &ProgressBar::hidden(), |step| match step {
        LogStep::Measured(p) => points.push(p),
        LogStep::Skipped(s) => {
            // Only an engine that cannot be opened yet may be skipped; a failed run is a bug.
            assert!(!s.failed, "{s:?}");
            skipped.push(format!("{}: {}", s.engine, s.reason))
        }
    })
    .unwrap();
    assert_eq!(points[0].engine, RAW_ENGINE, "the reference comes first");
    // The direct-write reference follows where the file system has O_DIRECT (not tmpfs).
    let direct = usize::from(points[1].engine == log_bench::RAW_DIRECT_ENGINE);
    // The journal is measured once it exists; until then it is skipped with the reason.
    let journal = points.iter().any(|p| p.engine == "journal");
    assert!(journal || skipped.iter().any(|s| s.starts_with("journal")), "{points:?} {skipped:?}");
    assert_eq!(points.len() + skipped.len(), 3 + direct, "{points:?} {skipped:?}");
    assert!(points.iter().any(|p| p.engine == "volatile"));
    let mut table = report::LogTable::default();
    for p in &points {
        assert_eq!((p.threads, p.rpo_ms), (1, 0));
        assert!(p.records_per_sec > 0.0, "{p:?}");
        assert!(
            p.p50_us > 0.0 && p.p50_us <= p.p95_us && p.p95_us <= p.p99_us && p.p99_us <= p.p999_us,
            "{p:?}"
        );
        let value: serde_json::Value = serde_json::from_str(&report::log_json(p)).unwrap();
        let mut keys: Vec<&str> = value.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            ["engine", "p50_us", "p95_us", "p999_us", "p99_us", "records_per_sec", "rpo_ms", "threads"]
        );
        assert!(value["engine"].is_string() && value["threads"].is_u64() && value["rpo_ms"].is_u64());
        assert!(value["records_per_sec"].is_f64() && value["p999_us"].is_f64());
        let row = table.row(p);
        assert!(row.ends_with('x'), "ratio column present: {row}");
    }
    assert!(empty_dir(dir.path()), "run directories must be removed");
}

#[test]
fn bench_log_rejects_bad_specs() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let mut spec = log_spec(dir.path(), vec![EngineKind::Volatile]);
    spec.record_bytes = 0;
    assert!(log_bench::run_all(&spec, &ProgressBar::hidden(), |_| {}).is_err());
    let mut spec = log_spec(dir.path(), vec![EngineKind::Volatile]);
    spec.threads = vec![0];
    assert!(log_bench::run_all(&spec, &ProgressBar::hidden(), |_| {}).is_err());
}

#[test]
fn state_server_modes_count_every_commit_on_the_server() {
    // run_all fails the run (a `failed` skip, which run_bench refuses) when the server's
    // metrics do not show exactly one decision and one completion per commit.
    let dir = tempfile::tempdir_in(".").unwrap();
    for mode in [Mode::Unix, Mode::Tcp, Mode::Tls] {
        let mut spec = bench_spec(dir.path(), vec![EngineKind::Journal], vec![0]);
        spec.modes = vec![mode];
        spec.stop = Stop::Cycles(10);
        let (points, skipped) = run_bench(&spec);
        assert!(skipped.is_empty(), "{skipped:?}");
        assert_eq!(points.len(), 1);
        assert_eq!((points[0].cycles, points[0].mode.as_str()), (20, mode.name()));
        // The connection times come with every state-server run; a resumed TLS session
        // only in the tls mode.
        let handshake = points[0].handshake.expect("connection times");
        assert_eq!(handshake.connections, decree_bench::handshake::HANDSHAKE_CONNECTIONS);
        assert!(handshake.connect.p50 > 0.0 && handshake.connect.p50 <= handshake.connect.p95);
        assert_eq!(handshake.resumed.is_some(), mode == Mode::Tls, "{mode}");
    }
}

#[test]
fn tls_server_given_by_address_with_the_clients_files() {
    // A TLS server of the test's own CA, the way an operator runs one; the bench reaches
    // it with --connect tls:... and the client's three files, and the server counts one
    // decision per commit.
    let dir = tempfile::tempdir_in(".").unwrap();
    let ca = TestCa::new("bench-test CA");
    let ca_file = ca.write_ca(&dir.path().join("ca.pem"));
    let server_files = ca.server(dir.path(), "server", Validity::Current);
    let client = ca.client(dir.path(), "bench", Validity::Current);
    let mut config = ServerConfig::new(dir.path().join("log"), EngineKind::Journal);
    config.tcp = Some("127.0.0.1:0".parse().unwrap());
    config.tls = Some(TlsConfig {
        cert: server_files.cert,
        key: server_files.key,
        client_ca: ca_file.clone(),
        clients_allowed: vec!["bench".into()],
    });
    let rms = vec![DummyFactory::named("dummy-0", 0).arc(), DummyFactory::named("dummy-1", 0).arc()];
    let server = decree_server::start(config, rms).expect("server starts");
    let mut spec = bench_spec(&dir.path().join("runs"), vec![EngineKind::Journal], vec![0]);
    std::fs::create_dir(&spec.dir).unwrap();
    spec.modes = vec![Mode::Tls];
    spec.stop = Stop::Cycles(10);
    spec.connect = Some(format!("tls:{}", server.tcp_addr().unwrap()));
    spec.tls_files = ClientTlsFiles { ca: Some(ca_file), cert: Some(client.cert), key: Some(client.key) };
    let (points, skipped) = run_bench(&spec);
    assert!(skipped.is_empty(), "{skipped:?}");
    assert_eq!((points[0].cycles, points[0].mode.as_str()), (20, "tls"));
    // Without the client's files the same address is refused before any run.
    spec.tls_files = ClientTlsFiles::default();
    let err = tx::run_all(&spec, &ProgressBar::hidden(), |_| {}).unwrap_err().to_string();
    assert!(err.contains("needs --tls-ca, --tls-cert and --tls-key"), "{err}");
    server.shutdown().expect("server stops");
}

#[test]
fn alternated_rounds_compare_every_mode_to_the_first() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let mut spec = bench_spec(dir.path(), vec![EngineKind::Volatile], vec![0]);
    spec.modes = vec![Mode::Tcp, Mode::Tls];
    spec.rounds = 2;
    spec.stop = Stop::Cycles(5);
    let mut steps = Vec::new();
    tx::run_all(&spec, &ProgressBar::hidden(), |step| steps.push(step)).expect("benchmark runs");
    let order: Vec<(String, usize)> = steps
        .iter()
        .filter_map(|s| if let Step::Measured(p) = s { Some((p.mode.clone(), p.round)) } else { None })
        .collect();
    let expected = [("tcp", 1), ("tls", 1), ("tls", 2), ("tcp", 2)];
    assert_eq!(order, expected.map(|(m, r)| (m.to_string(), r)), "the second round starts with tls");
    let summaries: Vec<_> =
        steps.iter().filter_map(|s| if let Step::Compared(c) = s { Some(c.clone()) } else { None }).collect();
    assert_eq!(summaries.len(), 2, "one per mode, after the last round");
    assert_eq!((summaries[0].mode.as_str(), summaries[0].rounds), ("tcp", 2));
    assert!(summaries[0].tps_ratio.is_none(), "the reference has no ratio");
    assert_eq!(summaries[1].versus.as_deref(), Some("tcp"));
    assert!(summaries[1].tps_ratio.is_some_and(|r| r.min > 0.0 && r.min <= r.median && r.median <= r.max));
    assert!(summaries[1].resumed_p50_us.is_some() && summaries[0].resumed_p50_us.is_none());
    let lines = report::mode_summary_lines(&summaries[1]);
    assert!(
        lines.contains("tls/tcp: tps ") && lines.contains("connect with a full TLS handshake"),
        "{lines}"
    );
    assert!(matches!(steps.last(), Some(Step::Compared(_))));
}

#[test]
fn a_pair_is_promoted_then_commits_every_decision_with_its_backup() {
    // `--mode unix --replicas 1,2,2-received-tls-poll`, one round of a tiny duration: a
    // single server, then a pair whose member 1 is promoted and strict before the run, then
    // one whose backup acknowledges from memory over a TLS link, busy-polling it on a thread
    // of its own (which the promotion of member 1 stops there). run_bench refuses a failed
    // run, and a run fails unless the primary's metrics count one decision and one
    // completion per commit (plus the promotion's probe).
    let dir = tempfile::tempdir_in(".").unwrap();
    let mut spec = bench_spec(dir.path(), vec![EngineKind::Journal], vec![0]);
    let received_tls: Replicas = "2-received-tls-poll".parse().unwrap();
    (spec.modes, spec.replicas) = (vec![Mode::Unix], vec![Replicas::SINGLE, Replicas::PAIR, received_tls]);
    spec.stop = Stop::Duration(Duration::from_millis(300));
    let mut steps = Vec::new();
    tx::run_all(&spec, &ProgressBar::hidden(), |step| steps.push(step)).expect("benchmark runs");
    let points: Vec<&BenchPoint> =
        steps.iter().filter_map(|s| if let Step::Measured(p) = s { Some(&**p) } else { None }).collect();
    let skipped: Vec<_> = steps.iter().filter(|s| matches!(s, Step::Skipped(_))).collect();
    assert!(skipped.is_empty(), "{skipped:?}");
    let names: Vec<(&str, usize)> = points.iter().map(|p| (p.mode.as_str(), p.replicas)).collect();
    assert_eq!(names, [("unix", 1), ("unix-pair", 2), ("unix-pair-received-tls-poll", 2)]);
    assert!(
        points[2].cycles > 0,
        "the busy-polled received pair over TLS committed decisions: {:?}",
        points[2]
    );
    let (single, pair) = (points[0], points[1]);
    assert!(pair.cycles > 0, "the pair committed decisions: {pair:?}");
    assert!(single.promotion.is_none());
    let promotion = pair.promotion.expect("the pair's promotion time");
    assert!(promotion.answered_ms <= promotion.first_decision_ms, "{promotion:?}");
    assert!(promotion.first_decision_ms <= promotion.strict_ms, "{promotion:?}");
    let json: serde_json::Value = serde_json::from_str(&report::bench_json(pair)).unwrap();
    assert_eq!((json["mode"].as_str(), json["replicas"].as_u64()), (Some("unix-pair"), Some(2)));
    assert!(json["promotion"]["first_decision_ms"].is_number(), "{json}");
    assert!(report::bench_block(pair).contains("promotion: first decision acknowledged"));
    let summaries: Vec<_> =
        steps.iter().filter_map(|s| if let Step::Compared(c) = s { Some(c.clone()) } else { None }).collect();
    assert_eq!(summaries.len(), 3, "the single server and the pairs side by side");
    assert_eq!((summaries[1].mode.as_str(), summaries[1].versus.as_deref()), ("unix-pair", Some("unix")));
    assert!(summaries[1].promotion_ms.is_some() && summaries[1].tps_ratio.is_some());
    assert!(empty_dir(dir.path()), "both members' logs are removed after the run");
}

#[test]
fn a_split_run_gives_the_backup_its_own_cpu_and_gives_the_harness_its_cpus_back() {
    // `--mode unix --replicas 1,2 --cpus split`: both runs complete (the backup's threads
    // on CPU 1, the rest on CPU 0), and the calling thread may use every CPU it had after.
    let before = cpus_of_this_thread();
    assert!(!before.is_empty());
    let dir = tempfile::tempdir_in(".").unwrap();
    let mut spec = bench_spec(dir.path(), vec![EngineKind::Journal], vec![0]);
    (spec.modes, spec.replicas, spec.cpus) =
        (vec![Mode::Unix], vec![Replicas::SINGLE, Replicas::PAIR], CpuPlacement::Split);
    spec.stop = Stop::Duration(Duration::from_millis(300));
    let mut steps = Vec::new();
    let result = tx::run_all(&spec, &ProgressBar::hidden(), |step| steps.push(step));
    if !(before.contains(&0) && before.contains(&1)) {
        assert!(result.is_err(), "without CPUs 0 and 1 a run cannot be split");
        return;
    }
    result.expect("benchmark runs");
    let measured: Vec<&BenchPoint> =
        steps.iter().filter_map(|s| if let Step::Measured(p) = s { Some(&**p) } else { None }).collect();
    assert_eq!(measured.len(), 2);
    for point in measured {
        assert!(point.cycles > 0, "the single server and the pair both committed: {point:?}");
        let json: serde_json::Value = serde_json::from_str(&report::bench_json(point)).unwrap();
        assert_eq!(json["cpus"].as_str(), Some("split"), "{json}");
    }
    assert_eq!(cpus_of_this_thread(), before, "the harness's thread got its CPUs back");
    assert!(empty_dir(dir.path()));
}

#[test]
fn fixed_rate_counts_a_scheduled_latency_per_commit() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let config = LogConfig::new(dir.path().join("log"), EngineKind::Volatile, SyncPolicy::Immediate);
    let target = EmbeddedTarget::open(&config, 2).unwrap();
    let spec = RunSpec {
        threads: 2,
        stop: Stop::Duration(Duration::from_millis(500)),
        t1: ThinkRange::ZERO,
        t2: ThinkRange::ZERO,
        seed: 1,
        rate: Some(200.0),
    };
    let result = tx::run(&target, &spec, &ProgressBar::hidden()).unwrap();
    // About 100 commits; loose bounds, the machine may be loaded.
    assert!((10..=200).contains(&result.cycles), "{}", result.cycles);
    assert!(result.tps() > 50.0, "{}", result.tps());
    let lat = &result.latencies;
    assert_eq!(lat.commit_scheduled.count(), result.cycles);
    assert_eq!(lat.commit.count(), result.cycles);
    let point = decree_bench::tx::RatePoint::new(200.0, &result);
    assert!(point.commit_p50_us <= point.commit_p99_us && point.commit_p99_us <= point.commit_p999_us);
    assert!(point.commit_p50_us >= point.commit_service_p50_us * 0.99, "{point:?}");
}
