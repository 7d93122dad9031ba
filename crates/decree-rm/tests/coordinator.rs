//! End to end: the coordinator (decree-core) over a real journal log, driving real
//! PostgreSQL and MariaDB branches.
//!
//! Money moves between accounts in different databases. The bug these tests guard against
//! is a transfer that lands in one database and not the other: after commits, a rollback,
//! a branch that fails before prepare, and a crash between the decision and phase two
//! (recovery must commit what was decided and roll back what was not), the total must be
//! unchanged and every transfer must be in both databases or in neither.

mod common;

use std::sync::Arc;

use decree_core::{
    BranchRecord, CommitKind, Decision, DecisionStore, LogDecisions, Origin, ResourceManager, RmFactory,
    TmConfig, TmError, TransactionManager, TxContext, Vote, Xid,
};
use decree_log::{EngineKind, LogConfig, SyncPolicy};
use decree_rm::{MariaDbFactory, MariaDbHandle, MariaDbRm, PgFactory, PgHandle, PgRm};
use mysql::prelude::Queryable;

const PG_A: &str = "DECREE_TEST_PG_A";
const PG_B: &str = "DECREE_TEST_PG_B";
const MARIADB: &str = "DECREE_TEST_MARIADB";

/// A node id of its own for each test, so that recovery never touches another test's
/// (or an earlier run's) branches.
fn node_for(test: u32) -> u32 {
    ((common::run_token() % 100_000) as u32) * 16 + 1_000 + test
}

fn open_journal(dir: &std::path::Path) -> Arc<dyn decree_log::Log> {
    let config = LogConfig::new(dir, EngineKind::Journal, SyncPolicy::Immediate);
    Arc::from(decree_log::open(&config).expect("open the journal log"))
}

/// Creates accounts 1 and 2, each holding `balance`.
fn pg_accounts(rm: &PgRm, table: &str, balance: i64) {
    rm.client()
        .expect("connected")
        .batch_execute(&format!(
            "CREATE TABLE {table} (id int PRIMARY KEY, balance bigint NOT NULL); \
             INSERT INTO {table} VALUES (1, {balance}), (2, {balance})"
        ))
        .expect("create accounts");
}

fn pg_move(handle: &PgHandle, table: &str, account: i32, delta: i64) {
    let changed = handle
        .client()
        .expect("connected")
        .execute(&format!("UPDATE {table} SET balance = balance + $1 WHERE id = $2"), &[&delta, &account])
        .expect("update");
    assert_eq!(changed, 1);
}

fn pg_balance(dsn: &str, table: &str, account: i32) -> i64 {
    let mut client = postgres::Client::connect(dsn, postgres::NoTls).expect("connect");
    client
        .query_one(&format!("SELECT balance FROM {table} WHERE id = $1"), &[&account])
        .expect("balance")
        .get(0)
}

/// Creates accounts 1 and 2, each holding `balance`.
fn maria_accounts(rm: &MariaDbRm, table: &str, balance: i64) {
    let mut conn = rm.client().expect("connected");
    conn.query_drop(format!(
        "CREATE TABLE {table} (id INT PRIMARY KEY, balance BIGINT NOT NULL) ENGINE=InnoDB"
    ))
    .expect("create accounts");
    conn.query_drop(format!("INSERT INTO {table} VALUES (1, {balance}), (2, {balance})")).expect("insert");
}

fn maria_move(handle: &MariaDbHandle, table: &str, account: i32, delta: i64) {
    handle
        .client()
        .expect("connected")
        .exec_drop(format!("UPDATE {table} SET balance = balance + ? WHERE id = ?"), (delta, account))
        .expect("update");
}

fn maria_balance(dsn: &str, table: &str, account: i32) -> i64 {
    let mut conn = mysql::Conn::new(mysql::Opts::from_url(dsn).expect("DSN")).expect("connect");
    conn.exec_first(format!("SELECT balance FROM {table} WHERE id = ?"), (account,))
        .expect("balance")
        .expect("row")
}

/// Prepared branches minted by `node`, as the RM lists them.
fn prepared_of_node(rm: &mut dyn ResourceManager, node: u32) -> Vec<Xid> {
    let listed = rm.recover().expect("recover");
    listed.into_iter().filter(|x| x.origin().is_some_and(|o| o.node == node)).collect()
}

#[test]
fn transfers_between_two_postgres_databases_are_atomic() {
    let dsn_a = require_dsn!(PG_A);
    let dsn_b = require_dsn!(PG_B);
    let table = common::table("transfer_pg");
    let node = node_for(1);
    let fa = Arc::new(PgFactory::new("pg-a", &dsn_a).expect("DSN a"));
    let fb = Arc::new(PgFactory::new("pg-b", &dsn_b).expect("DSN b"));
    let a = fa.connect_pg().expect("connect a");
    let b = fb.connect_pg().expect("connect b");
    pg_accounts(&a, &table, 1_000);
    pg_accounts(&b, &table, 0);
    let (ha, hb) = (a.handle(), b.handle());

    let dir = tempfile::tempdir().expect("tempdir");
    let log = open_journal(dir.path());
    let config = TmConfig { node, ..TmConfig::default() };
    let factories: Vec<Arc<dyn RmFactory>> = vec![fa.clone(), fb.clone()];
    let tm = TransactionManager::embedded(log.clone(), config, factories).expect("coordinator");
    let mut tx = TxContext::open(&tm, vec![Box::new(a), Box::new(b)]).expect("tx_open");

    for _ in 0..5 {
        tx.begin().expect("begin");
        pg_move(&ha, &table, 1, -10);
        pg_move(&hb, &table, 1, 10);
        let report = tx.commit().expect("commit");
        assert_eq!(report.kind, CommitKind::TwoPhase);
        assert_eq!(report.phase_two_pending, 0);
    }
    assert_eq!((pg_balance(&dsn_a, &table, 1), pg_balance(&dsn_b, &table, 1)), (950, 50));

    // Rolled back by the application: neither side moves.
    tx.begin().expect("begin");
    pg_move(&ha, &table, 1, -500);
    pg_move(&hb, &table, 1, 500);
    tx.rollback().expect("rollback");

    // One branch fails before prepare: the coordinator rolls both back.
    tx.begin().expect("begin");
    pg_move(&ha, &table, 1, -300);
    assert!(hb.client().expect("connected").batch_execute("SELECT 1/0").is_err());
    let err = tx.commit().unwrap_err();
    assert!(matches!(err, TmError::RolledBack { ref rm, .. } if rm == "pg-b"), "{err}");

    // The context is usable again after a failed commit.
    tx.begin().expect("begin");
    pg_move(&ha, &table, 1, -1);
    pg_move(&hb, &table, 1, 1);
    tx.commit().expect("commit after a failed one");

    assert_eq!((pg_balance(&dsn_a, &table, 1), pg_balance(&dsn_b, &table, 1)), (949, 51));
    assert_eq!(log.stats().records_appended, 6, "one decision per two-phase commit, none for failures");
    let mut check_a = fa.connect().expect("connect");
    let mut check_b = fb.connect().expect("connect");
    assert!(prepared_of_node(check_a.as_mut(), node).is_empty(), "nothing left prepared on a");
    assert!(prepared_of_node(check_b.as_mut(), node).is_empty(), "nothing left prepared on b");
    tx.close().expect("tx_close");
}

#[test]
fn transfers_between_postgres_and_mariadb_are_atomic() {
    let dsn_a = require_dsn!(PG_A);
    let dsn_m = require_dsn!(MARIADB);
    let table = common::table("transfer_mixed");
    let node = node_for(2);
    let fa = Arc::new(PgFactory::new("pg-a", &dsn_a).expect("DSN a"));
    let fm = Arc::new(MariaDbFactory::new("maria", &dsn_m).expect("DSN m"));
    let a = fa.connect_pg().expect("connect a");
    let m = fm.connect_mariadb().expect("connect m");
    pg_accounts(&a, &table, 1_000);
    maria_accounts(&m, &table, 0);
    let (ha, hm) = (a.handle(), m.handle());

    let dir = tempfile::tempdir().expect("tempdir");
    let log = open_journal(dir.path());
    let config = TmConfig { node, ..TmConfig::default() };
    let factories: Vec<Arc<dyn RmFactory>> = vec![fa.clone(), fm.clone()];
    let tm = TransactionManager::embedded(log.clone(), config, factories).expect("coordinator");
    let mut tx = TxContext::open(&tm, vec![Box::new(a), Box::new(m)]).expect("tx_open");

    for _ in 0..5 {
        tx.begin().expect("begin");
        pg_move(&ha, &table, 1, -25);
        maria_move(&hm, &table, 1, 25);
        let report = tx.commit().expect("commit");
        assert_eq!(report.kind, CommitKind::TwoPhase);
        assert_eq!(report.phase_two_pending, 0);
    }
    tx.begin().expect("begin");
    pg_move(&ha, &table, 1, -400);
    maria_move(&hm, &table, 1, 400);
    tx.rollback().expect("rollback");

    // The PostgreSQL branch fails: the MariaDB branch must not keep its credit.
    tx.begin().expect("begin");
    maria_move(&hm, &table, 1, 99);
    assert!(ha.client().expect("connected").batch_execute("SELECT 1/0").is_err());
    let err = tx.commit().unwrap_err();
    assert!(matches!(err, TmError::RolledBack { ref rm, .. } if rm == "pg-a"), "{err}");

    assert_eq!(pg_balance(&dsn_a, &table, 1), 875);
    assert_eq!(maria_balance(&dsn_m, &table, 1), 125);
    let mut check_m = fm.connect().expect("connect");
    assert!(prepared_of_node(check_m.as_mut(), node).is_empty(), "nothing left prepared on MariaDB");
    tx.close().expect("tx_close");
}

#[test]
fn recovery_commits_decided_branches_and_rolls_back_the_rest() {
    let dsn_a = require_dsn!(PG_A);
    let dsn_b = require_dsn!(PG_B);
    let dsn_m = require_dsn!(MARIADB);
    let table = common::table("recovery");
    let node = node_for(3);
    let fa = Arc::new(PgFactory::new("pg-a", &dsn_a).expect("DSN a"));
    let fb = Arc::new(PgFactory::new("pg-b", &dsn_b).expect("DSN b"));
    let fm = Arc::new(MariaDbFactory::new("maria", &dsn_m).expect("DSN m"));
    let mut a = fa.connect_pg().expect("connect a");
    let mut b = fb.connect_pg().expect("connect b");
    pg_accounts(&a, &table, 1_000);
    pg_accounts(&b, &table, 0);
    maria_accounts(&fm.connect_mariadb().expect("connect m"), &table, 0);
    // MariaDB keeps a prepared branch attached to its connection: one connection each.
    let mut maria_connections = Vec::new();

    // First life: both transactions prepare everywhere, only `decided` reaches the log,
    // then the process "crashes" (connections and log dropped before phase two).
    let dir = tempfile::tempdir().expect("tempdir");
    let log = open_journal(dir.path());
    let incarnation = log.incarnation();
    let decided = Xid::decree(Origin { node, incarnation, session: 1, sequence: 1 });
    let undecided = Xid::decree(Origin { node, incarnation, session: 1, sequence: 2 });
    // Each transaction has its own account: a prepared branch keeps its row locks.
    for (xid, account, amount) in [(decided, 1, 100), (undecided, 2, 7)] {
        a.start(&xid.branch(0)).expect("start a");
        pg_move(&a.handle(), &table, account, -2 * amount);
        b.start(&xid.branch(1)).expect("start b");
        pg_move(&b.handle(), &table, account, amount);
        let mut m = fm.connect_mariadb().expect("connect m");
        m.start(&xid.branch(2)).expect("start m");
        maria_move(&m.handle(), &table, account, amount);
        assert_eq!(a.prepare(&xid.branch(0)).expect("prepare a"), Vote::Commit);
        assert_eq!(b.prepare(&xid.branch(1)).expect("prepare b"), Vote::Commit);
        assert_eq!(m.prepare(&xid.branch(2)).expect("prepare m"), Vote::Commit);
        if xid == decided {
            let store = LogDecisions::new(log.clone(), node);
            let branches = [("pg-a", 0), ("pg-b", 1), ("maria", 2)]
                .iter()
                .map(|&(rm, branch)| BranchRecord { rm: rm.to_string(), branch })
                .collect();
            store.decide(&Decision { xid, branches }).expect("decision record");
        }
        maria_connections.push(m);
    }
    drop((a, b, maria_connections));
    drop(log);

    // Second life: recovery finishes both, whatever the RMs' connections were.
    let log = open_journal(dir.path());
    assert!(log.incarnation() > incarnation, "a restart is a new incarnation");
    let config = TmConfig { node, ..TmConfig::default() };
    let factories: Vec<Arc<dyn RmFactory>> = vec![fa.clone(), fb.clone(), fm.clone()];
    let tm = TransactionManager::embedded(log, config, factories).expect("coordinator with recovery");
    assert!(tm.wait_idle(std::time::Duration::from_secs(30)), "background retries finished");
    let report = tm.recovery_report();
    assert_eq!(report.decisions, 1, "{report:?}");

    let decided_balances = (pg_balance(&dsn_a, &table, 1), pg_balance(&dsn_b, &table, 1));
    assert_eq!(decided_balances, (800, 100), "decided transfer committed");
    assert_eq!(maria_balance(&dsn_m, &table, 1), 100, "decided transfer committed on MariaDB");
    let undecided_balances = (pg_balance(&dsn_a, &table, 2), pg_balance(&dsn_b, &table, 2));
    assert_eq!(undecided_balances, (1_000, 0), "undecided transfer rolled back");
    assert_eq!(maria_balance(&dsn_m, &table, 2), 0, "undecided transfer rolled back on MariaDB");
    for factory in [fa.clone() as Arc<dyn RmFactory>, fb.clone(), fm.clone()] {
        let mut rm = factory.connect().expect("connect");
        assert!(prepared_of_node(rm.as_mut(), node).is_empty(), "{} still holds branches", factory.name());
    }
}

/// Throughput of transfers through the coordinator (journal log, rpo = 0) over real
/// databases. Not a test of speed (nothing is asserted on it): run it by hand with
/// `cargo test --release -p decree-rm --test coordinator bench -- --ignored --nocapture`.
#[test]
#[ignore]
fn bench_transfers_through_the_coordinator() {
    let dsn_a = require_dsn!(PG_A);
    let dsn_b = require_dsn!(PG_B);
    let dsn_m = require_dsn!(MARIADB);
    let transfers: u32 =
        std::env::var("DECREE_BENCH_TRANSFERS").ok().and_then(|v| v.parse().ok()).unwrap_or(500);
    let table = common::table("bench");
    let fa = Arc::new(PgFactory::new("pg-a", &dsn_a).expect("DSN a"));
    let fb = Arc::new(PgFactory::new("pg-b", &dsn_b).expect("DSN b"));
    let fm = Arc::new(MariaDbFactory::new("maria", &dsn_m).expect("DSN m"));
    pg_accounts(&fa.connect_pg().expect("a"), &table, 1_000_000);
    pg_accounts(&fb.connect_pg().expect("b"), &table, 0);
    maria_accounts(&fm.connect_mariadb().expect("m"), &table, 0);
    let dir = tempfile::tempdir().expect("tempdir");
    let log = open_journal(dir.path());
    let config = TmConfig { node: node_for(4), ..TmConfig::default() };
    let factories: Vec<Arc<dyn RmFactory>> = vec![fa.clone(), fb.clone(), fm.clone()];
    let tm = TransactionManager::embedded(log, config, factories).expect("coordinator");

    let a = fa.connect_pg().expect("a");
    let b = fb.connect_pg().expect("b");
    let (ha, hb) = (a.handle(), b.handle());
    let mut tx = TxContext::open(&tm, vec![Box::new(a), Box::new(b)]).expect("tx_open");
    let started = std::time::Instant::now();
    for _ in 0..transfers {
        tx.begin().expect("begin");
        pg_move(&ha, &table, 1, -1);
        pg_move(&hb, &table, 1, 1);
        tx.commit().expect("commit");
    }
    let elapsed = started.elapsed();
    tx.close().expect("close");
    println!(
        "postgres+postgres: {transfers} transfers in {:.3} s = {:.0} tx/s",
        elapsed.as_secs_f64(),
        f64::from(transfers) / elapsed.as_secs_f64()
    );

    let a = fa.connect_pg().expect("a");
    let m = fm.connect_mariadb().expect("m");
    let (ha, hm) = (a.handle(), m.handle());
    let mut tx = TxContext::open(&tm, vec![Box::new(a), Box::new(m)]).expect("tx_open");
    let started = std::time::Instant::now();
    for _ in 0..transfers {
        tx.begin().expect("begin");
        pg_move(&ha, &table, 1, -1);
        maria_move(&hm, &table, 1, 1);
        tx.commit().expect("commit");
    }
    let elapsed = started.elapsed();
    tx.close().expect("close");
    println!(
        "postgres+mariadb: {transfers} transfers in {:.3} s = {:.0} tx/s",
        elapsed.as_secs_f64(),
        f64::from(transfers) / elapsed.as_secs_f64()
    );
    assert_eq!(pg_balance(&dsn_a, &table, 1), 1_000_000 - 2 * i64::from(transfers));
    assert_eq!(pg_balance(&dsn_b, &table, 1) + maria_balance(&dsn_m, &table, 1), 2 * i64::from(transfers));
}
