//! decree-bank: the workload the kill loop starts, kills and restarts.
//!
//! ```text
//! decree-bank setup   --pair pg-pg --prefix kill_pgpg --accounts 50 --node 7 [--reset]
//! decree-bank run     --log-dir D --engine journal --workers 3 --pair pg-pg --prefix kill_pgpg
//!                     --accounts 50 --node 7 [--crash-point prepare|decided|phase-two --crash-at N]
//!                     [--transfers-max N] [--seed S]
//! decree-bank recover --log-dir D --engine journal --pair pg-pg --prefix kill_pgpg --accounts 50 --node 7
//! ```
//!
//! `run` and `recover` open the log and the coordinator, which recovers first (commits
//! decided branches, rolls back prepared branches of dead incarnations), then print
//! `LOG-WARNING ...` for what the log's open cut, `RECOVERED ...` and `READY ...`. `run` then moves money on `--workers` threads and prints
//! `ACK <transfer id>` (flushed) after each commit that returned Ok: the acknowledged set
//! the test checks. `recover` waits for background retries and exits. With a crash point,
//! the process SIGKILLs itself at that point of the `--crash-at`th transaction.
//! DSNs come from `--dsn-a`/`--dsn-b` or DECREE_TEST_PG_A and DECREE_TEST_PG_B (pg-pg) or
//! DECREE_TEST_MARIADB (pg-mariadb).

use decree_core::{TmConfig, TransactionManager};
use decree_crashtest::bank::{run_worker, BankConfig, PairKind, WorkerContext};
use decree_crashtest::crash::{CrashPlan, CrashPoint};
use decree_log::{EngineKind, LogConfig, SyncPolicy};
use std::collections::HashMap;
use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// Most worker threads.
const WORKERS_MAX: usize = 64;
/// How long `recover` waits for background retries before giving up.
const RECOVER_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Journal segments are small: every restart of the kill loop opens the log again.
const SEGMENT_BYTES: u64 = 1 << 20;

struct Args {
    command: String,
    values: HashMap<String, String>,
    reset: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let command = it.next().ok_or("usage: decree-bank setup|run|recover [--option value]...")?;
    let mut values = HashMap::new();
    let mut reset = false;
    while let Some(flag) = it.next() {
        let Some(name) = flag.strip_prefix("--") else { return Err(format!("unexpected argument {flag:?}")) };
        if name == "reset" {
            reset = true;
            continue;
        }
        let value = it.next().ok_or_else(|| format!("--{name} needs a value"))?;
        values.insert(name.to_string(), value);
    }
    Ok(Args { command, values, reset })
}

impl Args {
    fn get(&self, name: &str) -> Result<&str, String> {
        self.values.get(name).map(String::as_str).ok_or_else(|| format!("--{name} is required"))
    }

    fn parse<T: std::str::FromStr>(&self, name: &str, default: Option<T>) -> Result<T, String>
    where
        T::Err: std::fmt::Display,
    {
        match (self.values.get(name), default) {
            (Some(v), _) => v.parse().map_err(|e| format!("--{name} {v:?}: {e}")),
            (None, Some(d)) => Ok(d),
            (None, None) => Err(format!("--{name} is required")),
        }
    }

    fn dsn(&self, flag: &str, env: &str) -> Result<String, String> {
        if let Some(v) = self.values.get(flag) {
            return Ok(v.clone());
        }
        std::env::var(env).map_err(|_| format!("give --{flag} or set {env} (scripts/test-dbs.sh env)"))
    }

    fn bank(&self) -> Result<BankConfig, String> {
        let kind: PairKind = self.parse("pair", None)?;
        let dsn_b = match kind {
            PairKind::PgPg => self.dsn("dsn-b", "DECREE_TEST_PG_B")?,
            PairKind::PgMariaDb => self.dsn("dsn-b", "DECREE_TEST_MARIADB")?,
        };
        Ok(BankConfig {
            kind,
            dsn_a: self.dsn("dsn-a", "DECREE_TEST_PG_A")?,
            dsn_b,
            prefix: self.get("prefix")?.to_string(),
            accounts: self.parse("accounts", None)?,
            balance_start: self.parse("balance", Some(1000))?,
        })
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("decree-bank: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let args = parse_args()?;
    let bank = args.bank()?;
    let node: u32 = args.parse("node", None)?;
    match args.command.as_str() {
        "setup" => bank.setup(args.reset, node).map_err(|e| e.to_string()),
        "run" | "recover" => serve(&args, &bank, node),
        other => Err(format!("unknown command {other:?}; expected setup, run or recover")),
    }
}

fn open_tm(args: &Args, bank: &BankConfig, node: u32) -> Result<Arc<TransactionManager>, String> {
    let engine: EngineKind = args.parse("engine", Some(EngineKind::Journal))?;
    let mut log_config = LogConfig::new(args.get("log-dir")?, engine, SyncPolicy::Immediate);
    log_config.segment_bytes = SEGMENT_BYTES;
    let log = decree_log::open(&log_config).map_err(|e| format!("cannot open the log: {e}"))?;
    for warning in log.open_warnings() {
        say(&format!("LOG-WARNING {warning}"));
    }
    let config = TmConfig {
        node,
        retry_backoff_min: Duration::from_millis(5),
        retry_backoff_max: Duration::from_millis(200),
        ..TmConfig::default()
    };
    let factories = bank.factories().map_err(|e| e.to_string())?;
    let tm = TransactionManager::embedded(Arc::from(log), config, factories)
        .map_err(|e| format!("coordinator start (recovery) failed: {e}"))?;
    let r = tm.recovery_report();
    say(&format!(
        "RECOVERED decisions={} committed={} rolled_back={} left_alone={} deferred={} missing_rms={}",
        r.decisions,
        r.branches_committed,
        r.branches_rolled_back,
        r.branches_left_alone,
        r.deferred,
        r.missing_rms.len()
    ));
    Ok(tm)
}

/// Writes one line to stdout and flushes it, so that a kill right after loses nothing
/// that was said.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn serve(args: &Args, bank: &BankConfig, node: u32) -> Result<(), String> {
    bank.validate().map_err(|e| e.to_string())?;
    let tm = open_tm(args, bank, node)?;
    say(&format!("READY incarnation={}", tm.store().incarnation()));
    if args.command == "recover" {
        if !tm.wait_idle(RECOVER_IDLE_TIMEOUT) {
            return Err(format!("background recovery still pending after {RECOVER_IDLE_TIMEOUT:?}"));
        }
        say("RECOVER-DONE");
        return Ok(());
    }
    let workers: usize = args.parse("workers", Some(3))?;
    if workers == 0 || workers > WORKERS_MAX {
        return Err(format!("--workers {workers} not in 1..={WORKERS_MAX}"));
    }
    let plan = match args.values.get("crash-point") {
        None => CrashPlan::none(),
        Some(point) => {
            let point: CrashPoint = point.parse()?;
            let nth: u64 = args.parse("crash-at", Some(1))?;
            if nth == 0 {
                return Err("--crash-at counts transactions from 1".into());
            }
            CrashPlan::new(point.trigger(nth), CrashPlan::kill_process())
        }
    };
    let seed: u64 = args.parse("seed", Some(rand::random()))?;
    let stop = AtomicBool::new(false);
    let ctx = WorkerContext {
        tm: &tm,
        config: bank,
        plan: &plan,
        stop: &stop,
        transfers_max: args.parse("transfers-max", Some(u64::MAX))?,
    };
    let on_ack = |id: &str, _: &decree_core::CommitReport| say(&format!("ACK {id}"));
    let on_error = |e: &decree_crashtest::BankError| eprintln!("decree-bank: transfer failed: {e}");
    let results: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let ctx = &ctx;
                let (on_ack, on_error) = (&on_ack, &on_error);
                scope.spawn(move || run_worker(ctx, seed.wrapping_add(w as u64), on_ack, on_error))
            })
            .collect();
        handles.into_iter().map(|h| h.join()).collect()
    });
    let mut acked = 0;
    for result in results {
        match result {
            Ok(Ok(report)) => acked += report.acked,
            Ok(Err(e)) => return Err(format!("worker failed: {e}")),
            Err(_) => return Err("a worker panicked".into()),
        }
    }
    if !tm.wait_idle(RECOVER_IDLE_TIMEOUT) {
        return Err(format!("phase two still pending after {RECOVER_IDLE_TIMEOUT:?}"));
    }
    say(&format!("DONE acked={acked}"));
    Ok(())
}
