//! Outcome answers that are never wrong, and decisions the server checks.
//!
//! Each test reproduces a defect found by an independent client: "rolled back" for a
//! committed transaction after a restart, a decision whose write failed rolled back while
//! it may be on disk, two decisions sharing a log key, a `Complete` from a stranger that
//! makes the server forget a dead client's decision, and decisions the server accepted
//! although it could never finish them. Resource managers: real PostgreSQL where the issue
//! involves a database (scripts/test-dbs.sh), decree-core's dummy for fault injection.

mod common;

use common::{count, decision, dsn, error_code, eventually, metric, metrics, prepare_insert, xid_of, Raw};
use decree_client::RemoteDecisions;
use decree_core::testing::dummy::{BranchOutcome, Call, FaultAction, FaultRule};
use decree_core::testing::DummyFactory;
use decree_core::{
    BranchRecord, Decision, DecisionStore, HeuristicOutcome, Origin, Outcome, ResourceManager, Xid,
};
use decree_log::testing::fault::FaultStorage;
use decree_log::EngineKind;
use decree_proto::{ErrorCode, Message};
use decree_rm::PgRm;
use decree_server::{RmConfig, ServerConfig};
use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

fn config(dir: &Path, engine: EngineKind) -> ServerConfig {
    let mut c = ServerConfig::new(dir.join("log"), engine);
    c.unix = Some(dir.join("decree.sock"));
    c.metrics = Some("127.0.0.1:0".parse().unwrap());
    c
}

fn endpoint(dir: &Path) -> String {
    format!("unix:{}", dir.join("decree.sock").display())
}

/// Points 5 and 6: a decision the server could never finish, or that the protocol
/// forbids, is refused with its own code, nothing is written, and the session goes on.
#[test]
fn decisions_naming_unknown_rms_bquals_duplicates_or_nothing_are_refused_and_the_session_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let a = DummyFactory::named("a", 100);
    let server = decree_server::start(config(dir.path(), EngineKind::Volatile), vec![a.arc()]).unwrap();
    let mut raw = Raw::connect(dir.path(), &[1, 2]);
    let xid = raw.xid(1);
    let unknown = raw.request(&Message::Decide(decision(xid, &["a", "nowhere"])));
    assert_eq!(error_code(&unknown), ErrorCode::UnknownRm);
    assert!(format!("{unknown:?}").contains("nowhere"), "{unknown:?}");
    let branch_xid =
        Decision { xid: xid.branch(0), branches: vec![BranchRecord { rm: "a".into(), branch: 0 }] };
    assert_eq!(error_code(&raw.request(&Message::Decide(branch_xid))), ErrorCode::BranchQualifier);
    let twice = Decision {
        xid,
        branches: vec![
            BranchRecord { rm: "a".into(), branch: 3 },
            BranchRecord { rm: "a".into(), branch: 3 },
        ],
    };
    assert_eq!(error_code(&raw.request(&Message::Decide(twice))), ErrorCode::DuplicateBranch);
    let empty = Decision { xid, branches: Vec::new() };
    assert_eq!(error_code(&raw.request(&Message::Decide(empty))), ErrorCode::NoBranches);
    // The connection is still open and nothing was decided.
    assert_eq!(raw.request(&Message::Ping), Message::Pong);
    assert_eq!(raw.request(&Message::Outcome(xid)), Message::OutcomeIs(Outcome::InProgress));
    assert_eq!(raw.request(&Message::Decide(decision(xid, &["a"]))), Message::DecideOk);
    assert_eq!(raw.request(&Message::Outcome(xid)), Message::OutcomeIs(Outcome::Committed));
    assert_eq!(metric(&metrics(&server), "decree_decides_refused_total"), 4.0);
    assert_eq!(metric(&metrics(&server), "decree_commits_total"), 1.0);
    // The client library names the problem too.
    let store = RemoteDecisions::connect(&endpoint(dir.path())).unwrap();
    let session = store.open_session().unwrap();
    match store.decide(&decision(xid_of(&store, session, 1), &["ghost"])) {
        Err(e) => assert!(e.to_string().contains("ghost"), "{e}"),
        Ok(()) => panic!("a decision naming an unknown resource manager must be refused"),
    }
    store.decide(&decision(xid_of(&store, session, 2), &["a"])).unwrap();
    server.shutdown().unwrap();
}

/// Point 4: a `Complete` from a session that did not decide the transaction must not make
/// the server forget a dead client's decision before its phase two is done.
#[test]
fn a_complete_from_another_session_is_ignored_and_the_server_finishes_the_orphan() {
    let dir = tempfile::tempdir().unwrap();
    let a = DummyFactory::named("a", 100);
    // Phase two on "a" fails until the rule is lifted: the orphan stays unfinished.
    a.set_rules(vec![FaultRule::sometimes(Call::Commit, FaultAction::Fail, 1.0)]);
    let server = decree_server::start(config(dir.path(), EngineKind::Volatile), vec![a.arc()]).unwrap();
    let mut rm = a.connection();
    rm.open().unwrap();
    let mut owner = Raw::connect(dir.path(), &[1, 2]);
    let orphan = owner.xid(1);
    rm.prepare(&orphan.branch(0)).unwrap();
    assert_eq!(owner.request(&Message::Decide(decision(orphan, &["a"]))), Message::DecideOk);
    let mut live = Raw::connect(dir.path(), &[1, 2]);
    let livexid = live.xid(1);
    assert_eq!(live.request(&Message::Decide(decision(livexid, &["a"]))), Message::DecideOk);
    drop(owner); // The client dies after its decision.

    let mut stranger = Raw::connect(dir.path(), &[1, 2]);
    stranger.send(&Message::Complete(orphan));
    stranger.send(&Message::Complete(livexid)); // another live session's decision
    stranger.send(&Message::CompleteHeuristic(orphan, HeuristicOutcome::RolledBack));
    assert_eq!(stranger.request(&Message::Ping), Message::Pong);
    assert_eq!(metric(&metrics(&server), "decree_completes_ignored_total"), 3.0);
    assert_eq!(stranger.request(&Message::Outcome(orphan)), Message::OutcomeIs(Outcome::Committed));
    assert_eq!(stranger.request(&Message::Outcome(livexid)), Message::OutcomeIs(Outcome::Committed));

    a.set_rules(Vec::new());
    eventually("the server commits the dead client's branch", || {
        a.outcome(&orphan.branch(0)) == Some(BranchOutcome::Committed)
    });
    assert_eq!(stranger.request(&Message::Outcome(orphan)), Message::OutcomeIs(Outcome::Committed));
    // The live owner completes its own decision; that one is not ignored.
    live.send(&Message::Complete(livexid));
    assert_eq!(live.request(&Message::Ping), Message::Pong);
    assert_eq!(metric(&metrics(&server), "decree_completes_ignored_total"), 3.0);
    assert_eq!(live.request(&Message::Outcome(livexid)), Message::OutcomeIs(Outcome::Committed));
    server.shutdown().unwrap();
}

/// Point 1 (heuristic): a branch found rolled back during the server's phase two makes the
/// outcome heuristic, never committed; a version-1 client gets an error instead of a value
/// it does not know, and the answer survives a restart.
#[test]
fn a_branch_rolled_back_in_phase_two_is_a_heuristic_outcome_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (DummyFactory::named("a", 100), DummyFactory::named("b", 100));
    b.set_rules(vec![FaultRule::first(Call::Commit, FaultAction::VoteNo, 1)]);
    let factories = || vec![a.arc(), b.arc()];
    let server = decree_server::start(config(dir.path(), EngineKind::Journal), factories()).unwrap();
    let (mut ra, mut rb) = (a.connection(), b.connection());
    ra.open().unwrap();
    rb.open().unwrap();
    let mut client = Raw::connect(dir.path(), &[1, 2]);
    let xid = client.xid(1);
    ra.prepare(&xid.branch(0)).unwrap();
    rb.prepare(&xid.branch(1)).unwrap();
    assert_eq!(client.request(&Message::Decide(decision(xid, &["a", "b"]))), Message::DecideOk);
    drop(client);
    eventually("the server finishes both branches", || a.prepared().is_empty() && b.prepared().is_empty());
    assert_eq!(b.outcome(&xid.branch(1)), Some(BranchOutcome::RolledBack));
    let mut v2 = Raw::connect(dir.path(), &[2]);
    eventually("the outcome is heuristic", || {
        v2.request(&Message::Outcome(xid)) == Message::OutcomeIs(Outcome::Heuristic)
    });
    let mut v1 = Raw::connect(dir.path(), &[]);
    assert_eq!(error_code(&v1.request(&Message::Outcome(xid))), ErrorCode::OutcomeHeuristic);
    assert_eq!(v1.request(&Message::Ping), Message::Pong, "the answer does not close the connection");
    drop((v1, v2));
    server.shutdown().unwrap();

    let server = decree_server::start(config(dir.path(), EngineKind::Journal), factories()).unwrap();
    let store = RemoteDecisions::connect(&endpoint(dir.path())).unwrap();
    assert_eq!(store.outcome(&xid).unwrap(), Outcome::Heuristic);
    server.shutdown().unwrap();
}

/// Point 3: `(session << 40) ^ sequence ^ (incarnation << 20) ^ ...` made session 5 of
/// incarnation 2 at sequence 2^20 + 3 and session 5 of incarnation 3 at sequence 3 share a
/// key, so completing the second forgot the first, an in-doubt decision, and presumed
/// abort then rolled back a branch of a committed transaction.
#[test]
fn a_decision_whose_old_key_collides_survives_the_completion_of_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), EngineKind::Journal);
    let a = DummyFactory::named("a", 100);
    let mut rm = a.connection();
    rm.open().unwrap();
    // Incarnation 2 wrote an in-doubt decision under the key derived from its Xid.
    let old = Xid::decree(Origin { node: 1, incarnation: 2, session: 5, sequence: (1 << 20) + 3 });
    drop(decree_log::open(&cfg.log_config().unwrap()).unwrap());
    {
        let log = decree_log::open(&cfg.log_config().unwrap()).unwrap();
        assert_eq!(log.incarnation(), 2);
        log.append(old.log_key(), &decision(old, &["a"]).encode()).unwrap();
    }
    rm.prepare(&old.branch(0)).unwrap();
    // Incarnation 3 cannot finish it yet (phase two fails on "a").
    a.set_rules(vec![FaultRule::sometimes(Call::Commit, FaultAction::Fail, 1.0)]);
    let server = decree_server::start(cfg.clone(), vec![a.arc()]).unwrap();
    assert_eq!(server.incarnation(), 3);
    let mut sessions = Vec::new();
    let mut five = loop {
        let raw = Raw::connect(dir.path(), &[1, 2]);
        if raw.session().2 == 5 {
            break raw;
        }
        assert!(raw.session().2 < 5, "session ids count up from 1");
        sessions.push(raw);
    };
    let new = five.xid(3);
    assert_eq!(new.log_key(), old.log_key(), "the pair collides under the derived key");
    assert_eq!(five.request(&Message::Decide(decision(new, &["a"]))), Message::DecideOk);
    five.send(&Message::Complete(new));
    assert_eq!(five.request(&Message::Ping), Message::Pong);
    assert_eq!(five.request(&Message::Outcome(old)), Message::OutcomeIs(Outcome::Committed));
    drop((five, sessions));
    server.shutdown().unwrap();

    // After a restart the old decision must still be there to commit its branch.
    a.set_rules(Vec::new());
    let server = decree_server::start(cfg, vec![a.arc()]).unwrap();
    eventually("the old decision's branch is finished", || a.prepared().is_empty());
    assert_eq!(a.outcome(&old.branch(0)), Some(BranchOutcome::Committed), "presumed abort must not win");
    let store = RemoteDecisions::connect(&endpoint(dir.path())).unwrap();
    assert_eq!(store.outcome(&old).unwrap(), Outcome::Committed);
    assert_eq!(store.outcome(&new).unwrap(), Outcome::Committed);
    server.shutdown().unwrap();
}

/// Point 2: `LogFailed` means unknown. Nothing acts on that Xid (its branches stay
/// prepared, the answer is unknown) until a restart has read the log; then the branches
/// all go the way the log says.
#[test]
fn a_decision_whose_write_failed_is_unknown_and_left_alone_until_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), EngineKind::Journal);
    let storage = FaultStorage::new(7);
    storage.disable_direct_io();
    let (a, b) = (DummyFactory::named("a", 100), DummyFactory::named("b", 100));
    let factories = || vec![a.arc(), b.arc()];
    let server =
        decree_server::start_on_storage(cfg.clone(), Arc::new(storage.clone()), factories()).unwrap();
    let (mut ra, mut rb) = (a.connection(), b.connection());
    ra.open().unwrap();
    rb.open().unwrap();
    let mut client = Raw::connect(dir.path(), &[1, 2]);
    let (doubtful, undecided) = (client.xid(1), client.xid(2));
    for xid in [doubtful, undecided] {
        ra.prepare(&xid.branch(0)).unwrap();
        rb.prepare(&xid.branch(1)).unwrap();
    }
    storage.fail_syncs_after(0); // every sync from here on fails: the decision's, whatever else syncs
    let reply = client.request(&Message::Decide(decision(doubtful, &["a", "b"])));
    assert_eq!(error_code(&reply), ErrorCode::LogFailed);
    assert_eq!(client.request(&Message::Outcome(doubtful)), Message::OutcomeIs(Outcome::Unknown));
    drop(client); // The client dies: presumed abort runs for its session.
    eventually("the undecided transaction is rolled back", || {
        a.outcome(&undecided.branch(0)) == Some(BranchOutcome::RolledBack)
            && b.outcome(&undecided.branch(1)) == Some(BranchOutcome::RolledBack)
    });
    let mut asker = Raw::connect(dir.path(), &[2]);
    assert_eq!(asker.request(&Message::Outcome(undecided)), Message::OutcomeIs(Outcome::RolledBack));
    assert_eq!(asker.request(&Message::Outcome(doubtful)), Message::OutcomeIs(Outcome::Unknown));
    let mut v1 = Raw::connect(dir.path(), &[]);
    assert_eq!(error_code(&v1.request(&Message::Outcome(doubtful))), ErrorCode::OutcomeUnknown);
    let mut prepared = a.prepared();
    prepared.extend(b.prepared());
    prepared.sort_by_key(|x| x.to_gid());
    assert_eq!(
        prepared,
        vec![doubtful.branch(0), doubtful.branch(1)],
        "nothing touched the doubtful branches"
    );
    drop((asker, v1));
    let _ = server.shutdown();

    // A restart reads the log; whatever it holds, both branches go the same way and the
    // answer says which.
    let reopened = storage.crash_with(decree_log::testing::fault::CrashMode::KeepUnsynced);
    let server = decree_server::start_on_storage(cfg, Arc::new(reopened), factories()).unwrap();
    eventually("the doubtful branches are resolved", || a.prepared().is_empty() && b.prepared().is_empty());
    let (oa, ob) = (a.outcome(&doubtful.branch(0)), b.outcome(&doubtful.branch(1)));
    assert_eq!(oa, ob, "half-committed: {oa:?} / {ob:?}");
    let store = RemoteDecisions::connect(&endpoint(dir.path())).unwrap();
    let answer = store.outcome(&doubtful).unwrap();
    match oa {
        Some(BranchOutcome::Committed) => assert_eq!(answer, Outcome::Committed),
        Some(BranchOutcome::RolledBack) => assert_eq!(answer, Outcome::RolledBack),
        other => panic!("the branch ended as {other:?}"),
    }
    server.shutdown().unwrap();
}

/// Asking about Xids the server cannot vouch for: another node's, an earlier incarnation's
/// that nothing remembers, a session never opened. Each is unknown, never rolled back.
#[test]
fn xids_the_server_cannot_vouch_for_are_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), EngineKind::Journal);
    let server = decree_server::start(cfg.clone(), Vec::new()).unwrap();
    server.shutdown().unwrap();
    let server = decree_server::start(cfg, Vec::new()).unwrap();
    let store = RemoteDecisions::connect(&endpoint(dir.path())).unwrap();
    let inc = server.incarnation();
    let at = |node, incarnation, session| Xid::decree(Origin { node, incarnation, session, sequence: 1 });
    eventually("the first recovery pass has ended", || {
        store.outcome(&at(1, inc - 1, 1)).unwrap() != Outcome::InProgress
    });
    assert_eq!(store.outcome(&at(1, inc - 1, 1)).unwrap(), Outcome::Unknown, "earlier incarnation");
    assert_eq!(store.outcome(&at(2, inc, 1)).unwrap(), Outcome::Unknown, "another node");
    assert_eq!(store.outcome(&at(1, inc, 999)).unwrap(), Outcome::Unknown, "a session never opened");
    assert_eq!(store.outcome(&at(1, inc, 0)).unwrap(), Outcome::Unknown, "session 0 is never issued");
    assert_eq!(store.outcome(&at(1, inc + 1, 1)).unwrap(), Outcome::Unknown, "a later incarnation");
    let foreign = Xid::new(42, b"other-tm", b"").unwrap();
    assert_eq!(store.outcome(&foreign).unwrap(), Outcome::Unknown, "another transaction manager");
    let session = store.open_session().unwrap();
    assert_eq!(store.outcome(&xid_of(&store, session, 1)).unwrap(), Outcome::InProgress, "its session lives");
    store.close_session(session);
    eventually("a closed session's undecided Xid is rolled back", || {
        store.outcome(&xid_of(&store, session, 1)).unwrap() == Outcome::RolledBack
    });
    server.shutdown().unwrap();
}

/// The memory of outcomes is bounded: past `outcomes_remembered_max`, the oldest answers
/// become unknown (never rolled back) for closed sessions of this incarnation.
#[test]
fn an_evicted_outcome_makes_undecided_answers_unknown_not_rolled_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), EngineKind::Journal);
    cfg.limits.outcomes_remembered_max = 4;
    let a = DummyFactory::named("a", 100);
    let server = decree_server::start(cfg.clone(), vec![a.arc()]).unwrap();
    let mut client = Raw::connect(dir.path(), &[2]);
    for seq in 1..=6 {
        let xid = client.xid(seq);
        assert_eq!(client.request(&Message::Decide(decision(xid, &["a"]))), Message::DecideOk);
        client.send(&Message::Complete(xid));
    }
    let never = client.xid(100);
    let (first, last) = (client.xid(1), client.xid(6));
    drop(client);
    let mut asker = Raw::connect(dir.path(), &[2]);
    // Until the first recovery pass after the start has ended, undecided Xids are in
    // progress (a CI run on a loaded machine asked before it had).
    eventually("the session is closed and the first pass has ended", || {
        let text = metrics(&server);
        metric(&text, "decree_sessions_closed_total") >= 1.0
            && metric(&text, "decree_recovery_passes_total") >= 1.0
    });
    assert_eq!(asker.request(&Message::Outcome(last)), Message::OutcomeIs(Outcome::Committed));
    assert_eq!(asker.request(&Message::Outcome(first)), Message::OutcomeIs(Outcome::Unknown), "evicted");
    assert_eq!(asker.request(&Message::Outcome(never)), Message::OutcomeIs(Outcome::Unknown));
    drop(asker);
    server.shutdown().unwrap();
    let server = decree_server::start(cfg, vec![a.arc()]).unwrap();
    let store = RemoteDecisions::connect(&endpoint(dir.path())).unwrap();
    assert_eq!(store.outcome(&last).unwrap(), Outcome::Committed, "remembered across the restart");
    eventually("the first recovery pass has ended", || store.outcome(&first).unwrap() != Outcome::InProgress);
    assert_eq!(store.outcome(&first).unwrap(), Outcome::Unknown);
    server.shutdown().unwrap();
}

// ---------------------------------------------------------------------------------------
// PostgreSQL: the reproduction of the issue, with real databases and a server process
// that is stopped with SIGTERM and killed with SIGKILL between the questions.

/// Runs a server in a child process (this test binary re-executed) when asked through the
/// environment; does nothing in a normal test run.
#[test]
fn child_server_entry() {
    let Ok(path) = std::env::var("DECREE_TEST_OUTCOMES_CHILD_CONFIG") else { return };
    let config = ServerConfig::from_toml_file(&path).expect("child config");
    let factories = config.rm_factories().expect("child factories");
    decree_server::run_with(config, factories).expect("child server runs until a signal");
}

struct Child {
    process: std::process::Child,
}

impl Child {
    fn spawn(config_path: &Path, dir: &Path) -> Child {
        let process = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["child_server_entry", "--exact", "--nocapture", "--test-threads=1"])
            .env("DECREE_TEST_OUTCOMES_CHILD_CONFIG", config_path)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let endpoint = endpoint(dir);
        eventually("the child server answers", || RemoteDecisions::connect(&endpoint).is_ok());
        Child { process }
    }

    fn kill_9(mut self) {
        self.process.kill().unwrap();
        self.process.wait().unwrap();
    }

    fn terminate(mut self) {
        let pid = self.process.id().to_string();
        assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        let exit = self.process.wait().unwrap();
        assert!(exit.success(), "SIGTERM must stop the server cleanly, got {exit}");
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// Asks from a fresh connection, as a client that lost its reply would.
fn ask(dir: &Path, xid: &Xid) -> Outcome {
    RemoteDecisions::connect(&endpoint(dir)).expect("connect").outcome(xid).expect("outcome")
}

/// Point 1 as the independent client found it: the server commits both branches of a dead
/// client and completes the transaction; after a clean restart, and after SIGKILL restarts
/// following a lost `DecideOk`, `Outcome` must still say committed (it said rolled back).
#[test]
fn pg_a_committed_transaction_stays_committed_after_every_kind_of_restart() {
    let (Some(dsn_a), Some(dsn_b)) = (dsn("DECREE_TEST_PG_A"), dsn("DECREE_TEST_PG_B")) else { return };
    let token = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64 & 0xfff_ffff;
    let node = 0x2000_0000 | token as u32;
    let table = format!("outcome_{token:x}");
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = ServerConfig::new(dir.path().join("log"), EngineKind::Journal);
    cfg.node = node;
    cfg.unix = Some(dir.path().join("decree.sock"));
    cfg.rm = vec![
        RmConfig { name: "pg-a".into(), kind: "postgres".into(), dsn: dsn_a.clone() },
        RmConfig { name: "pg-b".into(), kind: "postgres".into(), dsn: dsn_b.clone() },
    ];
    let config_path = dir.path().join("decree.toml");
    let toml = format!(
        "node = {node}\nlog_dir = {:?}\nunix = {:?}\n[[rm]]\nname = \"pg-a\"\nkind = \"postgres\"\ndsn = {dsn_a:?}\n[[rm]]\nname = \"pg-b\"\nkind = \"postgres\"\ndsn = {dsn_b:?}\n",
        dir.path().join("log"),
        dir.path().join("decree.sock"),
    );
    std::fs::write(&config_path, toml).unwrap();
    let (mut a, mut b) = (PgRm::connect("pg-a", &dsn_a).unwrap(), PgRm::connect("pg-b", &dsn_b).unwrap());
    for rm in [&mut a, &mut b] {
        rm.client().unwrap().batch_execute(&format!("CREATE TABLE {table} (id bigint PRIMARY KEY)")).unwrap();
    }
    let drop_tables = |a: &PgRm, b: &PgRm| {
        for rm in [a, b] {
            let _ = rm.client().unwrap().batch_execute(&format!("DROP TABLE IF EXISTS {table}"));
        }
    };

    // 1. The client prepares both branches, decides, and dies before phase two.
    let server = Child::spawn(&config_path, dir.path());
    let store = RemoteDecisions::connect(&endpoint(dir.path())).unwrap();
    let session = store.open_session().unwrap();
    let first = xid_of(&store, session, 1);
    prepare_insert(&mut a, &first.branch(0), &table, 1);
    prepare_insert(&mut b, &first.branch(1), &table, 1);
    store.decide(&decision(first, &["pg-a", "pg-b"])).unwrap();
    drop(store);
    eventually("the server commits both branches", || count(&a, &table, 1) == 1 && count(&b, &table, 1) == 1);
    eventually("the outcome is committed", || ask(dir.path(), &first) == Outcome::Committed);

    // 2. A clean restart, then two SIGKILL restarts: the answer stays committed.
    server.terminate();
    let server = Child::spawn(&config_path, dir.path());
    assert_eq!(ask(dir.path(), &first), Outcome::Committed, "after SIGTERM and a restart");
    server.kill_9();
    let server = Child::spawn(&config_path, dir.path());
    assert_eq!(ask(dir.path(), &first), Outcome::Committed, "after SIGKILL and a restart");

    // 3. A lost DecideOk: the decision is durable, the server is killed before anyone
    // finishes it, restarted (it finishes it), killed and restarted again.
    let store = RemoteDecisions::connect(&endpoint(dir.path())).unwrap();
    let session = store.open_session().unwrap();
    let second = xid_of(&store, session, 1);
    let undecided = xid_of(&store, session, 2);
    prepare_insert(&mut a, &second.branch(0), &table, 2);
    prepare_insert(&mut b, &second.branch(1), &table, 2);
    prepare_insert(&mut a, &undecided.branch(0), &table, 3);
    store.decide(&decision(second, &["pg-a", "pg-b"])).unwrap();
    server.kill_9();
    drop(store);
    let server = Child::spawn(&config_path, dir.path());
    eventually("the restarted server commits the second transaction", || {
        count(&a, &table, 2) == 1 && count(&b, &table, 2) == 1
    });
    eventually("and rolls back the undecided one", || ask(dir.path(), &undecided) == Outcome::RolledBack);
    assert_eq!(ask(dir.path(), &second), Outcome::Committed);
    server.kill_9();
    let server = Child::spawn(&config_path, dir.path());
    // Committed answers come from the memory at once (a completion waits for its entry).
    assert_eq!(ask(dir.path(), &first), Outcome::Committed);
    assert_eq!(ask(dir.path(), &second), Outcome::Committed);
    // The memory of a presumed-abort rollback is written lazily, so a SIGKILL just after
    // it may lose it: then the earlier incarnation's Xid is unknown, never committed.
    eventually("the first recovery pass has ended", || ask(dir.path(), &undecided) != Outcome::InProgress);
    let answer = ask(dir.path(), &undecided);
    assert!(matches!(answer, Outcome::RolledBack | Outcome::Unknown), "{answer:?}");
    assert_eq!(count(&a, &table, 3), 0);
    server.terminate();
    drop_tables(&a, &b);
}
