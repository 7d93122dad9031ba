//! The limits of a decision record hold at every entry point, and a record never stores
//! anything other than the decision it was given.
//!
//! The bug guarded against: `Decision::encode_into` cut resource-manager names at 255
//! bytes and wrote the branch count as `len() as u16`, while the coordinator registered
//! names of any length. A 300-byte name was written as its first 255 bytes (recovery then
//! looks for a factory that does not exist and the decision stays in the log forever), and
//! 70,000 branches were written with a count of 4,464 followed by 70,000 branches: a record
//! that no longer reads back. Now each limit is one constant, checked when a resource
//! manager is registered and when branches are enlisted, refused by the store before
//! anything is written, asserted when the record is written and checked when it is read.

mod common;

use common::*;
use decree_core::testing::dummy::{Call, DummyConfig, DummyFactory, FaultAction, FaultRule};
use decree_core::{
    BranchCalls, BranchRecord, CommitKind, Decision, DecisionStore, LimitError, LogDecisions, Origin,
    RmFactory, Session, StoreError, TmConfig, TmError, TransactionManager, TxContext, Xid, BRANCHES_MAX,
    DECISION_BYTES_MAX, RM_NAME_BYTES_MAX,
};
use decree_log::engine::volatile::VolatileLog;
use decree_log::{EngineKind, Log, LogConfig, SyncPolicy};
use std::sync::Arc;

fn xid(sequence: u64) -> Xid {
    Xid::decree(Origin { node: 7, incarnation: 1, session: 1, sequence })
}

fn decision(sequence: u64, count: usize, name: &str) -> Decision {
    let branches = (0..count).map(|i| BranchRecord { rm: name.to_string(), branch: i as u16 }).collect();
    Decision { xid: xid(sequence), branches }
}

#[test]
fn a_resource_manager_name_of_300_bytes_is_refused_when_it_is_registered() {
    let long = dummy(&"r".repeat(300));
    let log: Arc<dyn Log> = Arc::new(VolatileLog::new());
    let err = TransactionManager::embedded(log, quick_config(), vec![dummy("a").arc(), long.arc()])
        .err()
        .expect("a 300-byte name is refused");
    assert!(matches!(err, TmError::Limit(LimitError::RmNameTooLong { bytes: 300, .. })), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("resource manager name of 300 bytes exceeds RM_NAME_BYTES_MAX = 64"), "{text}");
    // In client/server mode too: the same check, whatever the store.
    let store = Arc::new(LogDecisions::new(Arc::new(VolatileLog::new()), 7));
    let err = TransactionManager::with_store(store, quick_config(), vec![long.arc()]).err().expect("refused");
    assert!(matches!(err, TmError::Limit(LimitError::RmNameTooLong { bytes: 300, .. })), "{err:?}");
}

#[test]
fn branches_max_past_the_record_limit_is_refused_by_name() {
    for branches_max in [70_000, BRANCHES_MAX + 1, 0] {
        let config = TmConfig { branches_max, ..quick_config() };
        let log: Arc<dyn Log> = Arc::new(VolatileLog::new());
        let err = TransactionManager::embedded(log, config, vec![dummy("a").arc()]).err().expect("refused");
        let text = err.to_string();
        assert!(text.contains(&format!("branches_max = {branches_max}")), "{text}");
        assert!(text.contains("BRANCHES_MAX = 512"), "{text}");
    }
    let config = TmConfig { branches_max: BRANCHES_MAX, ..quick_config() };
    let log: Arc<dyn Log> = Arc::new(VolatileLog::new());
    assert!(TransactionManager::embedded(log, config, vec![dummy("a").arc()]).is_ok());
}

#[test]
fn a_decision_of_70000_branches_or_a_300_byte_name_is_refused_before_anything_is_written() {
    let log = Arc::new(VolatileLog::new());
    let store = LogDecisions::new(log.clone(), 7);
    let err = store.decide(&decision(1, 70_000, "a")).unwrap_err();
    assert_eq!(err, StoreError::Limit(LimitError::TooManyBranches { count: 70_000 }));
    assert!(err.to_string().contains("70000 branches exceed BRANCHES_MAX = 512"), "{err}");
    let err = store.decide(&decision(2, 2, &"n".repeat(300))).unwrap_err();
    assert!(matches!(err, StoreError::Limit(LimitError::RmNameTooLong { bytes: 300, .. })), "{err:?}");
    assert!(err.to_string().contains("name of 300 bytes exceeds RM_NAME_BYTES_MAX = 64"), "{err}");
    assert_eq!(log.stats().records_appended, 0, "nothing was written");
    assert_eq!(log.live_records(), 0);
    // At the limits it is written.
    store.decide(&decision(3, BRANCHES_MAX, &"n".repeat(RM_NAME_BYTES_MAX))).unwrap();
    assert_eq!(log.live_records(), 1);
}

#[test]
#[should_panic(expected = "exceeds RM_NAME_BYTES_MAX = 64")]
fn writing_a_record_with_a_name_past_the_limit_is_a_bug_not_a_cut() {
    let _ = decision(1, 1, &"n".repeat(300)).encode();
}

#[test]
#[should_panic(expected = "exceeds BRANCHES_MAX = 512")]
fn writing_a_record_with_70000_branches_is_a_bug_not_a_wrapped_count() {
    let _ = decision(1, 70_000, "a").encode();
}

#[test]
fn a_record_at_every_limit_reads_back_unchanged_from_a_journal() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig::new(dir.path(), EngineKind::Journal, SyncPolicy::Immediate);
    // The longest Xid: the record can carry a bqual (the state server refuses one).
    let longest = Xid::new(0x0102_0304, &[0xab; 64], &[0xcd; 64]).unwrap();
    let name = "é".repeat(RM_NAME_BYTES_MAX / 2);
    let branches =
        (0..BRANCHES_MAX as u16).rev().map(|b| BranchRecord { rm: name.clone(), branch: b }).collect();
    let written = Decision { xid: longest, branches };
    let encoded = written.encode();
    assert_eq!(encoded.len(), DECISION_BYTES_MAX, "the constant is the record's size at every limit");
    {
        let log: Arc<dyn Log> = Arc::from(decree_log::open(&config).unwrap());
        LogDecisions::new(log.clone(), 7).decide(&written).unwrap();
    }
    let log = decree_log::open(&config).unwrap();
    let records = log.take_recovered();
    assert_eq!(records.len(), 1);
    let read = Decision::decode(&records[0].payload).unwrap();
    assert_eq!(read.branches.len(), BRANCHES_MAX);
    assert!(read.branches.iter().all(|b| b.rm == name), "every name unchanged");
    assert_eq!(read, written);
}

#[test]
fn a_record_past_the_limits_does_not_read_back() {
    // Written by hand (the encoder refuses): a 65-byte name, then 513 branches.
    let mut long_name = b"DCD1".to_vec();
    xid(1).encode(&mut long_name);
    long_name.extend_from_slice(&1u16.to_be_bytes());
    long_name.extend_from_slice(&[0, 0, 65]);
    long_name.extend_from_slice(&[b'n'; 65]);
    let err = Decision::decode(&long_name).unwrap_err();
    assert!(err.to_string().contains("name of 65 bytes exceeds RM_NAME_BYTES_MAX = 64"), "{err}");
    let mut many = b"DCD1".to_vec();
    xid(1).encode(&mut many);
    many.extend_from_slice(&513u16.to_be_bytes());
    for b in 0..513u16 {
        many.extend_from_slice(&b.to_be_bytes());
        many.extend_from_slice(&[1, b'a']);
    }
    let err = Decision::decode(&many).unwrap_err();
    assert!(err.to_string().contains("513 branches exceed BRANCHES_MAX = 512"), "{err}");
}

#[test]
fn a_name_at_the_limit_commits_in_two_phases_and_the_record_names_it_whole() {
    let a = dummy(&"a".repeat(RM_NAME_BYTES_MAX));
    let b = dummy("b");
    let (log, tm) = volatile_tm(&[&a, &b]);
    let mut tx = TxContext::open(&tm, connections(&[&a, &b])).unwrap();
    tx.begin().unwrap();
    assert_eq!(tx.commit().unwrap().kind, CommitKind::TwoPhase);
    assert_eq!(log.stats().records_appended, 1);
    tx.close().unwrap();
}

/// Two connections that prefer parallel calls and whose every start fails: each
/// enlistment round uses two branch numbers (kept, since the branches may exist).
fn failing_starts(name: &str) -> DummyFactory {
    let factory = DummyFactory::new(DummyConfig { parallel: true, ..DummyConfig::new(name) });
    factory.set_rules(vec![FaultRule::sometimes(Call::Start, FaultAction::Fail, 1.0)]);
    factory
}

#[test]
fn a_transaction_whose_failed_starts_used_up_the_branch_numbers_refuses_more() {
    let (a, b) = (failing_starts("a"), failing_starts("b"));
    let log: Arc<dyn Log> = Arc::new(VolatileLog::new());
    let config = TmConfig { branch_calls: BranchCalls::Parallel, ..quick_config() };
    let factories: Vec<Arc<dyn RmFactory>> = vec![a.arc(), b.arc()];
    let tm = TransactionManager::embedded(log, config, factories).unwrap();
    let mut session = Session::open(&tm, connections(&[&a, &b])).unwrap();
    let mut tx = session.begin().unwrap();
    for _ in 0..BRANCHES_MAX / 2 {
        match tx.enlist_all() {
            Err(TmError::Rm { call: "start", .. }) => {}
            other => panic!("expected the start to fail, got {other:?}"),
        }
    }
    // Numbers 0..512 are taken: a new one would be 512, past the last (and, before the
    // limit, 65,536 rounds later it wrapped to 0 and reused a number).
    let err = tx.enlist_all().unwrap_err();
    assert_eq!(err, TmError::Limit(LimitError::TooManyBranches { count: BRANCHES_MAX + 2 }));
    assert!(err.to_string().contains("514 branches exceed BRANCHES_MAX = 512"), "{err}");
    let err = tx.enlist(0).unwrap_err();
    assert_eq!(err, TmError::Limit(LimitError::TooManyBranches { count: BRANCHES_MAX + 1 }));
    assert_eq!(a.counts().get(Call::Start), (BRANCHES_MAX / 2) as u64, "no start after the limit");
    tx.rollback().unwrap();
    // The next transaction starts again from branch 0.
    a.set_rules(Vec::new());
    let mut tx = session.begin().unwrap();
    assert_eq!(tx.enlist(0).unwrap(), 0);
    tx.rollback().unwrap();
    session.close().unwrap();
}
