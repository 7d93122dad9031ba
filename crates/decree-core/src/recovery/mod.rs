//! One recovery engine for every process: what happens to a decided or undecided
//! transaction after the fact (phase two that the session could not finish, prepared
//! branches whose owner is gone).
//!
//! [`engine`] holds the rules as pure functions and a state machine ([`PhaseTwo`]):
//! events in, calls out, tested without resource managers, threads or disks. [`runtime`]
//! executes the calls with one connection cache, one backoff policy and one [`Recorder`].
//! Each process brings its liveness rule: the embedded coordinator
//! ([`OlderIncarnation`]: a transaction of an older incarnation has no owner), the state
//! server (the session's connection has closed), and `decree recover` (the operator
//! decides; it uses the runtime's calls only).

pub mod engine;
pub mod runtime;

pub use engine::{DecisionFact, FoundStep, Liveness, OlderIncarnation, PhaseTwo};
pub use runtime::{Backoff, Connections, Recorder, ScanCounts, ScanRules};
