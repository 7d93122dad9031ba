//! The outcome memory: a durable, bounded ring of (id, outcome) entries, so that the state
//! server answers "what became of transaction X?" truthfully after restarts.
//!
//! When a decided transaction finishes (or the server rolls one back itself, or a branch
//! reports a heuristic outcome), the server remembers its outcome here, and only once that
//! entry is durable writes the log's completion record that frees the decision. The
//! memory holds at most `capacity` entries; the oldest is overwritten first. It knows
//! nothing of Xids: an id is opaque bytes (1 to [`ID_BYTES_MAX`]) and an outcome a code
//! 1..=255 that the caller defines.
//!
//! # File format
//!
//! `outcomes.dat` is pre-allocated and zero-filled once ([`StorageFile::preallocate`]), so
//! that `fdatasync` flushes no metadata. It has no header: it is `capacity` slots of
//! [`SLOT_BYTES`] (192) bytes, and its length tells the capacity. Slot `i`, at offset
//! `192 * i`, holds the entry whose sequence number `s` has `s % capacity == i`; a slot is
//! always written whole. One slot, little-endian, framed as in [`crate::record`]:
//!
//! ```text
//! offset   size  field
//! 0        4     len      bytes after this 8-byte prefix: 19 + n
//! 4        4     crc      CRC32C of len (4 bytes LE) followed by bytes 8 .. 8 + len
//! 8        1     kind     1 (data)
//! 9        8     tag      "DCROUT01" (the record frame's txn field)
//! 17       8     sequence u64, >= 1, unique within the file
//! 25       1     outcome  u8, 1..=255, the caller's code
//! 26       1     id_len   n, 1..=134
//! 27       n     id
//! 27 + n   ..    zeros up to byte 192
//! ```
//!
//! A slot of zeros is empty. At open every slot is read: a slot whose frame fails its
//! checks (CRC, kind, tag, lengths, non-zero sequence and outcome) or whose sequence does
//! not map to its index is *damaged*: it is counted, reported (`tracing::warn!` and
//! [`OutcomeMemory::open_warnings`], naming the file and the offset) and treated as
//! empty (until the ring overwrites it, each open reports it again). Losing an entry only
//! makes the server answer "unknown", never a wrong answer: a torn write can only hit the
//! slots being overwritten, whose old entries were evicted already, and the CRC keeps a
//! mix of old and new bytes from reading as an entry; if a torn or lost write leaves an
//! old entry whole, that entry is still true. The valid entries are loaded; for an id
//! found twice the higher sequence wins. New sequence
//! numbers continue at the largest valid one found plus one, so a sequence number is
//! never reused while an entry bearing it can be on disk (one that never reached the disk,
//! or reads back damaged, may be reused: it lands in the same slot).
//!
//! A file whose length is not `capacity` slots (another capacity was configured, or the
//! length is not a whole number of slots) is rewritten at open: its newest entries, up to
//! the new capacity, are renumbered with consecutive sequence numbers ending at the
//! largest one found (so each has a slot of its own and new numbers still continue after
//! it) and written into `outcomes.dat.tmp`, which is zero-filled and synced, renamed over
//! `outcomes.dat`, and the directory synced; a crash leaves the old file or the new one.
//! A new memory is created the same way, so `outcomes.dat` is never seen half-created.
//! Dropped entries are reported in the open warnings. The memory takes no directory lock:
//! open it in a directory its caller owns (such as a log directory, under its `LOCK`).
//!
//! # Flushing
//!
//! [`OutcomeMemory::remember`] updates the in-memory index at once (lookups see the entry
//! before it is durable) and queues the entry; it never blocks on IO. One flusher thread
//! takes every entry queued since the previous flush, writes their slots with as few
//! `pwrite` calls as possible (the queued slots are contiguous: one write, or two at the
//! wrap-around), calls `sync_data` once, then calls the batch's callbacks. It flushes
//! when `flush_delay` has passed since the oldest queued entry was queued, at once when
//! [`FLUSH_BATCH`] entries wait, when [`OutcomeMemory::sync`] asks, or when the memory is
//! dropped (dropping flushes what is queued, then stops the thread); with a zero
//! `flush_delay` it flushes as soon as anything is queued.
//!
//! Bounds: the unflushed writes are bounded by the ring itself. The flusher writes the
//! *current* content of each dirty slot, so an entry queued and not yet flushed whose slot
//! is reused by a newer entry is simply superseded: at most `capacity` slots are written
//! per flush, however many entries were queued. Its callback is still called, after the
//! flush that wrote its slot's newer content; `remember` had returned it as evicted, and
//! the disk then holds what it would have held had it been flushed and then evicted. The
//! callbacks waiting for a flush are at most [`WAITING_MAX`]: beyond that `remember`
//! remembers nothing and calls the callback at once with [`LogError::Full`] (the caller
//! keeps the decision in the log and tries again later). The in-memory index (a map from
//! id to sequence and outcome, and one from slot to entry) holds at most `capacity`
//! entries; warnings kept from open are at most [`WARNINGS_MAX`] plus a summary line.
//!
//! A failed write or sync is fatal (fail-stop, never retried: after a failed `fdatasync`
//! the kernel may have dropped the dirty pages): that batch's callbacks, every callback
//! still queued and every later one get the error, `sync` returns it, and `remember`
//! changes nothing any more. Lookups keep answering from memory (what was remembered is
//! true, durable or not).

mod format;

pub use format::{ID_BYTES_MAX, OUTCOMES_FILE, SLOT_BYTES};

use self::format::SlotContent;
use crate::io::{Storage, StorageFile};
use crate::{DurableCallback, LogError};
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The largest capacity (16 Mi entries, a 3 GiB file): the index must fit in memory.
pub const CAPACITY_MAX: u32 = 16 << 20;
/// Entries waiting that make the flusher write at once instead of waiting for the delay.
pub const FLUSH_BATCH: usize = 256;
/// Callbacks that may wait for a flush; `remember` refuses more (see the module docs).
pub const WAITING_MAX: usize = 16_384;
/// Damaged slots reported one by one at open before a summary line takes over.
pub const WARNINGS_MAX: usize = 32;
/// Name of the file a capacity change or a creation writes before renaming it.
const TEMP_FILE: &str = "outcomes.dat.tmp";
/// Bytes read at a time while scanning slots at open.
const SCAN_CHUNK_BYTES: usize = 1 << 20;

/// The path of the outcome memory's file in `dir`, for tools that report on it.
pub fn outcomes_path(dir: &Path) -> PathBuf {
    dir.join(OUTCOMES_FILE)
}

/// An entry as the caller gave it, returned when the ring evicts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RememberedEntry {
    /// The id given to `remember`.
    pub id: Vec<u8>,
    /// The outcome code given to `remember`.
    pub outcome: u8,
}

/// One entry of the ring, as it is (or is about to be) in its slot.
#[derive(Debug, Clone)]
struct Entry {
    sequence: u64,
    id: Arc<[u8]>,
    outcome: u8,
}

/// Everything behind the one lock.
struct State {
    /// Each remembered id and the sequence and outcome of its newest entry; every one of
    /// them is the current entry of its slot in `ring`.
    index: HashMap<Arc<[u8]>, (u64, u8)>,
    /// Slot number to the entry it holds (on disk, or queued to be written there).
    ring: HashMap<u32, Entry>,
    /// The sequence number of the next entry.
    sequence_next: u64,
    /// Entries `queued_from .. sequence_next` wait for a flush (one callback each).
    queued_from: u64,
    /// When the oldest waiting entry was queued.
    queued_at: Option<Instant>,
    /// Callbacks of the waiting entries, in sequence order.
    waiting: Vec<DurableCallback>,
    /// Every entry up to this sequence number is durable (or superseded by one that is).
    durable_through: u64,
    /// `sync` wants every entry up to this sequence number durable.
    sync_wanted: u64,
    /// The error that stopped the memory (fail-stop).
    failed: Option<LogError>,
    /// The memory is being dropped: flush what is queued and exit.
    stopping: bool,
}

/// The file behind a durable memory.
struct Disk {
    path: PathBuf,
    file: Arc<dyn StorageFile>,
}

struct Shared {
    state: Mutex<State>,
    /// The flusher waits here for entries, a sync request or the end.
    work: Condvar,
    /// `sync` callers wait here for a flush to finish.
    flushed: Condvar,
    capacity: u32,
    flush_delay: Duration,
    /// `None` for the volatile memory.
    disk: Option<Disk>,
}

/// A durable, bounded memory of transaction outcomes (see the module documentation).
pub struct OutcomeMemory {
    shared: Arc<Shared>,
    flusher: Option<JoinHandle<()>>,
    warnings: Vec<String>,
}

/// The state server shares one memory between its runtime threads.
const _: fn() = || {
    fn shareable<T: Send + Sync>() {}
    shareable::<OutcomeMemory>();
};

impl std::fmt::Debug for OutcomeMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutcomeMemory")
            .field("path", &self.shared.disk.as_ref().map(|d| &d.path))
            .field("capacity", &self.shared.capacity)
            .field("len", &self.len())
            .finish()
    }
}

fn check_capacity(capacity: u32) -> Result<(), LogError> {
    if capacity == 0 || capacity > CAPACITY_MAX {
        return Err(LogError::Config(format!(
            "outcome memory capacity {capacity} is out of range: 1 to {CAPACITY_MAX} entries"
        )));
    }
    Ok(())
}

fn slot_of(sequence: u64, capacity: u32) -> u32 {
    (sequence % u64::from(capacity)) as u32
}

fn slot_offset(slot: u32) -> u64 {
    u64::from(slot) * SLOT_BYTES as u64
}

fn sync_error(path: &Path, e: &std::io::Error) -> LogError {
    LogError::SyncFailed { path: path.to_path_buf(), message: e.to_string() }
}

/// Calls a callback, containing its panic so that the flusher and the other callbacks go on.
fn call(done: DurableCallback, result: Result<(), LogError>) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| done(result))).is_err() {
        tracing::error!("an outcome memory callback panicked");
    }
}

/// Reads every slot of a file of `capacity` slots; returns the valid entries sorted by
/// sequence and reports damaged slots into `warnings`.
fn scan(
    file: &dyn StorageFile,
    path: &Path,
    capacity: u32,
    warnings: &mut Vec<String>,
) -> Result<Vec<Entry>, LogError> {
    let mut entries = Vec::new();
    let mut damaged = 0usize;
    let chunk_slots = SCAN_CHUNK_BYTES / SLOT_BYTES;
    let mut buf = vec![0u8; chunk_slots * SLOT_BYTES];
    let mut first = 0u32;
    while first < capacity {
        let n = chunk_slots.min((capacity - first) as usize);
        let bytes = &mut buf[..n * SLOT_BYTES];
        file.read_exact_at(bytes, slot_offset(first)).map_err(|e| LogError::io(path, e))?;
        for (i, slot_bytes) in bytes.chunks_exact(SLOT_BYTES).enumerate() {
            let slot = first + i as u32;
            match format::decode_slot(slot_bytes, slot, capacity) {
                SlotContent::Empty => {}
                SlotContent::Entry { sequence, outcome, id } => {
                    entries.push(Entry { sequence, id: Arc::from(id), outcome });
                }
                SlotContent::Damaged(reason) => {
                    damaged += 1;
                    if damaged <= WARNINGS_MAX {
                        let offset = slot_offset(slot);
                        tracing::warn!(path = %path.display(), offset, slot, %reason, "damaged outcome slot treated as empty");
                        warnings.push(format!(
                            "{}: damaged slot {slot} at offset {offset} treated as empty (its outcome is \
                             forgotten): {reason}",
                            path.display()
                        ));
                    }
                }
            }
        }
        first += n as u32;
    }
    if damaged > WARNINGS_MAX {
        let more = damaged - WARNINGS_MAX;
        tracing::warn!(path = %path.display(), damaged, "more damaged outcome slots treated as empty");
        warnings.push(format!("{}: {more} more damaged slots treated as empty", path.display()));
    }
    entries.sort_by_key(|e| e.sequence);
    Ok(entries)
}

/// Encodes `entries` (each in its slot: sequence modulo `capacity`) and writes them, one
/// `pwrite` per run of adjacent slots; does not sync.
fn write_entries(
    file: &dyn StorageFile,
    path: &Path,
    capacity: u32,
    entries: &[Entry],
) -> Result<(), LogError> {
    let mut buf = vec![0u8; entries.len() * SLOT_BYTES];
    for (entry, out) in entries.iter().zip(buf.chunks_exact_mut(SLOT_BYTES)) {
        format::encode_slot(out, entry.sequence, entry.outcome, &entry.id);
    }
    let mut run_start = 0;
    for i in 1..=entries.len() {
        let adjacent = i < entries.len()
            && slot_of(entries[i].sequence, capacity) == slot_of(entries[i - 1].sequence, capacity) + 1;
        if !adjacent {
            let first_slot = slot_of(entries[run_start].sequence, capacity);
            let bytes = &buf[run_start * SLOT_BYTES..i * SLOT_BYTES];
            file.write_all_at(bytes, slot_offset(first_slot)).map_err(|e| LogError::io(path, e))?;
            run_start = i;
        }
    }
    Ok(())
}

/// Keeps the newest `capacity` of `entries` (sorted by sequence), renumbered with
/// consecutive sequence numbers ending at the largest one, so each has a slot of its own.
fn keep_newest(mut entries: Vec<Entry>, capacity: u32) -> (Vec<Entry>, usize) {
    let dropped = entries.len().saturating_sub(capacity as usize);
    entries.drain(..dropped);
    if let Some(last) = entries.last().map(|e| e.sequence) {
        let first = last + 1 - entries.len() as u64;
        for (i, entry) in entries.iter_mut().enumerate() {
            assert!(entry.sequence <= first + i as u64, "sequences are sorted and distinct");
            entry.sequence = first + i as u64;
        }
    }
    (entries, dropped)
}

/// Writes a new file of `capacity` slots holding `entries` through `tmp`: zero-filled and
/// synced, entries written and synced, renamed over `path`, directory synced.
fn rewrite(
    storage: &dyn Storage,
    dir: &Path,
    path: &Path,
    tmp: &Path,
    capacity: u32,
    entries: &[Entry],
) -> Result<Arc<dyn StorageFile>, LogError> {
    let file = storage.open(tmp, true).map_err(|e| LogError::io(tmp, e))?;
    file.preallocate(u64::from(capacity) * SLOT_BYTES as u64).map_err(|e| LogError::io(tmp, e))?;
    if !entries.is_empty() {
        write_entries(&*file, tmp, capacity, entries)?;
        file.sync_data().map_err(|e| sync_error(tmp, &e))?;
    }
    storage.rename(tmp, path).map_err(|e| LogError::io(path, e))?;
    storage.sync_dir(dir).map_err(|e| sync_error(dir, &e))?;
    Ok(file)
}

impl OutcomeMemory {
    /// Opens or creates `dir/outcomes.dat` on `storage` with room for `capacity` entries
    /// (1 to [`CAPACITY_MAX`]) and reads back what it remembers; a file of another capacity
    /// is rewritten keeping its newest entries (see the module documentation).
    pub fn open(
        storage: Arc<dyn Storage>,
        dir: &Path,
        capacity: u32,
        flush_delay: Duration,
    ) -> Result<OutcomeMemory, LogError> {
        check_capacity(capacity)?;
        storage.create_dir_all(dir).map_err(|e| LogError::io(dir, e))?;
        let path = outcomes_path(dir);
        let tmp = dir.join(TEMP_FILE);
        let names = storage.list(dir).map_err(|e| LogError::io(dir, e))?;
        if names.contains(&tmp) {
            // Left by a rewrite that never reached its rename: the old file is intact.
            storage.remove(&tmp).map_err(|e| LogError::io(&tmp, e))?;
        }
        let wanted_len = u64::from(capacity) * SLOT_BYTES as u64;
        let mut warnings = Vec::new();
        let existing = if names.contains(&path) {
            let file = storage.open(&path, false).map_err(|e| LogError::io(&path, e))?;
            let len = file.len().map_err(|e| LogError::io(&path, e))?;
            let slots_on_disk = len / SLOT_BYTES as u64;
            if slots_on_disk > u64::from(CAPACITY_MAX) {
                return Err(LogError::Corrupted {
                    path,
                    offset: len,
                    reason: format!("{len} bytes is more than any outcome memory ({CAPACITY_MAX} slots)"),
                });
            }
            let tail = len % SLOT_BYTES as u64;
            if tail != 0 {
                let offset = len - tail;
                tracing::warn!(path = %path.display(), offset, tail, "outcome file ends in a partial slot");
                warnings.push(format!(
                    "{}: {tail} bytes at offset {offset} are not a whole slot and are ignored",
                    path.display()
                ));
            }
            let entries = scan(&*file, &path, slots_on_disk as u32, &mut warnings)?;
            Some((file, len, slots_on_disk as u32, entries))
        } else {
            None
        };
        let existed = existing.is_some();
        let (file, entries) = match existing {
            Some((file, len, _, entries)) if len == wanted_len => (file, entries),
            existing => {
                let (slots_on_disk, entries) = existing.map(|(_, _, n, e)| (n, e)).unwrap_or_default();
                let (entries, dropped) = keep_newest(entries, capacity);
                if existed {
                    tracing::info!(path = %path.display(), from = slots_on_disk, to = capacity, kept = entries.len(), dropped, "outcome memory resized");
                }
                if dropped > 0 {
                    let text = format!(
                        "{}: capacity changed from {slots_on_disk} to {capacity}: the {dropped} oldest \
                         outcomes are forgotten",
                        path.display()
                    );
                    tracing::warn!("{text}");
                    warnings.push(text);
                }
                let file = rewrite(&*storage, dir, &path, &tmp, capacity, &entries)?;
                (file, entries)
            }
        };

        let sequence_next = entries.last().map_or(1, |e| e.sequence + 1);
        let mut index = HashMap::with_capacity(entries.len());
        let mut ring = HashMap::with_capacity(entries.len());
        for entry in entries {
            // Sorted by sequence: a newer entry of the same id replaces the older one.
            index.insert(entry.id.clone(), (entry.sequence, entry.outcome));
            let previous = ring.insert(slot_of(entry.sequence, capacity), entry);
            assert!(previous.is_none(), "two entries for one slot after open");
        }
        tracing::info!(path = %path.display(), capacity, remembered = index.len(), sequence_next, "outcome memory opened");
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new(index, ring, sequence_next)),
            work: Condvar::new(),
            flushed: Condvar::new(),
            capacity,
            flush_delay,
            disk: Some(Disk { path, file }),
        });
        let flusher_shared = shared.clone();
        let flusher = std::thread::Builder::new()
            .name("decree-outcomes-flush".into())
            .spawn(move || flusher_loop(&flusher_shared))
            .map_err(|e| LogError::io(dir, e))?;
        Ok(OutcomeMemory { shared, flusher: Some(flusher), warnings })
    }

    /// A memory that keeps nothing on disk (the volatile engine): the same lookups and
    /// eviction, callbacks called at once with `Ok`.
    ///
    /// # Panics
    /// When `capacity` is 0 or above [`CAPACITY_MAX`] (a configuration that `open` refuses).
    pub fn volatile(capacity: u32) -> OutcomeMemory {
        if let Err(err) = check_capacity(capacity) {
            panic!("{err}");
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new(HashMap::new(), HashMap::new(), 1)),
            work: Condvar::new(),
            flushed: Condvar::new(),
            capacity,
            flush_delay: Duration::ZERO,
            disk: None,
        });
        OutcomeMemory { shared, flusher: None, warnings: Vec::new() }
    }

    /// Every remembered id with its outcome (at most the capacity): what a pair's primary
    /// sends a joining backup.
    pub fn entries(&self) -> Vec<(Vec<u8>, u8)> {
        self.shared.state.lock().index.iter().map(|(id, &(_, outcome))| (id.to_vec(), outcome)).collect()
    }

    /// The remembered outcome of `id`, if any; visible as soon as `remember` returns,
    /// before it is durable.
    pub fn lookup(&self, id: &[u8]) -> Option<u8> {
        self.shared.state.lock().index.get(id).map(|&(_, outcome)| outcome)
    }

    /// Remembers `outcome` for `id` (replacing an older entry of the same id in lookups)
    /// and returns the entry the full ring evicted, if that took away the memory of an id
    /// (an evicted entry whose id has a newer entry is not returned). Never blocks on IO:
    /// `durable` is called from the flusher thread once the entry is synced, or with the
    /// error if that flush failed. A refusal is returned instead, with nothing remembered
    /// and `durable` dropped uncalled, so that the caller decides at once what to keep:
    /// [`LogError::RecordTooLarge`] for an id longer than [`ID_BYTES_MAX`],
    /// [`LogError::Full`] when [`WAITING_MAX`] callbacks wait already, and the memory's
    /// error once it has failed (fail-stop). `durable` must not call
    /// [`OutcomeMemory::sync`] (it runs on the thread that sync waits for).
    ///
    /// # Panics
    /// When `id` is empty or `outcome` is 0: the caller's codes are 1..=255.
    pub fn remember(
        &self,
        id: &[u8],
        outcome: u8,
        durable: DurableCallback,
    ) -> Result<Option<RememberedEntry>, LogError> {
        assert!(!id.is_empty(), "an outcome memory id is never empty");
        assert!(outcome != 0, "outcome code 0 is reserved (zero-filled slots)");
        if id.len() > ID_BYTES_MAX {
            return Err(LogError::RecordTooLarge { len: id.len(), max: ID_BYTES_MAX });
        }
        let shared = &*self.shared;
        let capacity = shared.capacity;
        let mut st = shared.state.lock();
        if let Some(err) = st.failed.clone() {
            return Err(err);
        }
        if st.waiting.len() >= WAITING_MAX {
            let message = format!("{WAITING_MAX} outcome entries wait for a flush; retry when it catches up");
            return Err(LogError::Full(message));
        }
        let sequence = st.sequence_next;
        st.sequence_next += 1;
        let id: Arc<[u8]> = Arc::from(id);
        st.index.insert(id.clone(), (sequence, outcome));
        let slot = slot_of(sequence, capacity);
        let evicted = st.ring.insert(slot, Entry { sequence, id, outcome }).and_then(|old| {
            assert!(old.sequence < sequence, "slot {slot} held sequence {} >= {sequence}", old.sequence);
            match st.index.get(&old.id) {
                Some(&(newest, _)) if newest == old.sequence => {
                    st.index.remove(&old.id);
                    Some(RememberedEntry { id: old.id.to_vec(), outcome: old.outcome })
                }
                // The id has a newer entry (possibly this one): its memory is not lost.
                _ => None,
            }
        });
        assert!(st.index.len() <= st.ring.len() && st.ring.len() <= capacity as usize);
        if shared.disk.is_none() {
            st.queued_from = st.sequence_next;
            st.durable_through = sequence;
            drop(st);
            call(durable, Ok(()));
            return Ok(evicted);
        }
        if st.waiting.is_empty() {
            st.queued_at = Some(Instant::now());
        }
        st.waiting.push(durable);
        assert_eq!(
            st.waiting.len() as u64,
            st.sequence_next - st.queued_from,
            "one callback per queued entry"
        );
        let wake = st.waiting.len() == 1 || st.waiting.len() == FLUSH_BATCH;
        drop(st);
        if wake {
            shared.work.notify_one();
        }
        Ok(evicted)
    }

    /// Blocks until everything remembered so far is durable and its callbacks have run
    /// (shutdown, tests); the error that stopped the memory, if one did.
    pub fn sync(&self) -> Result<(), LogError> {
        let shared = &*self.shared;
        let mut st = shared.state.lock();
        let target = st.sequence_next - 1;
        loop {
            if let Some(err) = &st.failed {
                return Err(err.clone());
            }
            if st.durable_through >= target {
                return Ok(());
            }
            if st.sync_wanted < target {
                st.sync_wanted = target;
                shared.work.notify_one();
            }
            shared.flushed.wait(&mut st);
        }
    }

    /// The number of ids whose outcome is remembered (at most the capacity).
    pub fn len(&self) -> usize {
        self.shared.state.lock().index.len()
    }

    /// True when no outcome is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The number of entries the ring holds before it overwrites the oldest.
    pub fn capacity(&self) -> u32 {
        self.shared.capacity
    }

    /// What open found wrong (damaged slots with file and offset, forgotten entries), for
    /// operators: `decree recover list` prints them.
    pub fn open_warnings(&self) -> &[String] {
        &self.warnings
    }
}

impl State {
    fn new(index: HashMap<Arc<[u8]>, (u64, u8)>, ring: HashMap<u32, Entry>, sequence_next: u64) -> State {
        State {
            index,
            ring,
            sequence_next,
            queued_from: sequence_next,
            queued_at: None,
            waiting: Vec::new(),
            durable_through: sequence_next - 1,
            sync_wanted: 0,
            failed: None,
            stopping: false,
        }
    }
}

impl Drop for OutcomeMemory {
    /// Flushes what is queued (its callbacks are called) and stops the flusher thread.
    fn drop(&mut self) {
        let Some(thread) = self.flusher.take() else { return };
        self.shared.state.lock().stopping = true;
        self.shared.work.notify_all();
        if crate::engine::worker::join_unless_current(thread) {
            tracing::error!("the outcome memory flusher thread panicked");
        }
    }
}

/// Stops the memory if the flusher panics (a broken invariant), so that no callback is
/// lost and `sync` does not wait forever.
struct PanicGuard<'a>(&'a Shared);

impl Drop for PanicGuard<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let shared = self.0;
        let mut st = shared.state.lock();
        let path = shared.disk.as_ref().map(|d| d.path.clone()).unwrap_or_default();
        let err = st
            .failed
            .get_or_insert(LogError::Io { path, message: "the outcome memory flusher panicked".into() })
            .clone();
        let late = std::mem::take(&mut st.waiting);
        st.queued_from = st.sequence_next;
        drop(st);
        shared.flushed.notify_all();
        for done in late {
            call(done, Err(err.clone()));
        }
    }
}

/// The entries a flush of `queued` (sequence numbers) writes: the current entry of each
/// slot they dirtied, in slot order starting at the first one's slot.
fn take_batch(st: &State, queued: std::ops::Range<u64>, capacity: u32) -> Vec<Entry> {
    let count = (queued.end - queued.start).min(u64::from(capacity));
    // With more entries than slots every slot is dirty: start at the oldest survivor.
    let first = queued.end - count;
    (first..queued.end)
        .map(|sequence| {
            let entry = st.ring.get(&slot_of(sequence, capacity)).expect("a queued slot holds an entry");
            assert_eq!(entry.sequence, sequence, "a queued slot holds its newest entry");
            entry.clone()
        })
        .collect()
}

fn flusher_loop(shared: &Shared) {
    let _guard = PanicGuard(shared);
    let disk = shared.disk.as_ref().expect("only a durable memory has a flusher");
    let mut st = shared.state.lock();
    loop {
        if st.waiting.is_empty() {
            if st.stopping {
                return;
            }
            shared.work.wait(&mut st);
            continue;
        }
        let due = st.queued_at.expect("waiting entries have a queue time") + shared.flush_delay;
        let at_once = st.stopping
            || st.waiting.len() >= FLUSH_BATCH
            || st.sync_wanted >= st.queued_from
            || Instant::now() >= due;
        if !at_once {
            shared.work.wait_until(&mut st, due);
            continue;
        }
        let queued = st.queued_from..st.sequence_next;
        let batch = take_batch(&st, queued.clone(), shared.capacity);
        let callbacks = std::mem::take(&mut st.waiting);
        st.queued_from = queued.end;
        st.queued_at = None;
        let result = MutexGuard::unlocked(&mut st, || flush(disk, shared.capacity, &batch));
        let mut late = Vec::new();
        if let Err(err) = &result {
            st.failed = Some(err.clone());
            // Entries queued during the flush never will be written.
            late = std::mem::take(&mut st.waiting);
            st.queued_from = st.sequence_next;
            st.queued_at = None;
            shared.flushed.notify_all();
        }
        MutexGuard::unlocked(&mut st, || {
            for done in callbacks {
                call(done, result.clone());
            }
            if let Err(err) = &result {
                for done in late {
                    call(done, Err(err.clone()));
                }
            }
        });
        if result.is_ok() {
            // Only now, so that `sync` returns after the callbacks of what it waited for.
            assert!(st.durable_through < queued.end, "flushes finish in sequence order");
            st.durable_through = queued.end - 1;
            shared.flushed.notify_all();
        }
    }
}

/// Writes one batch and syncs it; any error stops the memory.
fn flush(disk: &Disk, capacity: u32, batch: &[Entry]) -> Result<(), LogError> {
    let written = write_entries(&*disk.file, &disk.path, capacity, batch);
    let result = written.and_then(|()| disk.file.sync_data().map_err(|e| sync_error(&disk.path, &e)));
    if let Err(err) = &result {
        tracing::error!(path = %disk.path.display(), error = %err, "outcome memory write failed; it is stopped (fail-stop)");
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(sequence: u64, id: &[u8]) -> Entry {
        Entry { sequence, id: Arc::from(id), outcome: 1 }
    }

    #[test]
    fn keep_newest_renumbers_into_distinct_slots() {
        // 3 and 7 share a slot of 4: after a gap (damaged slots) they would collide.
        let entries = vec![entry(1, b"a"), entry(3, b"b"), entry(5, b"c"), entry(6, b"d"), entry(7, b"e")];
        let (kept, dropped) = keep_newest(entries, 4);
        assert_eq!(dropped, 1);
        let seen: Vec<(u64, &[u8])> = kept.iter().map(|e| (e.sequence, &e.id[..])).collect();
        assert_eq!(seen, vec![(4, &b"b"[..]), (5, b"c"), (6, b"d"), (7, b"e")]);
        let (kept, dropped) = keep_newest(Vec::new(), 4);
        assert!(kept.is_empty() && dropped == 0);
    }

    #[test]
    fn a_batch_takes_each_dirty_slot_once_in_write_order() {
        let memory = OutcomeMemory::volatile(4);
        let sequences = |range| {
            let st = memory.shared.state.lock();
            take_batch(&st, range, 4).iter().map(|e| e.sequence).collect::<Vec<_>>()
        };
        for i in 1..=5u8 {
            memory.remember(&[i], 1, Box::new(|_| {})).expect("remembered");
        }
        assert_eq!(sequences(3..6), vec![3, 4, 5], "slots 3, 0, 1: two runs at the wrap-around");
        for i in 6..=10u8 {
            memory.remember(&[i], 1, Box::new(|_| {})).expect("remembered");
        }
        assert_eq!(sequences(1..11), vec![7, 8, 9, 10], "superseded entries are not written");
    }

    #[test]
    fn write_entries_uses_one_write_per_run() {
        let storage = crate::testing::fault::FaultStorage::new(1);
        let dir = Path::new("/outcomes-unit");
        storage.create_dir_all(dir).unwrap();
        let path = dir.join("f");
        let file = storage.open(&path, true).unwrap();
        file.preallocate(4 * SLOT_BYTES as u64).unwrap();
        let syncs_before = storage.syncs_done();
        // Two writes allowed: one per run (slots 3, then 0 and 1); one per entry would fail.
        storage.fail_writes_after(2);
        write_entries(&*file, &path, 4, &[entry(3, b"x"), entry(4, b"y"), entry(5, b"z")]).unwrap();
        assert!(write_entries(&*file, &path, 4, &[entry(6, b"w")]).is_err(), "the write budget was exact");
        assert_eq!(storage.syncs_done(), syncs_before, "write_entries does not sync");
        let live = storage.read_live(&path).unwrap();
        let slot = |i: usize| format::decode_slot(&live[i * SLOT_BYTES..(i + 1) * SLOT_BYTES], i as u32, 4);
        assert_eq!(slot(3), SlotContent::Entry { sequence: 3, outcome: 1, id: b"x" });
        assert_eq!(slot(0), SlotContent::Entry { sequence: 4, outcome: 1, id: b"y" });
        assert_eq!(slot(1), SlotContent::Entry { sequence: 5, outcome: 1, id: b"z" });
        assert_eq!(slot(2), SlotContent::Empty);
    }

    #[test]
    fn the_index_never_outgrows_the_ring() {
        let memory = OutcomeMemory::volatile(3);
        for i in 0..50u32 {
            // A few ids repeat, so that some evicted entries are shadowed by newer ones.
            let id = (i % 5).to_le_bytes();
            memory.remember(&id, (i % 7 + 1) as u8, Box::new(|_| {})).expect("remembered");
            let st = memory.shared.state.lock();
            assert!(st.index.len() <= st.ring.len() && st.ring.len() <= 3);
            for (id, &(sequence, outcome)) in &st.index {
                let held = &st.ring[&slot_of(sequence, 3)];
                assert_eq!((&held.id, held.outcome), (id, outcome));
            }
        }
    }
}
