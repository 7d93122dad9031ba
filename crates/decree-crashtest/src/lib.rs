//! The crash-safety proof of decree against real databases.
//!
//! A bank moves money between two databases (two PostgreSQL databases, or PostgreSQL and
//! MariaDB): every transfer debits an account in database A, credits one in database B and
//! records `transfers(id, amount)` in both, all in one global transaction that decree
//! commits in two phases. The process is killed at random moments and at chosen points of
//! the protocol ([`crash`]), restarted (recovery runs), and the invariant is checked in the
//! databases themselves ([`bank::Snapshot::violations`]): the total balance never changes,
//! every acknowledged transfer is in both databases, no transfer is in only one, and no
//! decree branch stays prepared.
//!
//! This crate is for tests only (`publish = false`); [`crash`] is fault injection around
//! real resource managers, never a stand-in for a database. The `decree-bank` binary is the
//! workload the kill loops spawn and kill: tests/kill_loop.rs with the embedded coordinator,
//! tests/pair_kill_loop.rs with its coordinator on a primary + backup pair of state servers.

pub mod bank;
pub mod crash;

pub use bank::{
    run_worker, transfer_id, BankConfig, BankConnection, BankError, PairKind, Snapshot, WorkerContext,
    WorkerReport,
};
pub use crash::{
    CrashFactory, CrashPlan, CrashPoint, CrashRm, CrashWitness, Trigger, TriggerCall, TriggerWhen,
};
