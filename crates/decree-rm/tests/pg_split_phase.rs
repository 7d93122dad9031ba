//! Split-phase calls on PostgreSQL against a real server (scripts/test-dbs.sh): a request
//! sent is on the server before its answer is taken, and the split-phase forms of start,
//! prepare and commit leave the branch where the blocking forms would, failures included.

mod common;

use std::str::FromStr;
use std::time::{Duration, Instant};

use decree_core::{BranchAnswer, BranchCall, ResourceManager, RmError, Vote};
use decree_rm::pg_client::{Client, Config};
use decree_rm::PgRm;

const PG_A: &str = "DECREE_TEST_PG_A";

/// Waits up to 10 s for `condition`, polling; false when it never held.
fn eventually(mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

#[test]
fn a_sent_statement_is_on_the_server_before_its_answer_is_taken() {
    let dsn = require_dsn!(PG_A);
    let mut holder = postgres::Client::connect(&dsn, postgres::NoTls).expect("connect");
    let key = (common::run_token() & 0x7fff_ffff) as i64;
    holder.execute("SELECT pg_advisory_lock($1)", &[&key]).expect("take the lock");

    let mut client = Client::connect(&Config::from_str(&dsn).expect("DSN")).expect("connect");
    let pid: i32 = client.query_one("SELECT pg_backend_pid()", &[]).expect("pid").get(0);
    let sent = client.send(format!("SELECT pg_advisory_lock({key})"));
    // Nothing drives this client now: only what `send` wrote can make the server wait.
    let waiting = eventually(|| {
        holder
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND pid = $1",
                &[&pid],
            )
            .expect("pg_locks")
            .get::<_, i64>(0)
            == 1
    });
    assert!(waiting, "the sent statement never reached the server");
    holder.execute("SELECT pg_advisory_unlock($1)", &[&key]).expect("release");
    client.receive(sent).expect("the lock is granted once released");
    let held: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = pg_backend_pid()",
            &[],
        )
        .expect("pg_locks")
        .get(0);
    assert_eq!(held, 1, "the answer taken is the sent statement's");
}

fn create_table(rm: &mut PgRm, table: &str) {
    rm.client()
        .expect("connected")
        .batch_execute(&format!("CREATE TABLE {table} (id bigint PRIMARY KEY)"))
        .expect("create table");
}

fn count(rm: &PgRm, table: &str, id: i64) -> i64 {
    rm.client()
        .expect("connected")
        .query_one(&format!("SELECT count(*) FROM {table} WHERE id = $1"), &[&id])
        .expect("count")
        .get(0)
}

fn call(rm: &mut PgRm, call: BranchCall, xid: &decree_core::Xid) -> BranchAnswer {
    assert!(rm.send(call, xid), "PostgreSQL has split-phase calls");
    rm.receive()
}

#[test]
fn split_phase_start_prepare_and_commit_finish_a_branch_like_the_blocking_calls() {
    let dsn = require_dsn!(PG_A);
    let mut rm = PgRm::connect("pg-a", &dsn).expect("connect");
    let mut observer = PgRm::connect("pg-a", &dsn).expect("connect");
    let table = common::table("split");
    create_table(&mut rm, &table);

    let xid = common::fresh_xid();
    call(&mut rm, BranchCall::Start, &xid).into_ack().expect("start");
    rm.client().expect("connected").execute(&format!("INSERT INTO {table} VALUES (1)"), &[]).expect("insert");
    rm.end(&xid).expect("end");
    assert!(rm.send(BranchCall::Prepare, &xid));
    let gid = xid.to_gid();
    let prepared = eventually(|| {
        observer
            .client()
            .expect("connected")
            .query_one("SELECT count(*) FROM pg_prepared_xacts WHERE gid = $1", &[&gid])
            .expect("pg_prepared_xacts")
            .get::<_, i64>(0)
            == 1
    });
    assert!(prepared, "the prepare was sent before its answer was taken");
    assert_eq!(rm.receive().into_vote().expect("vote"), Vote::Commit);
    assert_eq!(count(&observer, &table, 1), 0, "prepared, not committed");
    call(&mut rm, BranchCall::Commit, &xid).into_ack().expect("COMMIT PREPARED");
    assert_eq!(count(&observer, &table, 1), 1);
    assert!(!observer.recover().expect("recover").contains(&xid));

    // Work that failed votes no, and the connection serves the next branch.
    let failed = common::fresh_xid();
    call(&mut rm, BranchCall::Start, &failed).into_ack().expect("start");
    assert!(rm.client().expect("connected").batch_execute("SELECT 1/0").is_err());
    let vote = call(&mut rm, BranchCall::Prepare, &failed).into_vote();
    assert!(matches!(vote, Err(RmError::RolledBack(_))), "{vote:?}");

    // A call the branch's state forbids is refused without a statement.
    let open = common::fresh_xid();
    call(&mut rm, BranchCall::Start, &open).into_ack().expect("start");
    let refused = call(&mut rm, BranchCall::Commit, &open).into_ack();
    assert!(matches!(refused, Err(RmError::Protocol(_))), "{refused:?}");

    // An answer nobody took is settled before the next blocking call, which gets its own.
    rm.rollback(&open).expect("rollback");
    let unreceived = common::fresh_xid();
    assert!(rm.send(BranchCall::Start, &unreceived));
    rm.client()
        .expect("connected")
        .execute(&format!("INSERT INTO {table} VALUES (2)"), &[])
        .expect("insert after an unreceived BEGIN");
    rm.end(&unreceived).expect("end");
    assert_eq!(rm.prepare(&unreceived).expect("prepare"), Vote::Commit);
    rm.rollback(&unreceived).expect("rollback prepared");
    assert_eq!(count(&observer, &table, 2), 0);

    // A connection lost before the prepare: the vote is no or in doubt, never yes.
    let lost = common::fresh_xid();
    call(&mut rm, BranchCall::Start, &lost).into_ack().expect("start");
    let pid: i32 =
        rm.client().expect("connected").query_one("SELECT pg_backend_pid()", &[]).expect("pid").get(0);
    observer
        .client()
        .expect("connected")
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .expect("terminate");
    let vote = call(&mut rm, BranchCall::Prepare, &lost).into_vote();
    assert!(matches!(vote, Err(RmError::RolledBack(_) | RmError::Unavailable(_))), "{vote:?}");
    rm.rollback(&lost).expect("rollback of the lost branch");
    observer.client().expect("connected").batch_execute(&format!("DROP TABLE {table}")).expect("drop");
}

/// The session state and transaction start of backend `pid`, as another connection sees it.
fn backend_state(observer: &PgRm, pid: i32) -> (String, bool) {
    let row = observer
        .client()
        .expect("connected")
        .query_one("SELECT state, xact_start IS NOT NULL FROM pg_stat_activity WHERE pid = $1", &[&pid])
        .expect("pg_stat_activity");
    (row.get(0), row.get(1))
}

#[test]
fn start_queues_its_begin_until_the_first_statement_carries_it() {
    let dsn = require_dsn!(PG_A);
    let mut rm = PgRm::connect("pg-a", &dsn).expect("connect");
    let observer = PgRm::connect("pg-a", &dsn).expect("connect");
    let table = common::table("queued");
    create_table(&mut rm, &table);
    let pid: i32 =
        rm.client().expect("connected").query_one("SELECT pg_backend_pid()", &[]).expect("pid").get(0);

    let xid = common::fresh_xid();
    rm.start(&xid).expect("start");
    // Nothing went to the server: the session is idle, outside any transaction.
    assert_eq!(backend_state(&observer, pid), ("idle".to_string(), false));
    rm.client().expect("connected").execute(&format!("INSERT INTO {table} VALUES (1)"), &[]).expect("insert");
    // The insert went out behind the BEGIN: the session now holds an open transaction and
    // the row is not visible elsewhere.
    assert_eq!(backend_state(&observer, pid), ("idle in transaction".to_string(), true));
    assert_eq!(count(&observer, &table, 1), 0, "the insert runs inside the branch");
    let read_only: String =
        rm.client().expect("connected").query_one("SHOW transaction_read_only", &[]).expect("show").get(0);
    assert_eq!(read_only, "off", "the branch's transaction writes");
    assert_eq!(rm.prepare(&xid).expect("prepare"), Vote::Commit);
    rm.commit(&xid, false).expect("commit prepared");
    assert_eq!(count(&observer, &table, 1), 1);

    // A branch whose application ran nothing prepares too: the prepare carries the BEGIN.
    let empty = common::fresh_xid();
    rm.start(&empty).expect("start");
    assert_eq!(rm.prepare(&empty).expect("prepare of an empty branch"), Vote::ReadOnly);
    observer.client().expect("connected").batch_execute(&format!("DROP TABLE {table}")).expect("drop");
}

#[test]
fn statements_after_a_failed_begin_cannot_write_and_the_branch_votes_no() {
    let dsn = require_dsn!(PG_A);
    let mut rm = PgRm::connect("pg-a", &dsn).expect("connect");
    let observer = PgRm::connect("pg-a", &dsn).expect("connect");
    let table = common::table("nobegin");
    // Outside a branch the application writes as on any connection.
    create_table(&mut rm, &table);
    rm.client().expect("connected").execute(&format!("INSERT INTO {table} VALUES (1)"), &[]).expect("insert");

    // A BEGIN the server rejects while the session lives (as a cancel would make it), on a
    // new connection (read-only from its startup options)...
    let mut fresh = PgRm::connect("pg-a", &dsn).expect("connect");
    fresh.inject_begin_statement("BEGIN READ WRITE NOT_A_MODE").expect("inject");
    let first = common::fresh_xid();
    fresh.start(&first).expect("start only queues the BEGIN");
    let insert = fresh.client().expect("connected").execute(&format!("INSERT INTO {table} VALUES (5)"), &[]);
    let code = insert.as_ref().err().and_then(|e| e.as_db_error()).map(|db| db.code().code().to_string());
    assert_eq!(code.as_deref(), Some("25006"), "read-only transaction: {insert:?}");
    assert!(matches!(fresh.prepare(&first), Err(RmError::RolledBack(_))));
    fresh.rollback(&first).expect("nothing to roll back");

    // ... and on one the application used outside a branch (set read-only again at start).
    rm.inject_begin_statement("BEGIN READ WRITE NOT_A_MODE").expect("inject");
    let xid = common::fresh_xid();
    rm.start(&xid).expect("start only queues the BEGIN");
    let insert = rm.client().expect("connected").execute(&format!("INSERT INTO {table} VALUES (2)"), &[]);
    let err = insert.expect_err("a write after a failed BEGIN must not run on its own");
    let code = err.as_db_error().map(|db| db.code().code().to_string());
    assert_eq!(code.as_deref(), Some("25006"), "read-only transaction: {err}");
    // The application learns it at its next use of the connection, the coordinator at prepare.
    let next = rm.client().map(drop);
    assert!(matches!(&next, Err(RmError::RolledBack(m)) if m.contains("BEGIN")), "{next:?}");
    let vote = rm.prepare(&xid);
    assert!(matches!(&vote, Err(RmError::RolledBack(m)) if m.contains("BEGIN of branch")), "{vote:?}");
    rm.rollback(&xid).expect("nothing to roll back");
    assert_eq!(count(&observer, &table, 2) + count(&observer, &table, 5), 0, "the inserts changed nothing");

    // The connection serves the next branch, whose work commits only with it.
    rm.inject_begin_statement("BEGIN READ WRITE").expect("heal");
    let next = common::fresh_xid();
    rm.start(&next).expect("start");
    rm.client().expect("connected").execute(&format!("INSERT INTO {table} VALUES (3)"), &[]).expect("insert");
    assert_eq!(count(&observer, &table, 3), 0, "inside the branch");
    rm.commit(&next, true).expect("one-phase commit");
    assert_eq!(count(&observer, &table, 3), 1);
    // And outside a branch again, it writes as before.
    rm.client().expect("connected").execute(&format!("INSERT INTO {table} VALUES (4)"), &[]).expect("insert");
    assert_eq!(count(&observer, &table, 4), 1);
    observer.client().expect("connected").batch_execute(&format!("DROP TABLE {table}")).expect("drop");
}
