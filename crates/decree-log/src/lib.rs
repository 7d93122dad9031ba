//! The durable transaction log of decree.
//!
//! A log stores small records (a two-phase-commit decision is about 600 bytes) keyed by
//! a transaction key, makes them durable according to a [`SyncPolicy`], and forgets them
//! once their transaction is marked complete. After a restart it hands back exactly the
//! records of transactions that were not complete. It is not a general-purpose database:
//! records are never read back while the log is open, and they need no ordering between
//! transactions.
//!
//! Invariants every engine keeps:
//! - an `append` that returned `Ok` under `SyncPolicy::Immediate` survives power loss;
//! - every record on disk is framed (length, CRC32C, type, payload), see [`record`];
//! - a failed sync makes the log fail-stop: that call and every later one return an error;
//! - disk space and memory follow the number of live transactions, not the history.

pub mod config;
pub mod engine;
pub mod error;
pub mod io;
pub mod outcomes;
pub mod record;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod write_batch;
pub mod write_times;

pub use config::{EngineKind, LogConfig, SyncPolicy};
pub use error::LogError;
pub use outcomes::{OutcomeMemory, RememberedEntry};
pub use write_times::WriteTimes;

/// Identifies the transaction a record belongs to; completion forgets all its records.
pub type TxnKey = u64;

/// Called once a record is durable under the sync policy (or the log failed).
pub type DurableCallback = Box<dyn FnOnce(Result<(), LogError>) + Send + 'static>;

/// A record of a transaction that was not complete when the log was opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveRecord {
    /// The transaction the record belongs to.
    pub txn: TxnKey,
    /// The bytes given to `append`, unchanged.
    pub payload: Vec<u8>,
}

/// Counters a benchmark or the metrics endpoint reads; all are totals since open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogStats {
    /// Records appended.
    pub records_appended: u64,
    /// Completions recorded.
    pub completions: u64,
    /// Durable flushes (fdatasync, fsync or msync calls on the data path).
    pub flushes: u64,
    /// Bytes handed to the operating system.
    pub bytes_written: u64,
}

/// One durable transaction log; every engine implements it and passes one shared test suite.
pub trait Log: Send + Sync {
    /// Appends a record of `txn` and blocks until it is durable under the sync policy.
    fn append(&self, txn: TxnKey, payload: &[u8]) -> Result<(), LogError>;

    /// Appends a record of `txn` and calls `done` once durable; never blocks on disk IO,
    /// so that async callers (the state server) can use it from a runtime thread.
    fn append_with(&self, txn: TxnKey, payload: &[u8], done: DurableCallback);

    /// Marks every record of `txn` complete; written lazily, never waits for the disk.
    fn complete(&self, txn: TxnKey) -> Result<(), LogError>;

    /// Takes the records of transactions that were not complete at open (once; later
    /// calls return an empty vector). Records of one transaction keep their append order.
    fn take_recovered(&self) -> Vec<LiveRecord>;

    /// A number larger than any earlier open of this directory returned, made durable
    /// at open, so that identifiers minted by this process are told apart after a restart.
    fn incarnation(&self) -> u64;

    /// Makes everything appended so far durable, including completions (shutdown, tests).
    fn sync(&self) -> Result<(), LogError>;

    /// Totals since open.
    fn stats(&self) -> LogStats;

    /// What the open found and repaired without refusing (a torn tail cut, a torn record
    /// deleted), one line each, for the operator: `decree recover list` shows them.
    fn open_warnings(&self) -> Vec<String> {
        Vec::new()
    }

    /// How long the synced writes on the commit path took since open (the journal under
    /// `rpo = 0` keeps them; other engines report none).
    fn write_times(&self) -> WriteTimes {
        WriteTimes::default()
    }
}

/// Opens (creating if needed) the log described by `config`, taking the directory lock.
pub fn open(config: &LogConfig) -> Result<Box<dyn Log>, LogError> {
    engine::open(config)
}
