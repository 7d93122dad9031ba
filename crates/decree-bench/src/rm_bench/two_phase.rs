//! The "2pc" mode: one run over decree's coordinator, with its decisions in a fresh log of
//! the chosen engine and RPO, or on the state server of `--connect` (`two_phase_run`), and
//! one thread's loop of transactions through the resource managers of both databases
//! (`two_phase_loop`). After the threads end, the run waits for phase two to finish and,
//! with its own log, checks that the log holds one decision per transfer. Not for the modes
//! without decree (`local.rs`) nor the parts every mode shares (`threads.rs`).

use super::database::{db_error, Database};
use super::threads::{count, ids, more, one_row, run_threads, thread_rng, ThreadOut};
use super::{RmBenchSpec, Side};
use crate::log_use::LogUse;
use crate::BenchError;
use decree_client::{ClientOptions, RemoteDecisions};
use decree_core::{CommitKind, DecisionStore, TmConfig, TransactionManager, TxContext};
use decree_log::{Log, LogConfig, SyncPolicy};
use indicatif::ProgressBar;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long to wait for background phase-two work after a 2PC run.
const IDLE_WAIT: Duration = Duration::from_secs(30);

/// What a 2PC run did: the threads' counts, how long they ran, and the node id in its Xids.
pub(super) struct TwoPhaseRun {
    pub out: ThreadOut,
    pub elapsed: Duration,
    pub node: u32,
}

/// One 2PC run, `threads` sessions on a coordinator whose decisions go to a fresh log in
/// `dir`, or to the state server of `spec.connect`. Also returns the synced writes of the
/// run's own log and their times (none with a server: its log is not this process's).
pub(super) fn two_phase_run(
    spec: &RmBenchSpec,
    dbs: [&dyn Database; 2],
    threads: usize,
    dir: &std::path::Path,
    progress: &ProgressBar,
) -> Result<(TwoPhaseRun, Option<LogUse>), BenchError> {
    let factories = dbs.iter().map(|db| db.rm_factory()).collect();
    let config = TmConfig { node: spec.node, branch_calls: spec.branch_calls, ..TmConfig::default() };
    let Some(endpoint) = &spec.connect else {
        return embedded_run(spec, dbs, threads, dir, progress, config, factories);
    };
    let store = RemoteDecisions::connect_with(endpoint.clone(), ClientOptions::default())
        .map_err(|e| db_error(format!("connecting to the state server at {endpoint}"), e))?;
    let node = store.node();
    let store: Arc<dyn DecisionStore> = Arc::new(store);
    let tm = TransactionManager::with_store(store, config, factories)
        .map_err(|e| db_error("starting the coordinator", e))?;
    let (out, elapsed) = run_threads(threads, |index, start, failed| {
        two_phase_loop(spec, &tm, dbs, index, start, failed, progress)
    })?;
    wait_idle(&tm)?;
    Ok((TwoPhaseRun { out, elapsed, node }, None))
}

/// The 2PC run over an embedded log in `dir`, which must hold one decision per transfer.
fn embedded_run(
    spec: &RmBenchSpec,
    dbs: [&dyn Database; 2],
    threads: usize,
    dir: &std::path::Path,
    progress: &ProgressBar,
    config: TmConfig,
    factories: Vec<Arc<dyn decree_core::RmFactory>>,
) -> Result<(TwoPhaseRun, Option<LogUse>), BenchError> {
    let log_config = LogConfig::new(dir, spec.engine, SyncPolicy::from_rpo_ms(spec.rpo_ms));
    let log: Arc<dyn Log> = Arc::from(
        decree_log::open(&log_config)
            .map_err(|source| BenchError::EngineUnavailable { engine: spec.engine.name().into(), source })?,
    );
    let tm = TransactionManager::embedded(log.clone(), config, factories)
        .map_err(|e| db_error("starting the coordinator", e))?;
    let log_before = LogUse::of(&*log);
    let (out, elapsed) = run_threads(threads, |index, start, failed| {
        two_phase_loop(spec, &tm, dbs, index, start, failed, progress)
    })?;
    let used = LogUse::of(&*log).since(&log_before);
    wait_idle(&tm)?;
    let appended = log.stats().records_appended;
    if appended != out.transfers {
        return Err(db_error(
            "checking the log after the 2PC run",
            format!("{} transfers committed but the log holds {appended} decisions", out.transfers),
        ));
    }
    Ok((TwoPhaseRun { out, elapsed, node: spec.node }, Some(used)))
}

/// Waits for the phase two of every transaction of the run.
fn wait_idle(tm: &TransactionManager) -> Result<(), BenchError> {
    if !tm.wait_idle(IDLE_WAIT) {
        return Err(db_error(
            "after the 2PC run",
            format!("{} phase-two jobs still pending after {IDLE_WAIT:?}", tm.pending()),
        ));
    }
    Ok(())
}

/// One thread of the 2PC mode: a TX context over one connection to each database.
fn two_phase_loop(
    spec: &RmBenchSpec,
    tm: &Arc<TransactionManager>,
    dbs: [&dyn Database; 2],
    index: usize,
    start: Instant,
    failed: &AtomicBool,
    progress: &ProgressBar,
) -> Result<ThreadOut, BenchError> {
    let (rm_a, update_a) = dbs[0].branch()?;
    let (rm_b, update_b) = dbs[1].branch()?;
    let mut updates = [update_a, update_b];
    let mut tx = TxContext::open(tm, vec![rm_a, rm_b]).map_err(|e| db_error("tx_open", e))?;
    let mut rng = thread_rng(spec, index);
    let mut out = ThreadOut::default();
    let outcome = (|| {
        while more(spec.stop, out.transfers, start, failed) {
            let ids = ids(&mut rng, spec.accounts);
            let begun = Instant::now();
            tx.begin().map_err(|e| db_error("tx_begin", e))?;
            for ((update, id), side) in updates.iter_mut().zip(ids).zip(Side::BOTH) {
                one_row(update.update(id)?, side, id)?;
            }
            let committing = Instant::now();
            let report = tx.commit().map_err(|e| db_error("tx_commit", e))?;
            let end = Instant::now();
            if report.kind != CommitKind::TwoPhase {
                return Err(db_error(
                    "tx_commit",
                    format!("took the {:?} path, expected two-phase", report.kind),
                ));
            }
            count(
                &mut out,
                end.saturating_duration_since(committing),
                end.saturating_duration_since(begun),
                progress,
            );
        }
        Ok(())
    })();
    if outcome.is_err() {
        // A transaction left open by the failure is rolled back, not left for recovery.
        let _ = tx.rollback();
    }
    let closed = tx.close().map_err(|e| db_error("tx_close", e));
    outcome?;
    closed?;
    Ok(out)
}
