//! MariaDB as one database of the real-database benchmark.
//!
//! Setup creates an InnoDB table if missing and inserts the missing rows of 1..=accounts
//! in multi-row `INSERT ... ON DUPLICATE KEY UPDATE id = id` batches of at most
//! [`SETUP_BATCH_ROWS`] (existing rows keep their balance; nothing runs when every row is
//! there). The independent mode runs `START TRANSACTION`, the prepared UPDATE and `COMMIT`
//! on a plain `mysql::Conn`; the 2PC mode runs the prepared UPDATE inside the XA branch of
//! a [`MariaDbRm`] through its [`MariaDbHandle`]. Prepared branches come from `XA RECOVER`,
//! which lists the whole server (XA ids have no database): rows are parsed with
//! [`xid_from_recover_row`] and kept when they carry decree's format id and the
//! benchmark's node, so two databases on one server list the same branches (the runner
//! counts each once).

use super::database::{db_error, BranchPair, BranchUpdate, Database, LocalUpdate};
use super::{Side, BALANCE_START};
use crate::BenchError;
use decree_core::RmFactory;
use decree_rm::mariadb::{run_checked, xid_from_recover_row};
use decree_rm::{MariaDbFactory, MariaDbHandle, MariaDbRm};
use mysql::prelude::Queryable;
use mysql::{Conn, Opts, OptsBuilder, Statement};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

/// Rows per setup `INSERT` (about 20 KiB of SQL, far below `max_allowed_packet`).
const SETUP_BATCH_ROWS: u32 = 1_000;
/// Connect timeout of the plain connections when the DSN gives none, so that an
/// unreachable server fails fast (the RM connections have the same default).
const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);

/// One side of the pair on MariaDB.
pub(super) struct MariaDbDatabase {
    side: Side,
    opts: Opts,
    table: String,
    factory: Arc<MariaDbFactory>,
}

impl MariaDbDatabase {
    /// Checks the DSN (no connection yet).
    pub(super) fn new(side: Side, dsn: &str, table: &str) -> Result<MariaDbDatabase, BenchError> {
        let context = || format!("--dsn of database {}", side.name());
        let factory = MariaDbFactory::new(side.rm_name(), dsn).map_err(|e| db_error(context(), e))?;
        let opts = Opts::from_url(dsn).map_err(|e| db_error(context(), e))?;
        let opts = match opts.get_tcp_connect_timeout() {
            Some(_) => opts,
            None => OptsBuilder::from_opts(opts).tcp_connect_timeout(Some(CONNECT_TIMEOUT_DEFAULT)).into(),
        };
        Ok(MariaDbDatabase { side, opts, table: table.to_string(), factory: Arc::new(factory) })
    }

    fn connect(&self, purpose: &str) -> Result<Conn, BenchError> {
        Conn::new(self.opts.clone()).map_err(|e| self.side.connect_error(self.factory.address(), purpose, e))
    }
}

/// The multi-row INSERT of accounts `first..=last` (existing ids are left as they are).
fn insert_batch_sql(table: &str, first: u32, last: u32) -> String {
    let mut sql = String::with_capacity(64 + 24 * last.saturating_sub(first).saturating_add(1) as usize);
    let _ = write!(sql, "INSERT INTO {table} (id, balance) VALUES ");
    for id in first..=last {
        let comma = if id == first { "" } else { "," };
        let _ = write!(sql, "{comma}({id},{BALANCE_START})");
    }
    sql.push_str(" ON DUPLICATE KEY UPDATE id = id");
    sql
}

/// Whether InnoDB's COMMIT waits for its redo log on disk (`innodb_flush_log_at_trx_commit`
/// = 1) and, with the binary log on, for the binary log too (`sync_binlog` = 1).
fn mariadb_durability(flush_at_commit: u64, sync_binlog: u64, log_bin: bool) -> (String, bool) {
    let settings = format!(
        "MariaDB innodb_flush_log_at_trx_commit={flush_at_commit} log_bin={} sync_binlog={sync_binlog}",
        if log_bin { "ON" } else { "OFF" }
    );
    (settings, flush_at_commit == 1 && (!log_bin || sync_binlog == 1))
}

impl Database for MariaDbDatabase {
    fn durability(&self) -> Result<(String, bool), BenchError> {
        let row: Option<(u64, u64, u64)> = self
            .connect("to read its settings")?
            .query_first("SELECT @@innodb_flush_log_at_trx_commit, @@sync_binlog, @@log_bin")
            .map_err(|e| db_error(self.side.context("reading its durability settings"), e))?;
        let (flush_at_commit, sync_binlog, log_bin) = row.ok_or_else(|| {
            db_error(self.side.context("reading its durability settings"), "no row returned")
        })?;
        Ok(mariadb_durability(flush_at_commit, sync_binlog, log_bin != 0))
    }

    fn setup(&self, accounts: u32) -> Result<(), BenchError> {
        let table = &self.table;
        let mut conn = self.connect("for setup")?;
        conn.query_drop(format!(
            "CREATE TABLE IF NOT EXISTS {table} (id INT PRIMARY KEY, balance BIGINT NOT NULL) ENGINE=InnoDB"
        ))
        .map_err(|e| db_error(self.side.context(format!("creating {table}")), e))?;
        let present: Option<u64> = conn
            .query_first(format!("SELECT COUNT(*) FROM {table} WHERE id BETWEEN 1 AND {accounts}"))
            .map_err(|e| db_error(self.side.context(format!("counting the rows of {table}")), e))?;
        if present == Some(u64::from(accounts)) {
            return Ok(());
        }
        let mut first = 1;
        while first <= accounts {
            let last = accounts.min(first.saturating_add(SETUP_BATCH_ROWS - 1));
            conn.query_drop(insert_batch_sql(table, first, last)).map_err(|e| {
                db_error(self.side.context(format!("filling {table} (ids {first} to {last})")), e)
            })?;
            first = last.saturating_add(1);
            if last == u32::MAX {
                break;
            }
        }
        Ok(())
    }

    fn total(&self) -> Result<i64, BenchError> {
        let sql = format!("SELECT CAST(COALESCE(SUM(balance), 0) AS SIGNED) FROM {}", self.table);
        let total: Option<i64> = self
            .connect("to read the total")?
            .query_first(sql)
            .map_err(|e| db_error(self.side.context(format!("summing {}", self.table)), e))?;
        total.ok_or_else(|| db_error(self.side.context(format!("summing {}", self.table)), "no row returned"))
    }

    fn prepared_of_node(&self, node: u32) -> Result<Vec<String>, BenchError> {
        let rows: Vec<(i64, i64, i64, Vec<u8>)> = self
            .connect("to list prepared branches")?
            .query("XA RECOVER")
            .map_err(|e| db_error(self.side.context("XA RECOVER"), e))?;
        let mut ours = Vec::new();
        for (format_id, gtrid_length, bqual_length, data) in rows {
            // A row that does not parse as an Xid is not one of decree's: skip it.
            let Ok(xid) = xid_from_recover_row(format_id, gtrid_length, bqual_length, &data) else {
                continue;
            };
            if xid.origin().is_some_and(|o| o.node == node) {
                ours.push(xid.to_string());
            }
        }
        Ok(ours)
    }

    fn rm_factory(&self) -> Arc<dyn RmFactory> {
        self.factory.clone()
    }

    fn local(&self) -> Result<Box<dyn LocalUpdate>, BenchError> {
        let mut conn = self.connect("for the independent mode")?;
        let update = conn
            .prep(self.side.update_sql(&self.table, "?"))
            .map_err(|e| db_error(self.side.context("preparing the UPDATE"), e))?;
        Ok(Box::new(MariaDbLocal { conn, update, side: self.side }))
    }

    fn branch(&self) -> Result<BranchPair, BenchError> {
        let rm: MariaDbRm = self
            .factory
            .connect_mariadb()
            .map_err(|e| self.side.connect_error(self.factory.address(), "for the 2pc mode", e))?;
        let update = rm
            .client()
            .map_err(|e| e.to_string())
            .and_then(|mut conn| conn.prep(self.side.update_sql(&self.table, "?")).map_err(|e| e.to_string()))
            .map_err(|e| db_error(self.side.context("preparing the UPDATE"), e))?;
        let branch = MariaDbBranch { handle: rm.handle(), update, side: self.side };
        Ok((Box::new(rm), Box::new(branch)))
    }
}

/// A plain connection (autocommit on, so each transfer leg opens its own transaction)
/// with the side's UPDATE prepared.
struct MariaDbLocal {
    conn: Conn,
    update: Statement,
    side: Side,
}

impl LocalUpdate for MariaDbLocal {
    fn begin(&mut self) -> Result<(), BenchError> {
        self.conn
            .query_drop("START TRANSACTION")
            .map_err(|e| db_error(self.side.context("START TRANSACTION"), e))
    }

    fn update(&mut self, id: i32) -> Result<u64, BenchError> {
        self.conn
            .exec_drop(&self.update, (id,))
            .map_err(|e| db_error(self.side.context(self.side.verb()), e))?;
        Ok(self.conn.affected_rows())
    }

    fn commit(&mut self) -> Result<(), BenchError> {
        self.conn.query_drop("COMMIT").map_err(|e| db_error(self.side.context("COMMIT"), e))
    }

    fn begin_native(&mut self, gid: &str) -> Result<(), BenchError> {
        run_checked(&mut self.conn, &format!("XA START '{gid}'"))
            .map_err(|e| db_error(self.side.context("XA START"), e))
    }

    fn prepare_native(&mut self, gid: &str) -> Result<(), BenchError> {
        // One round trip, as decree's MariaDB RM sends it.
        run_checked(&mut self.conn, &format!("XA END '{gid}'; XA PREPARE '{gid}'"))
            .map_err(|e| db_error(self.side.context("XA END; XA PREPARE"), e))
    }

    fn commit_native(&mut self, gid: &str) -> Result<(), BenchError> {
        run_checked(&mut self.conn, &format!("XA COMMIT '{gid}'"))
            .map_err(|e| db_error(self.side.context("XA COMMIT"), e))
    }

    fn abandon_native(&mut self, gid: &str) {
        let _ = run_checked(&mut self.conn, &format!("XA END '{gid}'"));
        let _ = run_checked(&mut self.conn, &format!("XA ROLLBACK '{gid}'"));
    }
}

/// The application's side of a [`MariaDbRm`] branch, with the side's UPDATE prepared.
struct MariaDbBranch {
    handle: MariaDbHandle,
    update: Statement,
    side: Side,
}

impl BranchUpdate for MariaDbBranch {
    fn update(&mut self, id: i32) -> Result<u64, BenchError> {
        let what = || self.side.context(self.side.verb());
        let mut conn = self.handle.client().map_err(|e| db_error(what(), e))?;
        conn.exec_drop(&self.update, (id,)).map_err(|e| db_error(what(), e))?;
        Ok(conn.affected_rows())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_flush_at_every_commit_is_durable() {
        assert!(mariadb_durability(1, 0, false).1);
        assert!(mariadb_durability(1, 1, true).1);
        assert!(!mariadb_durability(2, 1, false).1, "flushed once a second");
        assert!(!mariadb_durability(1, 0, true).1, "binary log not synced");
        assert_eq!(
            mariadb_durability(1, 0, false).0,
            "MariaDB innodb_flush_log_at_trx_commit=1 log_bin=OFF sync_binlog=0"
        );
    }

    #[test]
    fn setup_batches_list_every_id_once() {
        let sql = insert_batch_sql("t", 3, 5);
        assert_eq!(
            sql,
            format!(
                "INSERT INTO t (id, balance) VALUES (3,{b}),(4,{b}),(5,{b}) ON DUPLICATE KEY UPDATE id = id",
                b = BALANCE_START
            )
        );
    }
}
