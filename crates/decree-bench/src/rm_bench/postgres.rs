//! PostgreSQL as one database of the real-database benchmark.
//!
//! Setup is one `CREATE TABLE IF NOT EXISTS` and one `INSERT ... SELECT FROM
//! generate_series ... ON CONFLICT DO NOTHING`; the independent mode runs `BEGIN`, the
//! prepared UPDATE and `COMMIT` on a plain `postgres::Client`; the 2PC mode runs the
//! prepared UPDATE on a [`PgRm`]'s connection through its [`PgHandle`]. Prepared branches
//! are read from `pg_prepared_xacts`, which lists the whole cluster: it is filtered to
//! this database, decree's gid prefix and the benchmark's node.

use super::database::{db_error, BranchPair, BranchUpdate, Database, LocalUpdate};
use super::{Side, BALANCE_START};
use crate::BenchError;
use decree_core::{RmFactory, Xid};
use decree_rm::{PgFactory, PgHandle, PgRm};
use std::sync::Arc;

/// One side of the pair on PostgreSQL.
pub(super) struct PgDatabase {
    side: Side,
    dsn: String,
    table: String,
    factory: Arc<PgFactory>,
}

impl PgDatabase {
    /// Checks the DSN (no connection yet).
    pub(super) fn new(side: Side, dsn: &str, table: &str) -> Result<PgDatabase, BenchError> {
        let factory = PgFactory::new(side.rm_name(), dsn)
            .map_err(|e| db_error(format!("--dsn of database {}", side.name()), e))?;
        Ok(PgDatabase { side, dsn: dsn.to_string(), table: table.to_string(), factory: Arc::new(factory) })
    }

    fn connect(&self, purpose: &str) -> Result<postgres::Client, BenchError> {
        postgres::Client::connect(&self.dsn, postgres::NoTls)
            .map_err(|e| self.side.connect_error(self.factory.address(), purpose, e))
    }
}

impl Database for PgDatabase {
    fn setup(&self, accounts: u32) -> Result<(), BenchError> {
        let table = &self.table;
        self.connect("for setup")?
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {table} (id int PRIMARY KEY, balance bigint NOT NULL); \
                 INSERT INTO {table} SELECT g, {BALANCE_START} FROM generate_series(1, {accounts}) g \
                 ON CONFLICT (id) DO NOTHING"
            ))
            .map_err(|e| db_error(self.side.context(format!("creating {table}")), pg(&e)))
    }

    fn total(&self) -> Result<i64, BenchError> {
        let sql = format!("SELECT COALESCE(SUM(balance), 0)::bigint FROM {}", self.table);
        let row = self
            .connect("to read the total")?
            .query_one(&sql, &[])
            .map_err(|e| db_error(self.side.context(format!("summing {}", self.table)), pg(&e)))?;
        row.try_get(0).map_err(|e| db_error(self.side.context(format!("summing {}", self.table)), pg(&e)))
    }

    fn durability(&self) -> Result<(String, bool), BenchError> {
        let what = || self.side.context("reading fsync and synchronous_commit");
        let row = self
            .connect("to read its settings")?
            .query_one("SELECT current_setting('fsync'), current_setting('synchronous_commit')", &[])
            .map_err(|e| db_error(what(), pg(&e)))?;
        let fsync: String = row.try_get(0).map_err(|e| db_error(what(), pg(&e)))?;
        let synchronous_commit: String = row.try_get(1).map_err(|e| db_error(what(), pg(&e)))?;
        Ok(postgres_durability(&fsync, &synchronous_commit))
    }

    fn prepared_of_node(&self, node: u32) -> Result<Vec<String>, BenchError> {
        let rows = self
            .connect("to list prepared branches")?
            .query(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND gid LIKE 'decree:%'",
                &[],
            )
            .map_err(|e| db_error(self.side.context("listing pg_prepared_xacts"), pg(&e)))?;
        let mut ours = Vec::new();
        for row in rows {
            let gid: String = row
                .try_get(0)
                .map_err(|e| db_error(self.side.context("reading pg_prepared_xacts"), pg(&e)))?;
            let mine = Xid::from_gid(&gid).ok().and_then(|x| x.origin()).is_some_and(|o| o.node == node);
            if mine {
                ours.push(gid);
            }
        }
        Ok(ours)
    }

    fn rm_factory(&self) -> Arc<dyn RmFactory> {
        self.factory.clone()
    }

    fn local(&self) -> Result<Box<dyn LocalUpdate>, BenchError> {
        let mut client = self.connect("for the independent mode")?;
        let update = client
            .prepare(&self.side.update_sql(&self.table, "$1"))
            .map_err(|e| db_error(self.side.context("preparing the UPDATE"), pg(&e)))?;
        Ok(Box::new(PgLocal { client, update, side: self.side }))
    }

    fn branch(&self) -> Result<BranchPair, BenchError> {
        let rm: PgRm = self
            .factory
            .connect_pg()
            .map_err(|e| self.side.connect_error(self.factory.address(), "for the 2pc mode", e))?;
        let update = rm
            .client()
            .map_err(|e| e.to_string())
            .and_then(|mut client| {
                client.prepare(&self.side.update_sql(&self.table, "$1")).map_err(|e| e.to_string())
            })
            .map_err(|e| db_error(self.side.context("preparing the UPDATE"), e))?;
        let branch = PgBranch { handle: rm.handle(), update, side: self.side };
        Ok((Box::new(rm), Box::new(branch)))
    }
}

/// A plain connection with the side's UPDATE prepared.
struct PgLocal {
    client: postgres::Client,
    update: postgres::Statement,
    side: Side,
}

impl LocalUpdate for PgLocal {
    fn begin(&mut self) -> Result<(), BenchError> {
        self.client.batch_execute("BEGIN").map_err(|e| db_error(self.side.context("BEGIN"), pg(&e)))
    }

    fn update(&mut self, id: i32) -> Result<u64, BenchError> {
        self.client
            .execute(&self.update, &[&id])
            .map_err(|e| db_error(self.side.context(self.side.verb()), pg(&e)))
    }

    fn commit(&mut self) -> Result<(), BenchError> {
        self.client.batch_execute("COMMIT").map_err(|e| db_error(self.side.context("COMMIT"), pg(&e)))
    }

    fn begin_native(&mut self, _gid: &str) -> Result<(), BenchError> {
        self.begin()
    }

    fn prepare_native(&mut self, gid: &str) -> Result<(), BenchError> {
        self.client
            .batch_execute(&format!("PREPARE TRANSACTION '{gid}'"))
            .map_err(|e| db_error(self.side.context("PREPARE TRANSACTION"), pg(&e)))
    }

    fn commit_native(&mut self, gid: &str) -> Result<(), BenchError> {
        self.client
            .batch_execute(&format!("COMMIT PREPARED '{gid}'"))
            .map_err(|e| db_error(self.side.context("COMMIT PREPARED"), pg(&e)))
    }

    fn abandon_native(&mut self, gid: &str) {
        let _ = self.client.batch_execute("ROLLBACK");
        let _ = self.client.batch_execute(&format!("ROLLBACK PREPARED '{gid}'"));
    }
}

/// The application's side of a [`PgRm`] branch, with the side's UPDATE prepared.
struct PgBranch {
    handle: PgHandle,
    update: postgres::Statement,
    side: Side,
}

impl BranchUpdate for PgBranch {
    fn update(&mut self, id: i32) -> Result<u64, BenchError> {
        let what = || self.side.context(self.side.verb());
        let mut client = self.handle.client().map_err(|e| db_error(what(), e))?;
        client.execute(&self.update, &[&id]).map_err(|e| db_error(what(), pg(&e)))
    }
}

/// Whether PostgreSQL's COMMIT waits for its WAL on disk: `fsync` on, and
/// `synchronous_commit` anything but `off` (`local`, `remote_write`, `on`, `remote_apply`
/// all flush the local WAL first).
fn postgres_durability(fsync: &str, synchronous_commit: &str) -> (String, bool) {
    let settings = format!("PostgreSQL fsync={fsync} synchronous_commit={synchronous_commit}");
    (settings, fsync == "on" && synchronous_commit != "off")
}

/// A PostgreSQL error with its SQLSTATE and the server's message (`postgres::Error`
/// displays only "db error" for those).
fn pg(e: &::postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("SQLSTATE {}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::postgres_durability;

    #[test]
    fn only_fsync_with_a_synchronous_commit_is_durable() {
        assert!(postgres_durability("on", "on").1);
        assert!(postgres_durability("on", "local").1);
        assert!(!postgres_durability("off", "on").1, "fsync off");
        assert!(!postgres_durability("on", "off").1, "asynchronous commit");
        assert_eq!(postgres_durability("on", "on").0, "PostgreSQL fsync=on synchronous_commit=on");
    }
}
