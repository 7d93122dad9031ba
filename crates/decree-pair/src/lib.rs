//! A primary + backup pair of decree servers, each with its own log on its own disk: the
//! rules that keep an acknowledged decision alive through the loss of either machine.
//!
//! This crate starts with the rules alone, as pure functions and one step machine with no
//! IO (openraft's engine is the model): [`epoch`] mints and compares the pair's epochs, and
//! [`rules`] says what a member does with a promotion, a peer's message, a decision's
//! progress, and whether it may acknowledge or call a resource manager. The link, the
//! catch-up and the server's use of them come on top, and obey these functions.
//!
//! The invariants, each checked by the table tests of [`rules`]:
//! - an epoch is minted only by a promotion, above every epoch the member has seen or its
//!   log holds, with the member's id in its low bits (two promotions never collide), and
//!   is durable before the member serves;
//! - the receiver fences: a message of an older epoch is refused, a newer one is recorded
//!   durably before anything else and turns a primary into a backup;
//! - a strict primary acknowledges a decision only when its own write and its backup's
//!   confirmation are both in; phase two and presumed-abort rollbacks act only on what the
//!   backup confirmed, and only while the member leads;
//! - a member starts as a backup, and promotion refuses a member that has not caught up
//!   since it started or rejoined, unless forced (and a forced promotion is recorded).

pub mod election;
pub mod epoch;
pub mod link;
pub mod outbox;
pub mod replica;
pub mod rules;
pub mod state_cell;
pub mod state_file;
mod sync;
pub mod wire;

pub use epoch::{Epoch, MemberId};
pub use replica::{Replica, ReplicaError};
pub use rules::{Command, Event, Fence, Node, PeerMessage, PromoteRefused, Role};
pub use state_file::PairState;
pub use wire::{LinkMessage, LinkRecord, RecordKind};
