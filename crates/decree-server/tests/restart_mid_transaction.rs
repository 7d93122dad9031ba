//! Issue 31, item 2: a server restart in the middle of a transaction. The client opened
//! its session before the restart and prepares its branch after it; its `Decide` finds no
//! server, so it asks `Outcome` on a new connection. Before, that Xid (of an earlier
//! incarnation, with no decision) was answered unknown and its branch held its locks until
//! the periodic pass; now the question makes the server look at once and again on the
//! rechecks' schedule, roll the branch back, remember it, and answer rolled back. The
//! periodic pass here is 600 s, so only the question can have done it.

mod common;

use common::{count, dsn, prepare_insert, Raw};
use decree_core::{Outcome, Xid};
use decree_log::EngineKind;
use decree_proto::Message;
use decree_rm::PgRm;
use decree_server::{RecoveryConfig, RmConfig, ServerConfig};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long the test waits for the answer to turn: a failure bound far below the periodic
/// pass (600 s), not a performance target.
const ANSWER_WAIT_MAX: Duration = Duration::from_secs(30);

#[test]
fn pg_an_outcome_question_about_a_branch_prepared_after_a_restart_rolls_it_back_and_says_so() {
    let Some(dsn_a) = dsn("DECREE_TEST_PG_A") else { return };
    let token = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64 & 0xfff_ffff;
    // A node id of its own: this server's recovery must touch no other test's branches.
    let node = 0x3100_0000 | token as u32;
    let table = format!("restart_mid_txn_{token:x}");
    let observer = PgRm::connect("observer", &dsn_a).unwrap();
    observer
        .client()
        .unwrap()
        .batch_execute(&format!("CREATE TABLE {table} (id bigint PRIMARY KEY)"))
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("decree.sock");
    let mut config = ServerConfig::new(dir.path().join("log"), EngineKind::Journal);
    config.node = node;
    config.unix = Some(socket.clone());
    config.recovery =
        RecoveryConfig { periodic_pass_ms: 600_000, recheck_after_close_ms: 200, rechecks_after_close: 4 };
    config.rm = vec![RmConfig { name: "pg-a".into(), kind: "postgres".into(), dsn: dsn_a.clone() }];
    // One connection at a time, each kept open while it is used: a session's close asks
    // for passes too, which would do the work this test must see the question do.
    let ask = |raw: &mut Raw, xid: &Xid| match raw.request(&Message::Outcome(*xid)) {
        Message::OutcomeIs(outcome) => outcome,
        other => panic!("expected OutcomeIs, got {other:?}"),
    };

    let server = decree_server::start(config.clone(), config.rm_factories().unwrap()).unwrap();
    let before = Raw::connect(dir.path(), &[1, 2, 3]);
    let xid = before.xid(1);
    server.shutdown().unwrap();
    let server = decree_server::start(config.clone(), config.rm_factories().unwrap()).unwrap();
    assert!(server.incarnation() > xid.origin().unwrap().incarnation, "a restart is a new incarnation");

    // After the restart (and its first pass), the client prepares its branch.
    let mut rm = PgRm::connect("pg-a", &dsn_a).unwrap();
    prepare_insert(&mut rm, &xid.branch(0), &table, 1);

    let mut after = Raw::connect(dir.path(), &[1, 2, 3]);
    let deadline = Instant::now() + ANSWER_WAIT_MAX;
    let mut answers = Vec::new();
    loop {
        let answer = ask(&mut after, &xid);
        answers.push(answer);
        if answer == Outcome::RolledBack {
            break;
        }
        // In progress until the first pass after the start ended, then unknown.
        assert!(
            matches!(answer, Outcome::InProgress | Outcome::Unknown),
            "never another answer meanwhile: {answers:?}"
        );
        assert!(
            Instant::now() < deadline,
            "still {answer:?} {ANSWER_WAIT_MAX:?} after the first question (periodic pass 600 s)"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let gid = xid.branch(0).to_gid();
    let prepared: i64 = observer
        .client()
        .unwrap()
        .query_one("SELECT count(*) FROM pg_prepared_xacts WHERE gid = $1", &[&gid])
        .unwrap()
        .get(0);
    assert_eq!(prepared, 0, "the branch is no longer prepared");
    assert_eq!(count(&observer, &table, 1), 0, "rolled back, not committed");
    // Asked again, after another restart too: the answer is remembered.
    assert_eq!(ask(&mut after, &xid), Outcome::RolledBack);
    drop((after, before));
    server.shutdown().unwrap();
    let server = decree_server::start(config.clone(), config.rm_factories().unwrap()).unwrap();
    let mut again = Raw::connect(dir.path(), &[1, 2, 3]);
    assert_eq!(ask(&mut again, &xid), Outcome::RolledBack, "remembered across a restart");
    drop(again);
    server.shutdown().unwrap();
    let _ = observer.client().unwrap().batch_execute(&format!("DROP TABLE IF EXISTS {table}"));
}
