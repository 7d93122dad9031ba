//! A MariaDB branch prepared before MariaDB was killed, finished by name after it restarts.
//!
//! The bug this guards against: a by-name commit first waits until the connection named in
//! the branch (`decree_rm::xa_name`) has let go of it. MariaDB numbers connections anew
//! after a restart, so that id may by then belong to an unrelated connection. A wait keyed
//! on the process list would wait for that connection, and the branch (detached since the
//! restart: its InnoDB transaction was recovered, tied to no connection) would stay
//! prepared, holding its locks, for as long as the stranger stays connected; a wait that
//! trusted a remembered "gone" for the id would be wrong the other way after a restart.
//! decree's wait looks at `INNODB_TRX`, which ties the recovered transaction to no
//! connection, so the commit must go through while a connection with the old id is open.
//!
//! The test starts a MariaDB of its own (scripts/test-dbs.sh with a private directory and
//! ports), prepares a branch through `MariaDbRm`, SIGKILLs `mariadbd`, starts it again on
//! the same data, opens connections until one has the preparer's old id (when the new
//! numbering reaches it), and commits the branch by name from another: the row must be
//! committed and nothing left prepared.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use decree_core::{Origin, ResourceManager, Xid};
use decree_rm::MariaDbRm;
use mysql::prelude::Queryable;

/// Most connections opened while looking for the preparer's old id after the restart.
const REUSE_TRIES_MAX: u64 = 200;
/// Longest time the commit by name may take after the restart.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(60);

/// A MariaDB of this test alone (scripts/test-dbs.sh with `DECREE_TEST_DBS_ONLY=mariadb`),
/// stopped and deleted on drop.
struct PrivateDbs {
    _dir: tempfile::TempDir,
    base: PathBuf,
}

impl PrivateDbs {
    fn script(&self, action: &str) -> String {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/test-dbs.sh");
        let out = Command::new("bash")
            .arg(script)
            .arg(action)
            .env("DECREE_TEST_DBS_DIR", &self.base)
            .env("DECREE_TEST_DBS_ONLY", "mariadb")
            // Below Linux's ephemeral range (32768-60999): no open connection's own end
            // holds it (the script also moves on to the next port if one does).
            .env("DECREE_TEST_MARIADB_PORT", "23506")
            .output()
            .expect("run scripts/test-dbs.sh");
        assert!(
            out.status.success(),
            "scripts/test-dbs.sh {action}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn start() -> PrivateDbs {
        let dir = tempfile::tempdir().expect("temporary directory");
        // The servers run as an unprivileged user when the tests run as root.
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        let dbs = PrivateDbs { base: dir.path().join("dbs"), _dir: dir };
        dbs.script("start");
        dbs
    }

    fn mariadb_dsn(&self) -> String {
        let env = self.script("env");
        env.lines()
            .find_map(|l| l.strip_prefix("export DECREE_TEST_MARIADB="))
            .map(|v| v.trim_matches(|c| c == '\'' || c == '"').to_string())
            .unwrap_or_else(|| panic!("no DECREE_TEST_MARIADB in {env}"))
    }

    /// SIGKILLs mariadbd and waits until it is gone.
    fn kill_mariadb(&self) {
        let pid = std::fs::read_to_string(self.base.join("mariadb.pid")).expect("mariadb.pid");
        let pid: i32 = pid.trim().parse().expect("a pid");
        // SAFETY: kill(2) with a pid read from the server's own pid file.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0, "kill -9 mariadbd {pid}");
        let deadline = Instant::now() + Duration::from_secs(30);
        // SAFETY: signal 0 only checks that the process exists.
        while unsafe { libc::kill(pid, 0) } == 0 {
            assert!(Instant::now() < deadline, "mariadbd {pid} still alive 30 s after SIGKILL");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for PrivateDbs {
    fn drop(&mut self) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/test-dbs.sh");
        let _ = Command::new("bash").arg(script).arg("stop").env("DECREE_TEST_DBS_DIR", &self.base).output();
    }
}

fn connection_id(rm: &mut MariaDbRm) -> u64 {
    rm.client().expect("connected").query_first("SELECT CONNECTION_ID()").expect("id").expect("a row")
}

#[test]
fn a_branch_prepared_before_mariadb_was_killed_is_committed_by_name_after_its_restart() {
    // The shared test servers are not used, but their variable says MariaDB is set up here.
    if common::test_dsn("DECREE_TEST_MARIADB").is_none() {
        return;
    }
    let dbs = PrivateDbs::start();
    let dsn = dbs.mariadb_dsn();
    let origin = Origin { node: 0x00C0_0013, incarnation: 1, session: 1, sequence: 1 };
    let xid = Xid::decree(origin).branch(1);
    let mut preparer = MariaDbRm::connect("maria", &dsn).expect("connect");
    preparer
        .client()
        .expect("connected")
        .query_drop("CREATE TABLE restart_branch (id BIGINT PRIMARY KEY) ENGINE=InnoDB")
        .expect("create table");
    let old_id = connection_id(&mut preparer);
    preparer.start(&xid).expect("XA START");
    preparer
        .client()
        .expect("connected")
        .query_drop("INSERT INTO restart_branch VALUES (1)")
        .expect("insert");
    preparer.prepare(&xid).expect("XA PREPARE");

    dbs.kill_mariadb();
    drop(preparer);
    dbs.script("start");
    let dsn = dbs.mariadb_dsn();

    // A stranger with the preparer's old id, connected while the branch is finished.
    let mut stranger = None;
    for _ in 0..REUSE_TRIES_MAX {
        let mut rm = MariaDbRm::connect("maria", &dsn).expect("connect after the restart");
        let id = connection_id(&mut rm);
        if id == old_id {
            stranger = Some(rm);
            break;
        }
        if id > old_id {
            break; // numbered past it already: no stranger this time
        }
    }
    eprintln!(
        "preparer's connection id {old_id}; a connection with that id after the restart: {}",
        if stranger.is_some() { "open during the commit" } else { "none" }
    );

    let mut rm = MariaDbRm::connect("maria", &dsn).expect("connect");
    assert!(rm.recover().expect("XA RECOVER").contains(&xid), "the branch survived the restart, prepared");
    let deadline = Instant::now() + COMMIT_TIMEOUT;
    loop {
        match rm.commit(&xid, false) {
            Ok(()) => break,
            Err(e) if Instant::now() < deadline => {
                eprintln!("not yet: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("the branch prepared before the restart cannot be committed by name: {e}"),
        }
    }
    let rows: u64 = rm
        .client()
        .expect("connected")
        .query_first("SELECT COUNT(*) FROM restart_branch WHERE id = 1")
        .expect("count")
        .expect("a row");
    assert_eq!(rows, 1, "the branch's row is committed");
    assert!(!rm.recover().expect("XA RECOVER").contains(&xid), "nothing left prepared");
    drop(stranger);
}
