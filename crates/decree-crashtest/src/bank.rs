//! The bank workload and its invariant, checked in the databases themselves.
//!
//! Database A (always PostgreSQL) and database B (PostgreSQL or MariaDB) each hold
//! `<prefix>_accounts(id, balance)` with `accounts` rows of `balance_start`, and
//! `<prefix>_transfers(id, amount)`. A transfer debits one account in A, credits one in B
//! and inserts its row in both, in one global transaction of two branches. Whatever
//! crashes, the databases must then show ([`Snapshot::violations`]):
//! - the total over both databases is `2 × accounts × balance_start`, and each database's
//!   total moved by exactly the sum of the transfers it holds;
//! - every acknowledged transfer is in both `transfers` tables, with the same amount;
//! - no transfer is in only one database;
//! - no decree branch of this coordinator's node stays prepared in either database.
//!
//! Tables carry a prefix and branches are filtered by node id so that several tests (and
//! other suites sharing the test databases) can run at once without seeing each other.

use crate::crash::{CrashPlan, CrashRm};
use decree_core::{
    CommitReport, ResourceManager, RmError, RmFactory, Session, TmError, TransactionManager, Xid,
};
use decree_rm::{MariaDbFactory, MariaDbHandle, PgFactory, PgHandle};
use mysql::prelude::Queryable;
use rand::{Rng, SeedableRng};
use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The resource-manager name of database A.
pub const RM_A: &str = "bank-a";
/// The resource-manager name of database B.
pub const RM_B: &str = "bank-b";
/// Most accounts a bank may have (setup inserts them in one statement).
pub const ACCOUNTS_MAX: u32 = 10_000;
/// Longest table prefix accepted.
pub const PREFIX_BYTES_MAX: usize = 32;
/// A worker gives up after this many failed transfers in a row (a broken database, not
/// a crash: crashes end the process).
pub const ERRORS_IN_A_ROW_MAX: u32 = 50;
/// Longest wait of a transfer's statement for a row lock, in seconds.
pub const LOCK_WAIT_S: u32 = 2;
/// Violations listed in full; the rest are counted.
const VIOLATIONS_LISTED_MAX: usize = 20;

/// What went wrong in the bank (never a violation of the invariant: those are listed).
#[derive(Debug, thiserror::Error)]
pub enum BankError {
    /// Bad arguments.
    #[error("configuration: {0}")]
    Config(String),
    /// A database statement failed outside the coordinator.
    #[error("database: {0}")]
    Db(String),
    /// A resource-manager call failed.
    #[error("resource manager: {0}")]
    Rm(#[from] RmError),
    /// The coordinator failed.
    #[error("coordinator: {0}")]
    Tm(#[from] TmError),
}

/// Which databases take part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairKind {
    /// Two PostgreSQL databases.
    PgPg,
    /// PostgreSQL (A) and MariaDB (B).
    PgMariaDb,
}

impl PairKind {
    /// The name used on command lines.
    pub fn name(self) -> &'static str {
        match self {
            PairKind::PgPg => "pg-pg",
            PairKind::PgMariaDb => "pg-mariadb",
        }
    }
}

impl FromStr for PairKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "pg-pg" => Ok(PairKind::PgPg),
            "pg-mariadb" => Ok(PairKind::PgMariaDb),
            _ => Err(format!("unknown database pair {s:?}; expected pg-pg or pg-mariadb")),
        }
    }
}

/// Where the bank lives and how big it is.
#[derive(Debug, Clone)]
pub struct BankConfig {
    /// Which databases take part.
    pub kind: PairKind,
    /// PostgreSQL DSN of database A.
    pub dsn_a: String,
    /// DSN of database B (PostgreSQL, or `mysql://...` for MariaDB).
    pub dsn_b: String,
    /// Table name prefix (letters, digits, `_`), so tests do not share tables.
    pub prefix: String,
    /// Accounts per database.
    pub accounts: u32,
    /// Starting balance of every account.
    pub balance_start: i64,
}

impl BankConfig {
    /// Checks the values that end up in SQL text.
    pub fn validate(&self) -> Result<(), BankError> {
        let prefix_ok = !self.prefix.is_empty()
            && self.prefix.len() <= PREFIX_BYTES_MAX
            && self.prefix.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !prefix_ok {
            return Err(BankError::Config(format!(
                "table prefix {:?} must be 1 to {PREFIX_BYTES_MAX} of a-z, 0-9, _",
                self.prefix
            )));
        }
        if self.accounts == 0 || self.accounts > ACCOUNTS_MAX {
            return Err(BankError::Config(format!("accounts {} not in 1..={ACCOUNTS_MAX}", self.accounts)));
        }
        if !(0..=1_000_000_000).contains(&self.balance_start) {
            return Err(BankError::Config(format!("balance_start {} not in 0..=1e9", self.balance_start)));
        }
        Ok(())
    }

    /// The total balance of one database after setup.
    pub fn total_per_database(&self) -> i64 {
        i64::from(self.accounts) * self.balance_start
    }

    fn accounts_table(&self) -> String {
        format!("{}_accounts", self.prefix)
    }

    fn transfers_table(&self) -> String {
        format!("{}_transfers", self.prefix)
    }

    /// The factories of both databases (recovery and phase-two retries use them).
    pub fn factories(&self) -> Result<Vec<Arc<dyn RmFactory>>, BankError> {
        let a: Arc<dyn RmFactory> = Arc::new(PgFactory::new(RM_A, &self.dsn_a)?);
        let b: Arc<dyn RmFactory> = match self.kind {
            PairKind::PgPg => Arc::new(PgFactory::new(RM_B, &self.dsn_b)?),
            PairKind::PgMariaDb => Arc::new(MariaDbFactory::new(RM_B, &self.dsn_b)?),
        };
        Ok(vec![a, b])
    }

    /// Creates the tables and accounts when missing; with `reset`, first rolls back
    /// prepared branches of `node` left by an earlier run and recreates the tables.
    pub fn setup(&self, reset: bool, node: u32) -> Result<(), BankError> {
        self.validate()?;
        let mut a = Direct::connect(PairKind::PgPg, &self.dsn_a)?;
        let mut b = Direct::connect(self.kind, &self.dsn_b)?;
        for db in [&mut a, &mut b] {
            if reset {
                db.purge_prepared(node)?;
                db.execute(&format!("DROP TABLE IF EXISTS {}", self.accounts_table()))?;
                db.execute(&format!("DROP TABLE IF EXISTS {}", self.transfers_table()))?;
            }
            db.create_tables(self)?;
            let count = db.query_i64(&format!("SELECT COUNT(*) FROM {}", self.accounts_table()))?;
            if count == 0 {
                db.insert_accounts(self)?;
            } else if count != i64::from(self.accounts) {
                return Err(BankError::Config(format!(
                    "{} holds {count} accounts, expected {}: run setup with --reset",
                    self.accounts_table(),
                    self.accounts
                )));
            }
        }
        Ok(())
    }
}

/// A direct connection for setup and checks (not a branch of any transaction).
enum Direct {
    Pg(Box<postgres::Client>),
    Maria(Box<mysql::Conn>),
}

fn pg_error(e: postgres::Error) -> BankError {
    BankError::Db(format!("PostgreSQL: {e}"))
}

fn maria_error(e: mysql::Error) -> BankError {
    BankError::Db(format!("MariaDB: {e}"))
}

impl Direct {
    fn connect(kind: PairKind, dsn: &str) -> Result<Direct, BankError> {
        match kind {
            PairKind::PgPg => postgres::Client::connect(dsn, postgres::NoTls)
                .map(|c| Direct::Pg(Box::new(c)))
                .map_err(|e| BankError::Db(format!("cannot connect to PostgreSQL ({dsn}): {e}"))),
            PairKind::PgMariaDb => {
                let opts = mysql::Opts::from_url(dsn)
                    .map_err(|e| BankError::Config(format!("invalid MariaDB DSN {dsn:?}: {e}")))?;
                mysql::Conn::new(opts)
                    .map(|c| Direct::Maria(Box::new(c)))
                    .map_err(|e| BankError::Db(format!("cannot connect to MariaDB ({dsn}): {e}")))
            }
        }
    }

    fn execute(&mut self, sql: &str) -> Result<(), BankError> {
        match self {
            Direct::Pg(c) => c.batch_execute(sql).map_err(pg_error),
            Direct::Maria(c) => c.query_drop(sql).map_err(maria_error),
        }
    }

    /// One integer (an aggregate cast to a 64-bit integer by the caller's SQL).
    fn query_i64(&mut self, sql: &str) -> Result<i64, BankError> {
        match self {
            Direct::Pg(c) => c.query_one(sql, &[]).map_err(pg_error)?.try_get::<_, i64>(0).map_err(pg_error),
            Direct::Maria(c) => c
                .query_first::<i64, _>(sql)
                .map_err(maria_error)?
                .ok_or_else(|| BankError::Db(format!("MariaDB: no row from {sql}"))),
        }
    }

    fn create_tables(&mut self, config: &BankConfig) -> Result<(), BankError> {
        let engine = if matches!(self, Direct::Maria(_)) { " ENGINE=InnoDB" } else { "" };
        self.execute(&format!(
            "CREATE TABLE IF NOT EXISTS {} (id INT PRIMARY KEY, balance BIGINT NOT NULL){engine}",
            config.accounts_table()
        ))?;
        self.execute(&format!(
            "CREATE TABLE IF NOT EXISTS {} (id VARCHAR(64) PRIMARY KEY, amount BIGINT NOT NULL){engine}",
            config.transfers_table()
        ))
    }

    fn insert_accounts(&mut self, config: &BankConfig) -> Result<(), BankError> {
        let values: Vec<String> =
            (0..config.accounts).map(|id| format!("({id},{})", config.balance_start)).collect();
        self.execute(&format!(
            "INSERT INTO {} (id, balance) VALUES {}",
            config.accounts_table(),
            values.join(",")
        ))
    }

    /// Total balance, and every transfer with its amount.
    fn read_bank(&mut self, config: &BankConfig) -> Result<(i64, HashMap<String, i64>), BankError> {
        let accounts = config.accounts_table();
        let transfers = config.transfers_table();
        // Both reads in one snapshot: a branch committed between two autocommit reads
        // would show its transfer row without its balance (seen in a pair kill loop while
        // the new primary's recovery committed branches).
        let (total, rows) = match self {
            Direct::Pg(c) => {
                let mut txn = c
                    .build_transaction()
                    .isolation_level(postgres::IsolationLevel::RepeatableRead)
                    .read_only(true)
                    .start()
                    .map_err(pg_error)?;
                let total = txn
                    .query_one(&format!("SELECT COALESCE(SUM(balance), 0)::BIGINT FROM {accounts}"), &[])
                    .map_err(pg_error)?
                    .try_get::<_, i64>(0)
                    .map_err(pg_error)?;
                let rows = txn
                    .query(&format!("SELECT id, amount FROM {transfers}"), &[])
                    .map_err(pg_error)?
                    .iter()
                    .map(|r| Ok((r.try_get::<_, String>(0)?, r.try_get::<_, i64>(1)?)))
                    .collect::<Result<Vec<_>, postgres::Error>>()
                    .map_err(pg_error)?;
                txn.commit().map_err(pg_error)?;
                (total, rows)
            }
            Direct::Maria(c) => {
                c.query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY").map_err(maria_error)?;
                let total = c
                    .query_first::<i64, _>(format!(
                        "SELECT CAST(COALESCE(SUM(balance), 0) AS SIGNED) FROM {accounts}"
                    ))
                    .map_err(maria_error)?
                    .unwrap_or(0);
                let rows: Vec<(String, i64)> =
                    c.query(format!("SELECT id, amount FROM {transfers}")).map_err(maria_error)?;
                c.query_drop("COMMIT").map_err(maria_error)?;
                (total, rows)
            }
        };
        Ok((total, rows.into_iter().collect()))
    }

    /// Prepared decree branches of `node` in this database (the whole server for MariaDB,
    /// this database for PostgreSQL), as Xids.
    fn prepared(&mut self, node: u32) -> Result<Vec<Xid>, BankError> {
        let mut found = Vec::new();
        match self {
            Direct::Pg(c) => {
                let rows = c
                    .query(
                        "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() \
                         AND gid LIKE 'decree:%'",
                        &[],
                    )
                    .map_err(pg_error)?;
                for row in rows {
                    let gid: String = row.try_get(0).map_err(pg_error)?;
                    let xid = Xid::from_gid(&gid)
                        .map_err(|e| BankError::Db(format!("unreadable decree gid {gid:?}: {e}")))?;
                    found.push(xid);
                }
            }
            Direct::Maria(c) => {
                let rows: Vec<(i64, i64, i64, Vec<u8>)> = c.query("XA RECOVER").map_err(maria_error)?;
                for (format_id, gtrid_length, bqual_length, data) in rows {
                    // Other transaction managers' branches may not even be valid decree Xids.
                    if let Ok(xid) =
                        decree_rm::mariadb::xid_from_recover_row(format_id, gtrid_length, bqual_length, &data)
                    {
                        found.push(xid);
                    }
                }
            }
        }
        found.retain(|x| x.origin().is_some_and(|o| o.node == node));
        Ok(found)
    }

    /// Rolls back the prepared branches of `node` (leftovers of an earlier test run).
    fn purge_prepared(&mut self, node: u32) -> Result<(), BankError> {
        for xid in self.prepared(node)? {
            let sql = match self {
                Direct::Pg(_) => format!("ROLLBACK PREPARED '{}'", xid.to_gid()),
                Direct::Maria(_) => format!("XA ROLLBACK {}", decree_rm::mariadb::xid_sql(&xid)?),
            };
            self.execute(&sql)?;
        }
        Ok(())
    }
}

/// What both databases hold, read outside any transaction of the bank.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Sum of the balances in database A.
    pub total_a: i64,
    /// Sum of the balances in database B.
    pub total_b: i64,
    /// Transfers recorded in A, by id.
    pub transfers_a: HashMap<String, i64>,
    /// Transfers recorded in B, by id.
    pub transfers_b: HashMap<String, i64>,
    /// Prepared decree branches of the node in A.
    pub prepared_a: Vec<Xid>,
    /// Prepared decree branches of the node in B.
    pub prepared_b: Vec<Xid>,
}

impl Snapshot {
    /// Reads both databases; `node` selects whose prepared branches count.
    pub fn take(config: &BankConfig, node: u32) -> Result<Snapshot, BankError> {
        config.validate()?;
        let mut a = Direct::connect(PairKind::PgPg, &config.dsn_a)?;
        let mut b = Direct::connect(config.kind, &config.dsn_b)?;
        // Prepared branches first: when none is listed, nothing was left to commit
        // while the balances were read (a recovery running beside cannot change them).
        let prepared_a = a.prepared(node)?;
        let prepared_b = b.prepared(node)?;
        let (total_a, transfers_a) = a.read_bank(config)?;
        let (total_b, transfers_b) = b.read_bank(config)?;
        Ok(Snapshot { total_a, total_b, transfers_a, transfers_b, prepared_a, prepared_b })
    }

    /// Every way the snapshot breaks the invariant (empty when it holds); `acked` are
    /// the transfers whose commit returned Ok to the application.
    pub fn violations(&self, config: &BankConfig, acked: &HashSet<String>) -> Vec<String> {
        let mut out = Vec::new();
        let per_db = config.total_per_database();
        if self.total_a + self.total_b != 2 * per_db {
            out.push(format!(
                "total balance {} + {} = {}, expected {}",
                self.total_a,
                self.total_b,
                self.total_a + self.total_b,
                2 * per_db
            ));
        }
        let sum_a: i64 = self.transfers_a.values().sum();
        let sum_b: i64 = self.transfers_b.values().sum();
        if self.total_a != per_db - sum_a {
            out.push(format!(
                "database A total {} but its {} transfers say {}",
                self.total_a,
                self.transfers_a.len(),
                per_db - sum_a
            ));
        }
        if self.total_b != per_db + sum_b {
            out.push(format!(
                "database B total {} but its {} transfers say {}",
                self.total_b,
                self.transfers_b.len(),
                per_db + sum_b
            ));
        }
        let mut acked_sorted: Vec<&String> = acked.iter().collect();
        acked_sorted.sort();
        for id in acked_sorted {
            match (self.transfers_a.contains_key(id), self.transfers_b.contains_key(id)) {
                (true, true) => {}
                (in_a, in_b) => {
                    out.push(format!("acknowledged transfer {id} missing (in A: {in_a}, in B: {in_b})"))
                }
            }
        }
        let mut only: Vec<String> = Vec::new();
        for (id, amount) in &self.transfers_a {
            match self.transfers_b.get(id) {
                None => only.push(format!("transfer {id} only in A")),
                Some(b) if b != amount => only.push(format!("transfer {id}: amount {amount} in A, {b} in B")),
                Some(_) => {}
            }
        }
        for id in self.transfers_b.keys() {
            if !self.transfers_a.contains_key(id) {
                only.push(format!("transfer {id} only in B"));
            }
        }
        only.sort();
        out.extend(only);
        for x in &self.prepared_a {
            out.push(format!("branch {} left prepared in A", x.to_gid()));
        }
        for x in &self.prepared_b {
            out.push(format!("branch {} left prepared in B", x.to_gid()));
        }
        if out.len() > VIOLATIONS_LISTED_MAX {
            let more = out.len() - VIOLATIONS_LISTED_MAX;
            out.truncate(VIOLATIONS_LISTED_MAX);
            out.push(format!("... and {more} more"));
        }
        out
    }
}

/// The application's side of one worker's two connections.
enum HandleB {
    Pg(PgHandle),
    Maria(MariaDbHandle),
}

/// One worker's connections: the coordinator gets the RMs, the bank keeps handles on them.
pub struct BankConnection {
    a: PgHandle,
    b: HandleB,
}

impl BankConnection {
    /// Opens connection A and B, wrapped in `plan`; returns the handles and the RMs to
    /// give to a session (index 0 = A, 1 = B).
    pub fn open(
        config: &BankConfig,
        plan: &Arc<CrashPlan>,
    ) -> Result<(BankConnection, Vec<Box<dyn ResourceManager>>), BankError> {
        config.validate()?;
        let rm_a = PgFactory::new(RM_A, &config.dsn_a)?.connect_pg()?;
        let a = rm_a.handle();
        let (b, rm_b): (HandleB, Box<dyn ResourceManager>) = match config.kind {
            PairKind::PgPg => {
                let rm = PgFactory::new(RM_B, &config.dsn_b)?.connect_pg()?;
                (HandleB::Pg(rm.handle()), Box::new(rm))
            }
            PairKind::PgMariaDb => {
                let rm = MariaDbFactory::new(RM_B, &config.dsn_b)?.connect_mariadb()?;
                (HandleB::Maria(rm.handle()), Box::new(rm))
            }
        };
        // A statement waiting for a row lock gives up after a bounded time. A lock is only
        // held long by a branch whose coordinator died between prepare and commit; then
        // the waiter belongs to a simulated dead process too, and a real crash would not
        // have left it waiting at all.
        a.client()?.batch_execute(&format!("SET lock_timeout = '{LOCK_WAIT_S}s'")).map_err(pg_error)?;
        match &b {
            HandleB::Pg(h) => h
                .client()?
                .batch_execute(&format!("SET lock_timeout = '{LOCK_WAIT_S}s'"))
                .map_err(pg_error)?,
            HandleB::Maria(h) => h
                .client()?
                .query_drop(format!("SET SESSION innodb_lock_wait_timeout = {LOCK_WAIT_S}"))
                .map_err(maria_error)?,
        }
        let rms: Vec<Box<dyn ResourceManager>> = vec![
            Box::new(CrashRm::new(Box::new(rm_a), 0, plan.clone())),
            Box::new(CrashRm::new(rm_b, 1, plan.clone())),
        ];
        Ok((BankConnection { a, b }, rms))
    }

    /// The transfer's work inside the branches: debit `from` in A, credit `to` in B,
    /// record the transfer in both. Call between enlist and commit.
    pub fn work(
        &self,
        config: &BankConfig,
        from: u32,
        to: u32,
        amount: i64,
        id: &str,
    ) -> Result<(), BankError> {
        assert!(id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'), "transfer ids are plain");
        let accounts = config.accounts_table();
        let transfers = config.transfers_table();
        let debit = format!("UPDATE {accounts} SET balance = balance - {amount} WHERE id = {from}");
        let credit = format!("UPDATE {accounts} SET balance = balance + {amount} WHERE id = {to}");
        let record = format!("INSERT INTO {transfers} (id, amount) VALUES ('{id}', {amount})");
        {
            let mut a = self.a.client()?;
            a.batch_execute(&format!("{debit}; {record}")).map_err(pg_error)?;
        }
        match &self.b {
            HandleB::Pg(h) => {
                let mut b = h.client()?;
                b.batch_execute(&format!("{credit}; {record}")).map_err(pg_error)?;
            }
            HandleB::Maria(h) => {
                let mut b = h.client()?;
                b.query_drop(&credit).map_err(maria_error)?;
                b.query_drop(&record).map_err(maria_error)?;
            }
        }
        Ok(())
    }
}

/// The transfer id of a transaction: unique across restarts since the incarnation grows.
pub fn transfer_id(xid: &Xid) -> Result<String, BankError> {
    let o = xid.origin().ok_or_else(|| BankError::Config(format!("{xid} is not a decree Xid")))?;
    Ok(format!("{}-{}-{}", o.incarnation, o.session, o.sequence))
}

/// How a worker ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerReport {
    /// Transfers acknowledged.
    pub acked: u64,
    /// Transfers that failed (rolled back or outcome unknown).
    pub failed: u64,
}

/// What the workers of one coordinator share.
pub struct WorkerContext<'a> {
    /// The coordinator.
    pub tm: &'a Arc<TransactionManager>,
    /// The bank.
    pub config: &'a BankConfig,
    /// The crash plan every connection is wrapped in.
    pub plan: &'a Arc<CrashPlan>,
    /// Set to end the workers after their current transfer.
    pub stop: &'a AtomicBool,
    /// Acknowledged transfers after which a worker ends.
    pub transfers_max: u64,
}

/// Runs transfers on one session until `stop` is set, `transfers_max` were acknowledged,
/// or the plan is dead; `on_ack` hears of each acknowledged transfer, right after commit
/// returned Ok, and `on_error` of each failure.
pub fn run_worker(
    ctx: &WorkerContext<'_>,
    seed: u64,
    on_ack: &(dyn Fn(&str, &CommitReport) + Sync),
    on_error: &(dyn Fn(&BankError) + Sync),
) -> Result<WorkerReport, BankError> {
    let WorkerContext { tm, config, plan, stop, transfers_max } = *ctx;
    let mut report = WorkerReport::default();
    // A simulated dead process cannot fail: whatever it did not finish simply stops.
    let opened =
        BankConnection::open(config, plan).and_then(|(bank, rms)| Ok((bank, Session::open(tm, rms)?)));
    let (bank, mut session) = match opened {
        Ok(pair) => pair,
        Err(_) if plan.is_dead() => return Ok(report),
        Err(e) => return Err(e),
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut errors_in_a_row = 0;
    while !stop.load(Ordering::Relaxed) && report.acked < transfers_max && !plan.is_dead() {
        let from = rng.gen_range(0..config.accounts);
        let to = rng.gen_range(0..config.accounts);
        let amount = rng.gen_range(1..=100);
        match transfer(&mut session, &bank, config, from, to, amount) {
            Ok((id, commit)) => {
                on_ack(&id, &commit);
                report.acked += 1;
                errors_in_a_row = 0;
            }
            Err(e) => {
                if plan.is_dead() {
                    break;
                }
                on_error(&e);
                report.failed += 1;
                errors_in_a_row += 1;
                if errors_in_a_row >= ERRORS_IN_A_ROW_MAX {
                    return Err(BankError::Db(format!(
                        "{errors_in_a_row} transfers failed in a row, last: {e}"
                    )));
                }
            }
        }
    }
    // A dead process closes nothing gracefully; dropping the session closes the sockets.
    match session.close() {
        Err(_) if plan.is_dead() => {}
        other => other?,
    }
    Ok(report)
}

fn transfer(
    session: &mut Session,
    bank: &BankConnection,
    config: &BankConfig,
    from: u32,
    to: u32,
    amount: i64,
) -> Result<(String, CommitReport), BankError> {
    let mut tx = session.begin()?;
    tx.enlist(0)?;
    tx.enlist(1)?;
    let id = transfer_id(&tx.xid())?;
    bank.work(config, from, to, amount, &id)?;
    let report = tx.commit()?;
    Ok((id, report))
}

#[cfg(test)]
mod tests {
    use super::*;
    use decree_core::Origin;

    fn config() -> BankConfig {
        BankConfig {
            kind: PairKind::PgPg,
            dsn_a: "host=a".into(),
            dsn_b: "host=b".into(),
            prefix: "unit".into(),
            accounts: 10,
            balance_start: 100,
        }
    }

    fn consistent() -> Snapshot {
        let transfers: HashMap<String, i64> = [("1-1-1".to_string(), 7), ("1-1-2".to_string(), 5)].into();
        Snapshot {
            total_a: 1000 - 12,
            total_b: 1000 + 12,
            transfers_a: transfers.clone(),
            transfers_b: transfers,
            prepared_a: Vec::new(),
            prepared_b: Vec::new(),
        }
    }

    #[test]
    fn a_consistent_bank_has_no_violations() {
        let acked: HashSet<String> = ["1-1-1".to_string()].into();
        assert_eq!(consistent().violations(&config(), &acked), Vec::<String>::new());
    }

    #[test]
    fn each_kind_of_damage_is_reported() {
        let c = config();
        let none = HashSet::new();
        // A half-applied transfer: in A only, B never credited.
        let mut half = consistent();
        half.transfers_b.remove("1-1-2");
        half.total_b -= 5;
        let v = half.violations(&c, &none);
        assert!(v.iter().any(|m| m.contains("total balance")), "{v:?}");
        assert!(v.iter().any(|m| m.contains("1-1-2 only in A")), "{v:?}");
        // An acknowledged transfer that neither database holds.
        let lost: HashSet<String> = ["9-9-9".to_string()].into();
        let v = consistent().violations(&c, &lost);
        assert!(v.iter().any(|m| m.contains("acknowledged transfer 9-9-9 missing")), "{v:?}");
        // Money moved without a transfer row.
        let mut silent = consistent();
        silent.total_a -= 3;
        silent.total_b += 3;
        let v = silent.violations(&c, &none);
        assert!(v.iter().any(|m| m.contains("database A total")), "{v:?}");
        assert!(v.iter().any(|m| m.contains("database B total")), "{v:?}");
        // A branch left prepared.
        let mut dangling = consistent();
        dangling.prepared_b.push(Xid::decree(Origin { node: 1, incarnation: 2, session: 3, sequence: 4 }));
        let v = dangling.violations(&c, &none);
        assert!(v.iter().any(|m| m.contains("left prepared in B")), "{v:?}");
    }

    #[test]
    fn names_parse_and_bad_configs_are_refused() {
        assert_eq!("pg-mariadb".parse::<PairKind>(), Ok(PairKind::PgMariaDb));
        assert!("oracle".parse::<PairKind>().is_err());
        let mut c = config();
        assert!(c.validate().is_ok());
        c.prefix = "Robert'); DROP".into();
        assert!(matches!(c.validate(), Err(BankError::Config(_))));
        c = config();
        c.accounts = ACCOUNTS_MAX + 1;
        assert!(matches!(c.validate(), Err(BankError::Config(_))));
        let xid = Xid::decree(Origin { node: 1, incarnation: 2, session: 3, sequence: 4 });
        assert_eq!(transfer_id(&xid).ok().as_deref(), Some("2-3-4"));
    }
}
