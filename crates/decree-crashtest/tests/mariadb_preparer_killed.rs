//! A MariaDB branch whose preparing process is SIGKILLed, finished by name at once from
//! another process.
//!
//! The bug this guards against (MariaDB 10.11): when the connection holding a prepared
//! branch goes away, the server lists the branch for other connections before it detaches
//! the InnoDB transaction from the closing connection, and an `XA COMMIT` by name that
//! lands in between answers OK and commits nothing. The transaction stays prepared and
//! holding its locks, `XA RECOVER` no longer lists it, and after a MariaDB restart it is
//! listed again with no decision left in decree's log, so presumed abort rolls back one
//! side of a committed transaction. A state server finishing a dead client's phase two, or
//! a recovery right after a crash, does exactly that. A raw probe lost 5 commits in 5,000
//! this way (docs/measurements.md). decree names each branch with its preparing
//! connection's id (`decree_rm::xa_name`) so that any process can wait for that connection.
//!
//! Each round a child process (`decree-xa-preparer`) prepares a branch inserting one row
//! and is SIGKILLed as soon as it says so; this process commits the branch by name through
//! `MariaDbRm` at once (every fourth round rolls it back instead), re-asking while the RM
//! answers that the branch is still attached. Every committed row must be there, no rolled
//! back row may be, and no branch of the test may be left prepared.
//! `DECREE_PREPARER_KILL_ROUNDS` sets the rounds (default 60).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use decree_core::{Origin, ResourceManager, RmError, Xid};
use decree_rm::MariaDbRm;
use mysql::prelude::Queryable;

const PREPARER_BIN: &str = env!("CARGO_BIN_EXE_decree-xa-preparer");
/// A node id of this test alone, so that no other test's recovery touches its branches.
const NODE: u32 = 0x00C0_0011;
/// Longest time one round may take to finish its branch.
const ROUND_TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn a_branch_whose_preparer_was_killed_is_finished_by_name_and_never_lost() {
    let Some(dsn) = common::test_dsn("DECREE_TEST_MARIADB") else { return };
    let rounds = common::env_count("DECREE_PREPARER_KILL_ROUNDS", 60);
    let incarnation = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_nanos() as u64 >> 8;
    let table = format!("preparer_killed_{incarnation:x}");
    let mut rm = MariaDbRm::connect("maria", &dsn).expect("connect");
    rm.client()
        .expect("connected")
        .query_drop(format!("CREATE TABLE {table} (id BIGINT PRIMARY KEY) ENGINE=InnoDB"))
        .expect("create table");

    let mut committed = Vec::new();
    let mut rolled_back = Vec::new();
    let mut attached_answers = 0u64;
    for round in 0..rounds {
        let origin = Origin { node: NODE, incarnation, session: std::process::id() as u64, sequence: round };
        let xid = Xid::decree(origin).branch(1);
        let mut child = Command::new(PREPARER_BIN)
            .args([&dsn, &table, &round.to_string()])
            .args([NODE as u64, incarnation, origin.session, round].map(|n| n.to_string()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn decree-xa-preparer");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("read");
        assert!(line.starts_with("PREPARED "), "round {round}: the preparer said {line:?}");
        child.kill().expect("SIGKILL the preparer");
        if round == 0 {
            // Not in later rounds: the look would delay the commit past the race's window.
            let preparer: u64 =
                line["PREPARED ".len()..].trim().parse().expect("the preparer's connection id");
            let rows: Vec<(i64, i64, i64, Vec<u8>)> =
                rm.client().expect("connected").query("XA RECOVER").expect("XA RECOVER");
            let mut expected = vec![0, 1]; // branch 1, then the connection id (docs/protocol.md)
            expected.extend_from_slice(&preparer.to_be_bytes());
            let names: Vec<Xid> = rows
                .into_iter()
                .filter_map(|(f, g, b, data)| decree_rm::mariadb::xid_from_recover_row(f, g, b, &data).ok())
                .filter(|name| name.gtrid() == xid.gtrid())
                .collect();
            assert_eq!(
                names.iter().map(|n| n.bqual().to_vec()).collect::<Vec<_>>(),
                vec![expected],
                "the branch is named with its preparing connection {preparer}"
            );
        }
        let commit = round % 4 != 3;
        let deadline = Instant::now() + ROUND_TIMEOUT;
        loop {
            let answer = if commit { rm.commit(&xid, false) } else { rm.rollback(&xid) };
            match answer {
                Ok(()) => break,
                Err(RmError::Unavailable(m)) if m.contains("attached") && Instant::now() < deadline => {
                    attached_answers += 1;
                }
                Err(e) => panic!("round {round}: finishing {xid} by name after its preparer was killed: {e}"),
            }
        }
        child.wait().expect("reap the preparer");
        if commit {
            committed.push(round)
        } else {
            rolled_back.push(round)
        }
    }

    let rows: Vec<u64> =
        rm.client().expect("connected").query(format!("SELECT id FROM {table}")).expect("rows");
    let lost: Vec<&u64> = committed.iter().filter(|r| !rows.contains(r)).collect();
    assert!(lost.is_empty(), "commits answered OK and lost (rows missing): {lost:?}");
    let revived: Vec<&u64> = rolled_back.iter().filter(|r| rows.contains(r)).collect();
    assert!(revived.is_empty(), "rolled back and yet committed: {revived:?}");
    let left: Vec<Xid> = rm
        .recover()
        .expect("XA RECOVER")
        .into_iter()
        .filter(|x| x.origin().is_some_and(|o| o.node == NODE && o.incarnation == incarnation))
        .collect();
    assert!(left.is_empty(), "branches of the test left prepared: {left:?}");
    eprintln!(
        "{rounds} rounds: {} committed, {} rolled back, {attached_answers} answers 'still attached'",
        committed.len(),
        rolled_back.len()
    );
    rm.client().expect("connected").query_drop(format!("DROP TABLE {table}")).expect("drop table");
}
