//! The embedded mode: decree's coordinator and its log live in the benchmark process.
//!
//! One [`TransactionManager`] over a fresh log per run, with `rms` dummy resource
//! managers that answer at once, as in the LIXA benchmark. Each benchmark thread is one
//! TX context ([`TmClient`], shared with the state-server modes): `open` opens every dummy
//! RM (tx_open), `begin` starts a global transaction on all of them, `commit` runs the
//! two-phase commit (prepare both, append the decision durably, commit both, complete
//! lazily), `close` closes the RMs (tx_close). With two or more
//! RMs every commit writes exactly one decision record, which [`BenchTarget::finish`]
//! checks against the log's counters.

use crate::client::{BenchClient, BenchTarget};
use crate::log_use::LogUse;
use crate::BenchError;
use decree_core::testing::DummyFactory;
use decree_core::{ResourceManager, RmFactory, TmConfig, TransactionManager, TxContext};
use decree_log::{Log, LogConfig};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The most dummy resource managers a benchmark may ask for (the coordinator's default
/// `branches_max`).
pub const RMS_MAX: usize = 64;

/// How long `finish` waits for background phase-two work (there should be none).
const IDLE_WAIT: Duration = Duration::from_secs(10);

/// A coordinator over an open log, shared by the clients of one run.
pub struct EmbeddedTarget {
    log: Arc<dyn Log>,
    tm: Arc<TransactionManager>,
    factories: Vec<DummyFactory>,
    rms: usize,
    committed: Arc<AtomicU64>,
}

impl EmbeddedTarget {
    /// Opens the log described by `config` and a coordinator with `rms` dummy RMs on it.
    pub fn open(config: &LogConfig, rms: usize) -> Result<Self, BenchError> {
        if rms == 0 || rms > RMS_MAX {
            return Err(BenchError::Option(format!("--rms {rms}: expected 1 to {RMS_MAX}")));
        }
        let log: Arc<dyn Log> = Arc::from(decree_log::open(config).map_err(|source| {
            BenchError::EngineUnavailable { engine: config.engine.name().into(), source }
        })?);
        let factories: Vec<DummyFactory> =
            (0..rms).map(|i| DummyFactory::named(&format!("dummy-{i}"), 0)).collect();
        let shared: Vec<Arc<dyn RmFactory>> = factories.iter().map(DummyFactory::arc).collect();
        let tm = TransactionManager::embedded(log.clone(), TmConfig::default(), shared).map_err(|e| {
            BenchError::Client { context: "starting the coordinator".into(), message: e.to_string() }
        })?;
        Ok(EmbeddedTarget { log, tm, factories, rms, committed: Arc::new(AtomicU64::new(0)) })
    }
}

impl BenchTarget for EmbeddedTarget {
    fn client(&self, _thread: usize) -> Result<Box<dyn BenchClient>, BenchError> {
        Ok(Box::new(TmClient::new(self.tm.clone(), self.factories.clone(), self.committed.clone())))
    }

    fn log_use(&self) -> Option<LogUse> {
        Some(LogUse::of(&*self.log))
    }

    fn finish(&self) -> Result<(), BenchError> {
        if !self.tm.wait_idle(IDLE_WAIT) {
            return Err(BenchError::Client {
                context: "after the run".into(),
                message: format!("{} phase-two jobs still pending after {IDLE_WAIT:?}", self.tm.pending()),
            });
        }
        let stats = self.log.stats();
        let committed = self.committed.load(Ordering::Relaxed);
        // One RM commits in one phase and writes nothing; two or more write one decision.
        let expected = if self.rms >= 2 { committed } else { 0 };
        if stats.records_appended != expected || stats.completions != expected {
            return Err(BenchError::Client {
                context: "checking the log after the run".into(),
                message: format!(
                    "{committed} commits with {} RMs, expected {expected} decisions, but the log counted {} \
                     appends and {} completions",
                    self.rms, stats.records_appended, stats.completions
                ),
            });
        }
        Ok(())
    }
}

/// The TX calls over a coordinator: the client of the embedded and state-server modes.
///
/// The first `open` opens a [`TxContext`] (a coordinator session: one state-server
/// connection in the remote modes); later cycles close and reopen only the resource
/// managers ([`TxContext::close_keep_session`], [`TxContext::reopen`]), so xa_open and
/// xa_close still run every cycle as in LIXA's workload, but nothing is allocated and no
/// connection is made per cycle. Commits are counted locally and added to the target's
/// total when the client is dropped (no shared cache line on the hot path).
pub(crate) struct TmClient {
    tm: Arc<TransactionManager>,
    factories: Vec<DummyFactory>,
    context: Option<TxContext>,
    open: bool,
    committed_here: u64,
    committed: Arc<AtomicU64>,
}

impl TmClient {
    /// A client of `tm` with one connection to each of `factories`, counting into `committed`.
    pub(crate) fn new(
        tm: Arc<TransactionManager>,
        factories: Vec<DummyFactory>,
        committed: Arc<AtomicU64>,
    ) -> Self {
        TmClient { tm, factories, context: None, open: false, committed_here: 0, committed }
    }

    fn context(&mut self, call: &str) -> Result<&mut TxContext, BenchError> {
        match self.context.as_mut() {
            Some(context) if self.open => Ok(context),
            _ => Err(tm_error(call, "the TX context is not open")),
        }
    }
}

fn tm_error(call: &str, e: impl std::fmt::Display) -> BenchError {
    BenchError::Client { context: call.into(), message: e.to_string() }
}

impl BenchClient for TmClient {
    fn open(&mut self) -> Result<(), BenchError> {
        if self.open {
            return Err(tm_error("tx_open", "already open"));
        }
        match self.context.as_mut() {
            Some(context) => context.reopen().map_err(|e| tm_error("tx_open", e))?,
            None => {
                let rms: Vec<Box<dyn ResourceManager>> = self
                    .factories
                    .iter()
                    .map(|f| Box::new(f.connection()) as Box<dyn ResourceManager>)
                    .collect();
                self.context = Some(TxContext::open(&self.tm, rms).map_err(|e| tm_error("tx_open", e))?);
            }
        }
        self.open = true;
        Ok(())
    }

    fn begin(&mut self) -> Result<(), BenchError> {
        self.context("tx_begin")?.begin().map_err(|e| tm_error("tx_begin", e))?;
        Ok(())
    }

    fn commit(&mut self) -> Result<(), BenchError> {
        self.context("tx_commit")?.commit().map_err(|e| tm_error("tx_commit", e))?;
        self.committed_here += 1;
        Ok(())
    }

    fn close(&mut self) -> Result<(), BenchError> {
        self.context("tx_close")?.close_keep_session().map_err(|e| tm_error("tx_close", e))?;
        self.open = false;
        Ok(())
    }
}

impl Drop for TmClient {
    fn drop(&mut self) {
        self.committed.fetch_add(self.committed_here, Ordering::Relaxed);
        if let Some(mut context) = self.context.take() {
            if self.open {
                let _ = context.close_keep_session();
            }
            // Ends the coordinator session (the state-server connection) now, not later.
            let _ = context.close();
        }
    }
}
