//! The journal engine: append-only, pre-allocated segment files with group commit and
//! segment recycling.
//!
//! Data path. An appender frames its record into the shared pending buffer under the
//! state mutex. If no flush is in flight it becomes the *leader*: it takes the whole
//! buffer, writes it with one `pwrite` (and, under `SyncPolicy::Immediate`, one
//! `fdatasync`), publishes the new acknowledged position and wakes the waiters of that
//! batch. Records that arrive meanwhile form the next batch; when the leader finishes it
//! hands the next flush to one blocked waiter of that batch, or to the engine's flusher
//! thread when only callbacks (`append_with`) wait. There is no timer: a flush starts as
//! soon as the previous one ends. Waiters of batch `n` sleep on condition variable
//! `n % 2`, so a flush wakes exactly the threads it made durable.
//!
//! Under `Immediate`, when the file system allows `O_DIRECT`, the leader writes the batch
//! padded to whole pages (a Padding frame fills the last one) through an
//! `O_DIRECT | O_DSYNC` handle of the segment: one system call, durable when it returns,
//! and faster than `pwrite` + `fdatasync` on the development VM, for one write alone and
//! under group commit (docs/measurements.md, "Direct writes"). Pages holding acknowledged
//! records are never written again: each batch starts on a fresh page, and a rotation
//! pads its header page the same way. On
//! file systems without `O_DIRECT` (tmpfs) it writes and syncs as below.
//!
//! Under `SyncPolicy::Window(d)` the leader only writes (the page cache survives a process
//! kill) and a syncer thread calls `fdatasync` every `d / 2`. On real files it writes by a
//! memory copy into a shared mapping of the current segment: measured, one `pwrite` per
//! append was the whole cost of a single appender (the ext4 buffered-write path), and
//! `fdatasync` flushes pages dirtied through the mapping just the same. There,
//! `append_with` leads the flush itself when no flush is in flight and the batch fits in
//! the current segment (a memory copy, no disk IO), and calls its callback in the caller's
//! thread: a hand-off to the flusher thread cost more than the write. When a rotation is
//! due (it syncs), or the segment is not mapped, it falls back to the flusher. Under
//! `Immediate` the flusher is woken once per request, not once per record. `complete`
//! only frames a Completion record; it goes out with the next flush. Under `Immediate`
//! completions never cause a flush of their own while appends keep coming: they wait for
//! the next synced batch, and the flusher writes them alone only after
//! `LogConfig::completion_idle_ms` without any batch, or once they fill half a batch.
//! A failed sync or write stops the log (fail-stop): the failing batch and every later call get the error, and syncs are
//! never retried, because after a failed `fdatasync` the kernel may have dropped the data.
//!
//! Invariants of the group commit, asserted after every batch (`State::assert_batch`, a
//! few comparisons, no walk over records): log positions form the chain `durable_lsn <=
//! acked_lsn <= pending_base_lsn`, and each only grows, like `batch_no` and the segment
//! sequence numbers; the entries (and `append_with` callbacks) are exactly the frames of
//! the pending buffer, and its blocked waiters wait for records in it. A waiter's batch is
//! flushed before the next batch starts. In the writer, `synced <= pos <= capacity` of the
//! current segment.
//!
//! Space. The engine keeps, for every live transaction, where its records are (segment,
//! offset, length) and, per segment, how many live records it holds. When the writer
//! moves to a new segment, a prefix of old segments without live records is dropped from
//! the range recovery must read (the new segment's header says so, and it is synced
//! before the old files are reused); old segments holding only a few live records are
//! checkpointed first: their transactions are copied into the new segment as a
//! Completion followed by all their records, which keeps per-transaction order. Files
//! are reused under new sequence numbers, so the directory holds the live range plus a
//! few spare files. A spare-file thread keeps one free file ready (created, zero-filled,
//! synced, directory entry synced) whenever none is free, so that a rotation only writes
//! and syncs the new header instead of allocating 8 MiB on the commit path; at most one
//! file more than before exists (two free files when a segment was freed during the
//! preparation).
//!
//! Files: this one holds the shared types, `JournalLog::open`, the `Log` impl and the
//! clean close; `journal/group_commit.rs` the pending batch, its leader and its waiters;
//! `journal/writer.rs` the segments, where a batch goes, rotation and checkpoints;
//! `journal/threads.rs` the flusher, syncer, spare-file and checkpoint threads;
//! `journal/format.rs` the on-disk layout; `journal/recovery.rs` recovery at open.

mod format;
mod group_commit;
mod recovery;
mod threads;
mod writer;

use crate::engine::watermark::{End, Found, Mark, Watermark};
use crate::engine::{owner, StatCounters};
use crate::io::{Storage, StorageFile, DIRECT_ALIGN};
use crate::record::{self, Decoded, RecordKind, HEADER_BYTES};
use crate::{
    DurableCallback, LiveRecord, Log, LogConfig, LogError, LogStats, SyncPolicy, TxnKey, WriteTimes,
};
use format::{BatchMarker, SegmentHeader, MARKER_BYTES, SEGMENT_HEADER_BYTES};
use parking_lot::{Condvar, Mutex, MutexGuard};
use recovery::FreeFile;
use std::collections::hash_map::Entry as MapEntry;
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use writer::{prepare_file, sync_error};

/// How often the durable end is checkpointed in the watermark (when it moved): the window
/// after a crash in which lost durable data at the end of the last segment looks like a
/// torn tail.
const CHECKPOINT_PERIOD: Duration = Duration::from_secs(1);
/// Smallest segment accepted: a batch, a checkpoint and a header must fit in one.
pub const SEGMENT_BYTES_MIN: u64 = 64 << 10;
/// Largest segment accepted: offsets inside a segment are stored as `u32`.
pub const SEGMENT_BYTES_MAX: u64 = 1 << 30;
/// Upper bound of the pending buffer (one batch), whatever the segment size.
const PENDING_BYTES_MAX_CAP: usize = 1 << 20;
/// `append_with` records parked while the pending buffer is full, in pending buffers.
const OVERFLOW_BATCHES_MAX: usize = 16;
/// Buffered completions that make the flusher write them out without waiting for appends.
const COMPLETION_FLUSH_BYTES: usize = 64 << 10;
/// Pause before the spare-file thread tries again after failing to prepare a file.
const SPARE_RETRY_DELAY: Duration = Duration::from_secs(1);

// Offsets inside a segment (`Loc`, `Entry`, the batch marker's fields) are `u32`.
const _: () = assert!(SEGMENT_BYTES_MAX <= u32::MAX as u64);
// The pending buffer is `segment_bytes / 8`, at most the cap: in the smallest segment it
// holds a marker and the header of a record (so `record_bytes_max` cannot underflow), and
// the largest buffer (twice the cap, for completions) keeps `u32` entry offsets.
const _: () = assert!((SEGMENT_BYTES_MIN / 8) as usize > MARKER_BYTES + HEADER_BYTES);
const _: () = assert!(2 * PENDING_BYTES_MAX_CAP <= u32::MAX as usize);
const _: () =
    assert!(SEGMENT_BYTES_MIN < SEGMENT_BYTES_MAX && (SEGMENT_HEADER_BYTES as u64) < SEGMENT_BYTES_MIN);
// A padding frame fills the gap to the next page; `padded_len` leaves at least a header
// and the zero payload it takes covers any gap (`zeros` holds two pages).
const _: () = assert!(HEADER_BYTES <= DIRECT_ALIGN);

/// Where one record lives on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Loc {
    seq: u64,
    offset: u32,
    len: u32,
}

/// The records of one live transaction; one record (the common case) needs no allocation.
enum Locs {
    One(Loc),
    Many(Vec<Loc>),
}

impl Locs {
    fn push(&mut self, loc: Loc) {
        match self {
            Locs::One(first) => *self = Locs::Many(vec![*first, loc]),
            Locs::Many(all) => all.push(loc),
        }
    }
    fn as_slice(&self) -> &[Loc] {
        match self {
            Locs::One(loc) => std::slice::from_ref(loc),
            Locs::Many(all) => all,
        }
    }
}

/// A frame in the pending buffer: what the writer needs to track it once it is placed.
#[derive(Debug, Clone, Copy)]
struct Entry {
    kind: RecordKind,
    txn: TxnKey,
    offset: u32,
    len: u32,
}

/// A segment in the range recovery reads.
struct Segment {
    seq: u64,
    path: PathBuf,
    file: Arc<dyn StorageFile>,
    /// A shared mapping of the current segment under `Window`, so that a batch reaches the
    /// page cache with a memory copy instead of a `pwrite` (the data path of rpo > 0).
    map: Option<memmap2::MmapRaw>,
    /// An `O_DIRECT | O_DSYNC` handle of the current segment under `Immediate`: a batch
    /// padded to whole pages is durable when its one write returns: one system call where
    /// `pwrite` + `fdatasync` takes two (see the module documentation).
    direct: Option<Arc<dyn StorageFile>>,
    capacity: u64,
    live_records: u64,
    live_bytes: u64,
}

/// What a flush did, for the state the syncer and later batches read.
struct Written {
    seq: u64,
    /// The segment's path and file when it is not the one the caller last saw.
    new_segment: Option<(PathBuf, Arc<dyn StorageFile>)>,
    end: u64,
    synced: u64,
    /// Everything before this batch is durable (the segment changed or the batch synced).
    earlier_durable: bool,
}

/// The segment files and the live-record index; only the flush leader touches it.
struct Writer {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    segment_bytes: u64,
    segments: VecDeque<Segment>,
    free: Vec<FreeFile>,
    next_file_id: u64,
    next_seq: u64,
    /// Write offset in the current (last) segment.
    pos: u64,
    /// Offset of the current segment known durable.
    synced: u64,
    live: HashMap<TxnKey, Locs>,
    scratch: Vec<u8>,
    marker_scratch: Vec<u8>,
    /// Write batches through a shared mapping when the storage has real files (`Window`).
    use_map: bool,
    /// Write batches with `O_DIRECT | O_DSYNC` (`Immediate`, when the file system allows).
    use_direct: bool,
    /// Page-aligned staging area of direct writes (over-allocated by one page).
    direct_buf: Vec<u8>,
    /// Zero payload of padding frames.
    zeros: Vec<u8>,
    /// Set at shutdown: the spare-file thread stops.
    closing: bool,
    /// A sync by the leader failed. The syncer thread syncs the same descriptor, and the
    /// kernel reports a write-back error to one caller only, so the syncer checks this
    /// before it trusts its own success.
    sync_failed: bool,
}

/// The shared state every caller locks briefly.
struct State {
    pending: Vec<u8>,
    entries: Vec<Entry>,
    callbacks: Vec<DurableCallback>,
    /// `append_with` records that did not fit in `pending`, moved in by the next leader, so
    /// that a burst neither blocks the caller nor fails at once.
    overflow: VecDeque<(TxnKey, Vec<u8>, DurableCallback)>,
    overflow_bytes: usize,
    spare_pending: Vec<u8>,
    spare_entries: Vec<Entry>,
    /// Log position (bytes ever queued) of `pending[0]`.
    pending_base_lsn: u64,
    /// Number of the pending batch; its waiters sleep on `batch_cv[batch_no % 2]`.
    batch_no: u64,
    /// Blocked callers waiting for the pending batch (0: hand the next flush to the flusher).
    pending_blocked: usize,
    flush_in_flight: bool,
    /// Written (and, under `Immediate`, durable) up to here.
    acked_lsn: u64,
    durable_lsn: u64,
    /// A `sync` caller wants everything up to here durable.
    sync_wanted_lsn: u64,
    stopped: Option<LogError>,
    shutdown: bool,
    flusher_wanted: bool,
    /// The flusher sleeps without a timeout (nothing buffered): the next completion wakes it.
    flusher_asleep: bool,
    segment_seq: u64,
    segment_path: PathBuf,
    segment_file: Arc<dyn StorageFile>,
    segment_written: u64,
    segment_synced: u64,
}

struct Shared {
    state: Mutex<State>,
    batch_cv: [Condvar; 2],
    space_cv: Condvar,
    flusher_cv: Condvar,
    syncer_cv: Condvar,
    /// Wakes the spare-file thread when a rotation took the last free file (waits on `writer`).
    spare_cv: Condvar,
    /// Wakes the checkpoint thread at shutdown (waits on `state`).
    checkpoint_cv: Condvar,
    writer: Mutex<Writer>,
    /// The directory's watermark: checkpoints of the durable end, and the clean close.
    watermark: Mutex<Watermark>,
    incarnation: u64,
    immediate: bool,
    /// Under `rpo = 0`: idle time after which buffered completions are written on their own.
    completion_idle: Duration,
    pending_bytes_max: usize,
    record_bytes_max: usize,
    stats: StatCounters,
}

/// What an appender does when the pending buffer is full.
#[derive(Clone, Copy, PartialEq, Eq)]
enum WhenFull {
    /// Flush it if no flush is in flight, else wait for room (blocking `append`).
    Lead,
    /// Wake the flusher and wait for room (`complete`, never IO itself).
    Wait,
    /// Fail at once (`append_with`, which must not block).
    Fail,
}

/// The journal engine; see the module documentation.
pub struct JournalLog {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    recovered: Mutex<Vec<LiveRecord>>,
    incarnation: u64,
    warnings: Vec<String>,
}

impl JournalLog {
    /// Opens (creating if needed) the journal in `config.dir` on `storage`: bumps the
    /// incarnation, recovers the live records and starts a fresh segment.
    pub fn open(config: &LogConfig, storage: Arc<dyn Storage>) -> Result<JournalLog, LogError> {
        if !(SEGMENT_BYTES_MIN..=SEGMENT_BYTES_MAX).contains(&config.segment_bytes) {
            return Err(LogError::Config(format!(
                "journal segment_bytes is {}, it must be between {SEGMENT_BYTES_MIN} and {SEGMENT_BYTES_MAX}",
                config.segment_bytes
            )));
        }
        let dir = config.dir.clone();
        storage.create_dir_all(&dir).map_err(|e| LogError::io(&dir, e))?;
        let incarnation = owner::bump_incarnation(&*storage, &dir)?;
        let mut watermark = Watermark::open(&*storage, &dir)?;
        let recovery = recovery::recover(&*storage, &dir)?;
        let found = Found { live: recovery.live.len() as u64, end: recovery.end(), torn: recovery.torn };
        watermark.begin_run(&found, true, incarnation, || {
            (recovery.segments.last().map_or(dir.clone(), |s| s.path.clone()), recovery.last_end)
        })?;
        let warnings = recovery.warnings.clone();

        let mut free = Vec::new();
        let mut removed = false;
        for file in recovery.free {
            if file.capacity >= config.segment_bytes {
                free.push(file);
            } else {
                // Left by a smaller segment size or a failed allocation: not worth reusing.
                storage.remove(&file.path).map_err(|e| LogError::io(&file.path, e))?;
                removed = true;
            }
        }
        if removed {
            storage.sync_dir(&dir).map_err(|e| sync_error(&dir, e))?;
        }
        let mut writer = Writer {
            storage: storage.clone(),
            dir: dir.clone(),
            segment_bytes: config.segment_bytes,
            segments: VecDeque::new(),
            free,
            next_file_id: recovery.next_file_id,
            next_seq: recovery.next_seq,
            pos: recovery.last_end,
            synced: 0,
            live: HashMap::new(),
            scratch: Vec::new(),
            marker_scratch: Vec::with_capacity(MARKER_BYTES),
            use_map: config.sync != SyncPolicy::Immediate,
            use_direct: config.sync == SyncPolicy::Immediate && config.direct_io,
            direct_buf: Vec::new(),
            zeros: vec![0u8; 2 * DIRECT_ALIGN],
            closing: false,
            sync_failed: false,
        };
        for segment in recovery.segments {
            writer.segments.push_back(Segment {
                seq: segment.seq,
                path: segment.path,
                file: segment.file,
                map: None,
                direct: None,
                capacity: segment.capacity,
                live_records: 0,
                live_bytes: 0,
            });
        }
        let mut recovered = Vec::new();
        for txn in recovery.live {
            for (loc, payload) in txn.records {
                writer.add_live(txn.txn, loc);
                recovered.push(LiveRecord { txn: txn.txn, payload });
            }
        }
        let stats = StatCounters::default();
        writer.rotate(0, &stats)?;
        assert!(writer.pos >= SEGMENT_HEADER_BYTES as u64);
        let current = writer.segments.back().expect("open starts a segment");

        let pending_bytes_max = ((config.segment_bytes / 8) as usize).min(PENDING_BYTES_MAX_CAP);
        let record_bytes_max =
            (config.record_bytes_max as usize).min(pending_bytes_max - MARKER_BYTES - HEADER_BYTES);
        let state = State {
            pending: Vec::with_capacity(pending_bytes_max),
            entries: Vec::new(),
            callbacks: Vec::new(),
            overflow: VecDeque::new(),
            overflow_bytes: 0,
            spare_pending: Vec::with_capacity(pending_bytes_max),
            spare_entries: Vec::new(),
            pending_base_lsn: 0,
            batch_no: 0,
            pending_blocked: 0,
            flush_in_flight: false,
            acked_lsn: 0,
            durable_lsn: 0,
            sync_wanted_lsn: 0,
            stopped: None,
            shutdown: false,
            flusher_wanted: false,
            flusher_asleep: false,
            segment_seq: current.seq,
            segment_path: current.path.clone(),
            segment_file: current.file.clone(),
            segment_written: writer.pos,
            segment_synced: writer.synced,
        };
        let immediate = config.sync == SyncPolicy::Immediate;
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            batch_cv: [Condvar::new(), Condvar::new()],
            space_cv: Condvar::new(),
            flusher_cv: Condvar::new(),
            syncer_cv: Condvar::new(),
            spare_cv: Condvar::new(),
            checkpoint_cv: Condvar::new(),
            writer: Mutex::new(writer),
            watermark: Mutex::new(watermark),
            incarnation,
            completion_idle: Duration::from_millis(u64::from(config.completion_idle_ms.max(1))),
            immediate,
            pending_bytes_max,
            record_bytes_max,
            stats,
        });
        let mut log = JournalLog {
            shared,
            threads: Vec::new(),
            recovered: Mutex::new(recovered),
            incarnation,
            warnings,
        };
        let spawn_error = |e: std::io::Error| LogError::Config(format!("cannot start a journal thread: {e}"));
        let shared = log.shared.clone();
        log.threads.push(
            std::thread::Builder::new()
                .name("decree-journal-flush".into())
                .spawn(move || shared.flusher_loop())
                .map_err(spawn_error)?,
        );
        let shared = log.shared.clone();
        log.threads.push(
            std::thread::Builder::new()
                .name("decree-journal-spare".into())
                .spawn(move || shared.spare_loop())
                .map_err(spawn_error)?,
        );
        let shared = log.shared.clone();
        log.threads.push(
            std::thread::Builder::new()
                .name("decree-journal-mark".into())
                .spawn(move || shared.checkpoint_loop())
                .map_err(spawn_error)?,
        );
        if let SyncPolicy::Window(window) = config.sync {
            let period = (window / 2).max(Duration::from_millis(1));
            let shared = log.shared.clone();
            log.threads.push(
                std::thread::Builder::new()
                    .name("decree-journal-sync".into())
                    .spawn(move || shared.syncer_loop(period))
                    .map_err(spawn_error)?,
            );
        }
        Ok(log)
    }

    /// Segment files in the range recovery reads, and spare files kept for reuse.
    pub fn segment_files(&self) -> (usize, usize) {
        let writer = self.shared.writer.lock();
        (writer.segments.len(), writer.free.len())
    }

    /// Transactions with live records, as the engine tracks them.
    pub fn live_transactions(&self) -> usize {
        self.shared.writer.lock().live.len()
    }

    fn check_size(&self, payload: &[u8]) -> Result<(), LogError> {
        if payload.len() > self.shared.record_bytes_max {
            return Err(LogError::RecordTooLarge { len: payload.len(), max: self.shared.record_bytes_max });
        }
        Ok(())
    }
}

impl Log for JournalLog {
    fn append(&self, txn: TxnKey, payload: &[u8]) -> Result<(), LogError> {
        self.check_size(payload)?;
        let shared = &*self.shared;
        let mut st = shared.state.lock();
        let lsn = shared.enqueue(
            &mut st,
            RecordKind::Data,
            txn,
            payload,
            shared.pending_bytes_max,
            WhenFull::Lead,
        )?;
        shared.stats.appended.fetch_add(1, Ordering::Relaxed);
        shared.wait_for(&mut st, lsn, false)
    }

    fn append_with(&self, txn: TxnKey, payload: &[u8], done: DurableCallback) {
        if let Err(err) = self.check_size(payload) {
            return done(Err(err));
        }
        let shared = &*self.shared;
        let mut st = shared.state.lock();
        let frame = record::frame_len(payload.len()) + MARKER_BYTES;
        // Under a window the acknowledgement needs only the write, a memory copy when the
        // batch fits in the mapped segment: lead the flush in this thread and call back,
        // without a hand-off.
        let inline = !shared.immediate
            && st.stopped.is_none()
            && !st.flush_in_flight
            && st.overflow.is_empty()
            && st.sync_wanted_lsn <= st.durable_lsn
            && st.pending.len() + frame <= shared.pending_bytes_max
            && shared.fits_without_io(&st, frame - MARKER_BYTES);
        if st.stopped.is_none()
            && (!st.overflow.is_empty() || st.pending.len() + frame > shared.pending_bytes_max)
        {
            // Park the record behind earlier parked ones (keeping per-transaction order).
            if st.overflow_bytes + payload.len() > OVERFLOW_BATCHES_MAX * shared.pending_bytes_max {
                drop(st);
                return done(Err(LogError::Full(format!(
                    "journal append queue is full ({} batches waiting); retry when flushes catch up",
                    OVERFLOW_BATCHES_MAX
                ))));
            }
            st.overflow_bytes += payload.len();
            st.overflow.push_back((txn, payload.to_vec(), done));
            shared.stats.appended.fetch_add(1, Ordering::Relaxed);
            shared.want_flusher(&mut st);
            return;
        }
        match shared.enqueue(
            &mut st,
            RecordKind::Data,
            txn,
            payload,
            shared.pending_bytes_max,
            WhenFull::Fail,
        ) {
            Ok(_) => {
                shared.stats.appended.fetch_add(1, Ordering::Relaxed);
                st.callbacks.push(done);
                if inline {
                    shared.lead(&mut st, false);
                } else {
                    shared.want_flusher(&mut st);
                }
            }
            Err(err) => {
                drop(st);
                done(Err(err));
            }
        }
    }

    fn complete(&self, txn: TxnKey) -> Result<(), LogError> {
        let shared = &*self.shared;
        let mut st = shared.state.lock();
        let limit = 2 * shared.pending_bytes_max;
        shared.enqueue(&mut st, RecordKind::Completion, txn, &[], limit, WhenFull::Wait)?;
        shared.stats.completions.fetch_add(1, Ordering::Relaxed);
        if !st.flush_in_flight && shared.completions_fill_a_write(&st) {
            st.flusher_wanted = true;
            shared.flusher_cv.notify_one();
        } else if st.flusher_asleep {
            // Starts the flusher's idle clock for this completion.
            st.flusher_asleep = false;
            shared.flusher_cv.notify_one();
        }
        Ok(())
    }

    fn take_recovered(&self) -> Vec<LiveRecord> {
        std::mem::take(&mut *self.recovered.lock())
    }

    fn incarnation(&self) -> u64 {
        self.incarnation
    }

    fn sync(&self) -> Result<(), LogError> {
        let shared = &*self.shared;
        let mut st = shared.state.lock();
        if let Some(err) = &st.stopped {
            return Err(err.clone());
        }
        if st.pending.is_empty() && !st.flush_in_flight && st.durable_lsn >= st.acked_lsn {
            return Ok(());
        }
        if st.pending.is_empty() {
            // An empty batch (just a marker) carries the sync request.
            st.pending.resize(MARKER_BYTES, 0);
        }
        let target = st.pending_base_lsn + st.pending.len() as u64;
        st.sync_wanted_lsn = st.sync_wanted_lsn.max(target);
        shared.wait_for(&mut st, target, true)
    }

    fn stats(&self) -> LogStats {
        self.shared.stats.snapshot()
    }

    fn write_times(&self) -> WriteTimes {
        self.shared.stats.write_times.snapshot()
    }

    fn open_warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }
}

impl Drop for JournalLog {
    fn drop(&mut self) {
        {
            let mut st = self.shared.state.lock();
            st.shutdown = true;
            self.shared.flusher_cv.notify_all();
            self.shared.syncer_cv.notify_all();
            self.shared.checkpoint_cv.notify_all();
        }
        {
            let mut writer = self.shared.writer.lock();
            writer.closing = true;
            self.shared.spare_cv.notify_all();
        }
        // Dropped by a callback on one of these threads, that one is not joined: it ends
        // after the callback returns, and the final flush below runs on it meanwhile.
        for thread in self.threads.drain(..) {
            if super::worker::join_unless_current(thread) {
                tracing::error!("a journal thread panicked");
            }
        }
        // Write out buffered completions so that a clean shutdown replays nothing finished,
        // and sync at least once, so that the writer knows its end is durable for the mark.
        let mut st = self.shared.state.lock();
        while st.stopped.is_none() && !st.flush_in_flight {
            self.shared.lead(&mut st, true);
            if st.pending.is_empty() && st.overflow.is_empty() && st.acked_lsn <= st.durable_lsn {
                break;
            }
        }
        self.shared.hand_off(&mut st);
        let clean = st.stopped.is_none() && st.durable_lsn >= st.acked_lsn && st.pending.is_empty();
        drop(st);
        if clean {
            self.shared.mark_clean_close();
        }
    }
}
