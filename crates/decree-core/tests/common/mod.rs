//! Helpers shared by the coordinator's integration tests: a coordinator over the volatile
//! log with dummy resource managers that remember every branch outcome.

#![allow(dead_code)]

use decree_core::testing::dummy::{BranchOutcome, DummyConfig, DummyFactory};
use decree_core::{ResourceManager, RmFactory, TmConfig, TransactionManager, Xid};
use decree_log::engine::volatile::VolatileLog;
use std::sync::Arc;
use std::time::Duration;

/// Outcomes a test dummy remembers (far more than any test makes).
pub const HISTORY_MAX: usize = 100_000;

/// A configuration with quick retries, so that background work finishes fast in tests.
pub fn quick_config() -> TmConfig {
    TmConfig {
        node: 7,
        retry_backoff_min: Duration::from_millis(1),
        retry_backoff_max: Duration::from_millis(20),
        ..TmConfig::default()
    }
}

/// A dummy named `name` that remembers outcomes.
pub fn dummy(name: &str) -> DummyFactory {
    DummyFactory::new(DummyConfig { history_max: HISTORY_MAX, ..DummyConfig::new(name) })
}

/// A coordinator over a fresh volatile log.
pub fn volatile_tm(factories: &[&DummyFactory]) -> (Arc<VolatileLog>, Arc<TransactionManager>) {
    let log = Arc::new(VolatileLog::new());
    let fs: Vec<Arc<dyn RmFactory>> = factories.iter().map(|f| f.arc()).collect();
    let tm = TransactionManager::embedded(log.clone(), quick_config(), fs).expect("coordinator starts");
    (log, tm)
}

/// One unopened connection per factory, boxed for a session.
pub fn connections(factories: &[&DummyFactory]) -> Vec<Box<dyn ResourceManager>> {
    factories.iter().map(|f| Box::new(f.connection()) as Box<dyn ResourceManager>).collect()
}

/// The outcome of branch `branch` of `xid` in `factory`.
pub fn outcome(factory: &DummyFactory, xid: &Xid, branch: u16) -> Option<BranchOutcome> {
    factory.outcome(&xid.branch(branch))
}
