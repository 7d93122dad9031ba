//! `decree bench`: the LIXA `lixat` workload against decree (tps and the latency the
//! transaction manager adds), with optional charts.

use crate::bench_log::parse_seconds;
use crate::common::{progress_bar, CliResult, Format, WorkDir};
use decree_bench::chart;
use decree_bench::client::{Mode, Replicas};
use decree_bench::cpus::CpuPlacement;
use decree_bench::report;
use decree_bench::rm_bench::{self, DbKind, RmBenchSpec, RmStep};
use decree_bench::think::{ThinkRange, Workload};
use decree_bench::tx::BenchPoint;
use decree_bench::tx::{self, BenchSpec, Step, Stop};
use decree_bench::write_floor;
use decree_client::ClientTlsFiles;
use decree_core::BranchCalls;
use decree_log::EngineKind;
use std::path::PathBuf;
use std::time::Duration;

/// Arguments of `decree bench`; with none, the README's run: embedded, journal, rpo=0,
/// 2 dummy RMs, extreme workload, 4/8/16/32 threads, 500 cycles each (2,000 to 16,000
/// samples per run; 10 to 30 s in all on the development machine).
#[derive(Debug, clap::Args)]
#[command(after_help = "Every thread loops: think t1; open; think t1; begin; think t2; commit; think t1; \
close. Presets: t1 = 500-1500us always; t2 = 500-1500us (extreme), 5-15ms (high), 50-150ms (medium). \
--t1 0 --t2 0 is a saturation test. Each engine, RPO and thread count runs on a fresh log in a \
subdirectory of --dir, removed afterwards; without --dir a temporary directory is made in the CURRENT \
directory (not /tmp, often a tmpfs) and removed at the end.

With --rm postgres|mariadb and two --dsn (A, then B), every transfer debits an account in A and credits \
one in B: per thread count, first as two local commits (independent), then with the databases' own \
two-phase statements issued by the thread itself, no coordinator and no decision log (native-2pc: the \
ceiling, what two-phase commit costs the databases), then as one decree two-phase commit over both \
databases (2pc, XA statements on MariaDB), followed by the ratios of their tps. After every run the \
balances must add up and no branch of the run's coordinator may be left prepared.")]
pub struct Args {
    /// Thread counts, comma-separated; one run each [default: 4,8,16,32; 1,4,16 with
    /// --rm postgres|mariadb].
    #[arg(long, value_delimiter = ',')]
    pub threads: Option<Vec<usize>>,
    /// Cycles per thread (LIXA's lixat -C; its report used 1000) [default: 500].
    #[arg(long, conflicts_with = "duration")]
    pub cycles: Option<u64>,
    /// Run each thread count for this many seconds instead of a number of cycles
    /// [default with --rm postgres|mariadb: 3].
    #[arg(long, value_parser = parse_seconds)]
    pub duration: Option<Duration>,
    /// Think-time preset.
    #[arg(long, default_value = "extreme", value_parser = parse_workload)]
    pub workload: Workload,
    /// Application think time, overriding the preset: MIN-MAX with a unit (500-1500us), or 0.
    #[arg(long)]
    pub t1: Option<ThinkRange>,
    /// Resource-manager time between begin and commit, overriding the preset, or 0.
    #[arg(long)]
    pub t2: Option<ThinkRange>,
    /// Dummy resource managers per transaction.
    #[arg(long, default_value_t = 2)]
    pub rms: usize,
    /// Log engines, comma-separated; every engine runs with every RPO.
    #[arg(long, value_delimiter = ',', default_value = "journal")]
    pub engine: Vec<EngineKind>,
    /// Recovery point objectives in milliseconds, comma-separated (0: sync before acking).
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub rpo: Vec<u64>,
    /// Where the transaction manager's log lives: in-process (embedded), or a state server
    /// over a Unix socket, TCP, or TCP with mutual TLS (started for each run with a
    /// throwaway CA unless --connect is given). Comma-separated modes run one after another
    /// in every round (see --rounds) and are compared to the first: --mode tcp,tls.
    #[arg(long, value_delimiter = ',', default_value = "embedded", value_parser = parse_mode)]
    pub mode: Vec<Mode>,
    /// Servers holding each decision, with --mode unix: 1 (a single server), or 2 (a
    /// primary + backup pair started for each run on two logs, member 1 promoted with force
    /// and strict before the run; its promotion time is reported), 2-received (its backup
    /// acknowledges from memory), 2-tls (TLS on its link, throwaway member certificates),
    /// 2-received-tls; a pair followed by -poll has its backup busy-poll the link (200 us
    /// after each frame: `pair.busy_poll_us`). Comma-separated, they alternate like the modes in every round and
    /// are compared to the first: --mode unix --replicas 1,2-received,2 --rounds 3.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub replicas: Vec<Replicas>,
    /// A running state server for --mode unix|tcp|tls (unix:/path, tcp:host:port or
    /// tls:host:port); the engine and RPO are then the server's own, whatever --engine and
    /// --rpo say. The decisions name the dummy resource managers dummy-0 and dummy-1, which
    /// the server's configuration must list (`[[rm]]` of kind dummy), since it refuses
    /// decisions naming resource managers it could not finish. With --rm postgres|mariadb
    /// (unix: or tcp:), the 2pc runs send their decisions there instead of to an embedded
    /// log, naming bench-a and bench-b (`[[rm]]` entries on the two --dsn databases).
    #[arg(long)]
    pub connect: Option<String>,
    /// With --connect tls:host:port: the PEM file of the CA that signed the server's
    /// certificate (with --tls-cert and --tls-key).
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// With --connect tls:host:port: this client's certificate chain (PEM).
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// With --connect tls:host:port: this client's private key (PEM).
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// Fixed-rate mode: transactions per second over all threads, no think times; reports
    /// commit latency percentiles from each commit's scheduled time and its service time.
    #[arg(long, conflicts_with_all = ["t1", "t2", "workload"])]
    pub rate: Option<f64>,
    /// Where each run's threads run: shared (every thread on every CPU, as on one machine),
    /// or split (the benchmark's clients and the single server or the pair's primary on CPU
    /// 0, the pair's backup on CPU 1, as if it had a machine of its own; its disk stays the
    /// same). Needs CPUs 0 and 1.
    #[arg(long, default_value = "shared")]
    pub cpus: CpuPlacement,
    /// Output format on stdout.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Write the characteristic curve to this SVG file and the percentiles to FILE-percentiles.svg.
    #[arg(long)]
    pub chart: Option<PathBuf>,
    /// Parent directory of the runs' logs (default: a temporary directory in the current one).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Seed of the think-time generators.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Resource managers: dummy (the LIXA workload), or real databases given by two --dsn:
    /// then each run compares decree 2PC against two independent local commits.
    #[arg(long, value_enum, default_value_t = RmChoice::Dummy)]
    pub rm: RmChoice,
    /// Database DSN for --rm postgres|mariadb; give it twice (A, then B): libpq's
    /// `host=... dbname=...` for postgres, `mysql://user:password@host:port/db` for mariadb.
    #[arg(long)]
    pub dsn: Vec<String>,
    /// With --rm postgres|mariadb: how decree calls the two branches at start, prepare and
    /// commit (auto: PostgreSQL's statements sent to both at once from the session's thread;
    /// MariaDB's on helper threads while a CPU is spare, else one after another).
    #[arg(long, value_enum, default_value_t = BranchCallsChoice::Auto)]
    pub branch_calls: BranchCallsChoice,
    /// Repeat the runs of every mode (--mode, or the three runs of --rm postgres|mariadb)
    /// this many times per thread count, each round starting with the next mode, and print
    /// the median and range of the rounds' figures and ratios (a noisy machine drifts less
    /// between runs close in time).
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
}

/// The `--branch-calls` values (decree_core::BranchCalls).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BranchCallsChoice {
    /// Split-phase where the RM has it (PostgreSQL); else helper threads while a CPU is
    /// idle enough, one after another when the machine is busy.
    Auto,
    /// Always in parallel on helper threads.
    Parallel,
    /// Always one after another.
    Sequential,
}

impl BranchCallsChoice {
    fn policy(self) -> BranchCalls {
        match self {
            BranchCallsChoice::Auto => BranchCalls::Auto,
            BranchCallsChoice::Parallel => BranchCalls::Parallel,
            BranchCallsChoice::Sequential => BranchCalls::Sequential,
        }
    }
}

/// Which resource managers `decree bench` drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RmChoice {
    /// Dummy RMs that answer at once (the LIXA workload).
    Dummy,
    /// Two PostgreSQL databases.
    Postgres,
    /// Two MariaDB databases (XA transactions).
    Mariadb,
}

impl RmChoice {
    /// The database kind of the real-database benchmark, None for the dummy RMs.
    fn db_kind(self) -> Option<DbKind> {
        match self {
            RmChoice::Dummy => None,
            RmChoice::Postgres => Some(DbKind::Postgres),
            RmChoice::Mariadb => Some(DbKind::MariaDb),
        }
    }
}

/// Thread counts when --threads is not given, in the dummy mode.
const THREADS_DEFAULT: [usize; 4] = [4, 8, 16, 32];
/// Thread counts when --threads is not given, with real databases.
const RM_THREADS_DEFAULT: [usize; 3] = [1, 4, 16];
/// Cycles per thread when neither --cycles nor --duration is given (dummy mode).
const CYCLES_DEFAULT: u64 = 500;
/// Seconds per run when neither --cycles nor --duration is given, with real databases.
const RM_DURATION_DEFAULT: Duration = Duration::from_secs(3);

fn parse_workload(text: &str) -> Result<Workload, String> {
    text.parse().map_err(|e: decree_bench::BenchError| e.to_string())
}

fn parse_mode(text: &str) -> Result<Mode, String> {
    text.parse().map_err(|e: decree_bench::BenchError| e.to_string())
}

impl Args {
    /// The benchmark these arguments describe, with its logs under `dir`.
    pub fn spec(&self, dir: PathBuf) -> BenchSpec {
        BenchSpec {
            engines: self.engine.clone(),
            rpos_ms: self.rpo.clone(),
            threads: self.threads.clone().unwrap_or_else(|| THREADS_DEFAULT.to_vec()),
            stop: match self.duration {
                Some(d) => Stop::Duration(d),
                None => Stop::Cycles(self.cycles.unwrap_or(CYCLES_DEFAULT)),
            },
            t1: self.t1.unwrap_or_else(|| self.workload.t1()),
            t2: self.t2.unwrap_or_else(|| self.workload.t2()),
            rms: self.rms,
            modes: self.mode.clone(),
            replicas: self.replicas.clone(),
            rounds: self.rounds,
            dir,
            seed: self.seed,
            connect: self.connect.clone(),
            tls_files: self.tls_files(),
            rate: self.rate,
            cpus: self.cpus,
        }
    }

    /// The --tls-* paths as given (checked together by `decree_bench::tx::check`).
    fn tls_files(&self) -> ClientTlsFiles {
        ClientTlsFiles { ca: self.tls_ca.clone(), cert: self.tls_cert.clone(), key: self.tls_key.clone() }
    }

    /// The real-database benchmark these arguments describe, with its logs under `dir`;
    /// options that only the dummy workload understands are refused.
    pub fn rm_spec(&self, dir: PathBuf) -> Result<RmBenchSpec, String> {
        let kind = self.rm.db_kind().ok_or("--rm dummy has no databases: use --rm postgres|mariadb")?;
        let rm = format!("--rm {}", kind.name());
        let [dsn_a, dsn_b] = <[String; 2]>::try_from(self.dsn.clone()).map_err(|dsns| {
            format!("{rm} needs exactly two --dsn (database A, then B), got {}", dsns.len())
        })?;
        let tls = [&self.tls_ca, &self.tls_cert, &self.tls_key].iter().any(|f| f.is_some());
        if self.mode != [Mode::Embedded]
            || self.replicas != [Replicas::SINGLE]
            || self.cpus != CpuPlacement::Shared
            || tls
        {
            return Err(format!(
                "{rm} runs the coordinator in this process, with its log embedded or on the server of \
                 --connect unix:/path|tcp:host:port: drop --mode, --replicas, --cpus and --tls-*"
            ));
        }
        let connect = match &self.connect {
            Some(address) if address.starts_with("tls:") => {
                return Err(format!("--connect {address}: {rm} reaches a server over unix: or tcp: only"))
            }
            Some(address) => Some(address.parse().map_err(|e| format!("--connect {address}: {e}"))?),
            None => None,
        };
        if self.rate.is_some() || self.chart.is_some() {
            return Err(format!("--rate and --chart are not supported with {rm}"));
        }
        if self.rounds == 0 || self.rounds > rm_bench::ROUNDS_MAX {
            return Err(format!("--rounds {}: expected 1 to {}", self.rounds, rm_bench::ROUNDS_MAX));
        }
        let [engine] = self.engine[..] else {
            return Err(format!("{rm} takes one --engine"));
        };
        let [rpo_ms] = self.rpo[..] else {
            return Err(format!("{rm} takes one --rpo"));
        };
        Ok(RmBenchSpec {
            kind,
            dsn_a,
            dsn_b,
            table: rm_bench::TABLE_DEFAULT.into(),
            accounts: rm_bench::ACCOUNTS_DEFAULT,
            threads: self.threads.clone().unwrap_or_else(|| RM_THREADS_DEFAULT.to_vec()),
            stop: match (self.duration, self.cycles) {
                (Some(d), _) => Stop::Duration(d),
                (None, Some(n)) => Stop::Cycles(n),
                (None, None) => Stop::Duration(RM_DURATION_DEFAULT),
            },
            engine,
            rpo_ms,
            dir,
            seed: self.seed,
            node: rm_bench::node_id(),
            branch_calls: self.branch_calls.policy(),
            rounds: self.rounds,
            connect,
        })
    }
}

/// The real-database benchmark: per thread count, independent commits, then decree 2PC,
/// then their ratio; each printed as soon as it is known.
fn run_rm(args: Args) -> CliResult {
    let work = WorkDir::new(args.dir.clone(), "decree-bench")?;
    let spec = args.rm_spec(work.path())?;
    if args.format == Format::Table {
        let stop = match spec.stop {
            Stop::Cycles(n) => format!("{n} transfers per thread"),
            Stop::Duration(d) => format!("{:.1} s per run", d.as_secs_f64()),
        };
        println!(
            "decree bench --rm {}: table {} ({} accounts per database), engine={} rpo={}ms, {stop}; \
             commit latency (p50/p95/p99) and whole transfer (xfer) in microseconds",
            spec.kind.name(),
            spec.table,
            spec.accounts,
            spec.engine,
            spec.rpo_ms
        );
    }
    let progress = progress_bar(None);
    // Under the databases' durability lines, which come first.
    let mut header = args.format == Format::Table;
    let outcome = rm_bench::run_all(&spec, &progress, |step| {
        progress.suspend(|| match (step, args.format) {
            (RmStep::Measured(p), Format::Table) => {
                if std::mem::take(&mut header) {
                    println!("{}", rm_bench::table_header());
                }
                println!("{}", rm_bench::table_row(&p))
            }
            (RmStep::Measured(p), Format::Json) => println!("{}", rm_bench::point_json(&p)),
            (RmStep::Ratio(r), Format::Table) => println!("{}", rm_bench::ratio_line(&r)),
            (RmStep::Ratio(r), Format::Json) => println!("{}", rm_bench::ratio_json(&r)),
            (RmStep::Summary(s), Format::Table) => println!("{}", rm_bench::summary_line(&s)),
            (RmStep::Summary(s), Format::Json) => println!("{}", rm_bench::summary_json(&s)),
            (RmStep::Durability(d), Format::Table) => println!("{}", rm_bench::durability_line(&d)),
            (RmStep::Durability(d), Format::Json) => println!("{}", rm_bench::durability_json(&d)),
        })
    });
    progress.finish_and_clear();
    outcome?;
    if args.format == Format::Table {
        println!("no decree branch left prepared in either database");
    }
    Ok(())
}

/// Runs the benchmark, printing each run as it ends, then draws the charts if asked.
pub fn run(args: Args) -> CliResult {
    if args.rm != RmChoice::Dummy {
        return run_rm(args);
    }
    if !args.dsn.is_empty() {
        return Err("--dsn needs --rm postgres or --rm mariadb".into());
    }
    if args.branch_calls != BranchCallsChoice::Auto {
        return Err(
            "--branch-calls needs --rm postgres or --rm mariadb (the dummy RMs answer at once)".into()
        );
    }
    let work = WorkDir::new(args.dir.clone(), "decree-bench")?;
    let spec = args.spec(work.path());
    tx::check(&spec)?;
    if args.format == Format::Table {
        print_header(&args, &spec);
    }
    let runs = (spec.engines.len() * spec.rpos_ms.len() * spec.variants().len() * spec.rounds) as u64;
    let progress = progress_bar(match spec.stop {
        Stop::Cycles(n) => Some(n.saturating_mul(spec.threads.iter().sum::<usize>() as u64) * runs),
        Stop::Duration(_) => None,
    });
    let floors = if needs_write_floor(&spec) {
        progress.set_message("raw write reference");
        write_floor::measure(&spec.dir, write_floor::WRITE_FLOOR_DURATION)?
    } else {
        Vec::new()
    };
    let mut points = Vec::new();
    let mut failures = Vec::new();
    let outcome = tx::run_all(&spec, &progress, |step| {
        progress.suspend(|| match step {
            Step::Measured(mut point) => {
                if point.rpo_ms == 0 && point.engine != EngineKind::Volatile.name() {
                    point.disk_floor = floors.clone();
                }
                match args.format {
                    Format::Table => print!("{}", report::bench_block(&point)),
                    Format::Json => println!("{}", report::bench_json(&point)),
                }
                points.push(*point);
            }
            Step::Skipped(skipped) => {
                failures.extend(skipped.failed.then(|| report::skipped_line(&skipped)));
                match args.format {
                    Format::Table => println!("{}", report::skipped_line(&skipped)),
                    Format::Json => eprintln!("{}", report::skipped_line(&skipped)),
                }
            }
            Step::Compared(summary) => match args.format {
                Format::Table => println!("{}", report::mode_summary_lines(&summary)),
                Format::Json => println!("{}", report::mode_summary_json(&summary)),
            },
        })
    });
    progress.finish_and_clear();
    outcome?;
    if !failures.is_empty() {
        return Err(format!("{} run(s) failed:\n{}", failures.len(), failures.join("\n")).into());
    }
    if points.is_empty() {
        return Err("no engine could be measured (see the skipped lines)".into());
    }
    if args.format == Format::Table {
        print_summaries(&spec, &points, &floors);
    }
    if let Some(path) = &args.chart {
        let title =
            format!("decree {} workload, {} mode, {} RMs", args.workload.name(), modes_text(&spec), spec.rms);
        let second = chart::write_charts(path, &title, &points)?;
        eprintln!("charts written: {} and {}", path.display(), second.display());
    }
    Ok(())
}

/// The modes as --mode takes them ("tcp,tls"), with the replica counts where a pair runs
/// ("unix replicas=1,2") and the CPU placement when it is not the default.
fn modes_text(spec: &BenchSpec) -> String {
    let modes = spec.modes.iter().map(Mode::name).collect::<Vec<_>>().join(",");
    let modes = match &spec.replicas[..] {
        [Replicas::SINGLE] => modes,
        counts => {
            let counts: Vec<String> = counts.iter().map(Replicas::to_string).collect();
            format!("{modes} replicas={}", counts.join(","))
        }
    };
    match spec.cpus {
        CpuPlacement::Shared => modes,
        split => format!("{modes} cpus={}", split.name()),
    }
}

/// The table's opening lines: what runs, then the column header.
fn print_header(args: &Args, spec: &BenchSpec) {
    let stop_text = match spec.stop {
        Stop::Cycles(n) => format!("{n} cycles per thread"),
        Stop::Duration(d) => format!("{:.1} s per run", d.as_secs_f64()),
    };
    let rounds = match spec.rounds {
        1 => String::new(),
        n => format!(", {n} rounds alternating the modes"),
    };
    let modes = modes_text(spec);
    match spec.rate {
        Some(rate) => println!(
            "decree bench: mode={modes} rms={} fixed rate {rate}/s over all threads, no think times, \
             {stop_text}{rounds}; latencies in microseconds",
            spec.rms
        ),
        None => println!(
            "decree bench: mode={modes} rms={} workload={} t1={} t2={} {stop_text}{rounds}; latencies in \
             microseconds",
            spec.rms,
            args.workload.name(),
            spec.t1,
            spec.t2
        ),
    }
    println!("{}", report::bench_header());
}

/// The summary tables after the last run: the characteristic curve, the disk's floor, and
/// the fixed-rate latencies with their round-trip floors.
fn print_summaries(spec: &BenchSpec, points: &[BenchPoint], floors: &[write_floor::WriteFloor]) {
    println!("\nsummary: throughput and total latency added by the TM");
    print!("{}", report::bench_summary(points));
    if !floors.is_empty() {
        println!("\nthe disk in the same run: one thread, one synced write at a time");
        print!("{}", report::write_floor_summary(points, floors));
    }
    if spec.rate.is_some() {
        println!("\nfixed rate: commit latency from its scheduled time (service time: the call alone)");
        print!("{}", report::rate_summary(points));
        print!("{}", report::round_trip_summary(points));
    }
}

/// Whether a run waits for the disk (a durable engine at `rpo = 0`) on this machine (the
/// embedded mode, or a server the benchmark starts itself), so that the disk's own synced
/// write is worth measuring next to it (`decree_bench::write_floor`).
fn needs_write_floor(spec: &BenchSpec) -> bool {
    spec.rpos_ms.contains(&0)
        && spec.engines.iter().any(|e| *e != EngineKind::Volatile)
        && (spec.modes.contains(&Mode::Embedded) || spec.connect.is_none())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Cli;
    use clap::Parser;
    use decree_bench::client::Variant;

    fn parse(line: &str) -> Args {
        match crate::parse_command(line) {
            crate::Command::Bench(args) => *args,
            other => panic!("{line}: parsed as {other:?}"),
        }
    }

    #[test]
    fn no_arguments_is_the_readme_run() {
        let args = parse("decree bench");
        let spec = args.spec(PathBuf::from("x"));
        assert_eq!(spec.engines, vec![EngineKind::Journal]);
        assert_eq!(spec.rpos_ms, vec![0]);
        assert_eq!(spec.threads, vec![4, 8, 16, 32]);
        assert_eq!(spec.stop, Stop::Cycles(500));
        assert_eq!(spec.t1, ThinkRange::from_us(500, 1500));
        assert_eq!(spec.t2, ThinkRange::from_us(500, 1500));
        assert_eq!(spec.rms, 2);
        assert_eq!(
            (spec.modes, spec.replicas, spec.rounds),
            (vec![Mode::Embedded], vec![Replicas::SINGLE], 1)
        );
        assert_eq!(args.format, Format::Table);
        assert!(args.chart.is_none());
    }

    #[test]
    fn presets_and_overrides() {
        let spec = parse("decree bench --workload medium").spec(PathBuf::new());
        assert_eq!(spec.t2, ThinkRange::from_us(50_000, 150_000));
        let spec = parse("decree bench --workload high --t1 0 --t2 0").spec(PathBuf::new());
        assert!(spec.t1.is_zero() && spec.t2.is_zero());
        let spec = parse("decree bench --t2 2-3ms --t1 100-200us").spec(PathBuf::new());
        assert_eq!(spec.t1, ThinkRange::from_us(100, 200));
        assert_eq!(spec.t2, ThinkRange::from_us(2_000, 3_000));
    }

    #[test]
    fn lists_duration_and_mode() {
        let args = parse(
            "decree bench --engine journal,volatile --rpo 0,10 --threads 2 --duration 1.5 --mode unix \
             --format json --chart c.svg --rms 3",
        );
        let spec = args.spec(PathBuf::new());
        assert_eq!(spec.engines, vec![EngineKind::Journal, EngineKind::Volatile]);
        assert_eq!(spec.rpos_ms, vec![0, 10]);
        assert_eq!(spec.stop, Stop::Duration(Duration::from_millis(1500)));
        assert_eq!(spec.modes, vec![Mode::Unix]);
        assert_eq!(spec.rms, 3);
        assert_eq!(args.chart, Some(PathBuf::from("c.svg")));
        assert_eq!(spec.connect, None);
        assert_eq!(spec.rate, None);
        let spec =
            parse("decree bench --mode tcp --connect tcp:127.0.0.1:7411 --rate 10000").spec(PathBuf::new());
        assert_eq!(spec.connect.as_deref(), Some("tcp:127.0.0.1:7411"));
        assert_eq!(spec.rate, Some(10_000.0));
    }

    /// The check `decree bench` runs before anything else, as the user sees it.
    fn refusal(line: &str) -> String {
        match tx::check(&parse(line).spec(PathBuf::new())) {
            Ok(()) => panic!("{line}: accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn tls_mode_mode_lists_and_rounds() {
        let spec = parse("decree bench --mode tls --threads 2").spec(PathBuf::new());
        assert_eq!((spec.modes, spec.connect), (vec![Mode::Tls], None));
        assert!(spec.tls_files.ca.is_none() && spec.tls_files.cert.is_none() && spec.tls_files.key.is_none());
        let spec =
            parse("decree bench --mode tcp,tls --rounds 3 --threads 32 --duration 5").spec(PathBuf::new());
        assert_eq!((spec.modes.clone(), spec.rounds), (vec![Mode::Tcp, Mode::Tls], 3));
        tx::check(&spec).expect("tcp and tls in alternated rounds");
        for (line, says) in [
            ("decree bench --mode tcp,tcp", "--mode lists tcp twice"),
            ("decree bench --mode tcp,tls --rounds 0", "--rounds 0: expected 1 to 100"),
            ("decree bench --mode tcp,tls --connect tcp:h:1", "takes one --mode"),
            ("decree bench --mode tcp --connect tls:h:1", "does not fit --mode tcp: expected tcp:"),
            ("decree bench --mode tls --connect tls:h:1", "needs --tls-ca, --tls-cert and --tls-key"),
        ] {
            let err = refusal(line);
            assert!(err.contains(says), "{line}: {err}");
        }
        assert!(Cli::try_parse_from("decree bench --mode tcp,ssl".split_whitespace()).is_err());
    }

    #[test]
    fn replicas_lists_alternate_a_single_server_and_a_pair() {
        let line =
            "decree bench --mode unix --replicas 1,2 --rounds 3 --threads 32 --duration 5 --t1 0 --t2 0";
        let spec = parse(line).spec(PathBuf::new());
        assert_eq!((spec.replicas.clone(), spec.rounds), (vec![Replicas::SINGLE, Replicas::PAIR], 3));
        let names: Vec<String> = spec.variants().iter().map(Variant::name).collect();
        assert_eq!(names, ["unix", "unix-pair"]);
        tx::check(&spec).expect("a single server and a pair in alternated rounds");
        let spec = parse("decree bench --mode unix --replicas 2").spec(PathBuf::new());
        assert_eq!(spec.variants(), vec![Variant { mode: Mode::Unix, replicas: Replicas::PAIR }]);
        tx::check(&spec).expect("a pair alone");
        assert_eq!(modes_text(&spec), "unix replicas=2");
        let line = "decree bench --mode unix --replicas 1,2-received,2,2-received-tls";
        let names: Vec<String> =
            parse(line).spec(PathBuf::new()).variants().iter().map(Variant::name).collect();
        assert_eq!(names, ["unix", "unix-pair-received", "unix-pair", "unix-pair-received-tls"]);
        for line in ["decree bench --mode unix --replicas 3", "decree bench --mode unix --replicas 0,1"] {
            let Err(e) = Cli::try_parse_from(line.split_whitespace()) else { panic!("{line}: accepted") };
            let e = e.to_string();
            assert!(e.contains("expected 1 (a single server) or 2"), "{line}: {e}");
        }
        for (line, says) in [
            ("decree bench --mode unix --replicas 2,2", "--replicas lists 2 twice"),
            ("decree bench --mode unix --replicas 2-tls,2-tls", "--replicas lists 2-tls twice"),
            ("decree bench --replicas 2", "over the Unix socket only: drop --mode embedded"),
            ("decree bench --mode unix,tcp --replicas 1,2", "drop --mode tcp"),
            (
                "decree bench --mode unix --replicas 2 --connect unix:/s",
                "starts its own pair: drop --connect",
            ),
            ("decree bench --mode unix --replicas 1,2 --engine volatile", "needs a durable engine"),
        ] {
            let err = refusal(line);
            assert!(err.contains(says), "{line}: {err}");
        }
        let err = parse("decree bench --rm postgres --dsn a --dsn b --replicas 2")
            .rm_spec(PathBuf::new())
            .expect_err("the real-database benchmark runs embedded");
        assert!(err.contains("--replicas"), "{err}");
        assert!(Cli::try_parse_from("decree bench --mode unix --replicas two".split_whitespace()).is_err());
    }

    #[test]
    fn tls_files_go_together_and_only_with_a_tls_address() {
        let line = "decree bench --mode tls --connect tls:db.example:7411 --tls-ca ca.pem --tls-cert c.pem \
                    --tls-key c.key";
        let spec = parse(line).spec(PathBuf::new());
        tx::check(&spec).expect("all three files with a tls: address");
        assert_eq!(spec.connect.as_deref(), Some("tls:db.example:7411"));
        assert_eq!(spec.tls_files.ca, Some(PathBuf::from("ca.pem")));
        assert_eq!(spec.tls_files.cert, Some(PathBuf::from("c.pem")));
        assert_eq!(spec.tls_files.key, Some(PathBuf::from("c.key")));
        for (flags, missing) in [
            ("--tls-ca ca.pem", "--tls-cert and --tls-key missing"),
            ("--tls-ca ca.pem --tls-cert c.pem", "--tls-key missing"),
            ("--tls-key c.key", "--tls-ca and --tls-cert missing"),
        ] {
            let err = refusal(&format!("decree bench --mode tls --connect tls:h:1 {flags}"));
            assert!(err.contains("--tls-ca, --tls-cert and --tls-key go together"), "{flags}: {err}");
            assert!(err.contains(missing), "{flags}: {err}");
        }
        let all = "--tls-ca a --tls-cert b --tls-key c";
        for line in [
            format!("decree bench --mode tls {all}"),
            format!("decree bench --mode tcp --connect tcp:h:1 {all}"),
        ] {
            assert!(refusal(&line).contains("are for --connect tls:host:port"), "{line}");
        }
        let err = parse(&format!("decree bench --rm postgres --dsn a --dsn b {all}"))
            .rm_spec(PathBuf::new())
            .expect_err("the real-database benchmark runs embedded");
        assert!(err.contains("--tls-*"), "{err}");
    }

    #[test]
    fn rm_postgres_defaults_and_refusals() {
        let spec = parse("decree bench --rm postgres --dsn host=a --dsn host=b")
            .rm_spec(PathBuf::from("d"))
            .expect("valid");
        assert_eq!((spec.dsn_a.as_str(), spec.dsn_b.as_str()), ("host=a", "host=b"));
        assert_eq!(spec.threads, vec![1, 4, 16]);
        assert_eq!(spec.stop, Stop::Duration(Duration::from_secs(3)));
        assert_eq!((spec.engine, spec.rpo_ms), (EngineKind::Journal, 0));
        let spec = parse("decree bench --rm postgres --dsn a --dsn b --threads 2 --cycles 20 --rpo 5")
            .rm_spec(PathBuf::new())
            .expect("valid");
        assert_eq!((spec.threads, spec.stop, spec.rpo_ms), (vec![2], Stop::Cycles(20), 5));
        for (line, says) in [
            ("decree bench --rm postgres --dsn a", "exactly two --dsn"),
            ("decree bench --rm postgres --dsn a --dsn b --dsn c", "exactly two --dsn"),
            ("decree bench --rm mariadb --dsn mysql://h/a", "--rm mariadb needs exactly two --dsn"),
            (
                "decree bench --rm mariadb --dsn a --dsn b --engine journal,file",
                "--rm mariadb takes one --engine",
            ),
            ("decree bench --rm postgres --dsn a --dsn b --mode unix", "embedded"),
            ("decree bench --rm postgres --dsn a --dsn b --rpo 0,10", "one --rpo"),
            ("decree bench --rm postgres --dsn a --dsn b --connect tls:h:1", "unix: or tcp: only"),
            ("decree bench --rm postgres --dsn a --dsn b --connect h:1", "--connect h:1"),
        ] {
            let err = parse(line).rm_spec(PathBuf::new()).expect_err(line);
            assert!(err.contains(says), "{line}: {err}");
        }
        assert_eq!(spec_connect("decree bench --rm postgres --dsn a --dsn b"), None);
        let line = "decree bench --rm postgres --dsn a --dsn b --connect unix:/run/d.sock";
        assert_eq!(
            spec_connect(line).as_deref(),
            Some("unix:/run/d.sock"),
            "the 2pc runs' decisions go there"
        );
        assert!(Cli::try_parse_from("decree bench --rm oracle".split_whitespace()).is_err());
        assert!(parse("decree bench").rm_spec(PathBuf::new()).is_err(), "the dummy RMs have no spec");
    }

    fn spec_connect(line: &str) -> Option<String> {
        parse(line).rm_spec(PathBuf::new()).expect(line).connect.map(|e| e.to_string())
    }

    #[test]
    fn rm_mariadb_builds_a_mariadb_spec() {
        let line =
            "decree bench --rm mariadb --dsn mysql://u@h:3306/a --dsn mysql://u@h:3306/b --threads 1,16";
        let spec = parse(line).rm_spec(PathBuf::from("d")).expect("valid");
        assert_eq!(spec.kind, DbKind::MariaDb);
        assert_eq!((spec.dsn_a.as_str(), spec.dsn_b.as_str()), ("mysql://u@h:3306/a", "mysql://u@h:3306/b"));
        assert_eq!((spec.threads, spec.stop), (vec![1, 16], Stop::Duration(Duration::from_secs(3))));
        let spec =
            parse("decree bench --rm postgres --dsn a --dsn b").rm_spec(PathBuf::new()).expect("valid");
        assert_eq!(spec.kind, DbKind::Postgres);
        assert_eq!(spec.branch_calls, BranchCalls::Auto, "the default policy");
        for (word, policy) in [("parallel", BranchCalls::Parallel), ("sequential", BranchCalls::Sequential)] {
            let line = format!("decree bench --rm postgres --dsn a --dsn b --branch-calls {word}");
            assert_eq!(parse(&line).rm_spec(PathBuf::new()).expect("valid").branch_calls, policy);
        }
        assert!(Cli::try_parse_from("decree bench --branch-calls sometimes".split_whitespace()).is_err());
        assert_eq!(spec.rounds, 1, "one round unless asked");
        let line = "decree bench --rm postgres --dsn a --dsn b --rounds 5";
        assert_eq!(parse(line).rm_spec(PathBuf::new()).expect("valid").rounds, 5);
        for rounds in ["0", "101"] {
            let line = format!("decree bench --rm postgres --dsn a --dsn b --rounds {rounds}");
            let err = parse(&line).rm_spec(PathBuf::new()).expect_err("out of range");
            assert!(err.contains("--rounds"), "{err}");
        }
    }

    #[test]
    fn bad_values_are_usage_errors() {
        for line in [
            "decree bench --workload fast",
            "decree bench --t1 1000",
            "decree bench --t2 9-1ms",
            "decree bench --mode pipe",
            "decree bench --cycles 10 --duration 2",
            "decree bench --rate 100 --t1 0",
            "decree bench --rate 100 --workload high",
        ] {
            assert!(Cli::try_parse_from(line.split_whitespace()).is_err(), "{line} should fail");
        }
    }
}
