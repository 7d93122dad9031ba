//! `decree recover`'s library ([`decree_server::admin`]) against real PostgreSQL databases
//! (scripts/test-dbs.sh) and a real journal log in a temporary directory.
//!
//! The bugs guarded against: an operator's hand resolution that contradicts the log
//! without being told (rolling back a decided transaction leaves it half-committed;
//! committing an undecided one breaks presumed abort), a forced choice that leaves no
//! trace, a resolution that forgets to complete the decision (the server would redo it at
//! its next start), and touching another transaction manager's prepared transactions.
//!
//! Without the DECREE_TEST_* variables the database test prints "skipped: ..." and returns;
//! with CI=true it fails instead.

mod common;

use common::{count, dsn, prepare_insert};
use decree_core::{BranchRecord, Decision, Origin, TraceContext, Xid};
use decree_log::EngineKind;
use decree_rm::PgRm;
use decree_server::admin::{self, AdminError, BranchState, Inspector, STATE_DECIDED, STATE_UNDECIDED};
use decree_server::{RmConfig, ServerConfig};
use std::time::{SystemTime, UNIX_EPOCH};

/// A token unique to this run, for node ids, table names and gids.
fn token() -> u64 {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    (nanos ^ ((std::process::id() as u64) << 24)) & 0x0fff_ffff
}

fn config(dir: &std::path::Path, node: u32, rms: &[(&str, &str)]) -> ServerConfig {
    let mut config = ServerConfig::new(dir.join("log"), EngineKind::Journal);
    config.node = node;
    config.unix = Some(dir.join("decree.sock"));
    config.rm = rms
        .iter()
        .map(|(name, dsn)| RmConfig { name: name.to_string(), kind: "postgres".into(), dsn: dsn.to_string() })
        .collect();
    config
}

fn prepared_gids(rm: &PgRm) -> Vec<String> {
    let rows = rm
        .client()
        .expect("client")
        .query("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()", &[])
        .expect("pg_prepared_xacts");
    rows.iter().map(|r| r.get(0)).collect()
}

/// Rolls back whatever this test left prepared and drops its tables, even on failure.
struct Cleanup {
    dsns: Vec<String>,
    gids: Vec<String>,
    table: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for dsn in &self.dsns {
            let Ok(rm) = PgRm::connect("cleanup", dsn) else { continue };
            let Ok(mut client) = rm.client() else { continue };
            for gid in &self.gids {
                let _ = client.batch_execute(&format!("ROLLBACK PREPARED '{gid}'"));
            }
            let _ = client.batch_execute(&format!("DROP TABLE IF EXISTS {}", self.table));
        }
    }
}

#[test]
fn recover_lists_and_resolves_real_in_doubt_transactions() {
    let (Some(dsn_a), Some(dsn_b)) = (dsn("DECREE_TEST_PG_A"), dsn("DECREE_TEST_PG_B")) else { return };
    let token = token();
    let node = 0x4000_0000 | token as u32;
    let table = format!("admin_{token:x}");
    let foreign = format!("other-tm-1-{token:x}");
    let xid = |sequence| Xid::decree(Origin { node, incarnation: 1, session: 9, sequence });
    // decided: commits; undecided: rolls back; forced_back: decided but rolled back by
    // force; forced_commit: undecided but committed by force.
    let (decided, undecided, forced_back, forced_commit) = (xid(1), xid(2), xid(3), xid(4));
    let mut cleanup =
        Cleanup { dsns: vec![dsn_a.clone(), dsn_b.clone()], gids: vec![foreign.clone()], table };
    for x in [decided, undecided, forced_back, forced_commit] {
        cleanup.gids.extend([x.branch(0).to_gid(), x.branch(1).to_gid()]);
    }
    let table = cleanup.table.clone();

    let mut a = PgRm::connect("pg-a", &dsn_a).expect("connect pg-a");
    let mut b = PgRm::connect("pg-b", &dsn_b).expect("connect pg-b");
    for rm in [&a, &b] {
        rm.client().unwrap().batch_execute(&format!("CREATE TABLE {table} (id bigint PRIMARY KEY)")).unwrap();
    }
    for (id, x) in [(1, decided), (2, undecided)] {
        prepare_insert(&mut a, &x.branch(0), &table, id);
        prepare_insert(&mut b, &x.branch(1), &table, id);
    }
    prepare_insert(&mut a, &forced_back.branch(0), &table, 3);
    prepare_insert(&mut a, &forced_commit.branch(0), &table, 4);
    a.client()
        .unwrap()
        .batch_execute(&format!("BEGIN; INSERT INTO {table} VALUES (100); PREPARE TRANSACTION '{foreign}'"))
        .expect("foreign prepare");

    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), node, &[("pg-a", &dsn_a), ("pg-b", &dsn_b)]);
    // The decided one's record kept its client's trace context (the log's DCD2 form).
    let client = TraceContext { trace_id: [0x1d; 16], span_id: [0x2e; 8], flags: 1 };
    {
        let log = decree_log::open(&config.log_config().unwrap()).expect("open log");
        let rec = |rm: &str, branch| BranchRecord { rm: rm.into(), branch };
        for (d, trace) in [
            (Decision { xid: decided, branches: vec![rec("pg-a", 0), rec("pg-b", 1)] }, Some(&client)),
            (Decision { xid: forced_back, branches: vec![rec("pg-a", 0)] }, None),
        ] {
            log.append(d.xid.log_key(), &d.encode_logged(trace)).expect("append decision");
        }
        log.sync().unwrap();
    }

    let factories = admin::factories_for(&config).expect("factories");
    let mut inspector = Inspector::open(&config, factories).expect("inspector opens");
    let listing = inspector.list();
    assert!(listing.rms.iter().all(|r| r.unreachable.is_none()), "{:?}", listing.rms);
    let find = |l: &admin::Listing, x: Xid| l.in_doubt.iter().find(|t| t.xid == x).cloned();
    let d = find(&listing, decided).expect("decided transaction listed");
    assert!(d.decided && d.state() == STATE_DECIDED);
    assert_eq!(d.branches.len(), 2, "{d:?}");
    assert!(d.branches.iter().all(|b| b.state == BranchState::Prepared), "{d:?}");
    assert_eq!(d.trace, Some(client), "the client's context its record kept");
    let u = find(&listing, undecided).expect("undecided transaction listed");
    assert!(!u.decided && u.state() == STATE_UNDECIDED);
    assert_eq!(u.branches.len(), 2, "{u:?}");
    assert_eq!(u.origin.map(|o| (o.node, o.session)), Some((node, 9)));
    assert!(u.age_s.is_some(), "PostgreSQL knows when the branch was prepared");
    assert!(listing.in_doubt.iter().all(|t| t.origin.is_some_and(|o| o.node == node)));
    let (text, json) = (listing.to_table(), listing.to_json());
    for shown in [&text, &json] {
        assert!(shown.contains(&decided.to_gid()) && shown.contains(&undecided.to_gid()), "{shown}");
        assert!(!shown.contains(&foreign), "foreign transaction listed: {shown}");
    }
    let parsed: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
    assert_eq!(parsed["in_doubt"].as_array().map(Vec::len), Some(4), "{json}");
    let shown = parsed["in_doubt"].as_array().unwrap().iter().find(|t| t["xid"] == decided.to_gid()).unwrap();
    assert_eq!(shown["trace_id"], client.trace_id_hex(), "{json}");
    assert_eq!(shown["span_id"], client.span_id_hex(), "{json}");
    let untraced = parsed["in_doubt"].as_array().unwrap().iter().find(|t| t["xid"] == undecided.to_gid());
    assert!(untraced.unwrap()["trace_id"].is_null(), "{json}");

    // Choices that contradict the log are refused and touch nothing.
    let e = inspector.rollback(&decided, false).unwrap_err();
    assert!(matches!(e, AdminError::Refused(_)) && e.to_string().contains(&decided.to_gid()), "{e}");
    let e = inspector.commit(&undecided, false).unwrap_err();
    assert!(matches!(e, AdminError::Refused(_)) && e.to_string().contains("presumed abort"), "{e}");
    assert_eq!(count(&a, &table, 1) + count(&a, &table, 2), 0);
    assert!(!dir.path().join("log").join(admin::HEURISTICS_FILE).exists());

    let r = inspector.commit(&decided, false).expect("commit decided");
    assert!(r.log_completed && r.heuristic.is_none(), "{r}");
    assert_eq!((count(&a, &table, 1), count(&b, &table, 1)), (1, 1), "both branches committed");
    let r = inspector.rollback(&undecided, false).expect("rollback undecided");
    assert!(r.heuristic.is_none(), "{r}");
    assert_eq!((count(&a, &table, 2), count(&b, &table, 2)), (0, 0));

    let r = inspector.rollback(&forced_back, true).expect("forced rollback");
    let heuristics = r.heuristic.clone().expect("forced rollback recorded");
    assert_eq!(count(&a, &table, 3), 0);
    let r = inspector.commit(&forced_commit, true).expect("forced commit");
    assert!(r.heuristic.is_some() && r.log_completed, "{r}");
    assert_eq!(count(&a, &table, 4), 1);
    let recorded = std::fs::read_to_string(&heuristics).expect("heuristics file");
    assert!(recorded.contains(&format!("heuristic rollback {forced_back}")), "{recorded}");
    assert!(recorded.contains(&format!("heuristic commit {forced_commit}")), "{recorded}");

    let listing = inspector.list();
    for x in [decided, undecided, forced_back, forced_commit] {
        assert!(find(&listing, x).is_none(), "{x} still listed: {}", listing.to_table());
    }
    let e = inspector.commit(&decided, false).unwrap_err();
    assert!(matches!(e, AdminError::NotFound { .. }), "{e}");
    drop(inspector);

    // Every decision was completed: a coordinator starting now finds nothing to redo.
    let log = decree_log::open(&config.log_config().unwrap()).expect("reopen log");
    assert_eq!(log.take_recovered(), Vec::new());
    drop(log);
    assert!(prepared_gids(&a).contains(&foreign), "the foreign transaction was touched");
    a.client().unwrap().batch_execute(&format!("ROLLBACK PREPARED '{foreign}'")).expect("foreign rollback");
    assert!(!prepared_gids(&a).contains(&foreign));
}

#[test]
fn a_locked_log_directory_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 1, &[]);
    let held = decree_log::open(&config.log_config().unwrap()).expect("first owner");
    let err = Inspector::open(&config, Vec::new()).err().expect("locked directory refused");
    let message = err.to_string();
    assert!(matches!(err, AdminError::LogInUse { .. }), "{err:?}");
    assert!(message.contains(&config.log_dir.display().to_string()), "{message}");
    assert!(message.contains("in use by a running decree process"), "{message}");
    drop(held);
    assert!(Inspector::open(&config, Vec::new()).is_ok(), "free once the owner is gone");
}

#[test]
fn an_unreachable_resource_manager_is_reported_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 1, &[("pg-down", "host=127.0.0.1 port=1 user=decree dbname=none")]);
    let factories = admin::factories_for(&config).expect("factories");
    let mut inspector = Inspector::open(&config, factories).expect("opens despite the RM");
    let listing = inspector.list();
    assert_eq!(listing.rms.len(), 1);
    assert!(listing.rms[0].unreachable.is_some(), "{:?}", listing.rms);
    assert!(listing.to_table().contains("rm pg-down: unreachable: "), "{}", listing.to_table());
    assert!(listing.in_doubt.is_empty());
}

/// The newest journal segment of `log_dir`: its path and bytes.
fn newest_segment(log_dir: &std::path::Path) -> (std::path::PathBuf, Vec<u8>) {
    let mut newest: Option<(u64, std::path::PathBuf, Vec<u8>)> = None;
    for entry in std::fs::read_dir(log_dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "seg") {
            let bytes = std::fs::read(&path).unwrap();
            let seq = u64::from_le_bytes(bytes[9..17].try_into().unwrap());
            if newest.as_ref().is_none_or(|(s, _, _)| seq > *s) {
                newest = Some((seq, path, bytes));
            }
        }
    }
    let (_, path, bytes) = newest.expect("a segment");
    (path, bytes)
}

/// Guards against `decree recover list` hiding what the log's open found: a torn last
/// batch (after a crash) is listed as a warning naming the file, and durable data lost
/// after a clean close is an error naming the file, not a shorter list.
#[test]
fn recover_list_reports_a_torn_tail_and_refuses_lost_data() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 1, &[]);
    let decide = |log: &dyn decree_log::Log, n: u64| {
        for sequence in 0..n {
            let xid = Xid::decree(Origin { node: 1, incarnation: log.incarnation(), session: 1, sequence });
            let decision = Decision { xid, branches: vec![BranchRecord { rm: "a".into(), branch: 0 }] };
            log.append(sequence + 1, &decision.encode()).expect("append");
        }
    };
    // A crash: the log is leaked, and its lock file removed as a dead process's lock is.
    let log = decree_log::open(&config.log_config().unwrap()).expect("log opens");
    decide(&*log, 4);
    std::mem::forget(log);
    std::fs::remove_file(config.log_dir.join("LOCK")).unwrap();
    let (path, mut bytes) = newest_segment(&config.log_dir);
    let last = bytes.iter().rposition(|&b| b != 0).unwrap();
    bytes[last] ^= 0x55;
    std::fs::write(&path, &bytes).unwrap();
    let mut inspector = Inspector::open(&config, Vec::new()).expect("a torn tail is cut");
    let listing = inspector.list();
    assert_eq!(listing.in_doubt.len(), 3, "the torn batch's decision is dropped");
    let table = listing.to_table();
    assert!(table.contains("warning: ") && table.contains("torn batch"), "{table}");
    assert!(table.contains(&path.display().to_string()), "{table}");
    drop(inspector);

    // Lost after a clean close: refused with the file named.
    let dir = tempfile::tempdir().unwrap();
    let config = self::config(dir.path(), 1, &[]);
    let log = decree_log::open(&config.log_config().unwrap()).expect("log opens");
    decide(&*log, 40);
    drop(log);
    let (path, mut bytes) = newest_segment(&config.log_dir);
    let end = bytes.iter().rposition(|&b| b != 0).unwrap();
    bytes[end / 2..].fill(0);
    std::fs::write(&path, &bytes).unwrap();
    let err = Inspector::open(&config, Vec::new()).err().expect("lost data refused");
    let message = err.to_string();
    assert!(
        message.contains("durable log data lost") && message.contains(&path.display().to_string()),
        "{message}"
    );
}

/// `decree recover` on the log of a pair member: the other member may lead and decide what
/// this log has not seen, so listing works but acting is refused unless overridden, and an
/// override is recorded before anything is touched.
#[test]
fn a_pair_members_log_is_listed_but_not_resolved_without_an_override() {
    use decree_pair::{Epoch, MemberId, PairState};
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 3, &[]);
    std::fs::create_dir_all(&config.log_dir).unwrap();
    let member = MemberId::new(2).unwrap();
    let seen = Epoch::mint(member, &[]);
    let state = PairState { member, seen, forced: Some(seen) };
    decree_pair::state_file::store(&decree_log::io::StdStorage, &config.log_dir, None, &state).unwrap();
    let mut inspector = Inspector::open(&config, Vec::new()).expect("opens");
    let listing = inspector.list();
    assert_eq!(listing.pair, Some(state));
    let table = listing.to_table();
    assert!(table.contains("pair member 2: highest epoch seen 1.2, last forced promotion 1.2"), "{table}");
    assert!(listing.to_json().contains("\"epoch_seen\": 258"), "{}", listing.to_json());

    let xid = Xid::decree(decree_core::Origin { node: 3, incarnation: seen.raw(), session: 1, sequence: 1 });
    for refused in [inspector.commit(&xid, false), inspector.rollback(&xid, true)] {
        let why = refused.expect_err("refused on a pair member").to_string();
        assert!(why.contains("member 2 of a pair") && why.contains("--pair-override"), "{why}");
    }
    let heuristics = inspector.heuristics_path();
    assert!(!heuristics.exists(), "a refusal records nothing");
    inspector.allow_on_pair_member();
    let why = inspector.rollback(&xid, false).expect_err("nothing to roll back").to_string();
    assert!(why.contains("is not in doubt"), "past the pair check: {why}");
    let recorded = std::fs::read_to_string(&heuristics).unwrap();
    assert!(
        recorded.contains(&format!("pair-override rollback {xid} member=2 epoch_seen=1.2")),
        "{recorded}"
    );
}

/// `decree recover list` on a pair member's log shows the pair's epoch of each in-doubt
/// transaction (the incarnation in its Xid), so that an operator sees which primary
/// decided it: here one decision of epoch 1.1 (member 1 led) and one of epoch 2.2 (member
/// 2 led after it), on member 2's log.
#[test]
fn recover_list_on_a_pair_members_log_shows_each_transactions_epoch() {
    use decree_pair::{Epoch, MemberId, PairState};
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 3, &[]);
    std::fs::create_dir_all(&config.log_dir).unwrap();
    let first = Epoch::mint(MemberId::new(1).unwrap(), &[]);
    let second = Epoch::mint(MemberId::new(2).unwrap(), &[first]);
    assert_eq!((first.to_string().as_str(), second.to_string().as_str()), ("1.1", "2.2"));
    let state = PairState { member: MemberId::new(2).unwrap(), seen: second, forced: None };
    decree_pair::state_file::store(&decree_log::io::StdStorage, &config.log_dir, None, &state).unwrap();
    {
        let log = decree_log::open(&config.log_config().unwrap()).expect("open log");
        for (epoch, sequence) in [(first, 1), (second, 2)] {
            let xid = Xid::decree(Origin { node: 3, incarnation: epoch.raw(), session: 7, sequence });
            let decision = Decision { xid, branches: vec![BranchRecord { rm: "pg-a".into(), branch: 0 }] };
            log.append(xid.log_key(), &decision.encode()).expect("append decision");
        }
        log.sync().unwrap();
    }
    let listing = Inspector::open(&config, Vec::new()).expect("opens").list();
    assert_eq!(listing.in_doubt.len(), 2, "{listing:?}");
    let table = listing.to_table();
    let header = table.lines().find(|l| l.starts_with("XID")).expect("a header");
    assert!(header.contains("EPOCH"), "{table}");
    let column = header.find("EPOCH").unwrap();
    for (epoch, sequence) in [(first, 1), (second, 2)] {
        let origin = format!(" {}/7/{sequence} ", epoch.raw());
        let row = table.lines().find(|l| l.contains(&origin)).unwrap_or_else(|| panic!("{origin}: {table}"));
        let cell = row[column..].split_whitespace().next();
        assert_eq!(cell, Some(epoch.to_string().as_str()), "the EPOCH column: {table}");
    }
    let json: serde_json::Value = serde_json::from_str(&listing.to_json()).unwrap();
    let epochs: Vec<&str> =
        json["in_doubt"].as_array().unwrap().iter().map(|t| t["epoch"].as_str().unwrap()).collect();
    assert_eq!(epochs, ["1.1", "2.2"], "{json}");

    // Off a pair, incarnations are not epochs: no column, no value.
    std::fs::remove_file(config.log_dir.join(decree_pair::state_file::PAIR_FILE)).unwrap();
    let listing = Inspector::open(&config, Vec::new()).expect("opens").list();
    assert!(!listing.to_table().contains("EPOCH"), "{}", listing.to_table());
    let json: serde_json::Value = serde_json::from_str(&listing.to_json()).unwrap();
    assert!(json["in_doubt"][0]["epoch"].is_null(), "{json}");
}
