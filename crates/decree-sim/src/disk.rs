//! A member's decision log in the simulation: a model of a log engine (not decree's
//! journal), over the member's fault storage, with the engines' contract and nothing more.
//!
//! `append_with` and `complete` only queue, as the engines' writer threads do; the
//! simulation's disk turn ([`SimLog::flush`]) writes everything queued as framed records
//! (`decree_log::record`, length and CRC32C) at the end of one file, syncs it once, and
//! then calls the appends' callbacks: the group commit. A failed sync fails every queued
//! append and every later call (fail-stop). A process killed loses what is queued; a power
//! loss (the fault storage's crash) loses what was not synced, or keeps part of it torn.
//! Reopening reads the records back up to the first frame that does not check out, cuts
//! the file there, and hands the live ones back through `take_recovered`; what the real
//! engines do with a torn tail is tested in `decree-log`'s own crash suite.
//!
//! The simulation's invariants ask it what the member would have if it were promoted now
//! ([`SimLog::holds`]) and what is on stable storage ([`SimLog::durably_holds`]).

use decree_core::{Decision, Xid};
use decree_log::io::{Storage, StorageFile};
use decree_log::record::{self, Decoded, RecordKind};
use decree_log::{DurableCallback, LiveRecord, Log, LogError, LogStats, TxnKey};
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The log file's name in the member's directory.
const LOG_FILE: &str = "sim.log";

/// The longest record payload the simulation writes (a decision of a few branches).
const PAYLOAD_BYTES_MAX: usize = 64 << 10;

/// What waits for the disk turn.
enum Queued {
    Append { txn: TxnKey, payload: Vec<u8>, done: DurableCallback },
    Complete { txn: TxnKey },
}

/// A member's log.
pub struct SimLog {
    path: PathBuf,
    inner: Mutex<Inner>,
}

struct Inner {
    file: Arc<dyn StorageFile>,
    /// Where the next record goes.
    len: u64,
    queued: Vec<Queued>,
    /// What this process appended and did not complete (queued or written), by key.
    live: BTreeMap<TxnKey, Xid>,
    /// The same, counted by Xid (a decision may be filed under several keys).
    live_xids: BTreeMap<Xid, usize>,
    /// Decisions of records that are on stable storage (synced, or read back at open).
    durable: BTreeSet<Xid>,
    failed: Option<LogError>,
    fail_next_sync: bool,
    recovered: Vec<LiveRecord>,
}

impl Inner {
    /// Key `txn` is no longer live.
    fn forget(&mut self, txn: TxnKey) {
        let Some(xid) = self.live.remove(&txn) else { return };
        match self.live_xids.get_mut(&xid) {
            Some(count) if *count > 1 => *count -= 1,
            _ => {
                self.live_xids.remove(&xid);
            }
        }
    }
}

/// The Xid of a decision record's payload (either log form).
fn xid_of(payload: &[u8]) -> Option<Xid> {
    Decision::decode_logged(payload).ok().map(|(d, _)| d.xid)
}

impl SimLog {
    /// Opens (creating) the log in `dir` of `storage`: reads its records back up to the
    /// first that does not check out and cuts the file there.
    pub fn open(storage: &Arc<dyn Storage>, dir: &Path) -> Result<SimLog, LogError> {
        let path = dir.join(LOG_FILE);
        let io = |e: std::io::Error| LogError::io(&path, e);
        storage.create_dir_all(dir).map_err(io)?;
        let file = storage.open(&path, true).map_err(io)?;
        let len = file.len().map_err(io)? as usize;
        let mut buf = vec![0u8; len];
        file.read_exact_at(&mut buf, 0).map_err(io)?;
        let mut live: BTreeMap<TxnKey, Vec<Vec<u8>>> = BTreeMap::new();
        let mut at = 0;
        while let Decoded::Frame(frame, used) = record::decode(&buf[at..], PAYLOAD_BYTES_MAX + 64) {
            match frame.kind {
                RecordKind::Data => live.entry(frame.txn).or_default().push(frame.payload.to_vec()),
                RecordKind::Completion => {
                    live.remove(&frame.txn);
                }
                RecordKind::Padding => {}
            }
            at += used;
        }
        file.set_len(at as u64).map_err(io)?;
        file.sync_data().map_err(io)?;
        storage.sync_dir(dir).map_err(io)?;
        let mut recovered = Vec::new();
        let mut by_key = BTreeMap::new();
        let mut durable = BTreeSet::new();
        for (txn, payloads) in live {
            for payload in payloads {
                if let Some(xid) = xid_of(&payload) {
                    by_key.insert(txn, xid);
                    durable.insert(xid);
                }
                recovered.push(LiveRecord { txn, payload });
            }
        }
        let mut live_xids = BTreeMap::new();
        for xid in by_key.values() {
            *live_xids.entry(*xid).or_insert(0) += 1;
        }
        let inner = Inner {
            file,
            len: at as u64,
            queued: Vec::new(),
            live: by_key,
            live_xids,
            durable,
            failed: None,
            fail_next_sync: false,
            recovered,
        };
        Ok(SimLog { path, inner: Mutex::new(inner) })
    }

    /// The decisions live in the log of `dir` on `storage` as a reopen would find them,
    /// read without changing anything (for the invariants, on a member that is down).
    pub fn read_decisions(storage: &dyn Storage, dir: &Path) -> BTreeSet<Xid> {
        let path = dir.join(LOG_FILE);
        let Ok(file) = storage.open(&path, false) else { return BTreeSet::new() };
        let len = file.len().unwrap_or(0) as usize;
        let mut buf = vec![0u8; len];
        if file.read_exact_at(&mut buf, 0).is_err() {
            return BTreeSet::new();
        }
        let mut live: BTreeMap<TxnKey, Xid> = BTreeMap::new();
        let mut at = 0;
        while let Decoded::Frame(frame, used) = record::decode(&buf[at..], PAYLOAD_BYTES_MAX + 64) {
            match frame.kind {
                RecordKind::Data => {
                    if let Some(xid) = xid_of(frame.payload) {
                        live.insert(frame.txn, xid);
                    }
                }
                RecordKind::Completion => {
                    live.remove(&frame.txn);
                }
                RecordKind::Padding => {}
            }
            at += used;
        }
        live.into_values().collect()
    }

    /// The disk's turn: writes everything queued, syncs once, then calls the appends'
    /// callbacks (outside the lock: they may complete records). Returns whether anything
    /// was queued.
    pub fn flush(&self) -> bool {
        let (callbacks, result) = {
            let mut inner = self.inner.lock();
            if inner.queued.is_empty() {
                return false;
            }
            let queued = std::mem::take(&mut inner.queued);
            let result = self.write_and_sync(&mut inner, &queued);
            let mut callbacks = Vec::new();
            for item in queued {
                if let Queued::Append { payload, done, .. } = item {
                    if result.is_ok() {
                        inner.durable.extend(xid_of(&payload));
                    }
                    callbacks.push(done);
                }
            }
            if let Err(e) = &result {
                inner.failed.get_or_insert(e.clone());
            }
            (callbacks, result)
        };
        for done in callbacks {
            done(result.clone());
        }
        true
    }

    fn write_and_sync(&self, inner: &mut Inner, queued: &[Queued]) -> Result<(), LogError> {
        if let Some(e) = &inner.failed {
            return Err(e.clone());
        }
        let mut buf = Vec::new();
        for item in queued {
            match item {
                Queued::Append { txn, payload, .. } => {
                    record::encode(&mut buf, RecordKind::Data, *txn, payload)
                }
                Queued::Complete { txn } => record::encode(&mut buf, RecordKind::Completion, *txn, &[]),
            }
        }
        inner.file.write_all_at(&buf, inner.len).map_err(|e| LogError::io(&self.path, e))?;
        inner.len += buf.len() as u64;
        let sync_failed = |message: String| LogError::SyncFailed { path: self.path.clone(), message };
        if std::mem::take(&mut inner.fail_next_sync) {
            return Err(sync_failed("injected fault: the log's sync failed (EIO)".into()));
        }
        inner.file.sync_data().map_err(|e| sync_failed(e.to_string()))
    }

    /// Whether anything waits for the disk's turn.
    pub fn has_queued(&self) -> bool {
        !self.inner.lock().queued.is_empty()
    }

    /// Makes the next disk turn's sync fail (and so the log, fail-stop).
    pub fn fail_next_sync(&self) {
        self.inner.lock().fail_next_sync = true;
    }

    /// Whether the log has failed.
    pub fn failed(&self) -> bool {
        self.inner.lock().failed.is_some()
    }

    /// Whether a promotion now would find a live decision of `xid`: appended by this
    /// process and not completed (what a clean close writes), or, once the log has
    /// failed, on stable storage.
    pub fn holds(&self, xid: &Xid) -> bool {
        let inner = self.inner.lock();
        if inner.failed.is_some() {
            return inner.durable.contains(xid);
        }
        inner.live_xids.contains_key(xid)
    }

    /// Whether a decision record of `xid` is on stable storage.
    pub fn durably_holds(&self, xid: &Xid) -> bool {
        self.inner.lock().durable.contains(xid)
    }
}

impl Log for SimLog {
    fn append(&self, txn: TxnKey, payload: &[u8]) -> Result<(), LogError> {
        let result = Arc::new(Mutex::new(None));
        let slot = result.clone();
        self.append_with(txn, payload, Box::new(move |r| *slot.lock() = Some(r)));
        self.flush();
        let outcome = result.lock().take();
        outcome.unwrap_or_else(|| Err(LogError::Config("the append was not flushed".into())))
    }

    fn append_with(&self, txn: TxnKey, payload: &[u8], done: DurableCallback) {
        let mut inner = self.inner.lock();
        if let Some(e) = inner.failed.clone() {
            drop(inner);
            return done(Err(e));
        }
        if let Some(xid) = xid_of(payload) {
            inner.forget(txn);
            inner.live.insert(txn, xid);
            *inner.live_xids.entry(xid).or_insert(0) += 1;
        }
        inner.queued.push(Queued::Append { txn, payload: payload.to_vec(), done });
    }

    fn complete(&self, txn: TxnKey) -> Result<(), LogError> {
        let mut inner = self.inner.lock();
        if let Some(e) = &inner.failed {
            return Err(e.clone());
        }
        inner.forget(txn);
        inner.queued.push(Queued::Complete { txn });
        Ok(())
    }

    fn take_recovered(&self) -> Vec<LiveRecord> {
        std::mem::take(&mut self.inner.lock().recovered)
    }

    fn incarnation(&self) -> u64 {
        1
    }

    fn sync(&self) -> Result<(), LogError> {
        self.flush();
        match &self.inner.lock().failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    fn stats(&self) -> LogStats {
        LogStats::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use decree_core::{BranchRecord, Origin};
    use decree_log::testing::fault::{CrashMode, FaultStorage};

    fn decision(sequence: u64) -> Vec<u8> {
        let xid = Xid::decree(Origin { node: 1, incarnation: 0x101, session: 1, sequence });
        Decision { xid, branches: vec![BranchRecord { rm: "a".into(), branch: 0 }] }.encode()
    }

    #[test]
    fn only_flushed_records_survive_a_power_loss_and_completed_ones_stay_completed() {
        let disk = FaultStorage::new(3);
        let storage: Arc<dyn Storage> = Arc::new(disk.clone());
        let dir = Path::new("/m");
        let log = SimLog::open(&storage, dir).unwrap();
        let done = Arc::new(Mutex::new(Vec::new()));
        for (key, sequence) in [(1, 1), (2, 2)] {
            let done = done.clone();
            log.append_with(key, &decision(sequence), Box::new(move |r| done.lock().push(r.is_ok())));
        }
        assert!(done.lock().is_empty(), "nothing is durable before the disk's turn");
        assert!(log.flush());
        assert_eq!(*done.lock(), vec![true, true]);
        log.complete(1).unwrap();
        log.append_with(3, &decision(3), Box::new(|_| {}));
        let after: Arc<dyn Storage> = Arc::new(disk.crash_with(CrashMode::DropUnsynced));
        let reopened = SimLog::open(&after, dir).unwrap();
        let keys: Vec<u64> = reopened.take_recovered().iter().map(|r| r.txn).collect();
        assert_eq!(keys, vec![1, 2], "the completion and the third append were never written");
        log.flush();
        let after: Arc<dyn Storage> = Arc::new(disk.crash_with(CrashMode::DropUnsynced));
        let keys: Vec<u64> =
            SimLog::open(&after, dir).unwrap().take_recovered().iter().map(|r| r.txn).collect();
        assert_eq!(keys, vec![2, 3]);
    }

    #[test]
    fn a_failed_sync_fails_the_queued_appends_and_every_later_call() {
        let storage: Arc<dyn Storage> = Arc::new(FaultStorage::new(4));
        let log = SimLog::open(&storage, Path::new("/m")).unwrap();
        let failed = Arc::new(Mutex::new(0));
        let f = failed.clone();
        log.append_with(1, &decision(1), Box::new(move |r| *f.lock() += r.is_err() as u32));
        log.fail_next_sync();
        log.flush();
        assert_eq!(*failed.lock(), 1);
        assert!(log.failed() && log.complete(1).is_err());
        let f = failed.clone();
        log.append_with(2, &decision(2), Box::new(move |r| *f.lock() += r.is_err() as u32));
        assert_eq!(*failed.lock(), 2);
    }
}
