//! Tests of the outcome memory (`decree_log::outcomes`): lookups across reopen, eviction,
//! capacity changes, batching, and what survives power loss, torn writes, failed syncs and
//! damaged slots. Crash tests run on the fault-injecting storage; the others on real files.

use decree_log::io::{StdStorage, Storage};
use decree_log::outcomes::{
    outcomes_path, CAPACITY_MAX, FLUSH_BATCH, ID_BYTES_MAX, OUTCOMES_FILE, SLOT_BYTES, WAITING_MAX,
};
use decree_log::testing::fault::{CrashMode, FaultStorage};
use decree_log::{DurableCallback, LogError, OutcomeMemory, RememberedEntry};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// A flush delay long enough that only `sync`, a full batch or drop flushes.
const LONG: Duration = Duration::from_secs(3600);
/// How long a test waits for a callback before calling it lost.
const PATIENCE: Duration = Duration::from_secs(20);

fn fault_dir() -> PathBuf {
    PathBuf::from("/outcomes-test/state")
}

fn open_fault(storage: &FaultStorage, capacity: u32, delay: Duration) -> OutcomeMemory {
    OutcomeMemory::open(Arc::new(storage.clone()), &fault_dir(), capacity, delay)
        .expect("open on fault storage")
}

fn open_std(dir: &Path, capacity: u32, delay: Duration) -> OutcomeMemory {
    OutcomeMemory::open(Arc::new(StdStorage), dir, capacity, delay).expect("open on the file system")
}

fn id(i: u32) -> Vec<u8> {
    format!("xid-{i:04}").into_bytes()
}

fn outcome(i: u32) -> u8 {
    (i % 250 + 1) as u8
}

/// A callback and the channel its result arrives on.
fn ack() -> (DurableCallback, mpsc::Receiver<Result<(), LogError>>) {
    let (tx, rx) = mpsc::channel();
    (Box::new(move |result| drop(tx.send(result))), rx)
}

fn result_of(rx: &mpsc::Receiver<Result<(), LogError>>) -> Result<(), LogError> {
    rx.recv_timeout(PATIENCE).expect("the callback was called")
}

/// Remembers `id(i)` with `outcome(i)` and waits until it is durable.
fn remember_durably(memory: &OutcomeMemory, i: u32) -> Option<RememberedEntry> {
    let (done, rx) = ack();
    let evicted = memory.remember(&id(i), outcome(i), done).expect("remembered");
    result_of(&rx).expect("durable");
    evicted
}

/// Remembers `id(i)` for each `i`, returning the receivers of their callbacks.
fn remember_all(
    memory: &OutcomeMemory,
    ids: std::ops::Range<u32>,
) -> Vec<mpsc::Receiver<Result<(), LogError>>> {
    ids.map(|i| {
        let (done, rx) = ack();
        memory.remember(&id(i), outcome(i), done).expect("remembered");
        rx
    })
    .collect()
}

fn evicted(i: u32) -> Option<RememberedEntry> {
    Some(RememberedEntry { id: id(i), outcome: outcome(i) })
}

/// The sequence number stored in `slot` of a file image (bytes 17..25 of the slot).
fn sequence_in(image: &[u8], slot: usize) -> u64 {
    let at = slot * SLOT_BYTES + 17;
    u64::from_le_bytes(image[at..at + 8].try_into().expect("8 bytes"))
}

#[test]
fn remembered_outcomes_survive_reopen_and_sequences_continue() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let memory = open_std(dir.path(), 8, Duration::ZERO);
        assert!(memory.is_empty() && memory.open_warnings().is_empty());
        for i in 1..=3 {
            assert_eq!(remember_durably(&memory, i), None);
        }
        assert_eq!((memory.lookup(&id(2)), memory.lookup(&id(9)), memory.len()), (Some(outcome(2)), None, 3));
    }
    let path = dir.path().join(OUTCOMES_FILE);
    assert_eq!(std::fs::metadata(&path).expect("outcomes.dat").len(), 8 * SLOT_BYTES as u64);
    {
        let memory = open_std(dir.path(), 8, Duration::ZERO);
        assert!(memory.open_warnings().is_empty(), "{:?}", memory.open_warnings());
        assert_eq!(memory.len(), 3);
        for i in 1..=3 {
            assert_eq!(memory.lookup(&id(i)), Some(outcome(i)), "id {i} after reopen");
        }
        assert_eq!(remember_durably(&memory, 4), None);
    }
    // Sequence 4 went to slot 4: had the numbering restarted at 1, it would have
    // overwritten id 1 in slot 1.
    let image = std::fs::read(&path).expect("read outcomes.dat");
    assert_eq!((1..=4).map(|slot| sequence_in(&image, slot)).collect::<Vec<_>>(), vec![1, 2, 3, 4]);
    let memory = open_std(dir.path(), 8, Duration::ZERO);
    assert_eq!(memory.len(), 4);
    for i in 1..=4 {
        assert_eq!(memory.lookup(&id(i)), Some(outcome(i)));
    }
    assert_eq!(outcomes_path(dir.path()), path);
}

#[test]
fn a_full_ring_evicts_the_oldest_and_reopen_agrees() {
    let storage = FaultStorage::new(1);
    {
        let memory = open_fault(&storage, 4, Duration::ZERO);
        let returned: Vec<Option<RememberedEntry>> = (0..6).map(|i| remember_durably(&memory, i)).collect();
        assert_eq!(returned, vec![None, None, None, None, evicted(0), evicted(1)]);
        assert_eq!((memory.len(), memory.capacity()), (4, 4));
        assert_eq!((memory.lookup(&id(0)), memory.lookup(&id(1))), (None, None));
    }
    let memory = open_fault(&storage.crash(), 4, Duration::ZERO);
    assert_eq!(memory.len(), 4);
    assert_eq!((memory.lookup(&id(0)), memory.lookup(&id(1))), (None, None));
    for i in 2..6 {
        assert_eq!(memory.lookup(&id(i)), Some(outcome(i)), "id {i}");
    }
    // The ring goes on where it stopped: the oldest survivor goes next.
    assert_eq!(remember_durably(&memory, 6), evicted(2));
}

#[test]
fn a_newer_outcome_for_the_same_id_wins_before_and_after_reopen() {
    let storage = FaultStorage::new(2);
    let (a, b) = (b"txn-a".as_slice(), b"txn-b".as_slice());
    {
        let memory = open_fault(&storage, 4, Duration::ZERO);
        for (the_id, code) in [(a, 1), (b, 1), (a, 2)] {
            let (done, rx) = ack();
            assert_eq!(memory.remember(the_id, code, done).expect("remembered"), None);
            result_of(&rx).expect("durable");
        }
        assert_eq!((memory.lookup(a), memory.lookup(b), memory.len()), (Some(2), Some(1), 2));
    }
    let storage = storage.crash();
    {
        let memory = open_fault(&storage, 4, Duration::ZERO);
        assert_eq!((memory.lookup(a), memory.lookup(b), memory.len()), (Some(2), Some(1), 2));
        // Sequence 4 fills the empty slot 0; 5 overwrites a's older entry, which is not
        // a lost memory; 6 overwrites b's only entry.
        assert_eq!(remember_durably(&memory, 10), None);
        assert_eq!(remember_durably(&memory, 11), None, "a's newer entry still holds its memory");
        assert_eq!(memory.lookup(a), Some(2));
        assert_eq!(remember_durably(&memory, 12), Some(RememberedEntry { id: b.to_vec(), outcome: 1 }));
        assert_eq!((memory.lookup(b), memory.len()), (None, 4));
    }
    let memory = open_fault(&storage.crash(), 4, Duration::ZERO);
    assert_eq!((memory.lookup(a), memory.lookup(b), memory.len()), (Some(2), None, 4));
    assert!(memory.open_warnings().is_empty());
}

#[test]
fn a_capacity_change_keeps_the_newest_entries() {
    let storage = FaultStorage::new(3);
    let path = outcomes_path(&fault_dir());
    {
        let memory = open_fault(&storage, 8, LONG);
        remember_all(&memory, 0..8);
        memory.sync().expect("sync");
    }
    // A rewrite interrupted before its rename leaves a temporary file; open removes it.
    let tmp = fault_dir().join("outcomes.dat.tmp");
    storage.open(&tmp, true).expect("tmp").write_all_at(b"junk", 0).expect("write");
    {
        let memory = open_fault(&storage, 3, LONG);
        assert_eq!(memory.len(), 3);
        for i in 0..8 {
            let expected = (i >= 5).then(|| outcome(i));
            assert_eq!(memory.lookup(&id(i)), expected, "id {i} after shrinking to 3");
        }
        let warnings = memory.open_warnings().join("\n");
        assert!(warnings.contains("5 oldest") && warnings.contains("from 8 to 3"), "{warnings}");
        assert!(!storage.list(&fault_dir()).expect("list").contains(&tmp), "the temporary file is gone");
        assert_eq!(storage.read_live(&path).expect("file").len(), 3 * SLOT_BYTES);
        let (done, rx) = ack();
        assert_eq!(
            memory.remember(&id(8), outcome(8), done).expect("remembered"),
            evicted(5),
            "the oldest kept entry goes first"
        );
        memory.sync().expect("sync");
        result_of(&rx).expect("durable");
    }
    // The rename and the new entry were durable.
    let storage = storage.crash();
    {
        let memory = open_fault(&storage, 3, LONG);
        assert!(memory.open_warnings().is_empty(), "{:?}", memory.open_warnings());
        assert_eq!(
            (6..=8).map(|i| memory.lookup(&id(i))).collect::<Vec<_>>(),
            vec![Some(outcome(6)), Some(outcome(7)), Some(outcome(8))]
        );
    }
    let storage = storage.crash();
    let memory = open_fault(&storage, 10, LONG);
    assert!(memory.open_warnings().is_empty(), "growing forgets nothing");
    assert_eq!(memory.len(), 3);
    assert_eq!(storage.read_live(&path).expect("file").len(), 10 * SLOT_BYTES);
    for i in 9..16 {
        let (done, _rx) = ack();
        assert_eq!(
            memory.remember(&id(i), outcome(i), done).expect("remembered"),
            None,
            "room for 10: id {i}"
        );
    }
    let (done, _rx) = ack();
    assert_eq!(memory.remember(&id(16), outcome(16), done).expect("remembered"), evicted(6));
    memory.sync().expect("sync");
    drop(memory);
    let memory = open_fault(&storage.crash(), 10, LONG);
    assert_eq!(memory.len(), 10);
    assert!((7..=16).all(|i| memory.lookup(&id(i)) == Some(outcome(i))));
}

#[test]
fn acknowledged_entries_survive_power_loss() {
    for (seed, mode) in
        [(4, CrashMode::DropUnsynced), (5, CrashMode::KeepRandomUnsynced), (6, CrashMode::KeepRandomUnsynced)]
    {
        let storage = FaultStorage::new(seed);
        let memory = open_fault(&storage, 16, LONG);
        let acked = remember_all(&memory, 0..10);
        memory.sync().expect("sync");
        for rx in &acked {
            assert!(matches!(rx.try_recv(), Ok(Ok(()))), "sync returns after the callbacks ran");
        }
        // Queued, not flushed (the delay is long): their callbacks have not run.
        let queued = remember_all(&memory, 10..13);
        assert!(queued.iter().all(|rx| rx.try_recv().is_err()));
        let after = open_fault(&storage.crash_with(mode), 16, LONG);
        for i in 0..10 {
            assert_eq!(after.lookup(&id(i)), Some(outcome(i)), "{mode:?}: acknowledged id {i} lost");
        }
        for i in 10..13 {
            let found = after.lookup(&id(i));
            assert!(found.is_none() || found == Some(outcome(i)), "{mode:?}: id {i} misread as {found:?}");
            if mode == CrashMode::DropUnsynced {
                assert_eq!(found, None, "an unsynced entry survived power loss");
            }
        }
        assert!(after.open_warnings().is_empty(), "{:?}", after.open_warnings());
    }
}

/// Crashes while the flusher's sync of a slot overwrite is in flight, with the write torn
/// at a random byte: the slot reads back as the new entry whole, the old entry whole, or
/// damaged with a warning naming its offset, never as a mix.
#[test]
fn a_torn_entry_is_ignored_with_a_warning_never_misread() {
    let path = outcomes_path(&fault_dir());
    let (mut damaged, mut whole) = (0, 0);
    for seed in 0..16u64 {
        let storage = FaultStorage::new(seed);
        let memory = open_fault(&storage, 4, Duration::ZERO);
        // Ids of different lengths, so that old and new frames overlap differently.
        let long_id = |i: u32| {
            let mut bytes = id(i);
            bytes.resize(40 + (i as usize * 31 + seed as usize * 7) % (ID_BYTES_MAX - 40), b'x');
            bytes
        };
        for i in 0..4 {
            let (done, rx) = ack();
            memory.remember(&long_id(i), outcome(i), done).expect("remembered");
            result_of(&rx).expect("durable");
        }
        storage.set_sync_delay(Duration::from_millis(100));
        let before = storage.read_live(&path).expect("file");
        let (done, _rx) = ack();
        // Sequence 5 overwrites slot 1, which holds id 0.
        assert_eq!(
            memory.remember(&long_id(4), outcome(4), done).expect("remembered").map(|e| e.id),
            Some(long_id(0))
        );
        let started = Instant::now();
        while storage.read_live(&path).expect("file")[SLOT_BYTES..2 * SLOT_BYTES]
            == before[SLOT_BYTES..2 * SLOT_BYTES]
        {
            assert!(started.elapsed() < PATIENCE, "the flusher never wrote slot 1");
            std::thread::yield_now();
        }
        let crashed = storage.crash_with(CrashMode::TearLastWrite);
        let after = open_fault(&crashed, 4, Duration::ZERO);
        for i in 1..4 {
            assert_eq!(after.lookup(&long_id(i)), Some(outcome(i)), "seed {seed}: acknowledged id {i}");
        }
        let old = after.lookup(&long_id(0));
        let new = after.lookup(&long_id(4));
        let warned =
            after.open_warnings().iter().any(|w| w.contains(OUTCOMES_FILE) && w.contains("offset 192"));
        match (old, new, warned) {
            (Some(code), None, false) => assert_eq!(code, outcome(0), "seed {seed}"),
            (None, Some(code), false) => {
                assert_eq!(code, outcome(4), "seed {seed}");
                whole += 1;
            }
            (None, None, true) => damaged += 1,
            other => panic!("seed {seed}: slot 1 read back as (old, new, warned) = {other:?}"),
        }
        assert!(after.open_warnings().len() <= 1, "{:?}", after.open_warnings());
    }
    assert!(damaged > 0, "no seed tore the entry's frame ({whole} kept it whole)");
}

#[test]
fn a_failed_sync_fails_that_callback_and_every_later_one() {
    let storage = FaultStorage::new(7);
    let path = outcomes_path(&fault_dir());
    let memory = open_fault(&storage, 8, Duration::ZERO);
    remember_durably(&memory, 0);
    // Only the next sync fails: later ones would succeed, but the memory must not retry.
    storage.fail_one_sync_after(0);
    let (done, rx) = ack();
    memory.remember(&id(1), outcome(1), done).expect("remembered");
    match result_of(&rx) {
        Err(LogError::SyncFailed { path: failed, .. }) => assert_eq!(failed, path),
        other => panic!("expected SyncFailed, got {other:?}"),
    }
    let syncs = storage.syncs_done();
    let (done, _rx) = ack();
    let refused = memory.remember(&id(2), outcome(2), done);
    assert!(
        matches!(refused, Err(LogError::SyncFailed { .. })),
        "refused at once with the error: {refused:?}"
    );
    assert!(matches!(memory.sync(), Err(LogError::SyncFailed { .. })));
    assert_eq!(storage.syncs_done(), syncs, "nothing is synced after the failure");
    // What was remembered is still true; nothing new is remembered.
    assert_eq!(
        (memory.lookup(&id(0)), memory.lookup(&id(1)), memory.lookup(&id(2))),
        (Some(1), Some(2), None)
    );
    drop(memory);
    let after = open_fault(&storage.crash(), 8, Duration::ZERO);
    assert_eq!((after.lookup(&id(0)), after.lookup(&id(1))), (Some(outcome(0)), None));
}

#[test]
fn a_failed_write_stops_the_memory_too() {
    let storage = FaultStorage::new(8);
    let memory = open_fault(&storage, 8, Duration::ZERO);
    storage.fail_writes_after(0);
    let (done, rx) = ack();
    memory.remember(&id(1), outcome(1), done).expect("remembered");
    assert!(matches!(result_of(&rx), Err(LogError::Io { .. })));
    storage.clear_faults();
    let (done, _rx) = ack();
    let refused = memory.remember(&id(2), outcome(2), done);
    assert!(matches!(refused, Err(LogError::Io { .. })), "fail-stop: no write after the failure");
    assert!(memory.sync().is_err());
}

#[test]
fn a_damaged_slot_is_reported_with_its_offset_and_read_as_empty() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(OUTCOMES_FILE);
    {
        let memory = open_std(dir.path(), 8, Duration::ZERO);
        for i in 1..=5 {
            remember_durably(&memory, i);
        }
    }
    // Sequence 3 (id 3) lives in slot 3; flip a bit of its id.
    let mut image = std::fs::read(&path).expect("read");
    image[3 * SLOT_BYTES + 30] ^= 0x40;
    std::fs::write(&path, &image).expect("write");
    {
        let memory = open_std(dir.path(), 8, Duration::ZERO);
        let warnings = memory.open_warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains(&path.display().to_string()), "{}", warnings[0]);
        assert!(warnings[0].contains("offset 576"), "{}", warnings[0]);
        assert_eq!(memory.lookup(&id(3)), None, "a damaged entry is forgotten, never misread");
        assert_eq!(memory.len(), 4);
        for i in [1, 2, 4, 5] {
            assert_eq!(memory.lookup(&id(i)), Some(outcome(i)));
        }
        // Sequences 6 to 11 go round the ring and overwrite the damaged slot with 11.
        for i in 6..=11 {
            remember_durably(&memory, i);
        }
    }
    let memory = open_std(dir.path(), 8, Duration::ZERO);
    assert!(memory.open_warnings().is_empty(), "{:?}", memory.open_warnings());
    assert_eq!(memory.lookup(&id(11)), Some(outcome(11)));
}

#[test]
fn the_volatile_memory_answers_and_evicts_without_disk() {
    let memory = OutcomeMemory::volatile(2);
    let called = Arc::new(AtomicBool::new(false));
    let flag = called.clone();
    let done: DurableCallback = Box::new(move |result| {
        result.expect("volatile callbacks succeed");
        flag.store(true, Ordering::SeqCst);
    });
    assert_eq!(memory.remember(&id(0), outcome(0), done).expect("remembered"), None);
    assert!(called.load(Ordering::SeqCst), "the callback ran before remember returned");
    let (done, rx) = ack();
    assert_eq!(memory.remember(&id(1), outcome(1), done).expect("remembered"), None);
    assert!(matches!(rx.try_recv(), Ok(Ok(()))));
    let (done, _rx) = ack();
    assert_eq!(memory.remember(&id(2), outcome(2), done).expect("remembered"), evicted(0));
    assert_eq!(
        (memory.lookup(&id(0)), memory.lookup(&id(2)), memory.len(), memory.capacity()),
        (None, Some(3), 2, 2)
    );
    memory.sync().expect("nothing to sync");
    assert!(memory.open_warnings().is_empty());
    // An id longer than a slot holds is refused, not truncated.
    let (done, rx) = ack();
    let refused = memory.remember(&[1; ID_BYTES_MAX + 1], 1, done);
    assert!(matches!(refused, Err(LogError::RecordTooLarge { .. })), "{refused:?}");
    assert!(rx.try_recv().is_err(), "a refused entry's callback is never called");
    assert_eq!(memory.len(), 2);
}

#[test]
fn a_capacity_out_of_range_is_refused() {
    let storage = FaultStorage::new(9);
    for capacity in [0, CAPACITY_MAX + 1] {
        let opened = OutcomeMemory::open(Arc::new(storage.clone()), &fault_dir(), capacity, Duration::ZERO);
        assert!(matches!(opened, Err(LogError::Config(_))), "capacity {capacity}");
        assert!(std::panic::catch_unwind(|| OutcomeMemory::volatile(capacity)).is_err());
    }
}

#[test]
fn queued_entries_are_written_together_with_one_sync() {
    let storage = FaultStorage::new(10);
    let memory = open_fault(&storage, 64, LONG);
    let syncs = storage.syncs_done();
    let acks = remember_all(&memory, 0..40);
    std::thread::sleep(Duration::from_millis(20));
    assert!(acks.iter().all(|rx| rx.try_recv().is_err()), "nothing flushes before the delay");
    assert_eq!(memory.lookup(&id(7)), Some(outcome(7)), "visible before it is durable");
    memory.sync().expect("sync");
    assert_eq!(storage.syncs_done() - syncs, 1, "one sync for the batch");
    assert!(acks.iter().all(|rx| matches!(rx.try_recv(), Ok(Ok(())))));
}

#[test]
fn a_full_batch_flushes_without_waiting_for_the_delay() {
    let storage = FaultStorage::new(11);
    let memory = open_fault(&storage, 1024, LONG);
    let syncs = storage.syncs_done();
    let acks = remember_all(&memory, 0..FLUSH_BATCH as u32);
    for rx in &acks {
        result_of(rx).expect("durable without sync()");
    }
    assert_eq!(storage.syncs_done() - syncs, 1);
}

#[test]
fn the_flush_delay_elapses_into_a_flush() {
    let storage = FaultStorage::new(12);
    let memory = open_fault(&storage, 16, Duration::from_millis(40));
    let started = Instant::now();
    let acks = remember_all(&memory, 0..3);
    for rx in &acks {
        result_of(rx).expect("durable once the delay passed");
    }
    assert!(started.elapsed() >= Duration::from_millis(40), "flushed after {:?}", started.elapsed());
}

#[test]
fn dropping_the_memory_flushes_what_is_queued() {
    let storage = FaultStorage::new(13);
    let memory = open_fault(&storage, 16, LONG);
    let acks = remember_all(&memory, 0..3);
    drop(memory);
    assert!(acks.iter().all(|rx| matches!(rx.try_recv(), Ok(Ok(())))), "drop ran every callback");
    let after = open_fault(&storage.crash(), 16, LONG);
    assert!((0..3).all(|i| after.lookup(&id(i)) == Some(outcome(i))));
}

#[test]
fn more_entries_than_slots_in_one_flush_keep_the_newest() {
    let storage = FaultStorage::new(14);
    let memory = open_fault(&storage, 4, LONG);
    let syncs = storage.syncs_done();
    let mut acks = Vec::new();
    for i in 0..10 {
        let (done, rx) = ack();
        let expected = if i >= 4 { evicted(i - 4) } else { None };
        assert_eq!(memory.remember(&id(i), outcome(i), done).expect("remembered"), expected, "id {i}");
        acks.push(rx);
    }
    memory.sync().expect("sync");
    assert_eq!(storage.syncs_done() - syncs, 1);
    assert!(acks.iter().all(|rx| matches!(rx.try_recv(), Ok(Ok(())))), "superseded entries are acknowledged");
    let after = open_fault(&storage.crash(), 4, LONG);
    assert!(after.open_warnings().is_empty());
    assert_eq!(after.len(), 4);
    assert!((0..10).all(|i| after.lookup(&id(i)) == (i >= 6).then(|| outcome(i))));
}

#[test]
fn a_full_queue_refuses_instead_of_growing() {
    let storage = FaultStorage::new(15);
    let memory = open_fault(&storage, 1 << 15, LONG);
    // The first full batch's sync takes long; the entries after it queue behind it until
    // the limit refuses one.
    storage.set_sync_delay(Duration::from_secs(3));
    let mut acks = Vec::new();
    let refused = loop {
        let i = acks.len() as u32;
        assert!(acks.len() < 3 * WAITING_MAX, "{i} entries and none refused");
        let (done, rx) = ack();
        match memory.remember(&id(i), 1, done) {
            Err(LogError::Full(_)) => break i,
            Err(other) => panic!("entry {i}: {other:?} before the flush could finish"),
            Ok(_) => match rx.try_recv() {
                Ok(early) => panic!("entry {i}: {early:?} before the flush could finish"),
                Err(_) => acks.push(rx),
            },
        }
    };
    assert!(refused as usize >= WAITING_MAX + FLUSH_BATCH, "refused after only {refused} entries");
    assert_eq!(memory.lookup(&id(refused)), None, "a refused entry is not remembered");
    storage.set_sync_delay(Duration::ZERO);
    memory.sync().expect("the queue drains");
    assert!(acks.iter().all(|rx| matches!(rx.try_recv(), Ok(Ok(())))));
    let (done, rx) = ack();
    memory.remember(b"after-the-drain", 1, done).expect("remembered");
    memory.sync().expect("sync");
    result_of(&rx).expect("accepted again");
}

#[test]
fn concurrent_remembers_are_all_acknowledged_and_survive() {
    let storage = FaultStorage::new(16);
    let memory = Arc::new(open_fault(&storage, 2000, Duration::from_millis(1)));
    let threads: Vec<_> = (0..4u32)
        .map(|t| {
            let memory = memory.clone();
            std::thread::spawn(move || {
                let acks = remember_all(&memory, t * 300..(t + 1) * 300);
                acks.iter().for_each(|rx| result_of(rx).expect("durable"));
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().expect("thread"));
    let after = open_fault(&storage.crash(), 2000, Duration::ZERO);
    assert_eq!(after.len(), 1200);
    assert!((0..1200).all(|i| after.lookup(&id(i)) == Some(outcome(i))));
}

/// Guards against an outcome memory that cannot be closed by its own callback: like the
/// log's, a state server's callback holds the state that owns the memory, and the flusher
/// thread that calls it may drop the last reference. Joining itself, that thread panicked
/// before the callbacks after it in its batch were called.
#[test]
fn a_memory_dropped_by_its_own_callback_closes_and_calls_every_callback() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let memory = Arc::new(open_std(dir.path(), 64, Duration::from_millis(20)));
    let (tx, rx) = mpsc::channel();
    let last = memory.clone();
    let first = tx.clone();
    let closing: DurableCallback = Box::new(move |r| {
        drop(last);
        first.send(("closing", r)).expect("receiver");
    });
    memory.remember(b"a", 1, closing).expect("remembered");
    let after: DurableCallback = Box::new(move |r| tx.send(("after", r)).expect("receiver"));
    memory.remember(b"b", 2, after).expect("remembered");
    drop(memory);
    let mut seen = Vec::new();
    for _ in 0..2 {
        let (which, r) = rx.recv_timeout(Duration::from_secs(30)).expect("a callback was never called");
        r.unwrap_or_else(|e| panic!("{which}: {e}"));
        seen.push(which);
    }
    seen.sort_unstable();
    assert_eq!(seen, ["after", "closing"]);
    let reopened = open_std(dir.path(), 64, Duration::from_millis(20));
    assert_eq!(reopened.lookup(b"a"), Some(1));
    assert_eq!(reopened.lookup(b"b"), Some(2));
}
