//! `decree bench`: the LIXA `lixat` workload against decree (tps and the latency the
//! transaction manager adds), with optional charts.

use crate::bench_log::parse_seconds;
use crate::common::{progress_bar, CliResult, Format, WorkDir};
use decree_bench::chart;
use decree_bench::client::Mode;
use decree_bench::report;
use decree_bench::think::{ThinkRange, Workload};
use decree_bench::tx::{self, BenchSpec, Step, Stop};
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
directory (not /tmp, often a tmpfs) and removed at the end.")]
pub struct Args {
    /// Thread counts, comma-separated; one run each.
    #[arg(long, value_delimiter = ',', default_value = "4,8,16,32")]
    pub threads: Vec<usize>,
    /// Cycles per thread (LIXA's lixat -C; its report used 1000).
    #[arg(long, default_value_t = 500, conflicts_with = "duration")]
    pub cycles: u64,
    /// Run each thread count for this many seconds instead of a number of cycles.
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
    /// over a Unix socket or TCP (started for each run unless --connect is given).
    #[arg(long, default_value = "embedded", value_parser = parse_mode)]
    pub mode: Mode,
    /// A running state server for --mode unix|tcp (unix:/path or tcp:host:port); the
    /// engine and RPO are then the server's own, whatever --engine and --rpo say.
    #[arg(long)]
    pub connect: Option<String>,
    /// Fixed-rate mode: transactions per second over all threads, no think times; reports
    /// commit latency percentiles from each commit's scheduled time and its service time.
    #[arg(long, conflicts_with_all = ["t1", "t2", "workload"])]
    pub rate: Option<f64>,
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
}

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
            threads: self.threads.clone(),
            stop: match self.duration {
                Some(d) => Stop::Duration(d),
                None => Stop::Cycles(self.cycles),
            },
            t1: self.t1.unwrap_or_else(|| self.workload.t1()),
            t2: self.t2.unwrap_or_else(|| self.workload.t2()),
            rms: self.rms,
            mode: self.mode,
            dir,
            seed: self.seed,
            connect: self.connect.clone(),
            rate: self.rate,
        }
    }
}

/// Runs the benchmark, printing each run as it ends, then draws the charts if asked.
pub fn run(args: Args) -> CliResult {
    let work = WorkDir::new(args.dir.clone(), "decree-bench")?;
    let spec = args.spec(work.path());
    let combinations = (spec.engines.len() * spec.rpos_ms.len()) as u64;
    let stop_text = match spec.stop {
        Stop::Cycles(n) => format!("{n} cycles per thread"),
        Stop::Duration(d) => format!("{:.1} s per run", d.as_secs_f64()),
    };
    if args.format == Format::Table {
        match spec.rate {
            Some(rate) => println!(
                "decree bench: mode={} rms={} fixed rate {rate}/s over all threads, no think times, {};                  latencies in microseconds",
                spec.mode, spec.rms, stop_text
            ),
            None => println!(
                "decree bench: mode={} rms={} workload={} t1={} t2={} {}; latencies in microseconds",
                spec.mode,
                spec.rms,
                args.workload.name(),
                spec.t1,
                spec.t2,
                stop_text
            ),
        }
        println!("{}", report::bench_header());
    }
    let progress = progress_bar(match spec.stop {
        Stop::Cycles(n) => Some(n.saturating_mul(spec.threads.iter().sum::<usize>() as u64) * combinations),
        Stop::Duration(_) => None,
    });
    let mut points = Vec::new();
    let mut failures = Vec::new();
    let outcome = tx::run_all(&spec, &progress, |step| {
        progress.suspend(|| match step {
            Step::Measured(point) => {
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
        println!("\nsummary: throughput and total latency added by the TM");
        print!("{}", report::bench_summary(&points));
        if spec.rate.is_some() {
            println!("\nfixed rate: commit latency from its scheduled time (service time: the call alone)");
            print!("{}", report::rate_summary(&points));
        }
    }
    if let Some(path) = &args.chart {
        let title = format!("decree {} workload, {} mode, {} RMs", args.workload.name(), spec.mode, spec.rms);
        let second = chart::write_charts(path, &title, &points)?;
        eprintln!("charts written: {} and {}", path.display(), second.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Cli;
    use clap::Parser;

    fn parse(line: &str) -> Args {
        let cli = Cli::try_parse_from(line.split_whitespace()).unwrap_or_else(|e| panic!("{line}: {e}"));
        match cli.command {
            crate::Command::Bench(args) => args,
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
        assert_eq!(spec.mode, Mode::Embedded);
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
        assert_eq!(spec.mode, Mode::Unix);
        assert_eq!(spec.rms, 3);
        assert_eq!(args.chart, Some(PathBuf::from("c.svg")));
        assert_eq!(spec.connect, None);
        assert_eq!(spec.rate, None);
        let spec =
            parse("decree bench --mode tcp --connect tcp:127.0.0.1:7411 --rate 10000").spec(PathBuf::new());
        assert_eq!(spec.connect.as_deref(), Some("tcp:127.0.0.1:7411"));
        assert_eq!(spec.rate, Some(10_000.0));
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
