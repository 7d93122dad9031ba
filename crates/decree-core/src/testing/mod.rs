//! Tools for tests and benchmarks of the coordinator, not for a product.
//!
//! Compiled only with the `testing` feature (and in this crate's own unit tests), so that
//! the crate root shows what an application uses: an application enlists real resource
//! managers (decree-rm's PostgreSQL and MariaDB ones), never one that keeps branch states
//! in memory and misbehaves on request. The benchmark, the state server's `dummy` kind of
//! resource manager (which the benchmark runs against) and the tests enable the feature.
//!
//! - [`dummy`]: an in-memory resource manager that answers at once or after a delay and
//!   injects faults on chosen calls; its factory and connection are re-exported here.
//! - [`restartable`]: a volatile log whose records a restart reads.
//! - [`log_lines`]: the log lines a call writes, as text.

pub mod dummy;
pub mod log_lines;
pub mod restartable;

pub use dummy::{DummyConfig, DummyFactory, DummyRm};
