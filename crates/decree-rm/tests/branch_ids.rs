//! Checks the branch-id vectors of docs/vectors/branch_ids.json against the encoders the
//! resource managers really use: `Xid::to_gid`/`Xid::from_gid` (the PostgreSQL gid that
//! `PREPARE TRANSACTION`, `COMMIT PREPARED` and recovery use), `mariadb::xid_sql` (the XA
//! statements), `xa_name` (a MariaDB branch's name with its preparing connection) and
//! `mariadb::xid_from_recover_row` (how recovery reads `XA RECOVER`). The
//! vectors were written by an independent encoder from docs/protocol.md, so a change of
//! either form breaks this test instead of silently moving the vectors.
//!
//! With the databases of scripts/test-dbs.sh, a branch prepared with plain SQL in the
//! documented form (as a client in another language prepares it) is found by decree's own
//! recovery listing as exactly that Xid and committed by decree's phase two.

mod common;

use decree_core::{Origin, ResourceManager, Xid, DECREE_FORMAT_ID};
use decree_rm::mariadb::{xid_from_recover_row, xid_sql};
use decree_rm::xa_name;
use decree_rm::{MariaDbRm, PgRm};
use serde_json::Value;

fn vectors() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/vectors/branch_ids.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("vector file")).expect("vector JSON")
}

fn num(v: &Value, field: &str) -> u64 {
    v[field].as_u64().unwrap_or_else(|| panic!("field {field} missing in {v}"))
}

fn text<'a>(v: &'a Value, field: &str) -> &'a str {
    v[field].as_str().unwrap_or_else(|| panic!("field {field} missing in {v}"))
}

fn origin(v: &Value) -> Origin {
    let o = &v["origin"];
    Origin {
        node: num(o, "node") as u32,
        incarnation: num(o, "incarnation"),
        session: num(o, "session"),
        sequence: num(o, "sequence"),
    }
}

#[test]
fn every_branch_vector_is_what_the_resource_managers_write_and_read() {
    let v = vectors();
    assert_eq!(num(&v, "format_id"), DECREE_FORMAT_ID as u64);
    assert_eq!(text(&v, "gid_prefix"), decree_core::xid::GID_PREFIX);
    let branches = v["branches"].as_array().expect("branches");
    assert!(branches.len() >= 3);
    for b in branches {
        let name = text(b, "name");
        let xid = Xid::decree(origin(b)).branch(num(b, "branch") as u16);
        assert_eq!(xid.format_id() as u64, num(b, "format_id"), "{name}");
        assert_eq!(hex::encode(xid.gtrid()), text(b, "gtrid"), "{name}: gtrid");
        assert_eq!(hex::encode(xid.bqual()), text(b, "bqual"), "{name}: bqual");
        assert_eq!(xid.branch_number(), Some(num(b, "branch") as u16), "{name}");
        let mut binary = Vec::new();
        xid.encode(&mut binary);
        assert_eq!(hex::encode(&binary), text(b, "xid_binary"), "{name}: binary Xid");
        // PostgreSQL: the gid written, and the gid recovery reads back.
        assert_eq!(xid.to_gid(), text(b, "postgres_gid"), "{name}: PostgreSQL gid");
        assert_eq!(Xid::from_gid(text(b, "postgres_gid")), Ok(xid), "{name}: gid parsed by recovery");
        // MariaDB/MySQL: the xid of the XA statements, and an XA RECOVER row read back.
        assert_eq!(xid_sql(&xid).expect("non-negative format id"), text(b, "mysql_xid"), "{name}: XA xid");
        let row = &b["mysql_xa_recover"];
        let data = hex::decode(text(row, "data")).expect("hex");
        let parsed = xid_from_recover_row(
            num(row, "formatID") as i64,
            num(row, "gtrid_length") as i64,
            num(row, "bqual_length") as i64,
            &data,
        );
        assert_eq!(parsed, Ok(xid), "{name}: XA RECOVER row");
        // MariaDB/MySQL: the branch's name on the server, with its preparing connection.
        let named = &b["mariadb_name"];
        let server_name = xa_name::on_server(&xid, num(named, "connection_id"));
        assert_eq!(hex::encode(server_name.bqual()), text(named, "bqual"), "{name}: named bqual");
        assert_eq!(
            xid_sql(&server_name).expect("non-negative"),
            text(named, "mysql_xid"),
            "{name}: named xid"
        );
        let row = &named["mysql_xa_recover"];
        let listed = xid_from_recover_row(
            num(row, "formatID") as i64,
            num(row, "gtrid_length") as i64,
            num(row, "bqual_length") as i64,
            &hex::decode(text(row, "data")).expect("hex"),
        )
        .expect("named XA RECOVER row");
        assert_eq!(
            xa_name::parse(&listed),
            xa_name::Listed { xid, preparer: Some(num(named, "connection_id")) },
            "{name}: a listed name read back"
        );
        assert_eq!(xid.origin(), Some(origin(b)), "{name}: origin");
    }
    let g = &v["global"];
    let global = Xid::decree(origin(g));
    let mut binary = Vec::new();
    global.encode(&mut binary);
    assert_eq!(hex::encode(&binary), text(g, "xid_binary"));
    assert_eq!(global.to_gid(), text(g, "postgres_gid"));
    assert_eq!(hex::encode(global.gtrid()), text(g, "gtrid"));
    assert_eq!(text(g, "bqual"), "");
}

#[test]
fn non_canonical_gids_are_never_the_gid_of_a_decree_branch() {
    let v = vectors();
    let bad = v["non_canonical_gids"].as_array().expect("non_canonical_gids");
    assert!(!bad.is_empty());
    for entry in bad {
        let gid = text(entry, "gid");
        // A decree branch's gid is canonical and carries an origin and a branch number.
        let branch_gid = Xid::from_gid(gid)
            .is_ok_and(|x| x.to_gid() == gid && x.origin().is_some() && x.branch_number().is_some());
        assert!(!branch_gid, "{}: {gid} is the gid of a decree branch", text(entry, "name"));
    }
    // The danger the vectors document: uppercase hex parses, so recovery lists the branch,
    // but every statement by name uses the lowercase string PostgreSQL does not know.
    let upper = bad.iter().find(|e| text(e, "name") == "uppercase_hex").expect("uppercase vector");
    let parsed = Xid::from_gid(text(upper, "gid")).expect("uppercase hex parses");
    assert_ne!(parsed.to_gid(), text(upper, "gid"));
}

/// A fresh branch Xid and its documented forms, built by hand as a foreign client does.
fn fresh_branch() -> (Xid, String, String) {
    let xid = common::fresh_xid().global().branch(1);
    let o = xid.origin().expect("decree xid");
    let mut gtrid = Vec::new();
    gtrid.extend_from_slice(&o.node.to_be_bytes());
    gtrid.extend_from_slice(&o.incarnation.to_be_bytes());
    gtrid.extend_from_slice(&o.session.to_be_bytes());
    gtrid.extend_from_slice(&o.sequence.to_be_bytes());
    let (g, b) = (hex::encode(gtrid), hex::encode(1u16.to_be_bytes()));
    let gid = format!("decree:{:08x}:{g}:{b}", DECREE_FORMAT_ID);
    let mysql = format!("X'{g}',X'{b}',{}", DECREE_FORMAT_ID);
    (xid, gid, mysql)
}

#[test]
fn a_postgres_branch_prepared_with_the_documented_gid_is_recovered_and_committed() {
    let dsn = require_dsn!("DECREE_TEST_PG_A");
    let (xid, gid, _) = fresh_branch();
    let table = common::table("bid_pg");
    let mut raw = postgres::Client::connect(&dsn, postgres::NoTls).expect("connect");
    raw.batch_execute(&format!("CREATE TABLE {table} (id bigint PRIMARY KEY)")).expect("create");
    raw.batch_execute(&format!("BEGIN; INSERT INTO {table} VALUES (1); PREPARE TRANSACTION '{gid}'"))
        .expect("prepare with the documented gid");
    let mut rm = PgRm::connect("pg-a", &dsn).expect("connect rm");
    assert!(rm.recover().expect("recover").contains(&xid), "decree's recovery lists {gid}");
    rm.commit(&xid, false).expect("decree's phase two commits it by name");
    let rows: i64 = raw.query_one(&format!("SELECT count(*) FROM {table}"), &[]).expect("count").get(0);
    assert_eq!(rows, 1, "the branch's insert is committed");
    assert!(!rm.recover().expect("recover").contains(&xid), "nothing left prepared");
    raw.batch_execute(&format!("DROP TABLE {table}")).expect("drop");
}

/// Both forms of docs/protocol.md: the name with the preparing connection's id (which
/// makes decree wait for that connection to let go of the branch) and the bare branch Xid
/// that clients wrote before (still recognised and committed).
#[test]
fn a_mariadb_branch_prepared_with_the_documented_xid_is_recovered_and_committed() {
    use mysql::prelude::Queryable;
    let dsn = require_dsn!("DECREE_TEST_MARIADB");
    let table = common::table("bid_my");
    let opts = mysql::Opts::from_url(&dsn).expect("dsn");
    let mut admin = mysql::Conn::new(opts.clone()).expect("connect");
    admin.query_drop(format!("CREATE TABLE {table} (id bigint PRIMARY KEY) ENGINE=InnoDB")).expect("create");
    let mut rm = MariaDbRm::connect("mariadb-a", &dsn).expect("connect rm");
    for (row, with_connection_id) in [(1, true), (2, false)] {
        let (xid, _, bare) = fresh_branch();
        let mut raw = mysql::Conn::new(opts.clone()).expect("connect");
        let x = if with_connection_id {
            let id: u64 = raw.query_first("SELECT CONNECTION_ID()").expect("id").expect("a row");
            let (g, b) = (hex::encode(xid.gtrid()), format!("0001{id:016x}"));
            format!("X'{g}',X'{b}',{DECREE_FORMAT_ID}")
        } else {
            bare
        };
        for sql in [
            format!("XA START {x}"),
            format!("INSERT INTO {table} VALUES ({row})"),
            format!("XA END {x}"),
            format!("XA PREPARE {x}"),
        ] {
            raw.query_drop(&sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
        // Dropping the connection detaches the prepared branch for other connections.
        drop(raw);
        assert!(rm.recover().expect("XA RECOVER").contains(&xid), "decree's recovery lists {x} as {xid}");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        loop {
            match rm.commit(&xid, false) {
                Ok(()) => break,
                Err(e) if std::time::Instant::now() < deadline => {
                    eprintln!("commit not yet possible ({e}); retrying");
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
                Err(e) => panic!("decree's phase two cannot commit {x}: {e}"),
            }
        }
        let rows: i64 = admin
            .query_first(format!("SELECT count(*) FROM {table} WHERE id = {row}"))
            .expect("count")
            .expect("a row");
        assert_eq!(rows, 1, "the insert of branch {x} is committed");
        assert!(!rm.recover().expect("XA RECOVER").contains(&xid), "nothing left prepared");
    }
    admin.query_drop(format!("DROP TABLE {table}")).expect("drop");
}
