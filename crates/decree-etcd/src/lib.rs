//! The etcd client a decree pair elects its primary with (issue 33).
//!
//! A thin layer over the `etcd-client` crate that offers exactly what the pair's election
//! needs and nothing else, so that the election's code reads in its own terms:
//! - [`Etcd::connect`] to a cluster's endpoints, with user and password and mutual TLS when
//!   etcd asks for them;
//! - leases: [`Etcd::grant_lease`], [`Etcd::keep_alive`] (each renewal reports when it was
//!   *sent*, on [`BootInstant`]'s clock, which is what a member's self-fencing measures
//!   from) and [`Etcd::revoke_lease`];
//! - [`Etcd::txn`], one transaction of [`Compare`]s and [`Op`]s (the leader key and the sync
//!   record are only ever written this way);
//! - [`Etcd::get`] with the key's mod revision, and [`Etcd::watch_prefix`];
//! - [`EtcdError::refusal`] and [`Etcd::diagnose`]: whether etcd refused this client (its
//!   password, permissions, certificate, or plaintext sent to a TLS port) rather than
//!   failed to answer, so that a member tells a configuration to fix from an outage.
//!
//! Every call has a deadline ([`EtcdConfig::request_timeout`]): a member that cannot reach
//! etcd must learn it in bounded time, never wait on a dead cluster. Every error names the
//! endpoints and the operation ([`EtcdError`]).
//!
//! The `etcd-client` crate compiles etcd's protobuf files with `protoc` when it is built:
//! decree-server uses this crate only behind its `etcd` feature, so the default build (the
//! README's benchmark) never needs protoc.

mod boot_clock;
mod client;
mod diagnose;
pub mod election;
mod error;
mod lease;
mod watch;

pub use boot_clock::BootInstant;
pub use client::{Compare, Entry, Etcd, EtcdConfig, Got, Op, TlsPaths, TxnResult};
pub use error::{Cause, EtcdError, Operation, Refusal};
pub use lease::{KeepAlive, KeepAliveAnswer, Lease, LeaseId};
pub use watch::{PrefixWatch, WatchEvent};
