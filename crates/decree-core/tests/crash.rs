//! Power loss under the coordinator, on the journal over the fault-injecting storage.
//!
//! The bugs guarded against: a commit acknowledged to the caller whose decision does not
//! survive power loss (recovery would roll back branches the caller was told committed),
//! and a failed decision write that the coordinator answers with a rollback although the
//! record may still reach the disk (recovery would then commit branches that were rolled
//! back). After any crash, every transaction must be all-committed or all-rolled-back.

mod common;

use common::*;
use decree_core::testing::dummy::{BranchOutcome, Call, DummyFactory, FaultAction, FaultRule};
use decree_core::{RmFactory, TmError, TransactionManager, TxContext, Xid};
use decree_log::engine::journal::JournalLog;
use decree_log::testing::fault::{CrashMode, FaultStorage};
use decree_log::{EngineKind, Log, LogConfig, SyncPolicy};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The journal on `storage`, once its spare-file thread has prepared its spare segment:
/// until then that thread writes and syncs too, and an injected fault meant for a decision
/// could hit its zero-filling instead (which made this suite flaky).
fn journal(storage: &FaultStorage) -> Arc<dyn Log> {
    let mut config = LogConfig::new("/crash/log", EngineKind::Journal, SyncPolicy::Immediate);
    config.segment_bytes = 1 << 20;
    let log =
        JournalLog::open(&config, Arc::new(storage.clone())).expect("journal opens on the fault storage");
    let deadline = Instant::now() + SPARE_WAIT_MAX;
    while log.segment_files().1 == 0 {
        assert!(Instant::now() < deadline, "the journal's spare segment file was never prepared");
        std::thread::sleep(Duration::from_millis(1));
    }
    Arc::new(log)
}

/// How long `journal` waits for the spare segment file (normally a few milliseconds).
const SPARE_WAIT_MAX: Duration = Duration::from_secs(30);

fn tm(log: Arc<dyn Log>, a: &DummyFactory, b: &DummyFactory) -> Arc<TransactionManager> {
    let factories: Vec<Arc<dyn RmFactory>> = vec![a.arc(), b.arc()];
    TransactionManager::embedded(log, quick_config(), factories).expect("coordinator starts")
}

#[test]
fn acknowledged_commits_survive_power_loss_before_phase_two() {
    let storage = FaultStorage::new(1);
    let (a, b) = (dummy("a"), dummy("b"));
    let coordinator = tm(journal(&storage), &a, &b);
    // Phase two never reaches either RM before the power cut.
    a.set_rules(vec![FaultRule::sometimes(Call::Commit, FaultAction::Fail, 1.0)]);
    b.set_rules(vec![FaultRule::sometimes(Call::Commit, FaultAction::Fail, 1.0)]);
    let mut tx = TxContext::open(&coordinator, connections(&[&a, &b])).unwrap();
    let acknowledged: Vec<Xid> = (0..20)
        .map(|_| {
            let xid = tx.begin().unwrap();
            assert_eq!(tx.commit().unwrap().phase_two_pending, 2);
            xid
        })
        .collect();
    let restarted = storage.crash_with(CrashMode::DropUnsynced);
    drop(tx);
    drop(coordinator);

    a.set_rules(Vec::new());
    b.set_rules(Vec::new());
    let coordinator = tm(journal(&restarted), &a, &b);
    assert_eq!(coordinator.recovery_report().decisions, acknowledged.len());
    for xid in &acknowledged {
        assert_eq!(outcome(&a, xid, 0), Some(BranchOutcome::Committed), "{xid}");
        assert_eq!(outcome(&b, xid, 1), Some(BranchOutcome::Committed), "{xid}");
    }
    assert!(a.prepared().is_empty() && b.prepared().is_empty());
}

/// With `direct`, the journal writes decisions with O_DIRECT|O_DSYNC and the write fails;
/// without, it writes and syncs and the sync fails.
fn failed_decision_is_settled_atomically(mode: CrashMode, direct: bool) -> BranchOutcome {
    let storage = FaultStorage::new(2);
    if !direct {
        storage.disable_direct_io();
    }
    let (a, b) = (dummy("a"), dummy("b"));
    let coordinator = tm(journal(&storage), &a, &b);
    let mut tx = TxContext::open(&coordinator, connections(&[&a, &b])).unwrap();
    tx.begin().unwrap();
    tx.commit().unwrap();

    if direct {
        storage.fail_writes_after(0);
    } else {
        storage.fail_next_sync();
    }
    let xid = tx.begin().unwrap();
    match tx.commit() {
        Err(TmError::OutcomeUnknown { .. }) => {}
        other => panic!("a failed decision write must leave the outcome unknown, got {other:?}"),
    }
    // Neither branch was rolled back: the record may still be on disk.
    assert_eq!(a.prepared(), vec![xid.branch(0)]);
    assert_eq!(b.prepared(), vec![xid.branch(1)]);

    let restarted = storage.crash_with(mode);
    drop(tx);
    drop(coordinator);
    let _coordinator = tm(journal(&restarted), &a, &b);
    let (ra, rb) = (outcome(&a, &xid, 0), outcome(&b, &xid, 1));
    assert_eq!(ra, rb, "both branches share one outcome after recovery ({mode:?})");
    assert!(a.prepared().is_empty() && b.prepared().is_empty());
    ra.expect("recovery settled the branches")
}

#[test]
fn a_failed_decision_write_is_settled_by_recovery_all_or_nothing() {
    for direct in [false, true] {
        assert_eq!(
            failed_decision_is_settled_atomically(CrashMode::DropUnsynced, direct),
            BranchOutcome::RolledBack,
            "direct writes: {direct}"
        );
        let kept = failed_decision_is_settled_atomically(CrashMode::KeepUnsynced, direct);
        assert!(matches!(kept, BranchOutcome::Committed | BranchOutcome::RolledBack));
    }
}
