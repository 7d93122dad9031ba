//! The journal's background threads: the flusher (writes batches only callbacks wait
//! for, and idle completions), the syncer (`rpo = N`), the spare-file preparer, and the
//! watermark's checkpoints of the durable end, with the mark of a clean close.

use super::*;

impl Shared {
    /// Keeps one spare segment file ready, so that a rotation never creates, zero-fills
    /// and syncs a file on the commit path. It only adds a file when none is free, so the
    /// directory holds at most one file more than the segments in use and their recycled
    /// files. Allocation failures (a full disk) are retried, rotation then prepares inline
    /// and reports the error to the batch that needed the file.
    pub(super) fn spare_loop(&self) {
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

    pub(super) fn flusher_loop(&self) {
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
    pub(super) fn syncer_loop(&self, period: Duration) {
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
    pub(super) fn checkpoint_loop(&self) {
        let mut written = End::default();
        let mut st = self.state.lock();
        loop {
            // Checked before the wait too: a close that set `shutdown` before this thread
            // first took the lock, or while it wrote a checkpoint, notified nobody, and
            // would otherwise wait out a whole period in `Drop`'s join.
            if st.shutdown || st.stopped.is_some() {
                return;
            }
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
    pub(super) fn mark_clean_close(&self) {
        let writer = self.writer.lock();
        if writer.sync_failed || writer.synced < writer.pos {
            return;
        }
        let Some(current) = writer.segments.back() else { return };
        let end = End { seq: current.seq, offset: writer.pos };
        self.watermark.lock().close_cleanly(writer.live.len() as u64, end, self.incarnation);
    }
}
