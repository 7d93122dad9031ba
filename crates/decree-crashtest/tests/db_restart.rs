//! A database that goes down during phase two, and comes back.
//!
//! The bug this guards against: a coordinator that treats a failed phase-two commit as a
//! failed transaction (reporting an error for a transaction that is decided, or rolling
//! back the other branch), or that forgets the branch once the error is reported, so that
//! it stays prepared, holding its locks, until someone notices. Database B is a private
//! PostgreSQL server started by this test (initdb into a temporary directory, so the
//! shared test server is never stopped). A fault-injection hook stops it (`pg_ctl stop -m
//! fast`) right before the coordinator sends B its phase-two commit. The commit must
//! still return Ok, saying that one branch is pending; the transaction must complete by
//! itself once the server is back (the coordinator's background retry), with the data
//! visible in both databases and nothing left prepared.

mod common;

use decree_core::{TmConfig, TransactionManager};
use decree_crashtest::bank::{run_worker, WorkerContext};
use decree_crashtest::{BankConfig, CrashPlan, PairKind, Snapshot, Trigger, TriggerCall, TriggerWhen};
use decree_log::{EngineKind, LogConfig, SyncPolicy};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const NODE: u32 = 0x00C0_0005;

/// A throwaway PostgreSQL server of this test alone.
struct PrivatePg {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    /// The OS user that runs the server when the test runs as root.
    user: Option<String>,
}

fn pg_bindir() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|d| d.join("initdb").exists())
        .collect();
    dirs.sort_by_key(|d| {
        d.parent()
            .and_then(|p| p.file_name())
            .and_then(|n| n.to_str())
            .and_then(|n| n.parse::<u32>().ok())
            .unwrap_or(0)
    });
    dirs.pop()
}

fn run(mut command: Command, what: &str) -> Result<(), String> {
    let out = command.output().map_err(|e| format!("{what}: cannot run: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

impl PrivatePg {
    fn command(&self, program: &Path) -> Command {
        match &self.user {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(program);
                c
            }
            None => Command::new(program),
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn init() -> Result<PrivatePg, String> {
        let bin = pg_bindir().ok_or("no PostgreSQL server binaries under /usr/lib/postgresql")?;
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        // SAFETY: geteuid has no preconditions.
        let user = (unsafe { libc::geteuid() } == 0).then(|| "postgres".to_string());
        if let Some(user) = &user {
            let uid = id_of(user, "-u")?;
            let gid = id_of(user, "-g")?;
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).map_err(|e| format!("chown: {e}"))?;
        }
        // Restarted on this port: below the ephemeral range, where no connection takes it.
        let port = decree_server::testing::ports::free_port();
        let pg = PrivatePg { dir, bin, port, user };
        let mut initdb = pg.command(&pg.bin.join("initdb"));
        initdb.arg("-D").arg(pg.data()).args([
            "-U",
            "decree",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-instructions",
        ]);
        run(initdb, "initdb")?;
        let sock = pg.dir.path().join("sock");
        let mut mkdir = pg.command(Path::new("/bin/mkdir"));
        mkdir.arg("-p").arg(&sock);
        run(mkdir, "mkdir")?;
        let settings = format!(
            "listen_addresses = '127.0.0.1'\nport = {}\nunix_socket_directories = '{}'\n\
             max_prepared_transactions = 20\nfsync = off\n",
            pg.port,
            sock.display()
        );
        let conf = pg.data().join("postgresql.auto.conf");
        let mut text = std::fs::read_to_string(&conf).unwrap_or_default();
        text.push_str(&settings);
        std::fs::write(&conf, text).map_err(|e| format!("write {}: {e}", conf.display()))?;
        pg.start()?;
        Ok(pg)
    }

    fn start(&self) -> Result<(), String> {
        let mut c = self.command(&self.bin.join("pg_ctl"));
        c.arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.dir.path().join("pg.log"))
            .args(["-w", "-t", "60", "start"]);
        run(c, "pg_ctl start")
    }

    fn stop(&self, mode: &str) -> Result<(), String> {
        let mut c = self.command(&self.bin.join("pg_ctl"));
        c.arg("-D").arg(self.data()).args(["-m", mode, "-w", "stop"]);
        run(c, "pg_ctl stop")
    }

    fn dsn(&self) -> String {
        format!("host=127.0.0.1 port={} user=decree dbname=postgres", self.port)
    }
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        let _ = self.stop("immediate");
    }
}

fn id_of(user: &str, flag: &str) -> Result<u32, String> {
    let out = Command::new("id").args([flag, user]).output().map_err(|e| format!("id: {e}"))?;
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|_| format!("no OS user {user:?} to run PostgreSQL"))
}

#[test]
fn phase_two_completes_after_the_database_restarts() {
    let Some(shared) = common::bank_config(PairKind::PgPg, "restart", 10) else { return };
    let pg = match PrivatePg::init() {
        Ok(pg) => Arc::new(pg),
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") => {
            panic!("cannot start a private PostgreSQL server: {e}")
        }
        Err(e) => {
            eprintln!("skipped: cannot start a private PostgreSQL server: {e}");
            return;
        }
    };
    let config = BankConfig { dsn_b: pg.dsn(), ..shared };
    config.setup(true, NODE).expect("setup");

    let dir = tempfile::tempdir().expect("temp dir");
    let log =
        decree_log::open(&LogConfig::new(dir.path().join("log"), EngineKind::Journal, SyncPolicy::Immediate))
            .expect("open the log");
    let tm_config = TmConfig {
        node: NODE,
        retry_backoff_min: Duration::from_millis(10),
        retry_backoff_max: Duration::from_millis(200),
        ..TmConfig::default()
    };
    let tm = TransactionManager::embedded(Arc::from(log), tm_config, config.factories().expect("factories"))
        .expect("coordinator");

    // Stop B right before its phase-two commit of the first transaction.
    let stopper = pg.clone();
    let trigger = Trigger { call: TriggerCall::Commit, rm_index: 1, when: TriggerWhen::Before, nth: 1 };
    let plan = CrashPlan::new(trigger, Arc::new(move || stopper.stop("fast").expect("stop database B")));
    let acks: Mutex<Vec<(String, usize)>> = Mutex::new(Vec::new());
    let stop = std::sync::atomic::AtomicBool::new(false);
    let ctx = WorkerContext { tm: &tm, config: &config, plan: &plan, stop: &stop, transfers_max: 1 };
    let on_ack = |id: &str, report: &decree_core::CommitReport| {
        acks.lock().expect("ack list").push((id.to_string(), report.phase_two_pending));
    };
    let on_error = |e: &decree_crashtest::BankError| panic!("the transfer failed: {e}");
    run_worker(&ctx, 1, &on_ack, &on_error).expect("one transfer");
    assert!(plan.fired(), "the hook never stopped database B");
    let acks = acks.into_inner().expect("ack list");
    assert_eq!(acks.len(), 1, "one transfer acknowledged: {acks:?}");
    assert_eq!(acks[0].1, 1, "commit returned Ok with B's phase two pending: {acks:?}");
    assert!(tm.pending() >= 1, "the coordinator keeps B's commit to retry while B is down");

    pg.start().expect("restart database B");
    assert!(tm.wait_idle(Duration::from_secs(60)), "phase two never completed after B came back");
    assert!(tm.retries() >= 1, "the background retry finished the transaction");
    let acked: HashSet<String> = acks.iter().map(|(id, _)| id.clone()).collect();
    let snapshot = Snapshot::take(&config, NODE).expect("read both databases");
    let violations = snapshot.violations(&config, &acked);
    assert!(violations.is_empty(), "invariant broken:\n  {}", violations.join("\n  "));
    assert_eq!(snapshot.transfers_b.len(), 1, "the transfer is visible in B");
}
