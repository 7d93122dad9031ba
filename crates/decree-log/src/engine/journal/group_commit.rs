//! The journal's group commit: appenders frame records into the shared pending batch,
//! one leader at a time writes it (`lead`), and waiters of a batch are woken when it is
//! durable; the state's invariants are checked at every batch.

use super::*;

impl State {
    /// Asserts the group commit's invariants (see the module documentation): a few
    /// comparisons, run at the start and the end of every batch, never per record.
    pub(super) fn assert_batch(&self) {
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

impl Shared {
    pub(super) fn enqueue(
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
    pub(super) fn lead(&self, st: &mut MutexGuard<'_, State>, force_sync: bool) {
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
                crate::write_batch::call_batch(callbacks, outcome, |done, r| done(r))
            });
        }
    }

    /// Moves parked `append_with` records into the (new) pending batch while they fit.
    pub(super) fn refill_from_overflow(&self, st: &mut MutexGuard<'_, State>) {
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
    pub(super) fn hand_off(&self, st: &mut MutexGuard<'_, State>) {
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
    pub(super) fn flush_needed_now(&self, st: &State) -> bool {
        !st.callbacks.is_empty()
            || !st.overflow.is_empty()
            || st.sync_wanted_lsn > st.durable_lsn
            || self.completions_fill_a_write(st)
    }

    /// Buffered completions are enough to be worth a write of their own.
    pub(super) fn completions_fill_a_write(&self, st: &State) -> bool {
        st.pending.len() >= COMPLETION_FLUSH_BYTES.min(self.pending_bytes_max / 2)
    }

    /// Asks the flusher thread for a flush; it is woken once per request, not per record
    /// (a flush in flight or an earlier request will pick the records up).
    pub(super) fn want_flusher(&self, st: &mut MutexGuard<'_, State>) {
        if !st.flush_in_flight && !st.flusher_wanted {
            st.flusher_wanted = true;
            self.flusher_cv.notify_one();
        }
    }

    /// Blocks until `lsn` is acknowledged (or durable), leading flushes when none runs.
    pub(super) fn wait_for(
        &self,
        st: &mut MutexGuard<'_, State>,
        lsn: u64,
        durable: bool,
    ) -> Result<(), LogError> {
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

    /// Whether the pending batch plus a frame of `frame` bytes can be written right now
    /// without disk IO: no rotation needed, and the segment is mapped (a memory copy) or
    /// simulated. Caller holds the state lock with no flush in flight, so no leader can
    /// move the write position until it leads itself.
    pub(super) fn fits_without_io(&self, st: &State, frame: usize) -> bool {
        let Some(writer) = self.writer.try_lock() else {
            return false;
        };
        let need = (st.pending.len() + frame + if st.pending.is_empty() { MARKER_BYTES } else { 0 }) as u64;
        writer.segments.back().is_some_and(|current| {
            (current.map.is_some() || current.file.raw_fd().is_none())
                && writer.pos + need <= current.capacity
        })
    }
}
