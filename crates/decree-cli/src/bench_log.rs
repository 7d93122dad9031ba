//! `decree bench-log`: durable appends per second of each log engine, next to the raw
//! `pwrite` + `fdatasync` reference measured first in the same directory.

use crate::common::{progress_bar, CliResult, Format, WorkDir};
use decree_bench::log_bench::{self, LogBenchSpec, LogStep};
use decree_bench::report::{self, LogTable};
use decree_log::EngineKind;
use std::path::PathBuf;
use std::time::Duration;

/// Parses a positive number of seconds (fractions allowed) of at most one hour.
pub fn parse_seconds(text: &str) -> Result<Duration, String> {
    let secs: f64 = text.trim().parse().map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !secs.is_finite() || secs <= 0.0 || secs > 3600.0 {
        return Err(format!("{text:?}: expected more than 0 and at most 3600 seconds"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Arguments of `decree bench-log`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Each engine, RPO and thread count runs in a fresh subdirectory of --dir, removed \
afterwards. Without --dir a temporary directory is made in the CURRENT directory (not /tmp, which is often \
a tmpfs where fsync costs nothing) and removed at the end: run it from the disk you want to measure.")]
pub struct Args {
    /// Log engines to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "journal,slots-fsync,slots-mmap,file,volatile")]
    pub engine: Vec<EngineKind>,
    /// Thread counts, comma-separated; one run each.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    pub threads: Vec<usize>,
    /// Seconds each run lasts (fractions allowed).
    #[arg(long, default_value = "3", value_parser = parse_seconds)]
    pub duration: Duration,
    /// Payload bytes per record (a 2-branch XA decision is about 600).
    #[arg(long, default_value_t = 600)]
    pub record_size: usize,
    /// Recovery point objectives in milliseconds, comma-separated (0: sync before acking).
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub rpo: Vec<u64>,
    /// Parent directory of the runs (default: a temporary directory in the current one).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Output format on stdout.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Size of the raw-fdatasync reference file in MiB (tests make it small).
    #[arg(long, default_value_t = 64, hide = true, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub reference_mib: u64,
    /// Make the journal write with pwrite + fdatasync instead of O_DIRECT | O_DSYNC (to
    /// compare the two on this disk).
    #[arg(long)]
    pub no_direct_io: bool,
}

/// Runs the log benchmark and prints each result as soon as it is measured.
pub fn run(args: Args) -> CliResult {
    let work = WorkDir::new(args.dir, "decree-bench-log")?;
    let spec = LogBenchSpec {
        engines: args.engine,
        threads: args.threads,
        rpos_ms: args.rpo,
        duration: args.duration,
        record_bytes: args.record_size,
        dir: work.path(),
        reference: true,
        raw_file_bytes: args.reference_mib << 20,
        direct_io: !args.no_direct_io,
    };
    let mut table = LogTable::default();
    if args.format == Format::Table {
        println!("{}", table.header());
    }
    let progress = progress_bar(Some(log_bench::run_count(&spec)));
    let mut measured = 0usize;
    let mut failures = Vec::new();
    let outcome = log_bench::run_all(&spec, &progress, |step| {
        progress.suspend(|| match step {
            LogStep::Measured(point) => {
                if point.engine != log_bench::RAW_ENGINE && point.engine != log_bench::RAW_DIRECT_ENGINE {
                    measured += 1;
                }
                match args.format {
                    Format::Table => println!("{}", table.row(&point)),
                    Format::Json => println!("{}", report::log_json(&point)),
                }
            }
            LogStep::Skipped(skipped) => {
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
    if measured == 0 && !spec.engines.is_empty() {
        return Err("no log engine could be measured (see the skipped lines)".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Cli;
    use clap::Parser;

    fn parse(line: &str) -> Args {
        match crate::parse_command(line) {
            crate::Command::BenchLog(args) => args,
            other => panic!("{line}: parsed as {other:?}"),
        }
    }

    #[test]
    fn defaults_follow_the_issue() {
        let args = parse("decree bench-log");
        assert_eq!(args.engine, EngineKind::ALL.to_vec());
        assert_eq!(args.threads, vec![1, 4, 16, 64]);
        assert_eq!(args.duration, Duration::from_secs(3));
        assert_eq!(args.record_size, 600);
        assert_eq!(args.rpo, vec![0]);
        assert_eq!(args.format, Format::Table);
        assert!(args.dir.is_none());
    }

    #[test]
    fn lists_and_values_parse() {
        let args = parse(
            "decree bench-log --engine journal,volatile --threads 1,16 --duration 0.2 --rpo 0,10 \
             --record-size 100 --dir d --format json",
        );
        assert_eq!(args.engine, vec![EngineKind::Journal, EngineKind::Volatile]);
        assert_eq!(args.threads, vec![1, 16]);
        assert_eq!(args.duration, Duration::from_millis(200));
        assert_eq!(args.rpo, vec![0, 10]);
        assert_eq!(args.record_size, 100);
        assert_eq!(args.dir, Some(PathBuf::from("d")));
        assert_eq!(args.format, Format::Json);
    }

    #[test]
    fn bad_values_are_usage_errors() {
        for line in [
            "decree bench-log --engine journal,nosuch",
            "decree bench-log --duration 0",
            "decree bench-log --duration abc",
            "decree bench-log --threads x",
            "decree bench-log --format xml",
        ] {
            assert!(Cli::try_parse_from(line.split_whitespace()).is_err(), "{line} should fail");
        }
    }
}
