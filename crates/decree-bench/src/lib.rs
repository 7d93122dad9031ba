//! decree's benchmarks: the log engines and the two-phase-commit workload.
//!
//! Two benchmarks, both comparative rather than absolute (their numbers are read against
//! a reference measured on the same machine in the same run, or against the figures of
//! other transaction managers in the anchors):
//! - [`log_bench`]: durable appends per second and their latency, per engine, RPO and
//!   thread count, next to raw `pwrite` + `fdatasync` on the same file system;
//! - [`tx`]: the LIXA `lixat` workload (open, begin, commit, close with think times), per
//!   thread count, reporting throughput and the latency the transaction manager adds.
//!
//! The transaction benchmark drives a [`client::BenchTarget`], so the embedded mode and
//! the state-server modes ([`remote`]) share the workload, the statistics, the reports and
//! the charts; [`rate`] is the fixed-rate variant of the workload, and [`round_trip`] its
//! same-run floor (a bare request and reply over the same transport at the same rate);
//! [`handshake`] times opening a connection to the server (which the runs never pay), and
//! [`compare`] sets the modes of alternated rounds side by side (plaintext against TLS,
//! a single server against a primary + backup pair, [`pair`]);
//! [`write_floor`] is the same-run floor of a durable commit (one synced write). [`rm_bench`] measures
//! the cost of atomicity with real databases (decree 2PC against two local commits).
//! Nothing here asserts on speed; tests check that the counts add up.

#![warn(missing_docs)]

pub mod chart;
pub mod client;
pub mod compare;
pub mod cpus;
pub mod embedded;
pub mod error;
pub mod handshake;
pub mod host_cpu;
pub mod log_bench;
pub mod log_use;
pub mod pair;
pub mod rate;
pub mod remote;
pub mod report;
pub mod rm_bench;
pub mod round_trip;
pub mod stats;
pub mod think;
pub mod tx;
pub mod write_floor;

pub use error::BenchError;
