//! Tests of the slots engine (both flavours) on the real file system and on the
//! fault-injecting storage. The fault storage has no raw descriptor, so there `slots-mmap`
//! runs its pwrite fallback: those tests check the slot layout and recovery rules, and the
//! real-file-system tests check the mapping itself.

use decree_log::engine::slots::SlotsLog;
use decree_log::io::{StdStorage, Storage};
use decree_log::testing::fault::{CrashMode, FaultStorage};
use decree_log::{EngineKind, LiveRecord, Log, LogConfig, LogError, SyncPolicy, TxnKey};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const FLAVOURS: [EngineKind; 2] = [EngineKind::SlotsFsync, EngineKind::SlotsMmap];
const SLOT_BYTES: u32 = 256;
/// The largest payload a 256-byte slot holds: stamp (8), frame header (17), sequence and
/// head sequence (16), trailer (8).
const SLOT_PAYLOAD_MAX: usize = 256 - 8 - 17 - 16 - 8;

fn config(dir: &Path, engine: EngineKind, slots_count: u32) -> LogConfig {
    let mut config = LogConfig::new(dir, engine, SyncPolicy::Immediate);
    config.slot_bytes = SLOT_BYTES;
    config.slots_count = slots_count;
    config
}

fn open_std(config: &LogConfig) -> SlotsLog {
    SlotsLog::open(config, Arc::new(StdStorage)).expect("open slots log")
}

fn open_fault(config: &LogConfig, storage: &FaultStorage) -> SlotsLog {
    SlotsLog::open(config, Arc::new(storage.clone()) as Arc<dyn Storage>)
        .expect("open slots log on fault storage")
}

fn payload(txn: TxnKey, index: usize) -> Vec<u8> {
    let len = 10 + (txn as usize * 7 + index * 13) % 150;
    (0..len).map(|i| (txn as usize + index + i) as u8).collect()
}

/// Groups records per transaction, keeping their order within each transaction.
fn by_txn(records: &[LiveRecord]) -> BTreeMap<TxnKey, Vec<Vec<u8>>> {
    let mut out: BTreeMap<TxnKey, Vec<Vec<u8>>> = BTreeMap::new();
    for record in records {
        out.entry(record.txn).or_default().push(record.payload.clone());
    }
    out
}

#[test]
fn reopen_returns_exactly_the_live_records_in_append_order() {
    for engine in FLAVOURS {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = config(dir.path(), engine, 64);
        let mut expected: BTreeMap<TxnKey, Vec<Vec<u8>>> = BTreeMap::new();
        let first_incarnation;
        {
            let log = open_std(&config);
            assert_eq!(log.is_mapped(), engine == EngineKind::SlotsMmap, "{engine}");
            first_incarnation = log.incarnation();
            assert!(log.take_recovered().is_empty());
            // Interleave transactions so that append order differs from slot order.
            for round in 0..3 {
                for txn in 1..=10u64 {
                    log.append(txn, &payload(txn, round)).expect("append");
                    expected.entry(txn).or_default().push(payload(txn, round));
                }
            }
            for txn in [2u64, 5, 9] {
                log.complete(txn).expect("complete");
                expected.remove(&txn);
            }
            assert_eq!(log.free_slots(), 64 - 21);
            let stats = log.stats();
            assert_eq!(stats.records_appended, 30);
            assert_eq!(stats.completions, 3);
            assert!(stats.flushes >= 30, "rpo=0 syncs every append: {stats:?}");
        }
        let log = open_std(&config);
        assert!(log.incarnation() > first_incarnation);
        let recovered = log.take_recovered();
        assert_eq!(recovered.len(), 21, "{engine}");
        assert_eq!(by_txn(&recovered), expected, "{engine}");
        assert!(log.take_recovered().is_empty(), "recovered records are handed out once");
        assert_eq!(log.free_slots(), 64 - 21);
        // Recovered records stay live until completed, then disappear for good.
        for txn in expected.keys() {
            log.complete(*txn).expect("complete recovered");
        }
        drop(log);
        let log = open_std(&config);
        assert!(log.take_recovered().is_empty(), "{engine}");
        assert_eq!(log.free_slots(), 64);
    }
}

#[test]
fn slots_are_reused_after_completion() {
    for engine in FLAVOURS {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = config(dir.path(), engine, 4);
        let log = open_std(&config);
        for round in 0..25u64 {
            for i in 0..4u64 {
                log.append(round * 4 + i, &payload(round, i as usize)).expect("append into a reused slot");
            }
            assert_eq!(log.free_slots(), 0);
            for i in 0..4u64 {
                log.complete(round * 4 + i).expect("complete");
            }
            assert_eq!(log.free_slots(), 4);
        }
        log.append(1000, b"survivor").expect("append");
        drop(log);
        let log = open_std(&config);
        assert_eq!(log.take_recovered(), vec![LiveRecord { txn: 1000, payload: b"survivor".to_vec() }]);
        let len = std::fs::metadata(dir.path().join("slots.dat")).expect("slots.dat").len();
        assert_eq!(len, 4096 + 4 * u64::from(SLOT_BYTES), "the file never grows");
    }
}

#[test]
fn a_full_log_names_its_slot_count_and_recovers_after_completion() {
    for engine in FLAVOURS {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = open_std(&config(dir.path(), engine, 3));
        for txn in 0..3 {
            log.append(txn, b"x").expect("append");
        }
        match log.append(3, b"x") {
            Err(LogError::Full(message)) => assert!(message.contains("all 3 slots"), "{message}"),
            other => panic!("expected Full, got {other:?}"),
        }
        let (sender, receiver) = std::sync::mpsc::channel();
        log.append_with(3, b"x", Box::new(move |result| sender.send(result).expect("send")));
        assert!(matches!(receiver.recv().expect("callback"), Err(LogError::Full(_))));
        log.complete(1).expect("complete");
        log.append(3, b"x").expect("a freed slot is usable");
    }
}

#[test]
fn records_larger_than_a_slot_or_the_limit_are_refused() {
    for engine in FLAVOURS {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = config(dir.path(), engine, 8);
        let log = open_std(&config);
        log.append(1, &vec![7u8; SLOT_PAYLOAD_MAX]).expect("a payload filling the slot exactly fits");
        match log.append(2, &vec![7u8; SLOT_PAYLOAD_MAX + 1]) {
            Err(LogError::RecordTooLarge { len, max }) => {
                assert_eq!((len, max), (SLOT_PAYLOAD_MAX + 1, SLOT_PAYLOAD_MAX));
            }
            other => panic!("expected RecordTooLarge, got {other:?}"),
        }
        assert_eq!(log.free_slots(), 7, "a refused record takes no slot");
        drop(log);
        config.record_bytes_max = 100;
        let log = open_std(&config);
        assert_eq!(log.take_recovered().len(), 1);
        assert!(matches!(log.append(3, &[0u8; 101]), Err(LogError::RecordTooLarge { len: 101, max: 100 })));
    }
}

#[test]
fn append_with_from_many_threads_calls_back_once_per_record() {
    for engine in FLAVOURS {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = config(dir.path(), engine, 512);
        let log = Arc::new(open_std(&config));
        let (sender, receiver) = std::sync::mpsc::channel();
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let log = log.clone();
                let sender = sender.clone();
                std::thread::spawn(move || {
                    for i in 0..50u64 {
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
        for (txn, result) in receiver.iter().take(200) {
            result.expect("durable");
            assert!(acknowledged.insert(txn), "txn {txn} acknowledged twice");
        }
        assert_eq!(acknowledged.len(), 200);
        drop(Arc::into_inner(log).expect("sole owner"));
        let log = open_std(&config);
        let recovered: BTreeSet<TxnKey> = log.take_recovered().iter().map(|r| r.txn).collect();
        assert_eq!(recovered, acknowledged, "{engine}");
    }
}

#[test]
fn geometry_of_an_existing_file_is_checked_and_can_grow() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = config(dir.path(), EngineKind::SlotsFsync, 8);
    open_std(&config).append(5, b"kept across growth").expect("append");
    config.slot_bytes = 512;
    match SlotsLog::open(&config, Arc::new(StdStorage)) {
        Err(LogError::Config(message)) => assert!(message.contains("slot_bytes = 256"), "{message}"),
        Err(other) => panic!("expected a configuration error, got {other:?}"),
        Ok(_) => panic!("a different slot size must be refused"),
    }
    config.slot_bytes = SLOT_BYTES;
    config.slots_count = 4;
    assert!(matches!(SlotsLog::open(&config, Arc::new(StdStorage)), Err(LogError::Config(_))));
    config.slots_count = 32;
    let log = open_std(&config);
    assert_eq!(log.take_recovered(), vec![LiveRecord { txn: 5, payload: b"kept across growth".to_vec() }]);
    assert_eq!(log.free_slots(), 31);
}

/// Bug guarded against: an engine that acknowledges an append before the slot write is
/// durable, or whose recovery misreads a slot whose completion a later sync made durable,
/// would lose acknowledged records or resurrect finished transactions after power loss.
/// Every acknowledged, not completed record must come back; a transaction completed before
/// a successful `sync()` must not. (Keys are not reused after completion, as in decree.)
#[test]
fn power_loss_keeps_every_acknowledged_record() {
    for engine in FLAVOURS {
        for seed in 0..30u64 {
            let storage = FaultStorage::new(seed);
            let config = config(Path::new("/log"), engine, 16);
            let log = open_fault(&config, &storage);
            let mut live: BTreeMap<TxnKey, Vec<Vec<u8>>> = BTreeMap::new();
            let mut completed_unsynced = BTreeSet::new();
            let mut completed_synced = BTreeSet::new();
            let mut generation = [0u64; 12];
            let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            for step in 0..60usize {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let small = (rng % 12) as usize;
                let txn = small as u64 * 1000 + generation[small];
                if rng % 11 == 0 {
                    log.sync().expect("sync");
                    completed_synced.extend(std::mem::take(&mut completed_unsynced));
                } else if rng % 3 == 0 && live.contains_key(&txn) {
                    log.complete(txn).expect("complete");
                    live.remove(&txn);
                    completed_unsynced.insert(txn);
                    generation[small] += 1;
                } else if live.values().map(Vec::len).sum::<usize>() < 16 {
                    log.append(txn, &payload(txn, step)).expect("append");
                    live.entry(txn).or_default().push(payload(txn, step));
                }
            }
            let mode = [CrashMode::DropUnsynced, CrashMode::TearLastWrite, CrashMode::ZeroLastWrite]
                [(seed % 3) as usize];
            let after = storage.crash_with(mode);
            drop(log);
            let reopened = open_fault(&config, &after);
            let recovered = by_txn(&reopened.take_recovered());
            for (txn, records) in &live {
                assert_eq!(recovered.get(txn), Some(records), "{engine} seed {seed}: txn {txn} lost");
            }
            for txn in recovered.keys() {
                assert!(
                    live.contains_key(txn) || completed_unsynced.contains(txn),
                    "{engine} seed {seed}: txn {txn} came back although its completion was durable"
                );
                assert!(!completed_synced.contains(txn));
            }
        }
    }
}

/// Bug guarded against: a slot reused before the old record's completion is durable, whose
/// new write is torn by the crash, must not stop recovery with a corruption error (slots
/// are independent; a bad slot is a torn write) and must not produce a half-new record.
/// With rpo=N nothing is synced until the flusher runs (here: an hour), so both the
/// completion and the reuse are unsynced when the power goes.
#[test]
fn a_torn_write_into_a_reused_slot_reads_as_free() {
    for engine in FLAVOURS {
        for seed in 0..16u64 {
            let storage = FaultStorage::new(seed);
            let mut config = config(Path::new("/log"), engine, 2);
            let log = open_fault(&config, &storage);
            log.append(1, &[0x11; 200]).expect("append");
            log.append(2, &[0x22; 200]).expect("append");
            drop(log); // closing syncs: both records durable
            config.sync = SyncPolicy::Window(Duration::from_secs(3600));
            let log = open_fault(&config, &storage);
            assert_eq!(log.take_recovered().len(), 2);
            log.complete(1).expect("complete");
            log.append(3, &[0x33; 150]).expect("append into the freed slot");
            let mode = if seed % 2 == 0 { CrashMode::TearLastWrite } else { CrashMode::KeepRandomUnsynced };
            let after = storage.crash_with(mode);
            drop(log);
            let reopened = open_fault(&config, &after);
            let recovered = by_txn(&reopened.take_recovered());
            assert_eq!(recovered.get(&2), Some(&vec![vec![0x22; 200]]), "{engine} seed {seed}");
            for (txn, records) in &recovered {
                let whole = match txn {
                    1 => vec![vec![0x11; 200]],
                    2 => vec![vec![0x22; 200]],
                    3 => vec![vec![0x33; 150]],
                    other => panic!("unknown txn {other}"),
                };
                assert_eq!(records, &whole, "{engine} seed {seed}: records come back whole or not at all");
            }
            if mode == CrashMode::TearLastWrite {
                assert!(!recovered.contains_key(&3), "a torn record must not come back");
            }
        }
    }
}

/// Bug guarded against: retrying or ignoring a failed fsync. After a failed sync the kernel
/// may have dropped the dirty pages, so a later successful sync proves nothing; the log must
/// refuse every later call instead of acknowledging records that may be gone.
#[test]
fn a_failed_sync_stops_the_log() {
    for engine in FLAVOURS {
        let storage = FaultStorage::new(7);
        let log = open_fault(&config(Path::new("/log"), engine, 16), &storage);
        log.append(1, b"before").expect("append");
        storage.fail_next_sync();
        assert!(matches!(log.append(2, b"lost"), Err(LogError::SyncFailed { .. })));
        // The storage would sync again now; the log must not.
        assert!(matches!(log.append(3, b"after"), Err(LogError::SyncFailed { .. })));
        assert!(matches!(log.complete(1), Err(LogError::SyncFailed { .. })));
        assert!(matches!(log.sync(), Err(LogError::SyncFailed { .. })));
        let (sender, receiver) = std::sync::mpsc::channel();
        log.append_with(4, b"async", Box::new(move |r| sender.send(r).expect("send")));
        assert!(matches!(receiver.recv().expect("callback"), Err(LogError::SyncFailed { .. })));
        let after = storage.crash();
        drop(log);
        let reopened = open_fault(&config(Path::new("/log"), engine, 16), &after);
        let recovered = by_txn(&reopened.take_recovered());
        assert_eq!(recovered.get(&1), Some(&vec![b"before".to_vec()]), "{engine}");
        assert!(!recovered.contains_key(&3) && !recovered.contains_key(&4));
    }
}

/// A failed sync on the background path (append_with, and the rpo=N flusher) stops the log
/// as well: the callback gets the error, and so does every later call.
#[test]
fn a_failed_background_sync_stops_the_log() {
    for engine in FLAVOURS {
        let storage = FaultStorage::new(3);
        let log = open_fault(&config(Path::new("/log"), engine, 16), &storage);
        storage.fail_syncs_after(0);
        let (sender, receiver) = std::sync::mpsc::channel();
        log.append_with(1, b"async", Box::new(move |r| sender.send(r).expect("send")));
        assert!(matches!(receiver.recv().expect("callback"), Err(LogError::SyncFailed { .. })));
        storage.clear_faults();
        assert!(matches!(log.append(2, b"x"), Err(LogError::SyncFailed { .. })), "{engine}");

        let storage = FaultStorage::new(4);
        let mut config = config(Path::new("/log"), engine, 16);
        config.sync = SyncPolicy::Window(Duration::from_millis(1));
        let log = open_fault(&config, &storage);
        storage.fail_syncs_after(0);
        log.append(1, b"acknowledged before the flush").expect("rpo=N acknowledges after the write");
        // Wait (without asserting on time) until the flusher has tried and latched the failure.
        let mut stopped = false;
        for _ in 0..10_000 {
            // The flusher may latch the failure between any two calls.
            if log.append(2, b"x").is_err() || log.complete(2).is_err() {
                stopped = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(stopped, "{engine}: the flusher's failed sync must stop the log");
        assert!(matches!(log.sync(), Err(LogError::SyncFailed { .. })));
    }
}

/// Slots are pre-allocated: a disk that fills up after open does not stop appends (writes
/// into the slot file never grow it), and a failing write is an error of that append only.
#[test]
fn full_disk_and_failed_writes() {
    for engine in FLAVOURS {
        let storage = FaultStorage::new(11);
        let log = open_fault(&config(Path::new("/log"), engine, 16), &storage);
        storage.set_space_limit(Some(storage.bytes_used()));
        for txn in 0..16 {
            log.append(txn, &payload(txn, 0)).expect("append into pre-allocated space");
        }
        for txn in 0..16 {
            log.complete(txn).expect("complete");
        }
        storage.clear_faults();
        storage.fail_writes_after(0);
        assert!(matches!(log.append(1, b"x"), Err(LogError::Io { .. })), "{engine}");
        assert_eq!(log.free_slots(), 16, "the failed append gave its slot back");
        storage.clear_faults();
        log.append(1, b"works again").expect("a failed write is not fail-stop");
    }
}

/// Bug guarded against: an rpo=N log that never syncs, or whose `sync()` misses the records
/// and completions written since the last flush.
#[test]
fn rpo_window_records_are_durable_after_sync() {
    for engine in FLAVOURS {
        let storage = FaultStorage::new(5);
        let mut config = config(Path::new("/log"), engine, 16);
        config.sync = SyncPolicy::Window(Duration::from_secs(3600));
        let log = open_fault(&config, &storage);
        let syncs_at_open = storage.syncs_done();
        for txn in 0..8 {
            log.append(txn, &payload(txn, 0)).expect("append");
        }
        log.complete(3).expect("complete");
        assert_eq!(storage.syncs_done(), syncs_at_open, "rpo=N appends do not sync");
        log.sync().expect("sync");
        let after = storage.crash();
        let reopened = open_fault(&config, &after);
        let recovered: BTreeSet<TxnKey> = reopened.take_recovered().iter().map(|r| r.txn).collect();
        assert_eq!(recovered, [0, 1, 2, 4, 5, 6, 7].into_iter().collect(), "{engine}");
        drop(log);
    }
}

/// Throughput of slots-fsync, slots-mmap and file at rpo=0 with 600-byte records, beside
/// raw `pwrite(600 B)` + `fdatasync` on a pre-allocated file in the same run. Comparative
/// only (never asserts on speed); run it on a real disk, in release mode:
/// `DECREE_BENCH_DIR=/work cargo test --release -p decree-log --test slots -- --ignored --nocapture`.
/// `DECREE_BENCH_MS` sets the length of one measurement (default 1500 ms); each figure is
/// the median of three. `DECREE_BENCH_ENGINES` (comma list) limits the engines measured.
#[test]
#[ignore = "benchmark: run explicitly in release mode"]
fn bench_rpo0_against_raw_fdatasync() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::Instant;

    let base = std::env::var("DECREE_BENCH_DIR").unwrap_or_else(|_| "/tmp".into());
    let run_ms: u64 = std::env::var("DECREE_BENCH_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(1500);
    let record = vec![0xA5u8; 600];

    // Runs `work(thread, iteration)` on `threads` threads for run_ms; returns operations/s.
    let measure = |threads: usize, work: &(dyn Fn(usize, u64) + Sync)| -> f64 {
        let stop = AtomicBool::new(false);
        let done = AtomicU64::new(0);
        let start = Instant::now();
        std::thread::scope(|scope| {
            for t in 0..threads {
                let (stop, done) = (&stop, &done);
                scope.spawn(move || {
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        work(t, i);
                        i += 1;
                    }
                    done.fetch_add(i, Ordering::Relaxed);
                });
            }
            std::thread::sleep(Duration::from_millis(run_ms));
            stop.store(true, Ordering::Relaxed);
        });
        done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
    };
    let median = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
        v[v.len() / 2]
    };

    println!("records/s, rpo=0, 600-byte records, median of 3 runs of {run_ms} ms, in {base}");
    println!("{:<28} {:>10} {:>10} {:>10}", "engine", "1 thread", "4 threads", "16 threads");
    let row = |name: &str, per_threads: &dyn Fn(usize) -> f64| {
        let figures: Vec<f64> =
            [1usize, 4, 16].iter().map(|&t| median((0..3).map(|_| per_threads(t)).collect())).collect();
        println!("{name:<28} {:>10.0} {:>10.0} {:>10.0}", figures[0], figures[1], figures[2]);
    };

    row("raw pwrite+fdatasync", &|threads| {
        let dir = tempfile::tempdir_in(&base).expect("bench dir");
        let file = StdStorage.open(&dir.path().join("raw.dat"), true).expect("open raw file");
        file.preallocate(64 << 20).expect("preallocate");
        let file = &file;
        let record = &record;
        measure(threads, &|t, i| {
            let offset = ((t as u64 * 4096 + i % 4096) * 1024) % (64 << 20);
            file.write_all_at(record, offset).expect("pwrite");
            file.sync_data().expect("fdatasync");
        })
    });
    let wanted = std::env::var("DECREE_BENCH_ENGINES").unwrap_or_default();
    for engine in [EngineKind::SlotsFsync, EngineKind::SlotsMmap, EngineKind::File] {
        if !wanted.is_empty() && !wanted.split(',').any(|name| name.trim() == engine.name()) {
            continue;
        }
        row(&format!("{engine} (append+complete)"), &|threads| {
            let dir = tempfile::tempdir_in(&base).expect("bench dir");
            let config = LogConfig::new(dir.path(), engine, SyncPolicy::Immediate);
            let log = decree_log::engine::open_with_storage(&config, Arc::new(StdStorage)).expect("open");
            let log = &*log;
            let record = &record;
            measure(threads, &|t, i| {
                let txn = ((t as u64) << 40) | i;
                log.append(txn, record).expect("append");
                log.complete(txn).expect("complete");
            })
        });
    }
}

/// Bug guarded against: races between threads that append, complete and reuse slots at the
/// same time (a slot handed to two records, a completion zeroing a slot that was already
/// reused, a sync that does not cover a concurrent acknowledged write). Threads run while
/// the power is cut at a random moment; every record acknowledged before the cut must come
/// back whole, and nothing may come back that was never appended.
#[test]
fn power_loss_during_concurrent_appends_and_completions() {
    use std::sync::Mutex;
    for engine in FLAVOURS {
        for seed in 0..6u64 {
            let storage = FaultStorage::new(seed);
            // Room for every record kept live (one in three) plus the ones in flight.
            let config = config(Path::new("/log"), engine, 512);
            let log = Arc::new(open_fault(&config, &storage));
            // txn -> payload, inserted once the append returned Ok; removed before complete.
            let acknowledged: Arc<Mutex<BTreeMap<TxnKey, Vec<u8>>>> = Arc::default();
            let appended: Arc<Mutex<BTreeMap<TxnKey, Vec<u8>>>> = Arc::default();
            let threads: Vec<_> = (0..4u64)
                .map(|t| {
                    let (log, acknowledged, appended) = (log.clone(), acknowledged.clone(), appended.clone());
                    std::thread::spawn(move || {
                        for i in 0..200u64 {
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
            // Cut the power once the threads are well under way (and slots are being reused).
            while appended.lock().expect("lock").len() < 100 + seed as usize * 100 {
                std::thread::yield_now();
            }
            let before = acknowledged.lock().expect("lock").clone();
            let mode = [CrashMode::DropUnsynced, CrashMode::TearLastWrite, CrashMode::KeepRandomUnsynced]
                [(seed % 3) as usize];
            let after = storage.crash_with(mode);
            for thread in threads {
                thread.join().expect("thread");
            }
            let reopened = open_fault(&config, &after);
            let recovered = reopened.take_recovered();
            let appended = appended.lock().expect("lock");
            let mut seen = BTreeSet::new();
            for record in &recovered {
                assert!(seen.insert(record.txn), "{engine} seed {seed}: txn {} came back twice", record.txn);
                assert_eq!(
                    Some(&record.payload),
                    appended.get(&record.txn),
                    "{engine} seed {seed}: bad record"
                );
            }
            for txn in before.keys() {
                assert!(seen.contains(txn), "{engine} seed {seed}: acknowledged txn {txn:#x} lost");
            }
        }
    }
}

/// Bug guarded against: a slot file whose only header is torn (a crash while the header is
/// rewritten to grow the file) could never be opened again. The backup copy, written and
/// synced first, takes over; only when both copies are damaged does open refuse, naming
/// the file.
#[test]
fn a_damaged_primary_header_falls_back_to_the_backup() {
    let storage = FaultStorage::new(21);
    let config = config(Path::new("/log"), EngineKind::SlotsFsync, 8);
    open_fault(&config, &storage).append(4, b"behind a damaged header").expect("append");
    let slots_file = Path::new("/log/slots.dat");
    storage.corrupt(slots_file, 10, 0xff).expect("damage the primary header");
    let log = open_fault(&config, &storage);
    assert_eq!(
        log.take_recovered(),
        vec![LiveRecord { txn: 4, payload: b"behind a damaged header".to_vec() }]
    );
    drop(log);
    storage.corrupt(slots_file, 10, 0xff).expect("undo");
    storage.corrupt(slots_file, 2048 + 10, 0xff).expect("damage the backup");
    assert_eq!(open_fault(&config, &storage).take_recovered().len(), 1, "a damaged backup alone is harmless");
    storage.corrupt(slots_file, 10, 0xff).expect("damage the primary too");
    match SlotsLog::open(&config, Arc::new(storage.clone())) {
        Err(LogError::Corrupted { path, .. }) => assert_eq!(path, slots_file),
        Err(other) => panic!("expected Corrupted, got {other:?}"),
        Ok(_) => panic!("two damaged headers must refuse to open"),
    }
}

/// Bug guarded against: completing a transaction of several records by clearing each slot
/// separately. Unsynced writes reach the disk in any order, so a crash could bring the
/// transaction back with some of its records missing. Completion must be one write (the
/// head's trailer), and the other slots must not be reused before it is durable.
#[test]
fn completion_of_a_multi_record_transaction_is_atomic() {
    for engine in FLAVOURS {
        for seed in 0..24u64 {
            let storage = FaultStorage::new(seed);
            let mut config = config(Path::new("/log"), engine, 6);
            let log = open_fault(&config, &storage);
            for i in 0..4 {
                log.append(1, &payload(1, i)).expect("append");
            }
            log.append(2, b"other").expect("append");
            drop(log);
            config.sync = SyncPolicy::Window(Duration::from_secs(3600));
            let log = open_fault(&config, &storage);
            assert_eq!(log.take_recovered().len(), 5);
            log.complete(1).expect("complete");
            // Reuse every free slot while the completion is not durable yet (the appends sync
            // first when no slot is free).
            for i in 0..5 {
                log.append(10 + i, &payload(10 + i, 0)).expect("append into a reused slot");
            }
            let mode = [CrashMode::KeepRandomUnsynced, CrashMode::TearLastWrite, CrashMode::DropUnsynced]
                [(seed % 3) as usize];
            let after = storage.crash_with(mode);
            drop(log);
            let recovered = by_txn(&open_fault(&config, &after).take_recovered());
            if let Some(records) = recovered.get(&1) {
                let all: Vec<Vec<u8>> = (0..4).map(|i| payload(1, i)).collect();
                assert_eq!(records, &all, "{engine} seed {seed}: a transaction came back in part");
            }
            assert_eq!(recovered.get(&2), Some(&vec![b"other".to_vec()]), "{engine} seed {seed}");
        }
    }
}

/// When every slot is live or waits for its completion to become durable, `append` and
/// `append_with` run (or hand to a worker) the sync that frees them instead of failing.
#[test]
fn slots_waiting_for_a_durable_completion_are_freed_by_the_next_append() {
    for engine in FLAVOURS {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = config(dir.path(), engine, 3);
        let log = open_std(&config);
        for i in 0..3 {
            log.append(1, &payload(1, i)).expect("append");
        }
        log.complete(1).expect("complete");
        assert_eq!(log.free_slots(), 3, "the head is free at once, the others pending");
        let (sender, receiver) = std::sync::mpsc::channel();
        for txn in 5..8u64 {
            let sender = sender.clone();
            log.append_with(txn, b"reuse", Box::new(move |r| sender.send((txn, r)).expect("send")));
        }
        for _ in 0..3 {
            let (txn, result) = receiver.recv().expect("callback");
            result.unwrap_or_else(|e| panic!("{engine}: append_with of txn {txn} failed: {e}"));
        }
        assert!(matches!(log.append(9, b"x"), Err(LogError::Full(_))));
        drop(log);
        let recovered: BTreeSet<TxnKey> = open_std(&config).take_recovered().iter().map(|r| r.txn).collect();
        assert_eq!(recovered, [5, 6, 7].into_iter().collect(), "{engine}");
    }
}

/// Guards against live slots zero-filled after a clean close reading as free slots and the
/// log opening with a fraction of its records: the clean close records the live count,
/// and open refuses with the file named. A clean close itself reopens exactly.
#[test]
fn live_slots_zeroed_after_a_clean_close_are_refused() {
    for engine in FLAVOURS {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = config(dir.path(), engine, 64);
        let log = open_std(&config);
        for txn in 0..20u64 {
            log.append(txn, &payload(txn, 0)).expect("append");
        }
        for txn in 0..5u64 {
            log.complete(txn).expect("complete");
        }
        drop(log);
        let log = open_std(&config);
        assert_eq!(log.take_recovered().len(), 15, "{engine}: a clean close reopens exactly");
        drop(log);
        let path = dir.path().join(decree_log::engine::slots::layout::SLOTS_FILE);
        let mut bytes = std::fs::read(&path).expect("read slots");
        let from = decree_log::engine::slots::layout::HEADER_AREA_BYTES as usize + 10 * SLOT_BYTES as usize;
        bytes[from..].fill(0);
        std::fs::write(&path, &bytes).expect("zero-fill the second half of the live slots");
        match SlotsLog::open(&config, Arc::new(StdStorage)) {
            Err(LogError::Lost { path: reported, reason, .. }) => {
                assert_eq!(reported, path, "{engine}");
                assert!(reason.contains("15 live records"), "{engine}: {reason}");
            }
            Err(other) => panic!("{engine}: expected lost data, got {other}"),
            Ok(log) => panic!("{engine}: opened with {} of 15 live records", log.take_recovered().len()),
        }
    }
}
