//! Kill -9 loops: the bank runs in its own process, dies, restarts, and the databases
//! must still balance.
//!
//! The bug this guards against: a coordinator that acknowledges a commit before its
//! decision is durable, forgets a decision across a restart, commits only some branches of
//! a decided transaction, or rolls back (or leaves dangling) branches in the wrong state
//! after a crash. Any of these shows up in the databases as money created or destroyed,
//! an acknowledged transfer missing, a transfer recorded in one database only, or a decree
//! branch left prepared (holding its locks forever). Each cycle starts `decree-bank run`,
//! kills it with SIGKILL at a random moment (sometimes even during its start-up recovery)
//! or lets it kill itself at a crash point (during prepare, right after the decision is
//! durable, during phase two), restarts it in `recover` mode and checks the invariant in
//! both databases against every transfer ever acknowledged. Cycles: DECREE_KILL_CYCLES
//! (default 50 per database pair); seed: DECREE_KILL_SEED; engine: DECREE_KILL_ENGINE.

mod common;

use decree_crashtest::{CrashPoint, PairKind, Snapshot};
use rand::Rng;
use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Longest wait for the workload to be ready or to reach its crash point.
const WAIT_MAX: Duration = Duration::from_secs(60);
const WORKERS: &str = "3";
const ACCOUNTS: u32 = 40;

#[derive(Debug, Clone, Copy)]
enum Mode {
    /// SIGKILL from the test after a random delay (from READY, or from spawn).
    Random { before_ready: bool },
    /// The process kills itself at this point of its nth transaction.
    Point(CrashPoint, u64),
}

/// What the `RECOVERED` line of a `recover` run said.
#[derive(Debug, Default, Clone, Copy)]
struct Recovered {
    decisions: u64,
    committed: u64,
    rolled_back: u64,
}

fn parse_recovered(line: &str) -> Option<Recovered> {
    let rest = line.strip_prefix("RECOVERED ")?;
    let mut r = Recovered::default();
    for field in rest.split(' ') {
        let (key, value) = field.split_once('=')?;
        let value: u64 = value.parse().ok()?;
        match key {
            "decisions" => r.decisions = value,
            "committed" => r.committed = value,
            "rolled_back" => r.rolled_back = value,
            _ => {}
        }
    }
    Some(r)
}

struct Bank {
    args: common::BankArgs,
    log_dir: std::path::PathBuf,
    engine: String,
}

impl Bank {
    fn command(&self, sub: &str) -> Command {
        let mut c = self.args.command(sub);
        if sub != "setup" {
            c.arg("--log-dir").arg(&self.log_dir).args(["--engine", &self.engine]);
        }
        c
    }
}

/// Reads the child's stdout lines into a channel (ends when the process dies).
fn spawn_reader(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().expect("stdout is piped");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

fn stderr_of(child: &mut Child) -> String {
    let mut text = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut text);
    }
    text
}

fn kill_loop(pair: PairKind, prefix: &str, node: u32) {
    let Some(config) = common::bank_config(pair, prefix, ACCOUNTS) else { return };
    let (seed, mut rng) = common::seeded_rng("DECREE_KILL_SEED");
    let cycles = common::env_count("DECREE_KILL_CYCLES", 50);
    let engine = std::env::var("DECREE_KILL_ENGINE").unwrap_or_else(|_| "journal".into());
    let dir = tempfile::tempdir().expect("temp dir");
    let args = common::BankArgs { pair, prefix: prefix.into(), accounts: ACCOUNTS, node };
    let bank = Bank { args, log_dir: dir.path().join("log"), engine: engine.clone() };
    let started = Instant::now();

    let setup = bank.command("setup").arg("--reset").output().expect("run decree-bank setup");
    assert!(setup.status.success(), "setup failed: {}", String::from_utf8_lossy(&setup.stderr));

    let mut acked: HashSet<String> = HashSet::new();
    let (mut random_kills, mut point_kills) = (0, [0u64; 3]);
    for cycle in 0..cycles {
        let mode = match cycle % 5 {
            0 | 1 => Mode::Random { before_ready: rng.gen_ratio(1, 8) },
            k => Mode::Point(CrashPoint::ALL[(k - 2) as usize], rng.gen_range(1..=8)),
        };
        let context = format!("{} cycle {cycle} ({mode:?}), seed {seed}", pair.name());
        let mut command = bank.command("run");
        command.args(["--workers", WORKERS, "--seed", &rng.gen::<u64>().to_string()]);
        if let Mode::Point(point, nth) = mode {
            command.args(["--crash-point", point.name(), "--crash-at", &nth.to_string()]);
        }
        let mut child =
            command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn decree-bank run");
        let lines = spawn_reader(&mut child);
        let mut seen = Vec::new();
        match mode {
            Mode::Random { before_ready } => {
                if !before_ready {
                    wait_ready(&lines, &mut seen, &mut child, &context);
                }
                std::thread::sleep(Duration::from_millis(rng.gen_range(10..=300)));
                if let Ok(Some(status)) = child.try_wait() {
                    panic!("{context}: the workload ended by itself ({status}): {}", stderr_of(&mut child));
                }
                child.kill().expect("SIGKILL the workload");
                let status = common::wait_exit(&mut child, WAIT_MAX).expect("a killed process exits");
                assert_eq!(status.signal(), Some(libc::SIGKILL), "{context}");
                random_kills += 1;
            }
            Mode::Point(point, _) => {
                let Some(status) = common::wait_exit(&mut child, WAIT_MAX) else {
                    let _ = child.kill();
                    panic!("{context}: the crash point was not reached within {WAIT_MAX:?}");
                };
                assert_eq!(
                    status.signal(),
                    Some(libc::SIGKILL),
                    "{context}: expected the crash point's SIGKILL, got {status}: {}",
                    stderr_of(&mut child)
                );
                point_kills[CrashPoint::ALL.iter().position(|p| *p == point).unwrap_or(0)] += 1;
            }
        }
        seen.extend(lines.iter());
        for line in &seen {
            if let Some(id) = line.strip_prefix("ACK ") {
                assert!(acked.insert(id.to_string()), "{context}: transfer id {id} acknowledged twice");
            }
        }

        let recover = bank.command("recover").output().expect("run decree-bank recover");
        let out = String::from_utf8_lossy(&recover.stdout);
        assert!(
            recover.status.success(),
            "{context}: recover failed: {}{}",
            out,
            String::from_utf8_lossy(&recover.stderr)
        );
        let recovered = out.lines().find_map(parse_recovered).expect("recover prints RECOVERED");
        // A process kill tears no write the kernel took (the journal writes with pwrite,
        // never a memory copy, under rpo=0): any torn tail reported here is a false alarm.
        if engine == "journal" {
            let warnings: Vec<&str> = seen
                .iter()
                .map(String::as_str)
                .chain(out.lines())
                .filter(|l| l.starts_with("LOG-WARNING"))
                .collect();
            assert!(warnings.is_empty(), "{context}: the log's open reported {warnings:?}");
        }
        // The crash points must have left what they promise, else the cycle tested nothing.
        match mode {
            Mode::Point(CrashPoint::Prepare, _) => {
                assert!(
                    recovered.rolled_back >= 1,
                    "{context}: no prepared branch to roll back: {recovered:?}"
                )
            }
            Mode::Point(CrashPoint::Decided | CrashPoint::PhaseTwo, _) => assert!(
                recovered.decisions >= 1 && recovered.committed >= 1,
                "{context}: no decided transaction to finish: {recovered:?}"
            ),
            Mode::Random { .. } => {}
        }

        let snapshot = Snapshot::take(&config, node).expect("read both databases");
        let violations = snapshot.violations(&config, &acked);
        assert!(violations.is_empty(), "{context}: invariant broken:\n  {}", violations.join("\n  "));
    }
    assert!(!acked.is_empty(), "{}: no transfer was ever acknowledged: the loop tested nothing", pair.name());
    eprintln!(
        "{}: {cycles} cycles ({random_kills} random kills, crash points prepare/decided/phase-two {:?}), \
         {} transfers acknowledged, engine {engine}, {:.1} s",
        pair.name(),
        point_kills,
        acked.len(),
        started.elapsed().as_secs_f64()
    );
}

fn wait_ready(lines: &mpsc::Receiver<String>, seen: &mut Vec<String>, child: &mut Child, context: &str) {
    let deadline = Instant::now() + WAIT_MAX;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => {
                let ready = line.starts_with("READY");
                seen.push(line);
                if ready {
                    return;
                }
            }
            Err(_) => {
                let _ = child.kill();
                panic!("{context}: the workload never became ready: {}", stderr_of(child));
            }
        }
    }
}

#[test]
fn kill_loop_postgres_postgres() {
    kill_loop(PairKind::PgPg, "kill_pgpg", 0x00C0_0001);
}

#[test]
fn kill_loop_postgres_mariadb() {
    kill_loop(PairKind::PgMariaDb, "kill_pgm", 0x00C0_0002);
}
