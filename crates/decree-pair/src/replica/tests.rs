//! The backup's copy on real log engines: what a batch makes durable survives a reopen,
//! completions and rejoins forget, a bad batch writes nothing, a failed sync is reported.

use super::*;
use decree_core::{BranchRecord, Origin};
use decree_log::testing::fault::FaultStorage;
use decree_log::{EngineKind, LogConfig, SyncPolicy};
use std::path::Path;
use std::sync::mpsc;

fn xid(sequence: u64) -> Xid {
    Xid::decree(Origin { node: 3, incarnation: 0x101, session: 7, sequence })
}

fn decision(sequence: u64) -> LinkRecord {
    let d = Decision {
        xid: xid(sequence),
        branches: vec![
            BranchRecord { rm: "pg-a".into(), branch: 0 },
            BranchRecord { rm: "pg-b".into(), branch: 1 },
        ],
    };
    LinkRecord { kind: RecordKind::Decision, xid: d.xid, payload: d.encode() }
}

fn completion(sequence: u64) -> LinkRecord {
    LinkRecord { kind: RecordKind::Completion, xid: xid(sequence), payload: Vec::new() }
}

fn open(dir: &Path, engine: EngineKind) -> Replica {
    let config = LogConfig::new(dir, engine, SyncPolicy::Immediate);
    Replica::open(Arc::from(decree_log::open(&config).unwrap()))
}

/// Applies `records` and waits for the batch's callback.
fn apply(replica: &mut Replica, records: &[LinkRecord]) -> Result<(), LogError> {
    let (tx, rx) = mpsc::channel();
    replica.apply(records, Box::new(move |result| tx.send(result).unwrap())).unwrap();
    rx.recv_timeout(std::time::Duration::from_secs(10)).expect("the batch's callback runs")
}

fn live(replica: &Replica) -> Vec<u64> {
    let mut sequences: Vec<u64> = replica.live().map(|x| x.origin().unwrap().sequence).collect();
    sequences.sort();
    sequences
}

#[test]
fn what_a_batch_made_durable_is_the_live_set_after_a_reopen_on_every_engine() {
    for engine in [EngineKind::Journal, EngineKind::SlotsFsync, EngineKind::File] {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut replica = open(dir.path(), engine);
            apply(&mut replica, &[decision(1), decision(2), decision(3)]).unwrap();
            apply(&mut replica, &[completion(2), decision(4)]).unwrap();
            assert_eq!(live(&replica), [1, 3, 4], "{engine:?}");
            replica.log.sync().unwrap();
        }
        let replica = open(dir.path(), engine);
        assert_eq!(live(&replica), [1, 3, 4], "{engine:?} after reopen");
    }
}

#[test]
fn a_resent_batch_changes_nothing_and_is_durable_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut replica = open(dir.path(), EngineKind::Journal);
    let batch = [decision(1), decision(2)];
    apply(&mut replica, &batch).unwrap();
    apply(&mut replica, &batch).unwrap();
    apply(&mut replica, &[completion(1), completion(1), completion(9)]).unwrap();
    assert_eq!(live(&replica), [2]);
    drop(replica);
    assert_eq!(live(&open(dir.path(), EngineKind::Journal)), [2]);
}

#[test]
fn a_batch_with_a_bad_record_is_refused_whole_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut replica = open(dir.path(), EngineKind::Journal);
    let mut misfiled = decision(2);
    misfiled.xid = xid(5);
    let garbage = LinkRecord { kind: RecordKind::Decision, xid: xid(6), payload: vec![1, 2, 3] };
    let loaded = LinkRecord { kind: RecordKind::Completion, xid: xid(1), payload: vec![0] };
    let outcome = LinkRecord { kind: RecordKind::Outcome, xid: xid(1), payload: vec![1] };
    for (bad, expected) in [
        (misfiled, "the decision inside is of"),
        (garbage, "undecodable"),
        (loaded, "carries no payload"),
        (outcome, "keeps no outcome memory"),
    ] {
        let batch = [decision(1), bad];
        let called = Arc::new(AtomicUsize::new(0));
        let counter = called.clone();
        let e = replica
            .apply(
                &batch,
                Box::new(move |_| {
                    counter.fetch_add(1, Ordering::SeqCst);
                }),
            )
            .unwrap_err();
        assert!(matches!(&e, ReplicaError::BadRecord { index: 1, .. }), "{e}");
        assert!(e.to_string().contains(expected), "{e}");
        assert_eq!(called.load(Ordering::SeqCst), 0, "a refused batch never reports durable");
    }
    assert_eq!(replica.live_count(), 0);
    assert_eq!(replica.log.stats().records_appended, 0, "nothing of a refused batch was written");
}

#[test]
fn rejoining_forgets_what_the_new_primary_does_not_hold_and_stays_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let mut replica = open(dir.path(), EngineKind::Journal);
    apply(&mut replica, &[decision(1), decision(2), decision(3)]).unwrap();
    let keep: HashSet<Xid> = [xid(2), xid(8)].into_iter().collect();
    assert_eq!(replica.retain(&keep).unwrap(), 2);
    assert_eq!(live(&replica), [2]);
    replica.log.sync().unwrap();
    drop(replica);
    assert_eq!(live(&open(dir.path(), EngineKind::Journal)), [2]);
}

#[test]
fn a_batch_without_decisions_is_durable_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut replica = open(dir.path(), EngineKind::Journal);
    apply(&mut replica, &[decision(4)]).unwrap();
    for batch in [vec![], vec![completion(4)], vec![completion(5)]] {
        let called = Arc::new(AtomicUsize::new(0));
        let counter = called.clone();
        let callback = move |result: Result<(), LogError>| {
            assert!(result.is_ok());
            counter.fetch_add(1, Ordering::SeqCst);
        };
        replica.apply(&batch, Box::new(callback)).unwrap();
        assert_eq!(
            called.load(Ordering::SeqCst),
            1,
            "reported durable before apply returned: nothing to wait for"
        );
    }
    assert_eq!(replica.live_count(), 0);
}

#[test]
fn a_failed_sync_reaches_the_batch_and_nothing_is_acknowledged_as_durable() {
    let storage = Arc::new(FaultStorage::new(11));
    // Syncs, not O_DSYNC writes, so that the failure below hits the batch's own sync.
    storage.disable_direct_io();
    let config = LogConfig::new("/backup", EngineKind::Journal, SyncPolicy::Immediate);
    let log: Arc<dyn Log> =
        Arc::from(decree_log::engine::open_with_storage(&config, storage.clone()).unwrap());
    let mut replica = Replica::open(log);
    apply(&mut replica, &[decision(1)]).unwrap();
    storage.fail_syncs_after(0);
    let result = apply(&mut replica, &[decision(2), decision(3)]);
    assert!(matches!(result, Err(LogError::SyncFailed { .. })), "{result:?}");
    // After power loss the copy holds what was durable: the first batch, maybe more, never
    // less (the acknowledged part is the floor).
    let after = storage.crash();
    let log: Arc<dyn Log> =
        Arc::from(decree_log::engine::open_with_storage(&config, Arc::new(after)).unwrap());
    let live = live(&Replica::open(log));
    assert!(live.starts_with(&[1]), "{live:?}");
}

#[test]
fn outcome_records_go_to_the_backups_outcome_memory() {
    use decree_log::outcomes::OutcomeMemory;
    let dir = tempfile::tempdir().unwrap();
    let open_memory = || {
        OutcomeMemory::open(Arc::new(decree_log::io::StdStorage), dir.path(), 64, std::time::Duration::ZERO)
            .unwrap()
    };
    let mut replica = open(dir.path(), EngineKind::Journal).with_outcomes(open_memory());
    let outcome =
        |sequence, byte| LinkRecord { kind: RecordKind::Outcome, xid: xid(sequence), payload: vec![byte] };
    apply(&mut replica, &[outcome(1, 1), outcome(2, 2)]).unwrap();
    for bad in [vec![], vec![0], vec![1, 1]] {
        let record = LinkRecord { kind: RecordKind::Outcome, xid: xid(3), payload: bad };
        let e = replica.apply(&[record], Box::new(|_| {})).unwrap_err();
        assert!(e.to_string().contains("one outcome byte"), "{e}");
    }
    drop(replica);
    let memory = open_memory();
    let id = |sequence| {
        let mut id = Vec::new();
        xid(sequence).encode(&mut id);
        id
    };
    assert_eq!(
        (memory.lookup(&id(1)), memory.lookup(&id(2)), memory.lookup(&id(3))),
        (Some(1), Some(2), None)
    );
    assert_eq!(memory.entries().len(), 2);
}

/// The bug this guards against: a burst of outcome records larger than the outcome
/// memory takes before a flush (`WAITING_MAX`) stopped the backup as if its disk had
/// failed (seen in a pair kill loop: the primary then never had a backup again). The batch
/// must wait for the memory's flush instead, and every outcome must be remembered.
#[test]
fn a_burst_of_outcomes_beyond_what_the_memory_takes_before_a_flush_waits_for_it() {
    use decree_log::outcomes::{OutcomeMemory, WAITING_MAX};
    let dir = tempfile::tempdir().unwrap();
    let storage = FaultStorage::new(12);
    // Slow syncs: the burst outruns the flusher, as a slow disk under load would.
    storage.set_sync_delay(std::time::Duration::from_millis(100));
    let burst = WAITING_MAX as u64 * 2 + 7;
    let memory =
        OutcomeMemory::open(Arc::new(storage.clone()), dir.path(), burst as u32, std::time::Duration::ZERO)
            .unwrap();
    let mut replica = open(&dir.path().join("log"), EngineKind::Journal).with_outcomes(memory);
    let records: Vec<LinkRecord> = (1..=burst)
        .map(|sequence| LinkRecord { kind: RecordKind::Outcome, xid: xid(sequence), payload: vec![2] })
        .collect();
    apply(&mut replica, &records).unwrap();
    let memory = replica.outcomes.as_ref().unwrap();
    memory.sync().unwrap();
    assert_eq!(memory.len() as u64, burst, "every outcome of the burst is remembered");
    let mut id = Vec::new();
    xid(burst).encode(&mut id);
    assert_eq!(memory.lookup(&id), Some(2));
    assert!(storage.syncs_done() >= 2, "the burst waited for at least one flush");
}

/// A batch's acknowledgement waits for its decisions only: outcome records go to the
/// memory, which syncs them on its own schedule. The bug this guards against: a failure of
/// that memory going unnoticed, so that a promoted backup would lack outcomes it was sent
/// while it went on acknowledging; the failure refuses every later batch (fail-stop).
#[test]
fn a_failed_outcome_memory_refuses_the_next_batch() {
    use decree_log::outcomes::OutcomeMemory;
    let dir = tempfile::tempdir().unwrap();
    let storage = FaultStorage::new(11);
    let memory =
        OutcomeMemory::open(Arc::new(storage.clone()), dir.path(), 64, std::time::Duration::ZERO).unwrap();
    let log_dir = dir.path().join("log");
    let mut replica = open(&log_dir, EngineKind::Journal).with_outcomes(memory);
    let outcome = |sequence| LinkRecord { kind: RecordKind::Outcome, xid: xid(sequence), payload: vec![1] };
    apply(&mut replica, &[decision(1), outcome(2)]).unwrap();
    // The first outcome durable before the fault: else the memory's flusher may fail on it
    // before the next batch arrives, which then is refused (rightly) instead of taken
    // (seen in a CI run).
    replica.sync_outcomes().unwrap();
    storage.fail_syncs_after(0);
    // Acknowledged: its decision is durable, whatever the memory does with the outcome.
    apply(&mut replica, &[decision(3), outcome(4)]).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match replica.apply(&[decision(5)], Box::new(|_| {})) {
            Err(ReplicaError::Log(e)) => {
                assert!(!e.to_string().is_empty());
                break;
            }
            Err(other) => panic!("refused for another reason: {other}"),
            // The memory's sync may not have run yet: a batch before it is taken.
            Ok(()) => assert!(std::time::Instant::now() < deadline, "the memory's failure was never seen"),
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(
        matches!(replica.apply(&[decision(6)], Box::new(|_| {})), Err(ReplicaError::Log(_))),
        "every later batch is refused"
    );
}
