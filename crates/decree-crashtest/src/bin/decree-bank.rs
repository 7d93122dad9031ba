//! decree-bank: the workload the kill loops start, kill and restart.
//!
//! ```text
//! decree-bank setup   --pair pg-pg --prefix kill_pgpg --accounts 50 --node 7 [--reset]
//! decree-bank run     --log-dir D --engine journal --workers 3 --pair pg-pg --prefix kill_pgpg
//!                     --accounts 50 --node 7 [--crash-point prepare|decided|phase-two --crash-at N]
//!                     [--transfers-max N] [--seed S] [--acked-file F]
//! decree-bank run     --state unix:/a.sock,unix:/b.sock --workers 3 --pair pg-pg --prefix pair_pgpg
//!                     --accounts 50 --node 7 [--failover-wait-s 60] [--transfers-max N] [--seed S]
//!                     [--acked-file F]
//! decree-bank recover --log-dir D --engine journal --pair pg-pg --prefix kill_pgpg --accounts 50 --node 7
//! ```
//!
//! `run` and `recover` open the log and the coordinator, which recovers first (commits
//! decided branches, rolls back prepared branches of dead incarnations), then print
//! `LOG-WARNING ...` for what the log's open cut, `RECOVERED ...` and `READY ...`. `run` then moves money on `--workers` threads and prints
//! `ACK <transfer id>` (flushed) after each commit that returned Ok: the acknowledged set
//! the test checks (also appended to `--acked-file`, one id a line, when given). `recover`
//! waits for background retries and exits. With a crash point,
//! the process SIGKILLs itself at that point of the `--crash-at`th transaction, right after
//! printing `CRASH-POINT <point> <transfer id>`.
//!
//! With `--state` the coordinator keeps its decisions on a state server instead (a comma
//! list names the members of a pair; whichever serves is used, waited for up to
//! `--failover-wait-s`), which recovers on its own: `run` prints `READY`, no `RECOVERED`.
//! When the server is lost (a decide or a session's open fails: the primary died), the
//! workers stop after their transfer in progress and `run` does what an application must
//! after a failover: it prints `STORE-LOST doubtful=N`, connects again through a new
//! client (the new primary's epoch is a new incarnation) and prints `FAILED-OVER
//! incarnation=I endpoint=E`, then asks the new primary the outcome of every transfer
//! whose decide got no answer and prints `RESOLVED <transfer id> <outcome>` (committed,
//! rolled-back, heuristic or unknown; in progress is asked again) before it exits. When
//! that primary is lost in turn before it answered, it fails over again (another
//! `FAILED-OVER` line) and asks the next one, until `--failover-wait-s` has passed.
//! DSNs come from `--dsn-a`/`--dsn-b` or DECREE_TEST_PG_A and DECREE_TEST_PG_B (pg-pg) or
//! DECREE_TEST_MARIADB (pg-mariadb).

use decree_client::RemoteDecisions;
use decree_core::{DecisionStore, Outcome, StoreError, TmConfig, TmError, TransactionManager, Xid};
use decree_crashtest::bank::{run_worker, transfer_id, BankConfig, BankError, PairKind, WorkerContext};
use decree_crashtest::crash::{CrashPlan, CrashPoint, CrashWitness};
use decree_log::{EngineKind, LogConfig, SyncPolicy};
use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Most worker threads.
const WORKERS_MAX: usize = 64;
/// How long `recover` waits for background retries before giving up.
const RECOVER_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Journal segments are small: every restart of the kill loop opens the log again.
const SEGMENT_BYTES: u64 = 1 << 20;
/// Default of `--failover-wait-s`: how long `run --state` waits for a member that serves.
const FAILOVER_WAIT_S: u64 = 60;
/// Pause between two tries to reach a serving member, or two questions about an outcome.
const RETRY_PAUSE: Duration = Duration::from_millis(20);

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
    match args.values.get("state") {
        Some(addresses) => open_remote_tm(args, addresses, bank, node),
        None => open_embedded_tm(args, bank, node),
    }
}

fn tm_config(node: u32) -> TmConfig {
    TmConfig {
        node,
        retry_backoff_min: Duration::from_millis(5),
        retry_backoff_max: Duration::from_millis(200),
        ..TmConfig::default()
    }
}

fn open_embedded_tm(args: &Args, bank: &BankConfig, node: u32) -> Result<Arc<TransactionManager>, String> {
    let engine: EngineKind = args.parse("engine", Some(EngineKind::Journal))?;
    let mut log_config = LogConfig::new(args.get("log-dir")?, engine, SyncPolicy::Immediate);
    log_config.segment_bytes = SEGMENT_BYTES;
    let log = decree_log::open(&log_config).map_err(|e| format!("cannot open the log: {e}"))?;
    for warning in log.open_warnings() {
        say(&format!("LOG-WARNING {warning}"));
    }
    let factories = bank.factories().map_err(|e| e.to_string())?;
    let tm = TransactionManager::embedded(Arc::from(log), tm_config(node), factories)
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

/// The coordinator over the state server (or pair) at `addresses`, which must mint Xids
/// with `node` (the invariant's check looks for that node's prepared branches).
fn open_remote_tm(
    args: &Args,
    addresses: &str,
    bank: &BankConfig,
    node: u32,
) -> Result<Arc<TransactionManager>, String> {
    if args.command == "recover" {
        return Err("recover runs on the embedded log; a state server recovers on its own".into());
    }
    let store = connect_serving(addresses, failover_wait(args)?)?;
    if store.node() != node {
        return Err(format!(
            "the state server at {} has node {}, not --node {node}",
            store.endpoint(),
            store.node()
        ));
    }
    let factories = bank.factories().map_err(|e| e.to_string())?;
    TransactionManager::with_store(Arc::new(store), tm_config(node), factories)
        .map_err(|e| format!("coordinator start failed: {e}"))
}

fn failover_wait(args: &Args) -> Result<Duration, String> {
    Ok(Duration::from_secs(args.parse("failover-wait-s", Some(FAILOVER_WAIT_S))?))
}

/// Connects to whichever member of `addresses` serves, trying again until `wait` has
/// passed: after a primary died, nobody serves until the operator promotes the backup.
fn connect_serving(addresses: &str, wait: Duration) -> Result<RemoteDecisions, String> {
    let deadline = Instant::now() + wait;
    loop {
        match RemoteDecisions::connect(addresses) {
            Ok(store) => return Ok(store),
            Err(StoreError::Unreachable(_)) if Instant::now() < deadline => std::thread::sleep(RETRY_PAUSE),
            Err(e) => return Err(format!("no member of {addresses} serves after {wait:?}: {e}")),
        }
    }
}

/// Writes one line to stdout and flushes it, so that a kill right after loses nothing
/// that was said.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn crash_plan(args: &Args) -> Result<Arc<CrashPlan>, String> {
    match args.values.get("crash-point") {
        None => Ok(CrashPlan::none()),
        Some(point) => {
            let point: CrashPoint = point.parse()?;
            let nth: u64 = args.parse("crash-at", Some(1))?;
            if nth == 0 {
                return Err("--crash-at counts transactions from 1".into());
            }
            // Said (flushed) before the kill: which transaction the process dies in.
            let witness: CrashWitness = Arc::new(move |xid: &Xid| match transfer_id(xid) {
                Ok(id) => say(&format!("CRASH-POINT {} {id}", point.name())),
                Err(e) => say(&format!("CRASH-POINT {} {e}", point.name())),
            });
            Ok(CrashPlan::witnessed(point.trigger(nth), Some(witness), CrashPlan::kill_process()))
        }
    }
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
    let plan = crash_plan(args)?;
    let acked_file = match args.values.get("acked-file") {
        Some(path) => Some(
            File::options()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| format!("cannot open --acked-file {path}: {e}"))?,
        ),
        None => None,
    };
    let stop = AtomicBool::new(false);
    let ctx = WorkerContext {
        tm: &tm,
        config: bank,
        plan: &plan,
        stop: &stop,
        transfers_max: args.parse("transfers-max", Some(u64::MAX))?,
    };
    let remote = args.values.contains_key("state");
    let seed: u64 = args.parse("seed", Some(rand::random()))?;
    let ended = run_workers(&ctx, workers, seed, remote, acked_file.as_ref())?;
    if ended.store_lost {
        return fail_over(args, &ended.doubts);
    }
    if !tm.wait_idle(RECOVER_IDLE_TIMEOUT) {
        return Err(format!("phase two still pending after {RECOVER_IDLE_TIMEOUT:?}"));
    }
    say(&format!("DONE acked={}", ended.acked));
    Ok(())
}

/// How the workers of a `run` ended.
struct Ended {
    /// Transfers acknowledged.
    acked: u64,
    /// The state server was lost (only with `--state`).
    store_lost: bool,
    /// Transactions whose decide got no answer: their outcome is the server's to tell.
    doubts: Vec<Xid>,
}

/// A failure that says the coordinator lost its state server: a decide without an answer,
/// a decision that could not be sent (rolled back), or a session the server did not open.
fn store_lost(e: &BankError) -> bool {
    matches!(e, BankError::Tm(TmError::OutcomeUnknown { .. } | TmError::NotSent { .. } | TmError::Store(_)))
}

fn run_workers(
    ctx: &WorkerContext<'_>,
    workers: usize,
    seed: u64,
    remote: bool,
    acked_file: Option<&File>,
) -> Result<Ended, String> {
    let lost = AtomicBool::new(false);
    let doubts = Mutex::new(Vec::new());
    let on_ack = |id: &str, _: &decree_core::CommitReport| {
        say(&format!("ACK {id}"));
        if let Some(mut file) = acked_file {
            // One write of the whole line: the workers append to the file at once.
            if let Err(e) = file.write_all(format!("{id}\n").as_bytes()) {
                eprintln!("decree-bank: cannot append {id} to --acked-file: {e}");
                std::process::abort();
            }
        }
    };
    let on_error = |e: &BankError| {
        eprintln!("decree-bank: transfer failed: {e}");
        if remote && store_lost(e) {
            if let BankError::Tm(TmError::OutcomeUnknown { xid, .. }) = e {
                doubts.lock().unwrap_or_else(|p| p.into_inner()).push(**xid);
            }
            lost.store(true, Ordering::SeqCst);
            ctx.stop.store(true, Ordering::SeqCst);
        }
    };
    let results: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
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
            // A worker that could not open its session once the primary was gone.
            Ok(Err(e)) if remote && store_lost(&e) => {
                eprintln!("decree-bank: worker ended: {e}");
                lost.store(true, Ordering::SeqCst);
            }
            Ok(Err(e)) => return Err(format!("worker failed: {e}")),
            Err(_) => return Err("a worker panicked".into()),
        }
    }
    let doubts = doubts.into_inner().unwrap_or_else(|p| p.into_inner());
    Ok(Ended { acked, store_lost: lost.load(Ordering::SeqCst), doubts })
}

/// The first pause before asking again about an outcome answered unknown, and the last:
/// 0.25 + 0.5 + ... + 4 s, about 8 s in all, past the server's first rechecks.
const UNKNOWN_FIRST_PAUSE: Duration = Duration::from_millis(250);
const UNKNOWN_LAST_PAUSE: Duration = Duration::from_secs(4);

/// What an application does after its state server's primary died: connect again (a new
/// client: the new primary's epoch is a new incarnation) and ask the new primary what
/// became of every transaction whose decide got no answer, never guessing.
/// The new primary can be lost in turn before it answered them all (an elected primary
/// whose lease lapsed again while etcd came back): then it fails over again, each time
/// printing `FAILED-OVER`, until `--failover-wait-s` has passed.
fn fail_over(args: &Args, doubts: &[Xid]) -> Result<(), String> {
    say(&format!("STORE-LOST doubtful={}", doubts.len()));
    let wait = failover_wait(args)?;
    let deadline = Instant::now() + wait;
    let connect = || -> Result<RemoteDecisions, String> {
        let store = connect_serving(args.get("state")?, deadline.saturating_duration_since(Instant::now()))?;
        say(&format!("FAILED-OVER incarnation={} endpoint={}", store.incarnation(), store.endpoint()));
        Ok(store)
    };
    let mut store = connect()?;
    for xid in doubts {
        let mut unknown_pause = UNKNOWN_FIRST_PAUSE;
        let outcome = loop {
            match store.outcome(xid) {
                // The new primary's first recovery pass has not ended yet: ask again.
                Ok(Outcome::InProgress) if Instant::now() < deadline => std::thread::sleep(RETRY_PAUSE),
                // An earlier epoch's Xid the new primary holds no decision of: the question
                // made it look for the branches (docs/protocol.md, rule 7), and once it has
                // rolled them back the answer says so. Asked again, on a doubling schedule.
                Ok(Outcome::Unknown) if unknown_pause <= UNKNOWN_LAST_PAUSE => {
                    std::thread::sleep(unknown_pause);
                    unknown_pause *= 2;
                }
                Ok(outcome) => break outcome,
                Err(StoreError::Unreachable(e)) if Instant::now() < deadline => {
                    eprintln!("decree-bank: outcome of {xid}: the new primary was lost too ({e}): failing over again");
                    store = connect()?;
                }
                Err(e) => return Err(format!("outcome of {xid} not answered by the new primary: {e}")),
            }
        };
        let name = match outcome {
            Outcome::Committed => "committed",
            Outcome::RolledBack => "rolled-back",
            Outcome::Heuristic => "heuristic",
            Outcome::Unknown => "unknown",
            Outcome::InProgress => "in-progress",
        };
        let id = transfer_id(xid).map_err(|e| e.to_string())?;
        say(&format!("RESOLVED {id} {name}"));
    }
    Ok(())
}
