//! The volatile engine: records live in memory only.
//!
//! It is the upper bound of every benchmark (no disk at all) and a fast log for tests of
//! the layers above. Nothing survives the process, so `take_recovered` is always empty.

use crate::engine::StatCounters;
use crate::{DurableCallback, LiveRecord, Log, LogError, LogStats, TxnKey};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

const SHARDS: usize = 64;

/// Memory-only log.
pub struct VolatileLog {
    shards: Vec<Mutex<HashMap<TxnKey, Vec<Vec<u8>>>>>,
    incarnation: u64,
    stats: StatCounters,
}

impl Default for VolatileLog {
    fn default() -> Self {
        Self::new()
    }
}

impl VolatileLog {
    /// An empty log with an incarnation taken from the clock (distinct per open).
    pub fn new() -> Self {
        static LAST: AtomicU64 = AtomicU64::new(0);
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(1);
        let incarnation = LAST.fetch_max(now, Ordering::SeqCst).max(now) + 1;
        LAST.fetch_max(incarnation, Ordering::SeqCst);
        VolatileLog {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            incarnation,
            stats: StatCounters::default(),
        }
    }

    fn shard(&self, txn: TxnKey) -> &Mutex<HashMap<TxnKey, Vec<Vec<u8>>>> {
        &self.shards[(txn.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % SHARDS]
    }

    /// Records currently held (live transactions' records).
    pub fn live_records(&self) -> usize {
        self.shards.iter().map(|s| s.lock().values().map(Vec::len).sum::<usize>()).sum()
    }
}

impl Log for VolatileLog {
    fn append(&self, txn: TxnKey, payload: &[u8]) -> Result<(), LogError> {
        self.shard(txn).lock().entry(txn).or_default().push(payload.to_vec());
        self.stats.appended.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn append_with(&self, txn: TxnKey, payload: &[u8], done: DurableCallback) {
        crate::write_batch::call_batch(std::iter::once(done), self.append(txn, payload), |done, r| done(r));
    }
    fn complete(&self, txn: TxnKey) -> Result<(), LogError> {
        self.shard(txn).lock().remove(&txn);
        self.stats.completions.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn take_recovered(&self) -> Vec<LiveRecord> {
        Vec::new()
    }
    fn incarnation(&self) -> u64 {
        self.incarnation
    }
    fn sync(&self) -> Result<(), LogError> {
        Ok(())
    }
    fn stats(&self) -> LogStats {
        self.stats.snapshot()
    }
}
