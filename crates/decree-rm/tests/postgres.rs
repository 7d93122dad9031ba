//! PostgreSQL resource manager against a real server (scripts/test-dbs.sh).
//!
//! These tests guard the properties the coordinator relies on: a prepared branch survives
//! its connection and can be finished from another one; recovery sees exactly decree's
//! branches of its own database; an unknown gid is reported as unknown (not as success or
//! as a transient failure); and a branch whose work failed never votes yes, although
//! PostgreSQL answers `PREPARE TRANSACTION` in an aborted transaction with a silent
//! rollback.

mod common;

use decree_core::{ResourceManager, RmError, RmFactory, Vote, Xid};
use decree_rm::{PgFactory, PgRm};

const PG_A: &str = "DECREE_TEST_PG_A";
const PG_B: &str = "DECREE_TEST_PG_B";

fn create_table(rm: &mut PgRm, table: &str) {
    rm.client()
        .expect("connected")
        .batch_execute(&format!("CREATE TABLE {table} (id bigint PRIMARY KEY, note text)"))
        .expect("create table");
}

fn drop_table(rm: &mut PgRm, table: &str) {
    rm.client().expect("connected").batch_execute(&format!("DROP TABLE {table}")).expect("drop table");
}

fn count(rm: &mut PgRm, table: &str, id: i64) -> i64 {
    let row = rm
        .client()
        .expect("connected")
        .query_one(&format!("SELECT count(*) FROM {table} WHERE id = $1"), &[&id])
        .expect("count query");
    row.get(0)
}

/// Starts `xid` on `rm`, inserts row `id` and prepares.
fn insert_and_prepare(rm: &mut PgRm, xid: &Xid, table: &str, id: i64) -> Vote {
    rm.start(xid).expect("start");
    rm.client()
        .expect("connected")
        .execute(&format!("INSERT INTO {table} VALUES ($1, 'branch')"), &[&id])
        .expect("insert");
    rm.end(xid).expect("end");
    rm.prepare(xid).expect("prepare")
}

#[test]
fn prepared_branch_commits_from_another_connection() {
    let dsn = require_dsn!(PG_A);
    let factory = PgFactory::new("pg-a", &dsn).expect("valid DSN");
    let mut preparer = factory.connect_pg().expect("connect");
    let mut other = factory.connect_pg().expect("connect");
    let table = common::table("commit_other");
    create_table(&mut preparer, &table);
    let xid = common::fresh_xid();

    assert_eq!(insert_and_prepare(&mut preparer, &xid, &table, 1), Vote::Commit);
    assert_eq!(count(&mut other, &table, 1), 0, "prepared work must not be visible yet");
    assert!(other.recover().expect("recover").contains(&xid), "prepared branch listed");
    drop(preparer); // the branch must outlive the connection that prepared it

    other.commit(&xid, false).expect("COMMIT PREPARED from another connection");
    assert_eq!(count(&mut other, &table, 1), 1, "committed row visible");
    assert!(!other.recover().expect("recover").contains(&xid), "finished branch no longer listed");
    let again = other.commit(&xid, false).unwrap_err();
    assert!(matches!(again, RmError::UnknownXid(_)), "second commit: {again:?}");
    drop_table(&mut other, &table);
}

#[test]
fn prepared_branch_rolls_back_and_leaves_no_data() {
    let dsn = require_dsn!(PG_A);
    let mut rm = PgRm::connect("pg-a", &dsn).expect("connect");
    let mut other = PgRm::connect("pg-a", &dsn).expect("connect");
    let table = common::table("rollback");
    create_table(&mut rm, &table);
    let xid = common::fresh_xid();

    assert_eq!(insert_and_prepare(&mut rm, &xid, &table, 7), Vote::Commit);
    other.rollback(&xid).expect("ROLLBACK PREPARED");
    assert_eq!(count(&mut rm, &table, 7), 0, "rolled-back row absent");
    assert!(!rm.recover().expect("recover").contains(&xid));
    let again = rm.rollback(&xid).unwrap_err();
    assert!(matches!(again, RmError::UnknownXid(_)), "second rollback: {again:?}");

    // The same connection can run the next branch after a prepare.
    let next = common::fresh_xid();
    assert_eq!(insert_and_prepare(&mut rm, &next, &table, 8), Vote::Commit);
    rm.commit(&next, false).expect("commit prepared on the preparing connection");
    assert_eq!(count(&mut other, &table, 8), 1);
    drop_table(&mut rm, &table);
}

#[test]
fn recover_lists_only_decree_branches_of_this_database() {
    let dsn_a = require_dsn!(PG_A);
    let dsn_b = require_dsn!(PG_B);
    let mut a = PgRm::connect("pg-a", &dsn_a).expect("connect a");
    let mut b = PgRm::connect("pg-b", &dsn_b).expect("connect b");
    let table = common::table("recover");
    create_table(&mut a, &table);
    create_table(&mut b, &table);

    let mine = common::fresh_xid();
    let in_other_database = common::fresh_xid();
    assert_eq!(insert_and_prepare(&mut a, &mine, &table, 1), Vote::Commit);
    assert_eq!(insert_and_prepare(&mut b, &in_other_database, &table, 1), Vote::Commit);
    // Another transaction manager's prepared transaction in the same database.
    let foreign_gid = format!("other-tm-{:x}", common::run_token());
    let mut raw = postgres::Client::connect(&dsn_a, postgres::NoTls).expect("raw connect");
    raw.batch_execute(&format!(
        "BEGIN; INSERT INTO {table} VALUES (2, 'foreign'); PREPARE TRANSACTION '{foreign_gid}'"
    ))
    .expect("foreign prepare");

    let listed = a.recover().expect("recover");
    assert!(listed.contains(&mine), "this database's decree branch listed: {listed:?}");
    assert!(!listed.contains(&in_other_database), "other database's branch not listed");
    assert!(listed.iter().all(|x| x.to_gid().starts_with("decree:")), "only decree gids: {listed:?}");
    let listed_b = b.recover().expect("recover b");
    assert!(listed_b.contains(&in_other_database) && !listed_b.contains(&mine));

    a.commit(&mine, false).expect("commit a");
    b.rollback(&in_other_database).expect("rollback b");
    raw.batch_execute(&format!("ROLLBACK PREPARED '{foreign_gid}'")).expect("foreign rollback");
    assert_eq!(count(&mut a, &table, 1), 1);
    assert_eq!(count(&mut a, &table, 2), 0);
    assert_eq!(count(&mut b, &table, 1), 0);
    drop_table(&mut a, &table);
    drop_table(&mut b, &table);
}

#[test]
fn unknown_gid_is_reported_as_unknown_xid() {
    let dsn = require_dsn!(PG_A);
    let mut rm = PgRm::connect("pg-a", &dsn).expect("connect");
    let xid = common::fresh_xid();
    let commit = rm.commit(&xid, false).unwrap_err();
    assert!(matches!(commit, RmError::UnknownXid(ref m) if m.contains("pg-a")), "{commit:?}");
    let rollback = rm.rollback(&xid).unwrap_err();
    assert!(matches!(rollback, RmError::UnknownXid(_)), "{rollback:?}");
    assert!(rm.forget(&xid).is_ok(), "forget has nothing to do");
}

#[test]
fn failed_work_votes_no_and_read_only_work_leaves_phase_two() {
    let dsn = require_dsn!(PG_A);
    let mut rm = PgRm::connect("pg-a", &dsn).expect("connect");
    let table = common::table("votes");
    create_table(&mut rm, &table);

    // A statement fails inside the branch: PREPARE would silently roll back; we vote no.
    let failed = common::fresh_xid();
    rm.start(&failed).expect("start");
    {
        let mut client = rm.client().expect("connected");
        client.execute(&format!("INSERT INTO {table} VALUES (1, 'x')"), &[]).expect("insert");
        assert!(client.batch_execute("SELECT 1/0").is_err(), "division by zero fails");
    }
    let vote = rm.prepare(&failed).unwrap_err();
    assert!(matches!(vote, RmError::RolledBack(_)), "aborted branch must vote no: {vote:?}");
    assert!(!rm.recover().expect("recover").contains(&failed), "nothing prepared");
    assert_eq!(count(&mut rm, &table, 1), 0);

    // A branch that only reads is committed at prepare and leaves phase two.
    let reader = common::fresh_xid();
    rm.start(&reader).expect("start");
    assert_eq!(count(&mut rm, &table, 1), 0);
    assert_eq!(rm.prepare(&reader).expect("prepare"), Vote::ReadOnly);
    assert!(!rm.recover().expect("recover").contains(&reader));

    // One-phase commit of a failed branch reports the rollback; of a good one commits.
    let one = common::fresh_xid();
    rm.start(&one).expect("start");
    {
        let mut client = rm.client().expect("connected");
        client.execute(&format!("INSERT INTO {table} VALUES (3, 'x')"), &[]).expect("insert");
        assert!(client.batch_execute("SELECT 1/0").is_err());
    }
    let err = rm.commit(&one, true).unwrap_err();
    assert!(matches!(err, RmError::RolledBack(_)), "{err:?}");
    let good = common::fresh_xid();
    rm.start(&good).expect("start");
    rm.client()
        .expect("connected")
        .execute(&format!("INSERT INTO {table} VALUES (4, 'x')"), &[])
        .expect("insert");
    rm.commit(&good, true).expect("one-phase commit");
    assert_eq!(count(&mut rm, &table, 3), 0);
    assert_eq!(count(&mut rm, &table, 4), 1);

    // A branch that was started but not prepared cannot be committed in two phases.
    let unprepared = common::fresh_xid();
    rm.start(&unprepared).expect("start");
    let err = rm.commit(&unprepared, false).unwrap_err();
    assert!(matches!(err, RmError::Protocol(_)), "{err:?}");
    rm.rollback(&unprepared).expect("rollback of the open branch");
    drop_table(&mut rm, &table);
}

#[test]
fn unreachable_or_wrong_database_errors_name_the_rm_and_address() {
    // Port 1 on the loopback is closed: no server needed for this case.
    let err = PgRm::connect("pg-ledger", "host=127.0.0.1 port=1 user=decree dbname=decree_a")
        .err()
        .expect("closed port refused");
    let RmError::Unavailable(message) = err else { panic!("expected Unavailable, got {err:?}") };
    assert!(message.contains("pg-ledger") && message.contains("host=127.0.0.1 port=1"), "{message}");

    let factory = PgFactory::new("pg-ledger", "host=127.0.0.1 port=1 dbname=x").expect("valid DSN");
    let err = factory.connect().err().expect("closed port refused");
    assert!(matches!(err, RmError::Unavailable(ref m) if m.contains("pg-ledger")), "{err:?}");

    let dsn = require_dsn!(PG_A);
    let wrong_db = format!("{dsn} dbname=decree_no_such_database");
    let err = PgRm::connect("pg-ledger", &wrong_db).err().expect("unknown database refused");
    let RmError::Unavailable(message) = err else { panic!("expected Unavailable, got {err:?}") };
    assert!(message.contains("pg-ledger") && message.contains("decree_no_such_database"), "{message}");
}

#[test]
fn a_live_client_guard_makes_coordinator_calls_fail_instead_of_deadlocking() {
    let dsn = require_dsn!(PG_A);
    let mut rm = PgRm::connect("pg-a", &dsn).expect("connect");
    let handle = rm.handle();
    let xid = common::fresh_xid();
    rm.start(&xid).expect("start");
    {
        let mut client = handle.client().expect("connected");
        client.batch_execute("SELECT 1").expect("work on the handle");
        let err = rm.prepare(&xid).unwrap_err();
        assert!(matches!(err, RmError::Protocol(ref m) if m.contains("in use")), "{err:?}");
    }
    // Once the guard is gone the branch goes on (the failed call changed nothing).
    assert_eq!(rm.prepare(&xid).expect("prepare"), Vote::ReadOnly);
}

#[test]
fn lost_connections_roll_back_open_work_and_reconnect_for_phase_two() {
    let dsn = require_dsn!(PG_A);
    let mut rm = PgRm::connect("pg-a", &dsn).expect("connect");
    let mut killer = PgRm::connect("pg-a", &dsn).expect("connect");
    let table = common::table("lost");
    create_table(&mut rm, &table);
    let backend_pid = |rm: &PgRm| -> i32 {
        rm.client().expect("connected").query_one("SELECT pg_backend_pid()", &[]).expect("pid").get(0)
    };
    let terminate = |killer: &PgRm, pid: i32| {
        let row = killer
            .client()
            .expect("connected")
            .query_one("SELECT pg_terminate_backend($1)", &[&pid])
            .expect("terminate");
        assert!(row.get::<_, bool>(0), "backend {pid} terminated");
    };

    // Lost while the branch is open: its work is gone, prepare must vote no.
    let open = common::fresh_xid();
    rm.start(&open).expect("start");
    rm.client()
        .expect("connected")
        .execute(&format!("INSERT INTO {table} VALUES (1, 'x')"), &[])
        .expect("insert");
    terminate(&killer, backend_pid(&rm));
    // The check and the PREPARE travel together, so a dead connection cannot tell whether
    // the PREPARE ran: either a "no" vote or an in-doubt error; rolling back must end it.
    let err = rm.prepare(&open).unwrap_err();
    assert!(matches!(err, RmError::RolledBack(_) | RmError::Unavailable(_)), "{err:?}");
    rm.rollback(&open).expect("rollback of the lost branch");
    assert_eq!(count(&mut killer, &table, 1), 0);
    assert!(!rm.recover().expect("recover").contains(&open), "nothing of the lost branch is left prepared");

    // Lost after prepare: the same value reconnects and commits the prepared branch.
    let prepared = common::fresh_xid();
    assert_eq!(insert_and_prepare(&mut rm, &prepared, &table, 2), Vote::Commit);
    terminate(&killer, backend_pid(&rm));
    rm.commit(&prepared, false).expect("COMMIT PREPARED after reconnecting");
    assert_eq!(count(&mut killer, &table, 2), 1);
    drop_table(&mut killer, &table);
}
