//! Tests of the file engine (one file per record) on the real file system and on the
//! fault-injecting storage.

use decree_log::engine::file::FileLog;
use decree_log::io::{StdStorage, Storage};
use decree_log::testing::fault::{CrashMode, FaultStorage};
use decree_log::{EngineKind, LiveRecord, Log, LogConfig, LogError, SyncPolicy, TxnKey};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

fn config(dir: &Path) -> LogConfig {
    LogConfig::new(dir, EngineKind::File, SyncPolicy::Immediate)
}

fn open_std(config: &LogConfig) -> FileLog {
    FileLog::open(config, Arc::new(StdStorage)).expect("open file log")
}

fn open_fault(config: &LogConfig, storage: &FaultStorage) -> FileLog {
    FileLog::open(config, Arc::new(storage.clone()) as Arc<dyn Storage>)
        .expect("open file log on fault storage")
}

fn payload(txn: TxnKey, index: usize) -> Vec<u8> {
    let len = 10 + (txn as usize * 7 + index * 13) % 600;
    (0..len).map(|i| (txn as usize + index + i) as u8).collect()
}

fn by_txn(records: &[LiveRecord]) -> BTreeMap<TxnKey, Vec<Vec<u8>>> {
    let mut out: BTreeMap<TxnKey, Vec<Vec<u8>>> = BTreeMap::new();
    for record in records {
        out.entry(record.txn).or_default().push(record.payload.clone());
    }
    out
}

fn record_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .expect("read_dir")
        .filter(|e| e.as_ref().map(|e| e.file_name().to_string_lossy().starts_with("rec-")).unwrap_or(false))
        .count()
}

#[test]
fn reopen_returns_exactly_the_live_records_in_append_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(dir.path());
    let mut expected: BTreeMap<TxnKey, Vec<Vec<u8>>> = BTreeMap::new();
    let first_incarnation;
    {
        let log = open_std(&config);
        first_incarnation = log.incarnation();
        for round in 0..3 {
            for txn in 1..=8u64 {
                log.append(txn, &payload(txn, round)).expect("append");
                expected.entry(txn).or_default().push(payload(txn, round));
            }
        }
        for txn in [3u64, 4] {
            log.complete(txn).expect("complete");
            expected.remove(&txn);
        }
        assert_eq!(record_files(dir.path()), 18, "completion removes the files");
        assert_eq!(log.stats().records_appended, 24);
    }
    let log = open_std(&config);
    assert!(log.incarnation() > first_incarnation);
    assert_eq!(by_txn(&log.take_recovered()), expected);
    assert!(log.take_recovered().is_empty());
    // Sequence numbers continue after the recovered ones: a new record of a recovered
    // transaction comes back after the old ones.
    log.append(1, b"later").expect("append");
    expected.get_mut(&1).expect("txn 1 live").push(b"later".to_vec());
    drop(log);
    let log = open_std(&config);
    assert_eq!(by_txn(&log.take_recovered()), expected);
}

/// Leftovers of appends that were never acknowledged: empty, cut short, garbage.
fn leave_torn_files(dir: &Path) {
    std::fs::write(dir.join(format!("rec-{:016x}-{:016x}.rec", 2, 100)), b"").expect("write");
    std::fs::write(dir.join(format!("rec-{:016x}-{:016x}.rec", 3, 101)), [9u8, 0, 0, 0, 1, 2])
        .expect("write");
    std::fs::write(dir.join(format!("rec-{:016x}-{:016x}.rec", 4, 102)), [0u8; 40]).expect("write");
}

#[test]
fn torn_record_files_are_deleted_at_open_after_a_crash() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(dir.path());
    let log = open_std(&config);
    log.append(1, b"good").expect("append");
    // A crash: no clean close is recorded (the leaked log's threads idle until the test ends).
    std::mem::forget(log);
    leave_torn_files(dir.path());
    std::fs::write(dir.path().join("unrelated.txt"), b"left alone").expect("write");
    let log = open_std(&config);
    assert_eq!(log.take_recovered(), vec![LiveRecord { txn: 1, payload: b"good".to_vec() }]);
    assert_eq!(record_files(dir.path()), 1, "torn files are deleted");
    assert!(dir.path().join("unrelated.txt").exists());
    let warnings = log.open_warnings();
    assert_eq!(warnings.len(), 3, "{warnings:?}");
    assert!(warnings.iter().all(|w| w.contains("deleted a torn record file")), "{warnings:?}");
}

/// Guards against a record file emptied, zeroed or deleted after a clean close being
/// taken for a torn write and dropped in silence: nothing can be torn after a clean close.
#[test]
fn a_record_lost_after_a_clean_close_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(dir.path());
    let log = open_std(&config);
    for txn in 0..5 {
        log.append(txn, b"decided").expect("append");
    }
    drop(log);
    let log = open_std(&config);
    assert!(log.open_warnings().is_empty(), "a clean close reopens without warnings");
    assert_eq!(log.take_recovered().len(), 5);
    drop(log);
    let victim = dir.path().join(format!("rec-{:016x}-{:016x}.rec", 3, 3));
    std::fs::write(&victim, [0u8; 40]).expect("zero a record file");
    match FileLog::open(&config, Arc::new(StdStorage)) {
        Err(LogError::Lost { path, reason, .. }) => {
            assert_eq!(path, victim);
            assert!(reason.contains("closed cleanly"), "{reason}");
        }
        other => panic!("a zeroed record after a clean close must be refused, got {:?}", other.map(|_| ())),
    }
    std::fs::remove_file(&victim).expect("delete it instead");
    match FileLog::open(&config, Arc::new(StdStorage)) {
        Err(LogError::Lost { reason, .. }) => assert!(reason.contains("5 live records, but 4"), "{reason}"),
        other => panic!("a deleted record after a clean close must be refused, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn records_larger_than_the_limit_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = config(dir.path());
    config.record_bytes_max = 600;
    let log = open_std(&config);
    log.append(1, &[1u8; 600]).expect("a record at the limit fits");
    assert!(matches!(log.append(2, &[1u8; 601]), Err(LogError::RecordTooLarge { len: 601, max: 600 })));
    let (sender, receiver) = std::sync::mpsc::channel();
    log.append_with(3, &[1u8; 601], Box::new(move |r| sender.send(r).expect("send")));
    assert!(matches!(receiver.recv().expect("callback"), Err(LogError::RecordTooLarge { .. })));
    assert_eq!(record_files(dir.path()), 1);
}

#[test]
fn append_with_from_many_threads_calls_back_once_per_record() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(dir.path());
    let log = Arc::new(open_std(&config));
    let (sender, receiver) = std::sync::mpsc::channel();
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let log = log.clone();
            let sender = sender.clone();
            std::thread::spawn(move || {
                for i in 0..25u64 {
                    let txn = t * 1000 + i;
                    let sender = sender.clone();
                    log.append_with(
                        txn,
                        &payload(txn, 0),
                        Box::new(move |r| sender.send((txn, r)).expect("send")),
                    );
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("thread");
    }
    drop(sender);
    let mut acknowledged = BTreeSet::new();
    for (txn, result) in receiver.iter().take(100) {
        result.expect("durable");
        assert!(acknowledged.insert(txn));
    }
    assert_eq!(acknowledged.len(), 100);
    drop(Arc::into_inner(log).expect("sole owner"));
    let log = open_std(&config);
    let recovered: BTreeSet<TxnKey> = log.take_recovered().iter().map(|r| r.txn).collect();
    assert_eq!(recovered, acknowledged);
}

/// Bug guarded against: a new record file is durable only after its directory is synced;
/// an engine that syncs the file but not the directory (or acknowledges before either)
/// loses acknowledged records on power loss. Completions are removals: once a later
/// directory sync ran, a completed record must not come back.
#[test]
fn power_loss_keeps_every_acknowledged_record() {
    for seed in 0..20u64 {
        let storage = FaultStorage::new(seed);
        let config = config(Path::new("/log"));
        let log = open_fault(&config, &storage);
        let mut live: BTreeMap<TxnKey, Vec<Vec<u8>>> = BTreeMap::new();
        let mut completed_unsynced = BTreeSet::new();
        let mut completed_synced = BTreeSet::new();
        let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        for step in 0..50usize {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let txn = rng % 10;
            if rng % 3 == 0 && live.contains_key(&txn) {
                log.complete(txn).expect("complete");
                live.remove(&txn);
                completed_unsynced.insert(txn);
            } else {
                log.append(txn, &payload(txn, step)).expect("append");
                live.entry(txn).or_default().push(payload(txn, step));
                completed_unsynced.remove(&txn);
                completed_synced.extend(std::mem::take(&mut completed_unsynced));
                completed_synced.retain(|t| !live.contains_key(t));
            }
        }
        let mode = [CrashMode::DropUnsynced, CrashMode::TearLastWrite, CrashMode::KeepRandomUnsynced]
            [(seed % 3) as usize];
        let after = storage.crash_with(mode);
        drop(log);
        let reopened = open_fault(&config, &after);
        let recovered = by_txn(&reopened.take_recovered());
        for (txn, records) in &live {
            assert_eq!(recovered.get(txn), Some(records), "seed {seed}: txn {txn} lost");
        }
        for txn in recovered.keys() {
            assert!(
                live.contains_key(txn) || completed_unsynced.contains(txn),
                "seed {seed}: txn {txn} resurrected"
            );
            assert!(!completed_synced.contains(txn));
        }
    }
}

/// Bug guarded against: an rpo=N append whose file was written but never synced is cut by
/// the crash; recovery must drop the torn file (with a warning), not refuse to open, and
/// must keep the records that `sync()` made durable.
#[test]
fn a_torn_unsynced_record_is_dropped_at_recovery() {
    for seed in 0..12u64 {
        let storage = FaultStorage::new(seed);
        let mut config = config(Path::new("/log"));
        config.sync = SyncPolicy::Window(Duration::from_secs(3600));
        let log = open_fault(&config, &storage);
        log.append(1, &[0x11; 300]).expect("append");
        log.sync().expect("sync");
        log.append(2, &[0x22; 300]).expect("append");
        storage.sync_dir(Path::new("/log")).expect("make the new name durable, not its content");
        let after = storage.crash_with(if seed % 2 == 0 {
            CrashMode::TearLastWrite
        } else {
            CrashMode::ZeroLastWrite
        });
        drop(log);
        let reopened = open_fault(&config, &after);
        let recovered = reopened.take_recovered();
        assert_eq!(recovered, vec![LiveRecord { txn: 1, payload: vec![0x11; 300] }], "seed {seed}");
        let files = after.list(Path::new("/log")).expect("list");
        assert_eq!(
            files.iter().filter(|p| p.to_string_lossy().contains("/rec-")).count(),
            1,
            "torn file deleted"
        );
    }
}

/// Bug guarded against: retrying or ignoring a failed fsync (see the slots test of the same
/// name): after one failed sync every call must fail.
#[test]
fn a_failed_sync_stops_the_log() {
    let storage = FaultStorage::new(1);
    let config = config(Path::new("/log"));
    let log = open_fault(&config, &storage);
    log.append(1, b"before").expect("append");
    storage.fail_next_sync();
    assert!(matches!(log.append(2, b"lost"), Err(LogError::SyncFailed { .. })));
    assert!(matches!(log.append(3, b"after"), Err(LogError::SyncFailed { .. })));
    assert!(matches!(log.complete(1), Err(LogError::SyncFailed { .. })));
    assert!(matches!(log.sync(), Err(LogError::SyncFailed { .. })));
    let (sender, receiver) = std::sync::mpsc::channel();
    log.append_with(4, b"async", Box::new(move |r| sender.send(r).expect("send")));
    assert!(matches!(receiver.recv().expect("callback"), Err(LogError::SyncFailed { .. })));
    let after = storage.crash();
    drop(log);
    let recovered = by_txn(&open_fault(&config, &after).take_recovered());
    assert_eq!(recovered.get(&1), Some(&vec![b"before".to_vec()]));
    assert!(!recovered.contains_key(&3) && !recovered.contains_key(&4));
}

/// A full disk fails the append that needs space (an IO error, not fail-stop: nothing
/// acknowledged is at risk) and leaves no partial file; appends work again once space is back.
#[test]
fn a_full_disk_fails_the_append_only() {
    let storage = FaultStorage::new(2);
    let config = config(Path::new("/log"));
    let log = open_fault(&config, &storage);
    log.append(1, b"fits").expect("append");
    storage.set_space_limit(Some(storage.bytes_used()));
    assert!(matches!(log.append(2, &[5u8; 100]), Err(LogError::Io { .. })));
    storage.clear_faults();
    log.append(3, b"works again").expect("append after space came back");
    let after = storage.crash();
    drop(log);
    let recovered: BTreeSet<TxnKey> =
        open_fault(&config, &after).take_recovered().iter().map(|r| r.txn).collect();
    assert_eq!(recovered, [1, 3].into_iter().collect());
}

/// Bug guarded against: an rpo=N log whose flusher forgets files written since the last
/// flush, or whose `sync()` does not make removals durable: after the flusher has run (or
/// `sync()` returned), every acknowledged record and every completion survives power loss.
#[test]
fn rpo_window_flusher_and_sync_make_records_and_removals_durable() {
    let storage = FaultStorage::new(9);
    let mut config = config(Path::new("/log"));
    config.sync = SyncPolicy::Window(Duration::from_millis(2));
    let log = open_fault(&config, &storage);
    for txn in 0..6 {
        log.append(txn, &payload(txn, 0)).expect("append");
    }
    log.complete(2).expect("complete");
    // Wait until the flusher has made the appends durable (no assertion on how long).
    let durable = |storage: &FaultStorage| {
        let after = storage.crash();
        let log = open_fault(&config, &after);
        log.take_recovered().iter().map(|r| r.txn).collect::<BTreeSet<TxnKey>>()
    };
    let expected: BTreeSet<TxnKey> = [0, 1, 3, 4, 5].into_iter().collect();
    let mut seen = BTreeSet::new();
    for _ in 0..5_000 {
        seen = durable(&storage);
        if seen == expected {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(seen, expected, "the flusher must sync files and removals");
    log.complete(4).expect("complete");
    log.sync().expect("sync");
    assert_eq!(durable(&storage), [0, 1, 3, 5].into_iter().collect());
}

/// Bug guarded against: races between threads appending and completing at once (a name
/// reused, a removal of the wrong file, a directory sync that misses a concurrent creation).
/// The power is cut while the threads run; every record acknowledged before the cut must
/// come back whole, and nothing may come back that was never appended.
#[test]
fn power_loss_during_concurrent_appends_and_completions() {
    use std::sync::Mutex;
    for seed in 0..4u64 {
        let storage = FaultStorage::new(seed);
        let config = config(Path::new("/log"));
        let log = Arc::new(open_fault(&config, &storage));
        let acknowledged: Arc<Mutex<BTreeMap<TxnKey, Vec<u8>>>> = Arc::default();
        let appended: Arc<Mutex<BTreeMap<TxnKey, Vec<u8>>>> = Arc::default();
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let (log, acknowledged, appended) = (log.clone(), acknowledged.clone(), appended.clone());
                std::thread::spawn(move || {
                    for i in 0..100u64 {
                        let txn = (t << 32) | i;
                        let bytes = payload(txn, i as usize);
                        appended.lock().expect("lock").insert(txn, bytes.clone());
                        log.append(txn, &bytes).expect("append (the crashed storage keeps working)");
                        acknowledged.lock().expect("lock").insert(txn, bytes);
                        if i % 3 != 0 {
                            acknowledged.lock().expect("lock").remove(&txn);
                            log.complete(txn).expect("complete");
                        }
                    }
                })
            })
            .collect();
        while appended.lock().expect("lock").len() < 50 + seed as usize * 80 {
            std::thread::yield_now();
        }
        let before = acknowledged.lock().expect("lock").clone();
        let after =
            storage.crash_with([CrashMode::DropUnsynced, CrashMode::TearLastWrite][(seed % 2) as usize]);
        for thread in threads {
            thread.join().expect("thread");
        }
        let recovered = open_fault(&config, &after).take_recovered();
        let appended = appended.lock().expect("lock");
        let mut seen = BTreeSet::new();
        for record in &recovered {
            assert!(seen.insert(record.txn), "seed {seed}: txn {} came back twice", record.txn);
            assert_eq!(Some(&record.payload), appended.get(&record.txn), "seed {seed}: bad record");
        }
        for txn in before.keys() {
            assert!(seen.contains(txn), "seed {seed}: acknowledged txn {txn:#x} lost");
        }
    }
}

/// Bug guarded against: treating a damaged record (bit rot in a file written to its full
/// length) like a torn write would delete a decided transaction without a word. Only
/// files cut short, empty or zeroed are torn writes; a full-length file that fails its
/// checksum, or holds another transaction's record, makes open refuse, naming the file.
#[test]
fn a_damaged_full_length_record_file_is_corruption() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(dir.path());
    let log = open_std(&config);
    log.append(7, &[0x77; 300]).expect("append");
    drop(log);
    let path = std::fs::read_dir(dir.path())
        .expect("read_dir")
        .map(|e| e.expect("entry").path())
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("rec-")))
        .expect("the record file");
    let mut bytes = std::fs::read(&path).expect("read");
    bytes[150] ^= 0x08;
    std::fs::write(&path, &bytes).expect("damage");
    match FileLog::open(&config, Arc::new(StdStorage)) {
        Err(LogError::Corrupted { path: reported, .. }) => assert_eq!(reported, path),
        Err(other) => panic!("expected Corrupted, got {other:?}"),
        Ok(_) => panic!("a damaged record must not be dropped silently"),
    }
    assert!(path.exists(), "a corrupted record is kept for the operator");
    // A record file renamed to another transaction is not what its name says either.
    bytes[150] ^= 0x08;
    std::fs::write(&path, &bytes).expect("repair");
    std::fs::rename(&path, dir.path().join(format!("rec-{:016x}-{:016x}.rec", 8, 0))).expect("rename");
    assert!(matches!(FileLog::open(&config, Arc::new(StdStorage)), Err(LogError::Corrupted { .. })));
}
