//! The two-phase commit engine of decree.
//!
//! This crate holds the protocol: XA identifiers ([`xid`]), the interface every resource
//! manager implements ([`rm`]), and the coordinator that drives prepare, the durable
//! decision and phase two on top of a [`decree_log::Log`]. It does no network IO of its own;
//! the state server and the real resource managers live in other crates.

pub mod rm;
pub mod store;
pub mod xid;

pub use rm::{HeuristicOutcome, ResourceManager, RmError, RmFactory, Vote};
pub use store::{BranchRecord, Decision, DecisionStore, Outcome, StoreError};
pub use xid::{Origin, Xid, XidError, DECREE_FORMAT_ID};
