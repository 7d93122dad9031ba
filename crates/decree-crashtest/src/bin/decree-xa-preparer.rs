//! decree-xa-preparer: prepares one MariaDB branch through decree-rm and waits to be killed.
//!
//! ```text
//! decree-xa-preparer <mysql dsn> <table> <row id> <node> <incarnation> <session> <sequence>
//! ```
//!
//! It inserts `<row id>` into `<table>` inside branch 1 of the decree Xid of that origin,
//! prepares the branch on its own connection, prints `PREPARED <connection id>` (flushed)
//! and then blocks on stdin, holding the connection, until the test SIGKILLs it. The test
//! (`tests/mariadb_preparer_killed.rs`) then finishes the branch by name from its own
//! process, as a state server finishing a dead client's phase two does.

use std::io::{Read, Write};
use std::process::ExitCode;

use decree_core::{Origin, ResourceManager, Vote, Xid};
use decree_rm::MariaDbRm;
use mysql::prelude::Queryable;

fn main() -> ExitCode {
    match prepare() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("decree-xa-preparer: {e}");
            ExitCode::FAILURE
        }
    }
}

fn prepare() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dsn, table, row, node, incarnation, session, sequence] = &args[..] else {
        return Err(
            "usage: decree-xa-preparer <dsn> <table> <row id> <node> <incarnation> <session> <sequence>"
                .into(),
        );
    };
    let number = |s: &str| s.parse::<u64>().map_err(|e| format!("{s:?}: {e}"));
    let origin = Origin {
        node: u32::try_from(number(node)?).map_err(|e| format!("node: {e}"))?,
        incarnation: number(incarnation)?,
        session: number(session)?,
        sequence: number(sequence)?,
    };
    let xid = Xid::decree(origin).branch(1);
    let mut rm = MariaDbRm::connect("maria", dsn).map_err(|e| e.to_string())?;
    rm.start(&xid).map_err(|e| e.to_string())?;
    let connection_id: u64 = {
        let mut client = rm.client().map_err(|e| e.to_string())?;
        client
            .query_drop(format!("INSERT INTO {table} (id) VALUES ({})", number(row)?))
            .map_err(|e| e.to_string())?;
        client.query_first("SELECT CONNECTION_ID()").map_err(|e| e.to_string())?.unwrap_or(0)
    };
    if rm.prepare(&xid).map_err(|e| e.to_string())? != Vote::Commit {
        return Err("the branch did not vote commit".into());
    }
    println!("PREPARED {connection_id}");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    let _ = std::io::stdin().read(&mut [0u8; 1]);
    drop(rm); // not reached when killed; otherwise the branch detaches for the test.
    Ok(())
}
