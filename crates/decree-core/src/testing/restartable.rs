//! A volatile log that keeps every appended record and hands them back at the next open,
//! as a file log would: tests of what a restart reads, without a disk.

use decree_log::engine::volatile::VolatileLog;
use decree_log::{LiveRecord, Log, LogError, LogStats};
use parking_lot::Mutex;
use std::sync::Arc;

/// A [`VolatileLog`] whose appended records a restart (or [`Log::take_recovered`]) reads.
#[derive(Default)]
pub struct RestartableLog {
    log: VolatileLog,
    records: Mutex<Vec<LiveRecord>>,
}

impl RestartableLog {
    /// The log of the next life, holding the records this one appended (a new incarnation).
    pub fn restart(&self) -> Arc<RestartableLog> {
        let records = std::mem::take(&mut *self.records.lock());
        Arc::new(RestartableLog { log: VolatileLog::new(), records: Mutex::new(records) })
    }
}

impl Log for RestartableLog {
    fn append(&self, txn: u64, payload: &[u8]) -> Result<(), LogError> {
        self.records.lock().push(LiveRecord { txn, payload: payload.to_vec() });
        self.log.append(txn, payload)
    }
    fn append_with(&self, txn: u64, payload: &[u8], done: decree_log::DurableCallback) {
        done(self.append(txn, payload))
    }
    fn complete(&self, txn: u64) -> Result<(), LogError> {
        self.log.complete(txn)
    }
    fn take_recovered(&self) -> Vec<LiveRecord> {
        std::mem::take(&mut *self.records.lock())
    }
    fn incarnation(&self) -> u64 {
        self.log.incarnation()
    }
    fn sync(&self) -> Result<(), LogError> {
        self.log.sync()
    }
    fn stats(&self) -> LogStats {
        self.log.stats()
    }
}
