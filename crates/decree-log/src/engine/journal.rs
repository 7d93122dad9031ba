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
//! preparation). The on-disk layout is described in `journal/format.rs`, recovery
//! in `journal/recovery.rs`.

mod format;
mod recovery;

use crate::engine::watermark::{self, End, Found, Mark, Watermark};
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

fn write_error(path: &std::path::Path, err: std::io::Error) -> LogError {
    if err.raw_os_error() == Some(libc::ENOSPC) || err.kind() == std::io::ErrorKind::StorageFull {
        LogError::Full(format!("no space left on the device writing {}: {err}", path.display()))
    } else {
        LogError::io(path, err)
    }
}

fn sync_error(path: &std::path::Path, err: std::io::Error) -> LogError {
    LogError::SyncFailed { path: path.to_path_buf(), message: err.to_string() }
}

/// Length of a batch of `len` bytes padded to whole pages for a direct write, leaving room
/// for a padding frame (at least its header) when the batch does not end on a boundary.
fn padded_len(len: usize) -> usize {
    let mut padded = len.div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;
    if padded != len && padded - len < HEADER_BYTES {
        padded += DIRECT_ALIGN;
    }
    padded
}

/// Copies `batch` to a page-aligned slice of `staging` and fills it up to `padded` bytes
/// with a padding frame of segment `seq`; returns the slice to write.
fn pad_for_direct<'a>(
    staging: &'a mut Vec<u8>,
    batch: &[u8],
    padded: usize,
    seq: u64,
    zeros: &[u8],
) -> &'a [u8] {
    if staging.len() < padded + DIRECT_ALIGN {
        staging.resize(padded + DIRECT_ALIGN, 0);
    }
    let start = staging.as_ptr().align_offset(DIRECT_ALIGN);
    let page_buf = &mut staging[start..start + padded];
    page_buf[..batch.len()].copy_from_slice(batch);
    let gap = padded - batch.len();
    if gap > 0 {
        record::encode_into(
            &mut page_buf[batch.len()..],
            RecordKind::Padding,
            seq,
            &zeros[..gap - HEADER_BYTES],
        );
    }
    page_buf
}

impl Writer {
    fn segment_mut(&mut self, seq: u64) -> &mut Segment {
        let first = self.segments.front().map(|s| s.seq).unwrap_or(0);
        let index = seq.checked_sub(first).expect("live record in a dropped segment") as usize;
        let segment = &mut self.segments[index];
        assert_eq!(segment.seq, seq, "segment range is not contiguous");
        segment
    }

    fn add_live(&mut self, txn: TxnKey, loc: Loc) {
        let segment = self.segment_mut(loc.seq);
        segment.live_records += 1;
        segment.live_bytes += u64::from(loc.len);
        match self.live.entry(txn) {
            MapEntry::Occupied(mut o) => o.get_mut().push(loc),
            MapEntry::Vacant(v) => {
                v.insert(Locs::One(loc));
            }
        }
    }

    fn remove_live(&mut self, txn: TxnKey) {
        if let Some(locs) = self.live.remove(&txn) {
            for loc in locs.as_slice() {
                let segment = self.segment_mut(loc.seq);
                assert!(segment.live_records > 0 && segment.live_bytes >= u64::from(loc.len));
                segment.live_records -= 1;
                segment.live_bytes -= u64::from(loc.len);
            }
        }
    }

    /// Writes one batch (starting with its marker slot) and tracks its records.
    fn write_batch(
        &mut self,
        buf: &mut [u8],
        entries: &[Entry],
        synced_hint: (u64, u64),
        sync: bool,
        stats: &StatCounters,
    ) -> Result<Written, LogError> {
        let mut earlier_durable = false;
        if let Some(current) = self.segments.back() {
            if current.seq == synced_hint.0 {
                self.synced = self.synced.max(synced_hint.1);
            }
        }
        let direct = self.use_direct && !buf.is_empty();
        let need = if direct { padded_len(buf.len()) as u64 } else { buf.len() as u64 };
        let fits = self.segments.back().is_some_and(|s| self.pos + need <= s.capacity);
        if !fits {
            self.rotate(need, stats)?;
            earlier_durable = true;
        }
        let current = self.segments.back().expect("a segment after rotation");
        let (seq, file, path) = (current.seq, &current.file, &current.path);
        let batch_pos = self.pos;
        if !buf.is_empty() {
            assert!(buf.len() >= MARKER_BYTES, "a batch starts with its marker");
            let marker = BatchMarker {
                batch_len: (need as usize - MARKER_BYTES) as u32,
                synced_through: self.synced as u32,
            };
            format::write_marker(buf, seq, marker, &mut self.marker_scratch);
            match &current.map {
                _ if current.direct.is_some() => {
                    let page_buf = pad_for_direct(&mut self.direct_buf, buf, need as usize, seq, &self.zeros);
                    let direct = current.direct.as_ref().expect("checked by the guard");
                    direct.write_all_at(page_buf, batch_pos).map_err(|e| write_error(path, e))?;
                    // O_DSYNC: durable now.
                    stats.flushes.fetch_add(1, Ordering::Relaxed);
                    self.synced = batch_pos + need;
                }
                Some(map) => {
                    assert!(batch_pos + need <= map.len() as u64, "batch past the end of the mapping");
                    // SAFETY: the mapping covers `capacity` bytes of a pre-allocated file that is
                    // never truncated while mapped (the directory lock keeps other processes
                    // out), only the flush leader writes to it (it holds the writer lock), and
                    // the range was just checked to lie inside the mapping.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            buf.as_ptr(),
                            map.as_mut_ptr().add(batch_pos as usize),
                            buf.len(),
                        );
                    }
                }
                None => file.write_all_at(buf, batch_pos).map_err(|e| write_error(path, e))?,
            }
            stats.bytes_written.fetch_add(need, Ordering::Relaxed);
            self.pos += need;
            // Each direct batch ends on a page boundary, so the next starts on a fresh page
            // and a page holding acknowledged records is never written again.
            assert!(!direct || current.direct.is_none() || self.pos.is_multiple_of(DIRECT_ALIGN as u64));
        }
        if sync && self.synced < self.pos {
            if let Err(e) = file.sync_data() {
                self.sync_failed = true;
                return Err(sync_error(path, e));
            }
            stats.flushes.fetch_add(1, Ordering::Relaxed);
            self.synced = self.pos;
        }
        assert!(
            self.synced <= self.pos && self.pos <= current.capacity,
            "the durable end {} never passes the written end {} nor the segment's {} bytes",
            self.synced,
            self.pos,
            current.capacity
        );
        let new_segment = (seq != synced_hint.0).then(|| (path.clone(), file.clone()));
        if sync {
            earlier_durable = true;
        }
        for entry in entries {
            match entry.kind {
                RecordKind::Data => {
                    let offset = (batch_pos + u64::from(entry.offset)) as u32;
                    self.add_live(entry.txn, Loc { seq, offset, len: entry.len });
                }
                RecordKind::Completion => self.remove_live(entry.txn),
                RecordKind::Padding => {}
            }
        }
        Ok(Written { seq, new_segment, end: self.pos, synced: self.synced, earlier_durable })
    }

    /// Appends to `scratch` a checkpoint batch of segment `seq` copying every record of
    /// `txns` (each after a Completion of its older copies, which keeps per-transaction
    /// order), read back and checked from the old segments; returns the new locations.
    fn copy_checkpoint(
        &mut self,
        scratch: &mut Vec<u8>,
        seq: u64,
        txns: Vec<TxnKey>,
    ) -> Result<Vec<(TxnKey, Vec<Loc>)>, LogError> {
        let mut copies: Vec<(TxnKey, Vec<Loc>)> = Vec::with_capacity(txns.len());
        if txns.is_empty() {
            return Ok(copies);
        }
        let marker_at = scratch.len();
        scratch.resize(marker_at + MARKER_BYTES, 0);
        for txn in txns {
            record::encode(scratch, RecordKind::Completion, txn, &[]);
            let mut new_locs = Vec::new();
            for loc in self.live.get(&txn).map(Locs::as_slice).unwrap_or(&[]) {
                let at = scratch.len();
                scratch.resize(at + loc.len as usize, 0);
                let index = (loc.seq - self.segments[0].seq) as usize;
                let source = &self.segments[index];
                source
                    .file
                    .read_exact_at(&mut scratch[at..], u64::from(loc.offset))
                    .map_err(|e| LogError::io(&source.path, e))?;
                match record::decode(&scratch[at..], loc.len as usize) {
                    Decoded::Frame(f, n)
                        if f.kind == RecordKind::Data && f.txn == txn && n == scratch.len() - at => {}
                    other => {
                        return Err(LogError::Corrupted {
                            path: source.path.clone(),
                            offset: u64::from(loc.offset),
                            reason: format!("live record of transaction {txn} reads back as {other:?}"),
                        })
                    }
                }
                new_locs.push(Loc { seq, offset: at as u32, len: loc.len });
            }
            copies.push((txn, new_locs));
        }
        let batch_len = (scratch.len() - marker_at - MARKER_BYTES) as u32;
        let marker = BatchMarker { batch_len, synced_through: 0 };
        format::write_marker(&mut scratch[marker_at..], seq, marker, &mut self.marker_scratch);
        Ok(copies)
    }

    /// Closes the current segment (synced in full) and starts the next one, dropping old
    /// segments without live records and checkpointing those with few.
    fn rotate(&mut self, need: u64, stats: &StatCounters) -> Result<(), LogError> {
        if let Some(current) = self.segments.back() {
            if self.synced < self.pos {
                if let Err(e) = current.file.sync_data() {
                    self.sync_failed = true;
                    return Err(sync_error(&current.path, e));
                }
                stats.flushes.fetch_add(1, Ordering::Relaxed);
                self.synced = self.pos;
            }
        }
        let previous_end = self.pos;
        let seq = self.next_seq;
        assert!(self.segments.back().is_none_or(|last| last.seq < seq), "segment sequence numbers only grow");
        let (drop_count, copy_txns) = self.plan_checkpoint();
        let oldest_needed = self.segments.get(drop_count).map(|s| s.seq).unwrap_or(seq);

        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        format::encode_header(&mut scratch, &SegmentHeader { seq, oldest_needed, previous_end });
        let copies = self.copy_checkpoint(&mut scratch, seq, copy_txns)?;
        if self.use_direct {
            // Direct writes start on a page boundary: a batch of padding fills the rest of
            // the header's (or the checkpoint's) last page.
            let marker_at = scratch.len();
            scratch.resize(marker_at + MARKER_BYTES, 0);
            // No gap when the marker itself ends the page: the batch is then empty, like a
            // `sync` batch's, instead of a padding frame of minus 17 bytes.
            let gap = padded_len(scratch.len()) - scratch.len();
            if gap > 0 {
                record::encode(&mut scratch, RecordKind::Padding, seq, &self.zeros[..gap - HEADER_BYTES]);
            }
            let batch_len = (scratch.len() - marker_at - MARKER_BYTES) as u32;
            let marker = BatchMarker { batch_len, synced_through: 0 };
            format::write_marker(&mut scratch[marker_at..], seq, marker, &mut self.marker_scratch);
            assert_eq!(scratch.len() % DIRECT_ALIGN, 0, "a direct write starts on a page boundary");
        }
        if scratch.len() as u64 + need > self.segment_bytes {
            return Err(LogError::Full(format!(
                "a batch of {need} bytes and a checkpoint of {} bytes do not fit in a segment of {} bytes",
                scratch.len(),
                self.segment_bytes
            )));
        }
        let (path, file, capacity) = self.take_file()?;
        file.write_all_at(&scratch, 0).map_err(|e| write_error(&path, e))?;
        file.sync_data().map_err(|e| sync_error(&path, e))?;
        stats.flushes.fetch_add(1, Ordering::Relaxed);
        stats.bytes_written.fetch_add(scratch.len() as u64, Ordering::Relaxed);

        // The new header is durable: the dropped segments are no longer read by recovery.
        if let Some(previous) = self.segments.back_mut() {
            previous.map = None;
        }
        let map = self.map_segment(&path, &*file, capacity);
        let direct = if self.use_direct {
            let direct = self.storage.open_direct(&path).map_err(|e| LogError::io(&path, e))?;
            if direct.is_none() {
                tracing::debug!("journal: no O_DIRECT on this file system; writing with fdatasync");
                self.use_direct = false;
            }
            direct
        } else {
            None
        };
        if let Some(previous) = self.segments.back_mut() {
            previous.direct = None;
        }
        self.segments.push_back(Segment {
            seq,
            path,
            file,
            map,
            direct,
            capacity,
            live_records: 0,
            live_bytes: 0,
        });
        for (txn, new_locs) in copies {
            self.remove_live(txn);
            for loc in new_locs {
                self.add_live(txn, loc);
            }
        }
        for _ in 0..drop_count {
            let old = self.segments.pop_front().expect("dropped segment exists");
            assert_eq!(old.live_records, 0, "segment {} dropped with live records", old.seq);
            self.free.push(FreeFile { path: old.path, file: old.file, capacity: old.capacity });
        }
        self.next_seq += 1;
        self.pos = scratch.len() as u64;
        self.synced = self.pos;
        assert!(self.pos <= capacity && self.segments.back().is_some_and(|s| s.seq == seq));
        self.scratch = scratch;
        Ok(())
    }

    /// How many leading segments the next header drops, and which transactions must be
    /// copied forward for that. Only segments older than the current one are copied, and
    /// only while the copies stay small.
    fn plan_checkpoint(&self) -> (usize, Vec<TxnKey>) {
        let mut zero_prefix = 0;
        while zero_prefix < self.segments.len() && self.segments[zero_prefix].live_records == 0 {
            zero_prefix += 1;
        }
        let budget = self.segment_bytes / 4;
        let mut drop_count = zero_prefix;
        let mut estimate = 0;
        while drop_count + 1 < self.segments.len() {
            let segment = &self.segments[drop_count];
            if estimate + segment.live_bytes > budget {
                break;
            }
            estimate += segment.live_bytes;
            drop_count += 1;
        }
        if drop_count == zero_prefix {
            return (zero_prefix, Vec::new());
        }
        let first_kept = self.segments[drop_count].seq;
        let mut txns = Vec::new();
        let mut cost = 0u64;
        for (txn, locs) in &self.live {
            if locs.as_slice().iter().any(|l| l.seq < first_kept) {
                cost += HEADER_BYTES as u64 + locs.as_slice().iter().map(|l| u64::from(l.len)).sum::<u64>();
                txns.push(*txn);
            }
        }
        if cost > self.segment_bytes / 2 {
            return (zero_prefix, Vec::new());
        }
        // Deterministic order keeps the on-disk result reproducible.
        txns.sort_unstable();
        (drop_count, txns)
    }

    /// Maps the new current segment when batches go through a mapping; `None` otherwise or
    /// when mapping fails (then batches use `pwrite`, which is only slower).
    fn map_segment(
        &self,
        path: &std::path::Path,
        file: &dyn StorageFile,
        capacity: u64,
    ) -> Option<memmap2::MmapRaw> {
        let fd = file.raw_fd().filter(|_| self.use_map)?;
        match memmap2::MmapOptions::new().len(capacity as usize).map_raw(fd) {
            Ok(map) => Some(map),
            Err(err) => {
                tracing::warn!(path = %path.display(), %err, "journal: cannot map the segment, using pwrite");
                None
            }
        }
    }

    /// A file for the next segment: a free one (normally the spare the spare-file thread
    /// keeps ready), or, when that thread fell behind, a new one prepared here.
    fn take_file(&mut self) -> Result<(PathBuf, Arc<dyn StorageFile>, u64), LogError> {
        if let Some(free) = self.free.pop() {
            return Ok((free.path, free.file, free.capacity));
        }
        let file_id = self.next_file_id;
        self.next_file_id += 1;
        let free = prepare_file(&*self.storage, &self.dir, file_id, self.segment_bytes)?;
        Ok((free.path, free.file, free.capacity))
    }
}

/// Creates segment file `file_id`: pre-allocated, zero-filled and synced, its directory
/// entry synced, so that a rotation into it only writes and syncs the new header.
fn prepare_file(
    storage: &dyn Storage,
    dir: &std::path::Path,
    file_id: u64,
    segment_bytes: u64,
) -> Result<FreeFile, LogError> {
    let path = dir.join(format::file_name(file_id));
    let file = storage.open(&path, true).map_err(|e| write_error(&path, e))?;
    if let Err(e) = file.preallocate(segment_bytes) {
        // A half-allocated file holds no header, so recovery would treat it as free;
        // removing it gives the space back now.
        let _ = storage.remove(&path);
        return Err(write_error(&path, e));
    }
    storage.sync_dir(dir).map_err(|e| sync_error(dir, e))?;
    Ok(FreeFile { path, file, capacity: segment_bytes })
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

impl State {
    /// Asserts the group commit's invariants (see the module documentation): a few
    /// comparisons, run at the start and the end of every batch, never per record.
    fn assert_batch(&self) {
        assert!(
            self.durable_lsn <= self.acked_lsn && self.acked_lsn <= self.pending_base_lsn,
            "durable {} <= written {} <= taken {} does not hold",
            self.durable_lsn,
            self.acked_lsn,
            self.pending_base_lsn
        );
        assert!(
            self.segment_synced <= self.segment_written,
            "the segment's durable end passed its written end"
        );
        match self.entries.last() {
            // Every frame of the buffer has its entry; the last one ends the buffer.
            Some(last) => assert_eq!(last.offset as usize + last.len as usize, self.pending.len()),
            // No record: nothing, or the marker alone (a `sync` request).
            None => assert!(self.pending.is_empty() || self.pending.len() == MARKER_BYTES),
        }
        assert!(self.callbacks.len() <= self.entries.len(), "a callback per appended record at most");
        assert!(
            self.pending_blocked == 0 || !self.pending.is_empty(),
            "blocked waiters wait for records in it"
        );
    }
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

impl Shared {
    fn enqueue(
        &self,
        st: &mut MutexGuard<'_, State>,
        kind: RecordKind,
        txn: TxnKey,
        payload: &[u8],
        limit: usize,
        when_full: WhenFull,
    ) -> Result<u64, LogError> {
        let frame = record::frame_len(payload.len());
        loop {
            if let Some(err) = &st.stopped {
                return Err(err.clone());
            }
            let need = frame + if st.pending.is_empty() { MARKER_BYTES } else { 0 };
            if st.pending.len() + need <= limit {
                break;
            }
            match when_full {
                WhenFull::Fail => {
                    return Err(LogError::Full(format!(
                        "journal append queue of {limit} bytes is full; retry when flushes catch up"
                    )))
                }
                WhenFull::Lead if !st.flush_in_flight => self.lead(st, false),
                WhenFull::Wait if !st.flush_in_flight => {
                    st.flusher_wanted = true;
                    self.flusher_cv.notify_one();
                    self.space_cv.wait(st);
                }
                _ => self.space_cv.wait(st),
            }
        }
        if st.pending.is_empty() {
            st.pending.resize(MARKER_BYTES, 0);
        }
        let offset = st.pending.len();
        record::encode(&mut st.pending, kind, txn, payload);
        st.entries.push(Entry { kind, txn, offset: offset as u32, len: frame as u32 });
        Ok(st.pending_base_lsn + st.pending.len() as u64)
    }

    /// Flushes the pending batch; the caller holds the state lock and no flush is in flight.
    fn lead(&self, st: &mut MutexGuard<'_, State>, force_sync: bool) {
        assert!(!st.flush_in_flight, "two flush leaders at once");
        st.assert_batch();
        st.flush_in_flight = true;
        if st.pending.is_empty() {
            self.refill_from_overflow(st);
        }
        let spare = std::mem::take(&mut st.spare_pending);
        let mut buf = std::mem::replace(&mut st.pending, spare);
        let spare = std::mem::take(&mut st.spare_entries);
        let mut entries = std::mem::replace(&mut st.entries, spare);
        let callbacks = std::mem::take(&mut st.callbacks);
        let batch_end = st.pending_base_lsn + buf.len() as u64;
        st.pending_base_lsn = batch_end;
        let batch_no = st.batch_no;
        st.batch_no += 1;
        st.pending_blocked = 0;
        self.refill_from_overflow(st);
        let sync = self.immediate || force_sync || st.sync_wanted_lsn > st.durable_lsn;
        let hint = (st.segment_seq, st.segment_synced);
        let acked_before = st.acked_lsn;
        self.space_cv.notify_all();
        let (durable_before, segment_before) = (st.durable_lsn, st.segment_seq);
        let result = MutexGuard::unlocked(st, || {
            if buf.is_empty() && !sync {
                return Ok(None);
            }
            let mut writer = self.writer.lock();
            let started = std::time::Instant::now();
            let written = writer.write_batch(&mut buf, &entries, hint, sync, &self.stats);
            if sync && self.immediate && written.is_ok() {
                self.stats.write_times.record(started.elapsed());
            }
            if writer.free.is_empty() {
                self.spare_cv.notify_one();
            }
            written.map(Some)
        });
        let ok = result.is_ok();
        match result {
            Ok(Some(written)) => {
                st.acked_lsn = batch_end;
                if sync {
                    st.durable_lsn = batch_end;
                } else if written.earlier_durable {
                    st.durable_lsn = st.durable_lsn.max(acked_before);
                }
                if let Some((path, file)) = written.new_segment {
                    assert!(written.seq > st.segment_seq, "segment sequence numbers only grow");
                    st.segment_seq = written.seq;
                    st.segment_path = path;
                    st.segment_file = file;
                    st.segment_synced = written.synced;
                } else {
                    // Only a leader moves the segment: it is the one this batch was given.
                    assert!(written.seq == st.segment_seq && written.end >= st.segment_written);
                    st.segment_synced = st.segment_synced.max(written.synced);
                }
                st.segment_written = written.end;
            }
            Ok(None) => st.acked_lsn = batch_end,
            Err(err) => {
                tracing::error!(%err, "journal: flush failed, the log is stopped");
                if st.stopped.is_none() {
                    st.stopped = Some(err);
                }
            }
        }
        buf.clear();
        entries.clear();
        st.spare_pending = buf;
        st.spare_entries = entries;
        st.flush_in_flight = false;
        // Positions only grow (the syncer may have moved `durable_lsn` meanwhile, forward).
        assert!(st.batch_no == batch_no + 1 && st.pending_base_lsn == batch_end);
        assert!(st.durable_lsn >= durable_before && st.segment_seq >= segment_before);
        assert!(!ok || st.acked_lsn == batch_end, "a flushed batch is acknowledged to its end");
        st.assert_batch();
        self.batch_cv[(batch_no % 2) as usize].notify_all();
        self.hand_off(st);
        if !callbacks.is_empty() {
            let outcome =
                if ok { Ok(()) } else { Err(st.stopped.clone().expect("failed flush stops the log")) };
            MutexGuard::unlocked(st, || {
                for done in callbacks {
                    done(outcome.clone());
                }
            });
        }
    }

    /// Moves parked `append_with` records into the (new) pending batch while they fit.
    fn refill_from_overflow(&self, st: &mut MutexGuard<'_, State>) {
        while let Some((_, payload, _)) = st.overflow.front() {
            let need =
                record::frame_len(payload.len()) + if st.pending.is_empty() { MARKER_BYTES } else { 0 };
            if st.pending.len() + need > self.pending_bytes_max {
                return;
            }
            let (txn, payload, done) = st.overflow.pop_front().expect("front exists");
            st.overflow_bytes -= payload.len();
            if st.pending.is_empty() {
                st.pending.resize(MARKER_BYTES, 0);
            }
            let offset = st.pending.len();
            record::encode(&mut st.pending, RecordKind::Data, txn, &payload);
            let len = (st.pending.len() - offset) as u32;
            st.entries.push(Entry { kind: RecordKind::Data, txn, offset: offset as u32, len });
            st.callbacks.push(done);
        }
    }

    /// After a flush: start the next one if records wait, or fail everyone if stopped.
    fn hand_off(&self, st: &mut MutexGuard<'_, State>) {
        if let Some(err) = st.stopped.clone() {
            for cv in &self.batch_cv {
                cv.notify_all();
            }
            self.space_cv.notify_all();
            let mut callbacks = std::mem::take(&mut st.callbacks);
            callbacks.extend(st.overflow.drain(..).map(|(_, _, done)| done));
            st.overflow_bytes = 0;
            if !callbacks.is_empty() {
                MutexGuard::unlocked(st, || {
                    for done in callbacks {
                        done(Err(err.clone()));
                    }
                });
            }
            return;
        }
        if (st.pending.is_empty() && st.overflow.is_empty()) || st.flush_in_flight {
            return;
        }
        if st.pending_blocked > 0 {
            self.batch_cv[(st.batch_no % 2) as usize].notify_one();
        } else if !self.immediate || self.flush_needed_now(st) {
            st.flusher_wanted = true;
            self.flusher_cv.notify_one();
        }
    }

    /// Whether the pending batch must be written now under `rpo = 0`: somebody waits for
    /// it, or its completions fill a write. Completions alone ride with the next synced
    /// batch (or go out once the log is idle, see `flusher_loop`): written on their own,
    /// they took the device from the next decision (32 threads of the extreme workload:
    /// 0.59-0.64 synced writes per commit with them, 0.51-0.57 without).
    fn flush_needed_now(&self, st: &State) -> bool {
        !st.callbacks.is_empty()
            || !st.overflow.is_empty()
            || st.sync_wanted_lsn > st.durable_lsn
            || self.completions_fill_a_write(st)
    }

    /// Buffered completions are enough to be worth a write of their own.
    fn completions_fill_a_write(&self, st: &State) -> bool {
        st.pending.len() >= COMPLETION_FLUSH_BYTES.min(self.pending_bytes_max / 2)
    }

    /// Asks the flusher thread for a flush; it is woken once per request, not per record
    /// (a flush in flight or an earlier request will pick the records up).
    fn want_flusher(&self, st: &mut MutexGuard<'_, State>) {
        if !st.flush_in_flight && !st.flusher_wanted {
            st.flusher_wanted = true;
            self.flusher_cv.notify_one();
        }
    }

    /// Blocks until `lsn` is acknowledged (or durable), leading flushes when none runs.
    fn wait_for(&self, st: &mut MutexGuard<'_, State>, lsn: u64, durable: bool) -> Result<(), LogError> {
        let batch = st.batch_no;
        // The waiter's record is in the pending batch, the one numbered `batch`.
        assert!(
            st.pending_base_lsn < lsn && lsn <= st.pending_base_lsn + st.pending.len() as u64,
            "a waiter waits for a record of the pending batch"
        );
        st.pending_blocked += 1;
        loop {
            let reached = if durable { st.durable_lsn } else { st.acked_lsn };
            if reached >= lsn {
                return Ok(());
            }
            if let Some(err) = &st.stopped {
                return Err(err.clone());
            }
            // Batch `batch` ends (acknowledged, synced when a durable waiter asked) before
            // the next one is taken: a later batch number with `lsn` not reached means a
            // flush dropped a waiter's record.
            assert!(st.batch_no <= batch + 1, "batch {batch} was flushed without acknowledging {lsn}");
            if !st.flush_in_flight {
                self.lead(st, durable);
                continue;
            }
            self.batch_cv[(batch % 2) as usize].wait(st);
        }
    }

    /// Keeps one spare segment file ready, so that a rotation never creates, zero-fills
    /// and syncs a file on the commit path. It only adds a file when none is free, so the
    /// directory holds at most one file more than the segments in use and their recycled
    /// files. Allocation failures (a full disk) are retried, rotation then prepares inline
    /// and reports the error to the batch that needed the file.
    fn spare_loop(&self) {
        let mut writer = self.writer.lock();
        loop {
            if writer.closing {
                return;
            }
            if !writer.free.is_empty() {
                self.spare_cv.wait(&mut writer);
                continue;
            }
            let file_id = writer.next_file_id;
            writer.next_file_id += 1;
            let (storage, dir, segment_bytes) =
                (writer.storage.clone(), writer.dir.clone(), writer.segment_bytes);
            let prepared =
                MutexGuard::unlocked(&mut writer, || prepare_file(&*storage, &dir, file_id, segment_bytes));
            match prepared {
                Ok(file) => writer.free.push(file),
                Err(err) => {
                    tracing::warn!(%err, "journal: cannot prepare a spare segment file, retrying");
                    self.spare_cv.wait_for(&mut writer, SPARE_RETRY_DELAY);
                }
            }
        }
    }

    /// Whether the pending batch plus a frame of `frame` bytes can be written right now
    /// without disk IO: no rotation needed, and the segment is mapped (a memory copy) or
    /// simulated. Caller holds the state lock with no flush in flight, so no leader can
    /// move the write position until it leads itself.
    fn fits_without_io(&self, st: &State, frame: usize) -> bool {
        let Some(writer) = self.writer.try_lock() else {
            return false;
        };
        let need = (st.pending.len() + frame + if st.pending.is_empty() { MARKER_BYTES } else { 0 }) as u64;
        writer.segments.back().is_some_and(|current| {
            (current.map.is_some() || current.file.raw_fd().is_none())
                && writer.pos + need <= current.capacity
        })
    }

    fn flusher_loop(&self) {
        let mut st = self.state.lock();
        loop {
            if st.flusher_wanted && !st.flush_in_flight {
                st.flusher_wanted = false;
                if (!st.pending.is_empty() || !st.overflow.is_empty()) && st.stopped.is_none() {
                    self.lead(&mut st, false);
                    continue;
                }
            }
            if st.shutdown {
                return;
            }
            // A request seen during someone else's flush is that leader's to hand off: its
            // `hand_off` wakes this thread again if records remain. Clearing it here keeps
            // the flag meaning "a wake-up is on its way", which `want_flusher` relies on.
            st.flusher_wanted = false;
            if !self.immediate {
                self.flusher_cv.wait(&mut st);
                continue;
            }
            if st.pending.is_empty() && !st.flush_in_flight {
                st.flusher_asleep = true;
                self.flusher_cv.wait(&mut st);
                st.flusher_asleep = false;
                continue;
            }
            // Under `rpo = 0` completions left behind by the last synced batch are written
            // once a whole idle period passed with no flush in flight and no new batch.
            let (batch_seen, quiet) = (st.batch_no, !st.flush_in_flight);
            let idle = self.flusher_cv.wait_for(&mut st, self.completion_idle).timed_out();
            if idle
                && quiet
                && st.batch_no == batch_seen
                && !st.flush_in_flight
                && !st.pending.is_empty()
                && st.stopped.is_none()
                && !st.shutdown
            {
                self.lead(&mut st, false);
            }
        }
    }

    /// Under `Window(d)`: writes what is buffered and syncs the current segment every `d/2`.
    fn syncer_loop(&self, period: Duration) {
        let mut st = self.state.lock();
        loop {
            if st.shutdown {
                return;
            }
            self.syncer_cv.wait_for(&mut st, period);
            if st.shutdown {
                return;
            }
            if st.stopped.is_some() {
                continue;
            }
            if (!st.pending.is_empty() || !st.overflow.is_empty()) && !st.flush_in_flight {
                self.lead(&mut st, false);
            }
            if st.acked_lsn <= st.durable_lsn || st.stopped.is_some() {
                continue;
            }
            let (file, path, seq) = (st.segment_file.clone(), st.segment_path.clone(), st.segment_seq);
            let (written, lsn) = (st.segment_written, st.acked_lsn);
            let synced = MutexGuard::unlocked(&mut st, || {
                file.sync_data()?;
                if self.writer.lock().sync_failed {
                    return Err(std::io::Error::other("a concurrent sync of the journal failed"));
                }
                Ok(())
            });
            match synced {
                Ok(()) => {
                    self.stats.flushes.fetch_add(1, Ordering::Relaxed);
                    if st.segment_seq == seq {
                        st.segment_synced = st.segment_synced.max(written);
                    }
                    // A rotation in between synced the older segment in full, so `lsn` holds.
                    st.durable_lsn = st.durable_lsn.max(lsn);
                    st.assert_batch();
                    for cv in &self.batch_cv {
                        cv.notify_all();
                    }
                }
                Err(e) => {
                    let err = sync_error(&path, e);
                    tracing::error!(%err, "journal: periodic sync failed, the log is stopped");
                    if st.stopped.is_none() {
                        st.stopped = Some(err);
                    }
                    self.hand_off(&mut st);
                }
            }
        }
    }
}

impl Shared {
    /// Every `CHECKPOINT_PERIOD`, records the durable end in the watermark when it moved,
    /// so that recovery can tell lost durable data from a torn tail after a crash. Off the
    /// commit path: its sync is of another file, in this thread.
    fn checkpoint_loop(&self) {
        let mut written = End::default();
        let mut st = self.state.lock();
        loop {
            self.checkpoint_cv.wait_for(&mut st, CHECKPOINT_PERIOD);
            if st.shutdown || st.stopped.is_some() {
                return;
            }
            let end = End { seq: st.segment_seq, offset: st.segment_synced };
            if end <= written {
                continue;
            }
            let result = MutexGuard::unlocked(&mut st, || {
                let live = self.writer.lock().live.len() as u64;
                self.watermark.lock().write(Mark { clean: false, live, end, incarnation: self.incarnation })
            });
            match result {
                Ok(()) => written = end,
                Err(err) => {
                    tracing::error!(%err, "journal: writing a checkpoint failed, the log is stopped");
                    if st.stopped.is_none() {
                        st.stopped = Some(err);
                    }
                    self.hand_off(&mut st);
                    return;
                }
            }
        }
    }

    /// After the final flush of a clean close: records the end and the live count, so
    /// that the next open finds exactly them (and warns about nothing).
    fn mark_clean_close(&self) {
        let writer = self.writer.lock();
        if writer.sync_failed || writer.synced < writer.pos {
            return;
        }
        let Some(current) = writer.segments.back() else { return };
        let mark = Mark {
            clean: true,
            live: writer.live.len() as u64,
            end: End { seq: current.seq, offset: writer.pos },
            incarnation: self.incarnation,
        };
        if let Err(err) = self.watermark.lock().write(mark) {
            tracing::error!(%err, "journal: cannot record the clean close; the next open checks less");
        }
    }
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
        if let Some(why) = watermark.last().and_then(|mark| watermark::contradiction(&mark, &found, true)) {
            let path = recovery.segments.last().map_or(dir.clone(), |s| s.path.clone());
            return Err(LogError::Lost { path, offset: recovery.last_end, reason: why });
        }
        // From here on a crash is a crash: the clean mark of the last close no longer holds.
        watermark.write(Mark { clean: false, live: found.live, end: found.end, incarnation })?;
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
        for thread in self.threads.drain(..) {
            let _ = thread.join();
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
