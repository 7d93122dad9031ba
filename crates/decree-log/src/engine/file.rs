//! The file engine: one file per record, the classic baseline (Narayana's FileStore).
//!
//! Each record is a file `rec-<txn>-<seq>.rec` (both 16 hex digits) in the log directory,
//! holding exactly one data frame (see [`crate::record`]). Under rpo=0 an append writes the
//! file, syncs it (`sync_data`) and then syncs the directory, since a new file is durable
//! only once its directory entry is. Under rpo=N the append returns after the write and a
//! background thread syncs the pending files and the directory at least every N ms.
//! Completion removes the transaction's files; the removals become durable with the next
//! directory sync (`sync()`, a later append, the flusher, or close), so a completed record
//! may reappear after a crash only if no directory sync followed its completion.
//!
//! Recovery lists the record files and decodes each. Records are independent files, and a
//! file is written once, in one write, so a file that is empty, all zeros or shorter than
//! the frame it starts is a torn write of an append that was never acknowledged: it is
//! deleted with a warning. A file written to its full length whose checksum fails, or that
//! holds another transaction's record, was damaged after the fact: open refuses with
//! `LogError::Corrupted` naming it, rather than silently dropping a decided transaction. Records come back in sequence order
//! (so each transaction keeps its append order) and new sequence numbers continue after the
//! largest name found, so a name is never reused. A failed sync stops the log (fail-stop).

use crate::engine::watermark::{Found, Watermark};
use crate::engine::worker::{FailStop, Flusher, WritePool};
use crate::engine::{owner, StatCounters};
use crate::io::{Storage, StorageFile};
use crate::record::{self, Decoded, RecordKind};
use crate::{DurableCallback, LiveRecord, Log, LogConfig, LogError, LogStats, SyncPolicy, TxnKey};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Threads performing the writes of `append_with`.
const WORKERS_COUNT: usize = 4;
/// Records one worker writes before syncing the directory once for all of them.
const WORKER_BATCH_MAX: usize = 64;
/// Appends waiting for a worker; beyond it `append_with` fails with `Full`.
const QUEUE_MAX: usize = 16384;
/// Files written but not yet synced under rpo=N; reaching it makes the appender sync.
const PENDING_MAX: usize = 4096;
/// Shards of the transaction-to-files map.
const LIVE_SHARDS: usize = 64;

/// A record waiting for a worker.
struct Job {
    txn: TxnKey,
    payload: Vec<u8>,
    done: DurableCallback,
}

/// The file-per-record engine; see the module documentation.
pub struct FileLog {
    inner: Arc<Inner>,
    pool: Option<WritePool<Job>>,
    flusher: Option<Flusher>,
}

struct Inner {
    dir: PathBuf,
    storage: Arc<dyn Storage>,
    record_bytes_max: usize,
    sync: SyncPolicy,
    live: Vec<Mutex<HashMap<TxnKey, Vec<u64>>>>,
    sequence_next: AtomicU64,
    fail: FailStop,
    recovered: Mutex<Option<Vec<LiveRecord>>>,
    incarnation: u64,
    /// Paths of files written but not yet synced (rpo=N only), at most `PENDING_MAX`; paths
    /// rather than open handles, so that a burst of appends cannot exhaust descriptors.
    pending: Mutex<Vec<PathBuf>>,
    stats: StatCounters,
    /// Creations and removals so far, and the count the last directory sync covered.
    changes: AtomicU64,
    synced_changes: AtomicU64,
    /// The directory's watermark: the record count of the last clean close.
    watermark: Mutex<Watermark>,
    /// Torn files deleted at open.
    warnings: Vec<String>,
}

fn record_name(txn: TxnKey, sequence: u64) -> String {
    format!("rec-{txn:016x}-{sequence:016x}.rec")
}

/// The (txn, sequence) a record file name encodes; `None` for any other file.
fn parse_name(path: &Path) -> Option<(TxnKey, u64)> {
    let name = path.file_name()?.to_str()?;
    let middle = name.strip_prefix("rec-")?.strip_suffix(".rec")?;
    let (txn, sequence) = middle.split_once('-')?;
    if txn.len() != 16 || sequence.len() != 16 {
        return None;
    }
    Some((u64::from_str_radix(txn, 16).ok()?, u64::from_str_radix(sequence, 16).ok()?))
}

fn live_shard(txn: TxnKey) -> usize {
    (txn.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % LIVE_SHARDS
}

fn call(done: DurableCallback, result: Result<(), LogError>) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| done(result))).is_err() {
        tracing::error!("a durable-append callback panicked");
    }
}

/// Largest record file read at open: anything longer is not a record of this engine.
const FILE_BYTES_MAX: u64 = 64 << 20;

/// What one record file holds at open.
enum FileContent {
    /// A valid record of the transaction its name says.
    Record(Vec<u8>),
    /// Empty, zeroed or cut short: a write that never completed.
    Torn(String),
    /// Written to its full length but damaged or not what its name says.
    Corrupted(String),
}

/// Reads and classifies one record file (see the module documentation).
fn read_record(storage: &dyn Storage, path: &Path, txn: TxnKey) -> Result<FileContent, LogError> {
    let file = storage.open(path, false).map_err(|e| LogError::io(path, e))?;
    let len = file.len().map_err(|e| LogError::io(path, e))?;
    if len > FILE_BYTES_MAX {
        return Ok(FileContent::Corrupted(format!("{len} bytes is more than any record")));
    }
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(&mut buf, 0).map_err(|e| LogError::io(path, e))?;
    // Not today's `record_bytes_max`: a record written under a larger limit is still read
    // back, and a frame longer than the file is a cut-short write (Truncated).
    Ok(match record::decode(&buf, FILE_BYTES_MAX as usize) {
        Decoded::Frame(frame, n) if n == buf.len() && frame.kind == RecordKind::Data && frame.txn == txn => {
            FileContent::Record(frame.payload.to_vec())
        }
        Decoded::Frame(frame, n) => FileContent::Corrupted(format!(
            "a {:?} frame of txn {} in {n} of {} bytes is not the record its name says",
            frame.kind,
            frame.txn,
            buf.len()
        )),
        Decoded::Zero => FileContent::Torn(format!("{} zero bytes", buf.len())),
        Decoded::Truncated => FileContent::Torn(format!("cut short at {} bytes", buf.len())),
        Decoded::Invalid(reason) => FileContent::Corrupted(reason),
    })
}

impl FileLog {
    /// Opens (creating if needed) the log directory, recovers the live records (deleting
    /// torn ones) and bumps the incarnation.
    pub fn open(config: &LogConfig, storage: Arc<dyn Storage>) -> Result<FileLog, LogError> {
        let dir = config.dir.clone();
        storage.create_dir_all(&dir).map_err(|e| LogError::io(&dir, e))?;
        let incarnation = owner::bump_incarnation(&*storage, &dir)?;
        let mut watermark = Watermark::open(&*storage, &dir)?;
        let record_bytes_max = config.record_bytes_max as usize;

        let mut found = Vec::new();
        let mut torn = Vec::new();
        for path in storage.list(&dir).map_err(|e| LogError::io(&dir, e))? {
            let Some((txn, sequence)) = parse_name(&path) else { continue };
            match read_record(&*storage, &path, txn)? {
                FileContent::Record(payload) => found.push((sequence, LiveRecord { txn, payload })),
                FileContent::Torn(reason) => torn.push((path, reason)),
                FileContent::Corrupted(reason) => {
                    return Err(LogError::Corrupted { path, offset: 0, reason });
                }
            }
        }
        let counted = Found { live: found.len() as u64, end: Default::default(), torn: torn.len() as u64 };
        // A torn file after a clean close is the damaged one; else only the count tells.
        watermark.begin_run(&counted, false, incarnation, || {
            (torn.first().map_or(dir.clone(), |(path, _)| path.clone()), 0)
        })?;
        let mut warnings = Vec::new();
        let deleted = torn.len();
        for (path, reason) in torn {
            tracing::warn!(path = %path.display(), %reason, "torn record file deleted");
            warnings.push(format!(
                "{}: deleted a torn record file ({reason}); it was never durable",
                path.display()
            ));
            storage.remove(&path).map_err(|e| LogError::io(&path, e))?;
        }
        if deleted > 0 {
            storage
                .sync_dir(&dir)
                .map_err(|e| LogError::SyncFailed { path: dir.clone(), message: e.to_string() })?;
        }
        found.sort_by_key(|(sequence, _)| *sequence);
        let mut live: Vec<Mutex<HashMap<TxnKey, Vec<u64>>>> =
            (0..LIVE_SHARDS).map(|_| Mutex::new(HashMap::new())).collect();
        let mut sequence_next = 0;
        let mut recovered = Vec::with_capacity(found.len());
        for (sequence, record) in found {
            live[live_shard(record.txn)].get_mut().entry(record.txn).or_default().push(sequence);
            sequence_next = sequence + 1;
            recovered.push(record);
        }

        let inner = Arc::new(Inner {
            dir: dir.clone(),
            storage,
            record_bytes_max,
            sync: config.sync,
            live,
            sequence_next: AtomicU64::new(sequence_next),
            fail: FailStop::default(),
            recovered: Mutex::new(Some(recovered)),
            incarnation,
            pending: Mutex::new(Vec::new()),
            stats: StatCounters::default(),
            changes: AtomicU64::new(0),
            synced_changes: AtomicU64::new(0),
            watermark: Mutex::new(watermark),
            warnings,
        });
        let worker_inner = inner.clone();
        let pool =
            WritePool::start("decree-file-write", WORKERS_COUNT, WORKER_BATCH_MAX, QUEUE_MAX, move |jobs| {
                worker_inner.run_batch(jobs)
            })
            .map_err(|e| LogError::io(&dir, e))?;
        let flusher = match config.sync {
            SyncPolicy::Immediate => None,
            SyncPolicy::Window(interval) => {
                let flusher_inner = inner.clone();
                Some(
                    Flusher::start("decree-file-flush", interval, move || flusher_inner.flush_if_changed())
                        .map_err(|e| LogError::io(&dir, e))?,
                )
            }
        };
        Ok(FileLog { inner, pool: Some(pool), flusher })
    }
}

impl Inner {
    fn path_of(&self, txn: TxnKey, sequence: u64) -> PathBuf {
        self.dir.join(record_name(txn, sequence))
    }

    fn sync_failed(&self, path: &Path, e: std::io::Error) -> LogError {
        self.fail.fail(path, &e)
    }

    /// Writes the record's file (not synced) and makes it live.
    fn write_record(&self, txn: TxnKey, payload: &[u8]) -> Result<(PathBuf, Arc<dyn StorageFile>), LogError> {
        self.fail.check()?;
        if payload.len() > self.record_bytes_max {
            return Err(LogError::RecordTooLarge { len: payload.len(), max: self.record_bytes_max });
        }
        let sequence = self.sequence_next.fetch_add(1, Ordering::Relaxed);
        let path = self.path_of(txn, sequence);
        let mut frame = Vec::with_capacity(record::frame_len(payload.len()));
        record::encode(&mut frame, RecordKind::Data, txn, payload);
        let written = self.storage.open(&path, true).and_then(|file| {
            file.write_all_at(&frame, 0)?;
            Ok(file)
        });
        let file = match written {
            Ok(file) => file,
            Err(e) => {
                // Nothing was acknowledged; a leftover partial file would be deleted at the
                // next open anyway, but try now so that it takes no space meanwhile.
                let _ = self.storage.remove(&path);
                return Err(LogError::io(&path, e));
            }
        };
        self.stats.bytes_written.fetch_add(frame.len() as u64, Ordering::Relaxed);
        self.changes.fetch_add(1, Ordering::AcqRel);
        // Registered only once written, so a concurrent complete() removes whole files.
        self.live[live_shard(txn)].lock().entry(txn).or_default().push(sequence);
        self.stats.appended.fetch_add(1, Ordering::Relaxed);
        Ok((path, file))
    }

    /// Syncs the files, then the directory (which also makes earlier removals durable).
    fn sync_files(&self, files: &[Arc<dyn StorageFile>]) -> Result<(), LogError> {
        let changes = self.changes.load(Ordering::Acquire);
        for file in files {
            file.sync_data().map_err(|e| self.sync_failed(&self.dir, e))?;
            self.stats.flushes.fetch_add(1, Ordering::Relaxed);
        }
        self.storage.sync_dir(&self.dir).map_err(|e| self.sync_failed(&self.dir, e))?;
        self.stats.flushes.fetch_add(1, Ordering::Relaxed);
        // Another thread's failed sync may have consumed the error our pages caused.
        self.fail.check()?;
        self.synced_changes.fetch_max(changes, Ordering::AcqRel);
        Ok(())
    }

    /// Syncs every pending file and the directory.
    fn sync_everything(&self) -> Result<(), LogError> {
        self.fail.check()?;
        let pending = std::mem::take(&mut *self.pending.lock());
        let mut files = Vec::with_capacity(pending.len());
        for path in pending {
            match self.storage.open(&path, false) {
                Ok(file) => files.push(file),
                // Completed and removed meanwhile: the directory sync below covers it.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                // An acknowledged record that cannot be synced may be lost: stop.
                Err(e) => return Err(self.sync_failed(&path, e)),
            }
        }
        self.sync_files(&files)
    }

    /// The rpo=N flusher's tick: sync when anything changed since the last sync.
    fn flush_if_changed(&self) {
        if self.fail.check().is_err() {
            return;
        }
        if self.changes.load(Ordering::Acquire) == self.synced_changes.load(Ordering::Acquire) {
            return;
        }
        // An error is latched; the next call of any kind reports it.
        let _ = self.sync_everything();
    }

    /// Queues a written file for the flusher (rpo=N); syncs now when the queue is full.
    fn defer_sync(&self, path: PathBuf) -> Result<(), LogError> {
        let full = {
            let mut pending = self.pending.lock();
            pending.push(path);
            pending.len() >= PENDING_MAX
        };
        if full {
            self.sync_everything()?;
        }
        Ok(())
    }

    /// A worker's batch: write every file, sync them and the directory once, then call back.
    fn run_batch(&self, jobs: Vec<Job>) {
        let mut files = Vec::with_capacity(jobs.len());
        let mut waiting = Vec::with_capacity(jobs.len());
        for job in jobs {
            match self.write_record(job.txn, &job.payload) {
                Ok(written) => {
                    files.push(written);
                    waiting.push(job.done);
                }
                Err(e) => call(job.done, Err(e)),
            }
        }
        if waiting.is_empty() {
            return;
        }
        let result = match self.sync {
            SyncPolicy::Immediate => {
                let handles: Vec<Arc<dyn StorageFile>> = files.into_iter().map(|(_, file)| file).collect();
                self.sync_files(&handles)
            }
            SyncPolicy::Window(_) => files.into_iter().try_for_each(|(path, _)| self.defer_sync(path)),
        };
        crate::write_batch::call_batch(waiting, result, call);
    }
}

impl Log for FileLog {
    fn append(&self, txn: TxnKey, payload: &[u8]) -> Result<(), LogError> {
        let (path, file) = self.inner.write_record(txn, payload)?;
        match self.inner.sync {
            SyncPolicy::Immediate => self.inner.sync_files(&[file]),
            SyncPolicy::Window(_) => self.inner.defer_sync(path),
        }
    }

    fn append_with(&self, txn: TxnKey, payload: &[u8], done: DurableCallback) {
        if let Err(e) = self.inner.fail.check() {
            return call(done, Err(e));
        }
        if payload.len() > self.inner.record_bytes_max {
            let max = self.inner.record_bytes_max;
            return call(done, Err(LogError::RecordTooLarge { len: payload.len(), max }));
        }
        let Some(pool) = &self.pool else {
            return call(done, Err(LogError::Config("the log is closing".into())));
        };
        if let Err(job) = pool.submit(Job { txn, payload: payload.to_vec(), done }) {
            let message = format!("append queue of {} records is full", pool.queue_max());
            call(job.done, Err(LogError::Full(message)));
        }
    }

    fn complete(&self, txn: TxnKey) -> Result<(), LogError> {
        let inner = &*self.inner;
        inner.fail.check()?;
        let sequences = inner.live[live_shard(txn)].lock().remove(&txn).unwrap_or_default();
        let mut result = Ok(());
        for sequence in sequences {
            let path = inner.path_of(txn, sequence);
            match inner.storage.remove(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => result = Err(LogError::io(&path, e)),
            }
            inner.changes.fetch_add(1, Ordering::AcqRel);
        }
        inner.stats.completions.fetch_add(1, Ordering::Relaxed);
        result
    }

    fn open_warnings(&self) -> Vec<String> {
        self.inner.warnings.clone()
    }

    fn take_recovered(&self) -> Vec<LiveRecord> {
        self.inner.recovered.lock().take().unwrap_or_default()
    }

    fn incarnation(&self) -> u64 {
        self.inner.incarnation
    }

    fn sync(&self) -> Result<(), LogError> {
        self.inner.sync_everything()
    }

    fn stats(&self) -> LogStats {
        self.inner.stats.snapshot()
    }
}

impl Drop for FileLog {
    fn drop(&mut self) {
        // Run queued appends (their callbacks must be called), stop the flusher, then make
        // pending files and removals durable if the log still works.
        drop(self.pool.take());
        drop(self.flusher.take());
        if self.inner.fail.check().is_ok() {
            match self.inner.sync_everything() {
                Ok(()) => self.inner.mark_clean_close(),
                Err(e) => tracing::error!(error = %e, "final sync of the file log failed"),
            }
        }
    }
}

impl Inner {
    /// After the final sync of a clean close: records the record count, so that the next
    /// open can tell a deleted or emptied record file from a torn write.
    fn mark_clean_close(&self) {
        let live =
            self.live.iter().map(|shard| shard.lock().values().map(Vec::len).sum::<usize>()).sum::<usize>();
        self.watermark.lock().close_cleanly(live as u64, Default::default(), self.incarnation);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_others_are_ignored() {
        let name = record_name(0xdead_beef, 42);
        assert_eq!(parse_name(Path::new(&name)), Some((0xdead_beef, 42)));
        assert_eq!(parse_name(Path::new("/x/INCARNATION")), None);
        assert_eq!(parse_name(Path::new("rec-12-34.rec")), None);
        assert_eq!(parse_name(Path::new("rec-zzzzzzzzzzzzzzzz-0000000000000001.rec")), None);
    }
}
