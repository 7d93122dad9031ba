//! What the runner needs of one database of the pair, whatever its kind: the
//! [`Database`] trait and the connections it hands out ([`LocalUpdate`] for the modes
//! without decree, [`BranchUpdate`] beside a resource manager for the 2PC mode), `open`
//! to pick the kind's implementation from a DSN, the one-call public helpers built on it
//! (`setup`, `total`, `prepared_of_node`), and `db_error`, the error of a failed database
//! call. The implementations are not here: one file per kind, `postgres.rs` and
//! `mariadb.rs`.

use super::{mariadb, postgres, DbKind, Side, TABLE_DEFAULT};
use crate::BenchError;
use decree_core::{ResourceManager, RmFactory};
use std::sync::Arc;

/// One database of the pair, as the runner sees it; one implementation per kind. Every
/// call opens its own connection: the runner calls the first three once per run, the
/// last two once per thread and run.
pub(super) trait Database: Sync {
    /// Creates the table and rows 1..=accounts if missing; existing rows keep their balance.
    fn setup(&self, accounts: u32) -> Result<(), BenchError>;
    /// The sum of all balances of the table.
    fn total(&self) -> Result<i64, BenchError>;
    /// The settings that make a local commit durable, as `name=value` pairs, and whether
    /// they do.
    fn durability(&self) -> Result<(String, bool), BenchError>;
    /// Decree branches minted by coordinator `node` still prepared where this database
    /// can see them, printable.
    fn prepared_of_node(&self, node: u32) -> Result<Vec<String>, BenchError>;
    /// The coordinator's factory for this database (recovery and phase-two retries).
    fn rm_factory(&self) -> Arc<dyn RmFactory>;
    /// A plain connection with this side's UPDATE prepared, for the independent and
    /// native two-phase modes.
    fn local(&self) -> Result<Box<dyn LocalUpdate>, BenchError>;
    /// A resource manager for the coordinator and, on the same connection, this side's
    /// UPDATE prepared, for the 2PC mode.
    fn branch(&self) -> Result<BranchPair, BenchError>;
}

/// A branch connection as the coordinator takes it, and the application's side of it.
pub(super) type BranchPair = (Box<dyn ResourceManager>, Box<dyn BranchUpdate>);

/// One thread's plain connection in the independent mode.
pub(super) trait LocalUpdate {
    /// Starts a local transaction.
    fn begin(&mut self) -> Result<(), BenchError>;
    /// Runs the prepared UPDATE on account `id`; returns the rows it changed.
    fn update(&mut self, id: i32) -> Result<u64, BenchError>;
    /// Commits the local transaction.
    fn commit(&mut self) -> Result<(), BenchError>;
    /// Starts a transaction that will be prepared as `gid` (native mode).
    fn begin_native(&mut self, gid: &str) -> Result<(), BenchError>;
    /// Prepares the open transaction as `gid` (native mode).
    fn prepare_native(&mut self, gid: &str) -> Result<(), BenchError>;
    /// Commits the prepared transaction `gid` (native mode).
    fn commit_native(&mut self, gid: &str) -> Result<(), BenchError>;
    /// Rolls back `gid` whether it is open or prepared, best effort, after a failure, so
    /// that no prepared transaction keeps its locks after the benchmark.
    fn abandon_native(&mut self, gid: &str);
}

/// One thread's application view of a branch connection in the 2PC mode.
pub(super) trait BranchUpdate {
    /// Runs the prepared UPDATE on account `id` inside the open branch; returns the rows
    /// it changed.
    fn update(&mut self, id: i32) -> Result<u64, BenchError>;
}

/// Opens one side of the pair (checks the DSN; connects only when asked to work).
pub(super) fn open(
    kind: DbKind,
    side: Side,
    dsn: &str,
    table: &str,
) -> Result<Box<dyn Database>, BenchError> {
    Ok(match kind {
        DbKind::Postgres => Box::new(postgres::PgDatabase::new(side, dsn, table)?),
        DbKind::MariaDb => Box::new(mariadb::MariaDbDatabase::new(side, dsn, table)?),
    })
}

pub(super) fn db_error(context: impl Into<String>, e: impl std::fmt::Display) -> BenchError {
    BenchError::Client { context: context.into(), message: e.to_string() }
}

/// Creates the accounts table and its rows in one database if missing (idempotent:
/// existing rows keep their balances). `side` only names the database in messages.
pub fn setup(kind: DbKind, side: Side, dsn: &str, table: &str, accounts: u32) -> Result<(), BenchError> {
    open(kind, side, dsn, table)?.setup(accounts)
}

/// The sum of all balances of `table` in one database.
pub fn total(kind: DbKind, side: Side, dsn: &str, table: &str) -> Result<i64, BenchError> {
    open(kind, side, dsn, table)?.total()
}

/// Branches minted by coordinator `node` that are still prepared in one database
/// (PostgreSQL: this database; MariaDB: the whole server, as `XA RECOVER` lists them).
pub fn prepared_of_node(kind: DbKind, side: Side, dsn: &str, node: u32) -> Result<Vec<String>, BenchError> {
    open(kind, side, dsn, TABLE_DEFAULT)?.prepared_of_node(node)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dsn_of_the_wrong_kind_is_refused_before_connecting() {
        let err = open(DbKind::MariaDb, Side::B, "host=127.0.0.1 user=x", "t").err().expect("not a URL");
        assert!(err.to_string().contains("database B"), "{err}");
        let err = open(DbKind::Postgres, Side::A, "host=x port=notaport", "t").err().expect("bad port");
        assert!(err.to_string().contains("database A"), "{err}");
    }
}
