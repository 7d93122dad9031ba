//! The two-phase commit engine of decree.
//!
//! This crate holds the protocol: XA identifiers ([`xid`]), the interface every resource
//! manager implements ([`rm`]), the pure rules of the protocol ([`protocol`]), and the
//! coordinator that drives prepare, the durable decision and phase two on top of a
//! [`DecisionStore`] — the process's own [`decree_log::Log`] ([`LogDecisions`]) or a state
//! server. It does no network IO of its own; the state server and the real resource
//! managers live in other crates. The in-memory resource manager of the benchmarks and the
//! fault-injection tests is no part of this surface: it is `testing::dummy`, compiled only
//! with the `testing` feature.
//!
//! # Usage
//!
//! A coordinator over the volatile log with two dummy resource managers (so this example
//! needs the `testing` feature, which this crate's own tests turn on), one TX context per
//! thread (the benchmark's loop is `begin` + `commit`):
//!
//! ```
//! use decree_core::testing::DummyFactory;
//! use decree_core::{CommitKind, TmConfig, TransactionManager, TxContext};
//! use std::sync::Arc;
//!
//! let log: Arc<dyn decree_log::Log> = Arc::new(decree_log::engine::volatile::VolatileLog::new());
//! let a = DummyFactory::named("dummy-a", 0);
//! let b = DummyFactory::named("dummy-b", 0);
//! let tm = TransactionManager::embedded(log.clone(), TmConfig::default(), vec![a.arc(), b.arc()])?;
//!
//! // Per thread: one context owning one connection per resource manager.
//! let mut tx = TxContext::open(&tm, vec![Box::new(a.connection()), Box::new(b.connection())])?;
//! for _ in 0..3 {
//!     tx.begin()?;
//!     let report = tx.commit()?;
//!     assert_eq!(report.kind, CommitKind::TwoPhase);
//! }
//! tx.close()?;
//! assert_eq!(log.stats().records_appended, 3);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! With a durable log, open it with `decree_log::open(&LogConfig)` and wrap the box in an
//! `Arc` (`Arc::from(boxed)`); `TransactionManager::embedded` then recovers what the last
//! run left. With a state server, use [`TransactionManager::with_store`].

#![warn(missing_docs)]

mod cpu_spare;
pub mod embedded;
pub mod error;
mod fanout;
pub mod keys;
pub mod limits;
pub mod protocol;
pub mod recovery;
pub mod rm;
pub mod session;
pub mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tm;
pub mod trace;
pub mod tx;
pub mod xid;

pub use embedded::LogDecisions;
pub use error::{HeuristicReport, TmError};
pub use keys::KeyAllocator;
pub use limits::{
    check_branch_count, check_rm_name, LimitError, BRANCHES_MAX, DECISION_BYTES_MAX,
    DECISION_RECORD_BYTES_MAX, RM_NAME_BYTES_MAX,
};
pub use rm::{BranchAnswer, BranchCall, HeuristicOutcome, ResourceManager, RmError, RmFactory, Vote};
pub use session::{CommitKind, CommitReport, Session, Transaction};
pub use store::{BranchRecord, Decision, DecisionStore, Outcome, RecoveredDecisions, StoreError};
pub use tm::{BranchCalls, RecoveryReport, TmConfig, TransactionManager};
pub use trace::{TraceContext, TRACE_CONTEXT_BYTES};
pub use tx::{TxContext, TxInfo, TxState};
pub use xid::{Origin, Xid, XidError, DECREE_FORMAT_ID};

#[cfg(test)]
mod tests {
    /// Benchmarks and servers move contexts into threads and share the coordinator.
    #[test]
    fn thread_safety_of_the_public_types() {
        fn send<T: Send>() {}
        fn sync<T: Send + Sync>() {}
        send::<crate::TxContext>();
        send::<crate::Session>();
        send::<crate::testing::DummyRm>();
        sync::<crate::TransactionManager>();
        sync::<crate::testing::DummyFactory>();
        sync::<crate::LogDecisions>();
    }
}
