//! The slots engine: fixed-size slots in one pre-allocated file, one record per slot,
//! each record made durable on its own (like Narayana's SlotStore and LIXA's state table).
//!
//! The layout and the rules that tell a record from a torn write or corruption are in
//! [`layout`]. Two flavours share them: `slots-fsync` writes a slot with `pwrite` and makes
//! it durable with `fdatasync`; `slots-mmap` copies it into a shared mapping and calls
//! `msync` (MS_SYNC) on the slot's pages. A storage without a raw descriptor (the
//! fault-injecting storage of the tests) has no mapping, so `slots-mmap` falls back to
//! `write_all_at` + `sync_data` there: crash tests exercise the slot layout and recovery
//! rules, not the mmap system calls. Threads sync their own writes concurrently; there is
//! no lock around syncs.
//!
//! Completion never waits for the disk and writes as little as it can:
//! - a transaction of one record (the usual decision) writes nothing at all: its slot goes
//!   back to the free list flagged *lazy*. The next record written there overwrites the
//!   head, which completes it too (whole or torn, see [`layout`]); a thread that completes
//!   and appends in turn thus reuses one slot and dirties one page per record. A lazy slot
//!   still unused at `sync()` (or at the rpo=N flusher's tick, or at close) gets its
//!   trailer zeroed just before that sync, so `sync()` makes every completion durable.
//! - a transaction of several records zeroes its head's trailer at once, without syncing.
//!   Its head's slot is free at once; its other slots are reused only after a whole-file
//!   sync that started after the zeroing succeeded (reusing one earlier could, after a
//!   crash, bring the transaction back without that record). Until then they wait in a
//!   pending list (bounded by the slot count); an append that finds no free slot runs that
//!   sync itself.
//!
//! A completed transaction may thus come back after a crash, but only if no `sync()` (and
//! no reuse of its slots) followed its completion, as the [`Log`] contract allows.
//!
//! Recovery scans every slot, keeps the records whose head is present (returned in
//! sequence order, which keeps each transaction's append order), treats torn and dead
//! slots as free, and refuses to open on a damaged record (`LogError::Corrupted`, naming
//! the file and the slot's offset). New sequence numbers continue after the largest one
//! found anywhere. A failed sync stops the log (fail-stop): every later call returns
//! `SyncFailed`.
//!
//! A slot joins its transaction only once its record is written, so `complete` never
//! frees a slot whose write is still to come: a record of `append_with` still queued when
//! its transaction completes stays live. Complete a transaction only after its appends
//! were acknowledged. Two concurrent *first* appends of one transaction both become heads;
//! completion zeroes both, and only then is it not atomic.

mod allocator;
pub mod layout;

use self::allocator::FreeSlots;
use self::layout::{SlotContent, HEADER_AREA_BYTES, SLOTS_FILE, SLOT_OVERHEAD_BYTES};
use crate::engine::watermark::{Found as Counted, Watermark};
use crate::engine::worker::{FailStop, Flusher, WritePool};
use crate::engine::{owner, StatCounters};
use crate::io::{Storage, StorageFile};
use crate::{
    DurableCallback, EngineKind, LiveRecord, Log, LogConfig, LogError, LogStats, SyncPolicy, TxnKey,
};
use memmap2::{MmapOptions, MmapRaw};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Arc;

/// Threads performing the writes of `append_with`.
const WORKERS_COUNT: usize = 4;
/// Records one worker writes before its one sync.
const WORKER_BATCH_MAX: usize = 256;
/// Descriptors of the slot file used for syncs, each by one thread at a time (see
/// [`SyncHandles`]).
const SYNC_HANDLES: usize = 8;
/// Shards of the transaction-to-slots map.
const LIVE_SHARDS: usize = 64;
/// Dead or torn slots reported one by one at recovery before a summary takes over.
const DEAD_WARNINGS_MAX: usize = 16;
/// The page size the allocator groups slots by (slots of one page go to one free list).
const PAGE_BYTES: usize = 4096;
/// Bytes read at a time while scanning slots at open.
const SCAN_CHUNK_BYTES: usize = 1 << 20;

/// A record on its way to a worker. Its slot is reserved already unless every slot was
/// busy or pending (then the worker allocates, syncing if needed); the queue limit is the
/// slot count.
struct Job {
    txn: TxnKey,
    slot: Option<(u32, bool)>,
    payload: Vec<u8>,
    done: DurableCallback,
}

/// The slots engine (both flavours); see the module documentation.
pub struct SlotsLog {
    inner: Arc<Inner>,
    pool: Option<WritePool<Job>>,
    flusher: Option<Flusher>,
}

/// The slots of one live transaction and the sequence number of its head.
struct TxnSlots {
    head: u64,
    slots: Vec<(u32, bool)>,
}

/// Open file descriptions of the slot file for `fdatasync`, one per concurrent sync.
///
/// Linux reports a write-back error once per open file description (`errseq_t`): when
/// threads sync through one shared descriptor, the one that reports a failure may be
/// another than the one whose records were dropped, and that one "succeeds" — possibly
/// before the failure is latched. With one descriptor per concurrent sync every sync that
/// covers a failed write-back reports it; and since a descriptor is held until its user has
/// latched (or checked) the fail-stop flag, an error consumed on a descriptor is always
/// latched before the next user of that descriptor checks the flag. `msync` always goes
/// through the mapping's single descriptor, so syncs of `slots-mmap` take `msync_lock`
/// instead and run one at a time.
struct SyncHandles {
    handles: Vec<Mutex<Arc<dyn StorageFile>>>,
    next: std::sync::atomic::AtomicUsize,
}

impl SyncHandles {
    fn open(storage: &dyn Storage, path: &Path, first: Arc<dyn StorageFile>) -> Result<Self, LogError> {
        let mut handles = vec![Mutex::new(first)];
        for _ in 1..SYNC_HANDLES {
            handles.push(Mutex::new(storage.open(path, false).map_err(|e| LogError::io(path, e))?));
        }
        Ok(SyncHandles { handles, next: std::sync::atomic::AtomicUsize::new(0) })
    }

    /// A free descriptor, or (when all are busy) the next one in turn, waiting for it.
    fn take(&self) -> parking_lot::MutexGuard<'_, Arc<dyn StorageFile>> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let n = self.handles.len();
        (0..n)
            .find_map(|i| self.handles[(start + i) % n].try_lock())
            .unwrap_or_else(|| self.handles[start % n].lock())
    }
}

struct Inner {
    path: PathBuf,
    file: Arc<dyn StorageFile>,
    /// Descriptors for `fdatasync`, one per concurrent sync.
    sync_handles: SyncHandles,
    /// Serialises `msync` calls (they share the mapping's descriptor).
    msync_lock: Mutex<()>,
    /// The shared mapping of the whole file, for `slots-mmap` on a real file.
    map: Option<MmapRaw>,
    slot_bytes: usize,
    slots_count: u32,
    record_bytes_max: usize,
    slot_payload_max: usize,
    sync: SyncPolicy,
    free: FreeSlots,
    /// Slots of completed transactions, each with the sync ticket that was current after
    /// the completion's write; in ticket order.
    pending: Mutex<VecDeque<(u64, u32)>>,
    live: Vec<Mutex<HashMap<TxnKey, TxnSlots>>>,
    sequence_next: AtomicU64,
    /// Whole-file syncs started so far; each takes the next ticket.
    sync_tickets: AtomicU64,
    /// One more than the largest ticket of a finished whole-file sync: everything written
    /// before a sync with a smaller ticket started is durable.
    durable_mark: AtomicU64,
    fail: FailStop,
    recovered: Mutex<Option<Vec<LiveRecord>>>,
    incarnation: u64,
    stats: StatCounters,
    /// Writes (records and completions) so far; `synced_changes` is the count a finished
    /// whole-file sync covered, so the rpo=N flusher skips syncs when nothing changed.
    changes: AtomicU64,
    synced_changes: AtomicU64,
    /// The directory's watermark: the live record count of the last clean close.
    watermark: Mutex<Watermark>,
}

fn check_config(config: &LogConfig) -> Result<(), LogError> {
    let smallest = SLOT_OVERHEAD_BYTES + 1;
    if (config.slot_bytes as usize) < smallest {
        return Err(LogError::Config(format!(
            "slot_bytes = {} cannot hold a record: at least {smallest} bytes are needed",
            config.slot_bytes
        )));
    }
    if config.slot_bytes > 1 << 24 {
        return Err(LogError::Config(format!("slot_bytes = {} exceeds 16 MiB", config.slot_bytes)));
    }
    if config.slots_count == 0 {
        return Err(LogError::Config("slots_count must be at least 1".into()));
    }
    Ok(())
}

fn live_shard(txn: TxnKey) -> usize {
    (txn.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % LIVE_SHARDS
}

/// A live record found at open.
struct Found {
    sequence: u64,
    slot: u32,
    head: u64,
    record: LiveRecord,
}

/// What the scan at open found.
struct Scanned {
    /// Live records (their head is present), sorted by sequence.
    records: Vec<Found>,
    /// Which slots hold a live record.
    live_slots: Vec<bool>,
    /// One more than the largest sequence number any slot names.
    sequence_next: u64,
}

/// Reads and classifies every slot; fails on a damaged record.
fn scan(
    file: &dyn StorageFile,
    path: &Path,
    slot_bytes: usize,
    slots_count: u32,
) -> Result<Scanned, LogError> {
    let mut candidates = Vec::new();
    let mut highest = 0u64;
    let mut dead = 0usize;
    let chunk_slots = (SCAN_CHUNK_BYTES / slot_bytes).max(1);
    let mut buf = vec![0u8; chunk_slots * slot_bytes];
    let mut first = 0u32;
    while first < slots_count {
        let n = chunk_slots.min((slots_count - first) as usize);
        let offset = HEADER_AREA_BYTES + u64::from(first) * slot_bytes as u64;
        file.read_exact_at(&mut buf[..n * slot_bytes], offset).map_err(|e| LogError::io(path, e))?;
        for (i, bytes) in buf[..n * slot_bytes].chunks_exact(slot_bytes).enumerate() {
            let slot = first + i as u32;
            match layout::decode_slot(bytes) {
                SlotContent::Free => {}
                SlotContent::Dead { reason, highest: named } => {
                    highest = highest.max(named);
                    dead += 1;
                    if dead <= DEAD_WARNINGS_MAX {
                        tracing::debug!(path = %path.display(), slot, %reason, "dead or torn slot treated as free");
                    }
                }
                SlotContent::Corrupted(reason) => {
                    return Err(LogError::Corrupted {
                        path: path.to_path_buf(),
                        offset: HEADER_AREA_BYTES + u64::from(slot) * slot_bytes as u64,
                        reason: format!("slot {slot}: {reason}"),
                    });
                }
                SlotContent::Record(r) => {
                    highest = highest.max(r.sequence).max(r.head);
                    candidates.push(Found {
                        sequence: r.sequence,
                        slot,
                        head: r.head,
                        record: LiveRecord { txn: r.txn, payload: r.payload.to_vec() },
                    });
                }
            }
        }
        first += n as u32;
    }
    // A record is live only while its transaction's head is: completion killed the head.
    let heads: HashSet<(TxnKey, u64)> =
        candidates.iter().filter(|f| f.head == f.sequence).map(|f| (f.record.txn, f.sequence)).collect();
    let before = candidates.len();
    candidates.retain(|f| heads.contains(&(f.record.txn, f.head)));
    let orphans = before - candidates.len();
    if dead + orphans > 0 {
        tracing::info!(path = %path.display(), dead, orphans, "slots of completed transactions and torn writes are free");
    }
    candidates.sort_by_key(|f| f.sequence);
    let mut live_slots = vec![false; slots_count as usize];
    for found in &candidates {
        live_slots[found.slot as usize] = true;
    }
    Ok(Scanned { records: candidates, live_slots, sequence_next: highest + 1 })
}

impl SlotsLog {
    /// Opens (creating if needed) the slot file in `config.dir`, recovers the live records
    /// and bumps the incarnation; `config.engine` picks the fsync or the mmap flavour.
    pub fn open(config: &LogConfig, storage: Arc<dyn Storage>) -> Result<SlotsLog, LogError> {
        check_config(config)?;
        let mmap = match config.engine {
            EngineKind::SlotsFsync => false,
            EngineKind::SlotsMmap => true,
            other => return Err(LogError::Config(format!("the slots engine cannot open a {other} log"))),
        };
        let dir = config.dir.as_path();
        storage.create_dir_all(dir).map_err(|e| LogError::io(dir, e))?;
        let incarnation = owner::bump_incarnation(&*storage, dir)?;
        let path = dir.join(SLOTS_FILE);
        let file = storage.open(&path, true).map_err(|e| LogError::io(&path, e))?;
        layout::prepare_file(&*storage, dir, &*file, &path, config.slot_bytes, config.slots_count)?;

        let slot_bytes = config.slot_bytes as usize;
        let mut watermark = Watermark::open(&*storage, dir)?;
        let scanned = scan(&*file, &path, slot_bytes, config.slots_count)?;
        let counted = Counted { live: scanned.records.len() as u64, end: Default::default(), torn: 0 };
        // A zeroed slot reads as free: only the count shows it, not where it was.
        watermark.begin_run(&counted, false, incarnation, || (path.clone(), HEADER_AREA_BYTES))?;
        let map = match (mmap, file.raw_fd()) {
            (true, Some(fd)) => {
                let total = HEADER_AREA_BYTES + u64::from(config.slots_count) * slot_bytes as u64;
                let total = usize::try_from(total)
                    .map_err(|_| LogError::Config(format!("{total} bytes of slots cannot be mapped")))?;
                Some(MmapOptions::new().len(total).map_raw(fd).map_err(|e| LogError::io(&path, e))?)
            }
            (true, None) => {
                tracing::debug!("storage has no raw descriptor: slots-mmap writes with pwrite and fdatasync");
                None
            }
            (false, _) => None,
        };

        let mut live: Vec<Mutex<HashMap<TxnKey, TxnSlots>>> =
            (0..LIVE_SHARDS).map(|_| Mutex::new(HashMap::new())).collect();
        let mut recovered = Vec::with_capacity(scanned.records.len());
        for found in scanned.records {
            let entry = live[live_shard(found.record.txn)]
                .get_mut()
                .entry(found.record.txn)
                .or_insert(TxnSlots { head: found.head, slots: Vec::new() });
            entry.slots.push((found.slot, found.head == found.sequence));
            recovered.push(found.record);
        }
        let slots_per_page = (PAGE_BYTES / slot_bytes).max(1) as u32;
        let live_slots = scanned.live_slots;
        let free = FreeSlots::new(config.slots_count, slots_per_page, |slot| live_slots[slot as usize]);
        let sync_handles = SyncHandles::open(&*storage, &path, file.clone())?;
        let inner = Arc::new(Inner {
            path,
            file,
            sync_handles,
            msync_lock: Mutex::new(()),
            map,
            slot_bytes,
            slots_count: config.slots_count,
            record_bytes_max: config.record_bytes_max as usize,
            slot_payload_max: slot_bytes - SLOT_OVERHEAD_BYTES,
            sync: config.sync,
            free,
            pending: Mutex::new(VecDeque::new()),
            live,
            sequence_next: AtomicU64::new(scanned.sequence_next.max(1)),
            sync_tickets: AtomicU64::new(0),
            durable_mark: AtomicU64::new(0),
            fail: FailStop::default(),
            recovered: Mutex::new(Some(recovered)),
            incarnation,
            stats: StatCounters::default(),
            changes: AtomicU64::new(0),
            synced_changes: AtomicU64::new(0),
            watermark: Mutex::new(watermark),
        });
        let worker_inner = inner.clone();
        let pool = WritePool::start(
            "decree-slots-write",
            WORKERS_COUNT,
            WORKER_BATCH_MAX,
            config.slots_count as usize,
            move |jobs| worker_inner.run_batch(jobs),
        )
        .map_err(|e| LogError::io(dir, e))?;
        let flusher = match config.sync {
            SyncPolicy::Immediate => None,
            SyncPolicy::Window(interval) => {
                let flusher_inner = inner.clone();
                Some(
                    Flusher::start("decree-slots-flush", interval, move || flusher_inner.flush_if_changed())
                        .map_err(|e| LogError::io(dir, e))?,
                )
            }
        };
        Ok(SlotsLog { inner, pool: Some(pool), flusher })
    }

    /// Slots holding no live record: free, or waiting for their completion to be durable
    /// (a snapshot, for tests and diagnostics).
    pub fn free_slots(&self) -> usize {
        self.inner.free.free_count() + self.inner.pending.lock().len()
    }

    /// True when appends copy into a memory mapping (slots-mmap on a real file).
    pub fn is_mapped(&self) -> bool {
        self.inner.map.is_some()
    }
}

fn call(done: DurableCallback, result: Result<(), LogError>) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| done(result))).is_err() {
        tracing::error!("a durable-append callback panicked");
    }
}

impl Inner {
    fn slot_offset(&self, slot: u32) -> u64 {
        assert!(slot < self.slots_count, "slot {slot} out of {}", self.slots_count);
        HEADER_AREA_BYTES + u64::from(slot) * self.slot_bytes as u64
    }

    fn check_size(&self, payload: &[u8]) -> Result<(), LogError> {
        if payload.len() > self.record_bytes_max {
            return Err(LogError::RecordTooLarge { len: payload.len(), max: self.record_bytes_max });
        }
        if payload.len() > self.slot_payload_max {
            return Err(LogError::RecordTooLarge { len: payload.len(), max: self.slot_payload_max });
        }
        Ok(())
    }

    /// Takes a free slot without any IO; `true` when it still holds a lazily completed
    /// head (the caller's overwrite completes it).
    fn try_allocate(&self) -> Option<(u32, bool)> {
        self.free.pop().or_else(|| {
            self.release_durable();
            self.free.pop()
        })
    }

    /// Takes a free slot; when none is free but completed ones wait for durability, runs
    /// the whole-file sync that releases them.
    fn allocate(&self) -> Result<(u32, bool), LogError> {
        if let Some(slot) = self.try_allocate() {
            return Ok(slot);
        }
        if !self.pending.lock().is_empty() {
            self.sync_whole(false)?;
            if let Some(slot) = self.free.pop() {
                return Ok(slot);
            }
        }
        Err(self.full_error())
    }

    fn full_error(&self) -> LogError {
        LogError::Full(format!(
            "all {} slots of {} hold live records; complete transactions or raise slots_count",
            self.slots_count,
            self.path.display()
        ))
    }

    /// Moves the pending slots whose completion is now durable to the free lists.
    fn release_durable(&self) {
        let mark = self.durable_mark.load(Ordering::SeqCst);
        let mut pending = self.pending.lock();
        while let Some(&(ticket, slot)) = pending.front() {
            if ticket >= mark {
                break;
            }
            pending.pop_front();
            self.free.push(slot, false);
        }
    }

    fn write_at(&self, offset: u64, bytes: &[u8]) -> std::io::Result<()> {
        match &self.map {
            Some(map) => {
                let offset = offset as usize;
                assert!(offset + bytes.len() <= map.len(), "write past the mapping");
                // SAFETY: the range lies inside the mapping (checked above), and it belongs to
                // a slot this thread owns (reserved in the allocator or being completed), so no
                // other thread writes it at the same time.
                unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), map.as_mut_ptr().add(offset), bytes.len())
                };
                Ok(())
            }
            None => self.file.write_all_at(bytes, offset),
        }?;
        self.stats.bytes_written.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        self.changes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// Writes a whole slot image. Into a mapping the trailer goes last, after a fence, so
    /// that page writeback racing with the copy can only see a prefix of the slot.
    fn write_slot(&self, slot: u32, image: &[u8]) -> std::io::Result<()> {
        debug_assert_eq!(image.len(), self.slot_bytes);
        let offset = self.slot_offset(slot);
        if self.map.is_some() {
            let at = layout::trailer_at(self.slot_bytes);
            self.write_at(offset, &image[..at])?;
            fence(Ordering::Release);
            self.write_at(offset + at as u64, &image[at..])
        } else {
            self.write_at(offset, image)
        }
    }

    /// Frames `payload` into its reserved slot, writes it and makes it live; frees the
    /// slot when anything fails.
    fn write_record(&self, txn: TxnKey, (slot, lazy): (u32, bool), payload: &[u8]) -> Result<(), LogError> {
        if let Err(e) = self.fail.check() {
            self.free.push(slot, lazy);
            return Err(e);
        }
        let sequence = self.sequence_next.fetch_add(1, Ordering::Relaxed);
        let head = self.live[live_shard(txn)].lock().get(&txn).map_or(sequence, |t| t.head);
        let image = layout::encode_slot(self.slot_bytes, txn, sequence, head, payload);
        if let Err(e) = self.write_slot(slot, &image) {
            // The slot may still hold the completed head it held: keep its lazy flag.
            self.free.push(slot, lazy);
            return Err(LogError::io(&self.path, e));
        }
        // Registered only once written: a concurrent complete() cannot free a slot whose
        // write is still to come and hand it to another record.
        let mut shard = self.live[live_shard(txn)].lock();
        let entry = shard.entry(txn).or_insert(TxnSlots { head, slots: Vec::new() });
        entry.slots.push((slot, head == sequence));
        drop(shard);
        self.stats.appended.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Makes the given slots durable: msync of their pages, or one whole-file fdatasync.
    fn sync_slots(&self, slots: &[u32]) -> Result<(), LogError> {
        let Some(map) = &self.map else {
            return self.sync_whole(false);
        };
        let _one_msync_at_a_time = self.msync_lock.lock();
        for &slot in slots {
            let offset = self.slot_offset(slot) as usize;
            map.flush_range(offset, self.slot_bytes).map_err(|e| self.fail.fail(&self.path, &e))?;
            self.stats.flushes.fetch_add(1, Ordering::Relaxed);
        }
        // A concurrent sync may have failed and consumed the kernel's error report for pages
        // this sync also needed (fsyncgate): trust the latch over our own success.
        self.fail.check()
    }

    /// Makes every write so far durable and releases the slots whose completion it
    /// covered; with `finish_lazy`, first writes the lazy completions, so that every
    /// completion so far is durable too.
    fn sync_whole(&self, finish_lazy: bool) -> Result<(), LogError> {
        self.fail.check()?;
        let mut zero_error = None;
        if finish_lazy {
            let at = layout::trailer_at(self.slot_bytes) as u64;
            self.free.finish_lazy(|slot| match self.write_at(self.slot_offset(slot) + at, &[0u8; 8]) {
                Ok(()) => true,
                Err(e) => {
                    zero_error = Some(LogError::io(&self.path, e));
                    false
                }
            });
        }
        let ticket = self.sync_tickets.fetch_add(1, Ordering::SeqCst);
        let changes = self.changes.load(Ordering::SeqCst);
        {
            // The descriptor (or the msync lock) is held until the outcome is latched or
            // checked; see `SyncHandles`.
            let (_msync, handle) = match &self.map {
                Some(_) => (Some(self.msync_lock.lock()), None),
                None => (None, Some(self.sync_handles.take())),
            };
            match (&self.map, &handle) {
                (Some(map), _) => map.flush(),
                (None, Some(file)) => file.sync_data(),
                (None, None) => unreachable!("a descriptor is taken when there is no mapping"),
            }
            .map_err(|e| self.fail.fail(&self.path, &e))?;
            self.stats.flushes.fetch_add(1, Ordering::Relaxed);
            self.fail.check()?;
        }
        self.durable_mark.fetch_max(ticket + 1, Ordering::SeqCst);
        self.synced_changes.fetch_max(changes, Ordering::SeqCst);
        self.release_durable();
        zero_error.map_or(Ok(()), Err)
    }

    /// The rpo=N flusher's tick: sync when anything changed since the last sync.
    fn flush_if_changed(&self) {
        if self.fail.check().is_err() {
            return;
        }
        if self.changes.load(Ordering::SeqCst) == self.synced_changes.load(Ordering::SeqCst)
            && self.pending.lock().is_empty()
        {
            return;
        }
        // An error is latched by sync_whole; the next call of any kind reports it.
        let _ = self.sync_whole(true);
    }

    /// A worker's batch: write every record, sync once, then call every callback.
    fn run_batch(&self, jobs: Vec<Job>) {
        let mut written: Vec<(u32, DurableCallback)> = Vec::with_capacity(jobs.len());
        for job in jobs {
            let slot = match job.slot.map_or_else(|| self.allocate(), Ok) {
                Ok(slot) => slot,
                Err(e) => {
                    call(job.done, Err(e));
                    continue;
                }
            };
            match self.write_record(job.txn, slot, &job.payload) {
                Ok(()) => written.push((slot.0, job.done)),
                Err(e) => call(job.done, Err(e)),
            }
        }
        if written.is_empty() {
            return;
        }
        let result = match self.sync {
            SyncPolicy::Window(_) => Ok(()),
            SyncPolicy::Immediate => {
                let slots: Vec<u32> = written.iter().map(|(slot, _)| *slot).collect();
                self.sync_slots(&slots)
            }
        };
        crate::write_batch::call_batch(written.into_iter().map(|(_, done)| done), result, call);
    }
}

impl Log for SlotsLog {
    fn append(&self, txn: TxnKey, payload: &[u8]) -> Result<(), LogError> {
        let inner = &*self.inner;
        inner.fail.check()?;
        inner.check_size(payload)?;
        let slot = inner.allocate()?;
        inner.write_record(txn, slot, payload)?;
        match inner.sync {
            SyncPolicy::Immediate => inner.sync_slots(&[slot.0]),
            SyncPolicy::Window(_) => Ok(()),
        }
    }

    fn append_with(&self, txn: TxnKey, payload: &[u8], done: DurableCallback) {
        let inner = &*self.inner;
        if let Err(e) = inner.fail.check().and_then(|()| inner.check_size(payload)) {
            return call(done, Err(e));
        }
        // No IO here: without a free slot the worker allocates, syncing if it must.
        let slot = inner.try_allocate();
        if slot.is_none() && inner.pending.lock().is_empty() {
            return call(done, Err(inner.full_error()));
        }
        let Some(pool) = &self.pool else {
            if let Some((slot, lazy)) = slot {
                inner.free.push(slot, lazy);
            }
            return call(done, Err(LogError::Config("the log is closing".into())));
        };
        if let Err(job) = pool.submit(Job { txn, slot, payload: payload.to_vec(), done }) {
            if let Some((slot, lazy)) = job.slot {
                inner.free.push(slot, lazy);
            }
            let message = format!("append queue of {} records is full", pool.queue_max());
            call(job.done, Err(LogError::Full(message)));
        }
    }

    fn complete(&self, txn: TxnKey) -> Result<(), LogError> {
        let inner = &*self.inner;
        inner.fail.check()?;
        let entry = inner.live[live_shard(txn)].lock().remove(&txn);
        let mut result = Ok(());
        if let Some(entry) = entry {
            inner.changes.fetch_add(1, Ordering::SeqCst);
            let others: Vec<u32> =
                entry.slots.iter().filter(|(_, is_head)| !is_head).map(|&(s, _)| s).collect();
            if others.is_empty() {
                // A single-record transaction (the usual decision): no write now. Its slot
                // is free at once with a lazy completion: the next record written there
                // overwrites the head, which completes it too (torn or whole), and if the
                // slot is still unused at the next sync(), that sync zeroes its trailer first.
                for &(slot, _) in &entry.slots {
                    inner.free.push(slot, true);
                }
            } else {
                // Zero the head's trailer now: the one write that completes the transaction.
                // The other slots are reused only once a sync made it durable, else a crash
                // could bring the transaction back without them.
                for &(slot, is_head) in &entry.slots {
                    if is_head {
                        let at = inner.slot_offset(slot) + layout::trailer_at(inner.slot_bytes) as u64;
                        if let Err(e) = inner.write_at(at, &[0u8; layout::TRAILER_BYTES]) {
                            result = Err(LogError::io(&inner.path, e));
                        }
                    }
                }
                let mut pending = inner.pending.lock();
                let ticket = inner.sync_tickets.load(Ordering::SeqCst);
                pending.extend(others.into_iter().map(|slot| (ticket, slot)));
                drop(pending);
                // The head's slot is free at once: overwriting it completes the transaction
                // as well, and its trailer is zeroed already.
                for &(slot, is_head) in &entry.slots {
                    if is_head {
                        inner.free.push(slot, false);
                    }
                }
            }
        }
        inner.stats.completions.fetch_add(1, Ordering::Relaxed);
        result
    }

    fn take_recovered(&self) -> Vec<LiveRecord> {
        self.inner.recovered.lock().take().unwrap_or_default()
    }

    fn incarnation(&self) -> u64 {
        self.inner.incarnation
    }

    fn sync(&self) -> Result<(), LogError> {
        self.inner.sync_whole(true)
    }

    fn stats(&self) -> LogStats {
        self.inner.stats.snapshot()
    }
}

impl Drop for SlotsLog {
    fn drop(&mut self) {
        // Run every queued append first (their callbacks must be called), then stop the
        // flusher, then make completions and rpo=N records durable if the log still works.
        drop(self.pool.take());
        drop(self.flusher.take());
        if self.inner.fail.check().is_ok() {
            match self.inner.sync_whole(true) {
                Ok(()) => self.inner.mark_clean_close(),
                Err(e) => tracing::error!(error = %e, "final sync of the slot log failed"),
            }
        }
    }
}

impl Inner {
    /// After the final sync of a clean close: records the live record count, so that the
    /// next open can tell a zeroed live slot (which reads as free) from a completion.
    fn mark_clean_close(&self) {
        let live: usize =
            self.live.iter().map(|shard| shard.lock().values().map(|t| t.slots.len()).sum::<usize>()).sum();
        self.watermark.lock().close_cleanly(live as u64, Default::default(), self.incarnation);
    }
}
