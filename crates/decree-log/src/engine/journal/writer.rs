//! The journal's writer: the segment files, where each batch goes (direct, mapped or
//! written and synced), rotation to a new segment with its checkpoint of long-lived
//! records, and the preparation of spare files. Only the flush leader calls it, under the
//! `writer` lock.

use super::*;

pub(super) fn write_error(path: &std::path::Path, err: std::io::Error) -> LogError {
    if err.raw_os_error() == Some(libc::ENOSPC) || err.kind() == std::io::ErrorKind::StorageFull {
        LogError::Full(format!("no space left on the device writing {}: {err}", path.display()))
    } else {
        LogError::io(path, err)
    }
}

pub(super) fn sync_error(path: &std::path::Path, err: std::io::Error) -> LogError {
    LogError::SyncFailed { path: path.to_path_buf(), message: err.to_string() }
}

/// Length of a batch of `len` bytes padded to whole pages for a direct write, leaving room
/// for a padding frame (at least its header) when the batch does not end on a boundary.
pub(super) fn padded_len(len: usize) -> usize {
    let mut padded = len.div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;
    if padded != len && padded - len < HEADER_BYTES {
        padded += DIRECT_ALIGN;
    }
    padded
}

/// Copies `batch` to a page-aligned slice of `staging` and fills it up to `padded` bytes
/// with a padding frame of segment `seq`; returns the slice to write.
pub(super) fn pad_for_direct<'a>(
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
    pub(super) fn segment_mut(&mut self, seq: u64) -> &mut Segment {
        let first = self.segments.front().map(|s| s.seq).unwrap_or(0);
        let index = seq.checked_sub(first).expect("live record in a dropped segment") as usize;
        let segment = &mut self.segments[index];
        assert_eq!(segment.seq, seq, "segment range is not contiguous");
        segment
    }

    pub(super) fn add_live(&mut self, txn: TxnKey, loc: Loc) {
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

    pub(super) fn remove_live(&mut self, txn: TxnKey) {
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
    pub(super) fn write_batch(
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
    pub(super) fn copy_checkpoint(
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
    pub(super) fn rotate(&mut self, need: u64, stats: &StatCounters) -> Result<(), LogError> {
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
    pub(super) fn plan_checkpoint(&self) -> (usize, Vec<TxnKey>) {
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
    pub(super) fn map_segment(
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
    pub(super) fn take_file(&mut self) -> Result<(PathBuf, Arc<dyn StorageFile>, u64), LogError> {
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
pub(super) fn prepare_file(
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
