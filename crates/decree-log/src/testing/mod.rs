//! Tools for tests and benchmarks of the log and the crates above it, not for a product.
//!
//! Compiled only with the `testing` feature (and in this crate's own unit tests), so that
//! the crate root shows what an application uses: an application opens a log over real
//! files ([`crate::io::StdStorage`]) and never builds a storage that loses writes on
//! purpose. The crates whose tests need these tools enable the feature in their
//! `[dev-dependencies]`; this crate enables it for its own tests through a dev-dependency
//! on itself.
//!
//! - `fault`: an in-memory [`crate::io::Storage`] that injects power loss, torn writes,
//!   failed syncs and a full disk, the storage every crash test of the engines runs on.

pub mod fault;
