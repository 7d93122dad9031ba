//! The decision store of embedded mode: decisions go straight to the process's own log.
//!
//! [`LogDecisions`] maps the [`DecisionStore`] calls onto a [`decree_log::Log`]: a decision
//! is one appended record under a key from a [`KeyAllocator`] (never one a live record
//! uses), a completion is the log's lazy completion of that key, found again by Xid. The node id comes from the configuration, the
//! incarnation from the log (a new one at every open), and session ids from a counter,
//! which is enough since sessions only need to be unique within one incarnation.
//!
//! A decision whose coordinator span is sampled is written with that span's context
//! (`DCD2`, as a state server writes it), so that the log names the transaction's trace
//! after a crash (`decree recover list`); any other decision is the `DCD1` bytes, from the
//! same reused buffer.

use crate::keys::KeyAllocator;
use crate::rm::HeuristicOutcome;
use crate::store::{Decision, DecisionStore, StoreError};
use crate::trace::TraceContext;
use crate::xid::Xid;
use decree_log::{Log, LogError};
use parking_lot::Mutex;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Encoded decisions larger than this give their buffer back instead of keeping it.
const ENCODE_BUFFER_BYTES_MAX: usize = 64 << 10;

thread_local! {
    /// One encode buffer per thread: decide then costs no allocation of its own.
    static ENCODE_BUFFER: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(1024));
}

/// Shards of the key map, so that sessions deciding at once rarely share a lock.
const KEY_SHARDS: usize = 16;

/// [`DecisionStore`] over the process's own log (embedded mode).
pub struct LogDecisions {
    log: Arc<dyn Log>,
    node: u32,
    incarnation: u64,
    sessions: AtomicU64,
    keys: KeyAllocator,
    /// The log keys of live decisions by Xid (a recovered Xid may have several records);
    /// grows with live transactions only: an entry leaves at completion.
    live: Vec<Mutex<HashMap<Xid, Vec<u64>>>>,
}

impl LogDecisions {
    /// A store writing to `log`, which holds no live decision, and minting Xids for `node`.
    pub fn new(log: Arc<dyn Log>, node: u32) -> Self {
        Self::with_recovered(log, node, HashMap::new())
    }

    /// A store over a log whose live decisions (found at open) were written under `keys`;
    /// those keys are never handed out again while they live.
    pub fn with_recovered(log: Arc<dyn Log>, node: u32, keys: HashMap<Xid, Vec<u64>>) -> Self {
        let incarnation = log.incarnation();
        let allocator = KeyAllocator::new(keys.values().flatten().copied());
        let live: Vec<Mutex<HashMap<Xid, Vec<u64>>>> =
            (0..KEY_SHARDS).map(|_| Mutex::new(HashMap::new())).collect();
        for (xid, k) in keys {
            live[shard(&xid)].lock().insert(xid, k);
        }
        LogDecisions { log, node, incarnation, sessions: AtomicU64::new(1), keys: allocator, live }
    }

    /// The key a decision of `xid` is appended under: the one it already has (a decision
    /// written again), else a fresh one.
    fn key_for(&self, xid: &Xid) -> u64 {
        let mut shard = self.live[shard(xid)].lock();
        let keys = shard.entry(*xid).or_default();
        if keys.is_empty() {
            keys.push(self.keys.next());
        }
        keys[0]
    }

    /// The log behind this store (recovery reads what it recovered).
    pub fn log(&self) -> &Arc<dyn Log> {
        &self.log
    }
}

/// The shard of the key map that holds `xid` (the sequence spreads one session's Xids).
fn shard(xid: &Xid) -> usize {
    let g = xid.gtrid();
    let last = g.last().copied().unwrap_or(0) as usize;
    let session = if g.len() > 19 { g[19] as usize } else { 0 };
    (last ^ session.rotate_left(2)) % KEY_SHARDS
}

/// Appends [`Decision::encode_logged`]'s bytes to `out`: the reused buffer's path.
fn encode_logged_into(decision: &Decision, trace: Option<&TraceContext>, out: &mut Vec<u8>) {
    match trace {
        Some(trace) => decision.encode_traced_into(trace, out),
        None => decision.encode_into(out),
    }
}

fn log_error(err: LogError) -> StoreError {
    StoreError::Log(err.to_string())
}

impl DecisionStore for LogDecisions {
    fn node(&self) -> u32 {
        self.node
    }

    fn incarnation(&self) -> u64 {
        self.incarnation
    }

    fn open_session(&self) -> Result<u64, StoreError> {
        Ok(self.sessions.fetch_add(1, Ordering::Relaxed))
    }

    fn close_session(&self, _session: u64) {
        // Embedded sessions die with the process; nothing to record.
    }

    fn decide(&self, decision: &Decision) -> Result<(), StoreError> {
        self.decide_traced(decision, None)
    }

    /// Writes a decision whose coordinator span is sampled as `DCD2`, so that recovery
    /// after a restart links to the transaction's trace; any other as the `DCD1` bytes.
    fn decide_traced(&self, decision: &Decision, trace: Option<&TraceContext>) -> Result<(), StoreError> {
        // Before the key: a refused decision leaves no trace.
        decision.check_limits()?;
        // An unsampled span is never exported: a link to it would show nothing.
        let trace = trace.filter(|t| t.is_sampled() && t.is_valid());
        let key = self.key_for(&decision.xid);
        ENCODE_BUFFER.with(|cell| match cell.try_borrow_mut() {
            Ok(mut buf) => {
                buf.clear();
                encode_logged_into(decision, trace, &mut buf);
                let result = self.log.append(key, &buf);
                if buf.capacity() > ENCODE_BUFFER_BYTES_MAX {
                    *buf = Vec::with_capacity(1024);
                }
                result.map_err(log_error)
            }
            // Re-entered from inside an append (a log calling back into us): use a fresh buffer.
            Err(_) => self.log.append(key, &decision.encode_logged(trace)).map_err(log_error),
        })
    }

    fn complete(&self, xid: &Xid) -> Result<(), StoreError> {
        let keys = self.live[shard(xid)].lock().remove(xid).unwrap_or_default();
        for key in keys {
            self.log.complete(key).map_err(log_error)?;
        }
        Ok(())
    }

    fn complete_heuristic_kept(
        &self,
        xid: &Xid,
        _outcome: HeuristicOutcome,
        _trace: Option<&TraceContext>,
    ) -> Result<bool, StoreError> {
        // No outcome is answered from here, so none can be lost: the branches may go.
        self.complete(xid).map(|()| true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{BranchRecord, RecoveredDecisions};
    use crate::testing::restartable::RestartableLog;
    use crate::xid::Origin;
    use decree_log::engine::volatile::VolatileLog;

    #[test]
    fn decide_appends_the_encoded_decision_and_complete_forgets_it() {
        let log = Arc::new(VolatileLog::new());
        let store = LogDecisions::new(log.clone(), 3);
        assert_eq!(store.node(), 3);
        assert_eq!(store.incarnation(), log.incarnation());
        let (s1, s2) = (store.open_session().unwrap(), store.open_session().unwrap());
        assert_ne!(s1, s2, "session ids are unique");
        let xid = Xid::decree(Origin { node: 3, incarnation: store.incarnation(), session: s1, sequence: 1 });
        let decision = Decision {
            xid,
            branches: vec![
                BranchRecord { rm: "a".into(), branch: 0 },
                BranchRecord { rm: "b".into(), branch: 1 },
            ],
        };
        store.decide(&decision).unwrap();
        assert_eq!(log.stats().records_appended, 1);
        assert_eq!(log.live_records(), 1);
        store.complete(&xid).unwrap();
        assert_eq!(log.live_records(), 0);
        assert_eq!(log.stats().completions, 1);
    }

    #[test]
    fn completing_a_transaction_forgets_only_its_own_decision_when_the_old_keys_collide() {
        // Session 5 of incarnation 6 at sequence 2^20 + 3 and session 5 of incarnation 7 at
        // sequence 3 had the same derived key: completing the second forgot the first.
        let old = Xid::decree(Origin { node: 1, incarnation: 6, session: 5, sequence: (1 << 20) + 3 });
        let new = Xid::decree(Origin { node: 1, incarnation: 7, session: 5, sequence: 3 });
        assert_eq!(old.log_key(), new.log_key(), "the pair collides under the derived key");
        let log = Arc::new(VolatileLog::new());
        let in_doubt = Decision { xid: old, branches: vec![BranchRecord { rm: "a".into(), branch: 0 }] };
        log.append(old.log_key(), &in_doubt.encode()).unwrap();
        let store = LogDecisions::with_recovered(log.clone(), 1, HashMap::from([(old, vec![old.log_key()])]));
        let decision = Decision { xid: new, branches: vec![BranchRecord { rm: "a".into(), branch: 0 }] };
        store.decide(&decision).unwrap();
        store.decide(&decision).unwrap(); // written again: same key, one completion forgets both
        assert_eq!(log.live_records(), 3);
        store.complete(&new).unwrap();
        assert_eq!(log.live_records(), 1, "the in-doubt decision of incarnation 6 is still live");
        store.complete(&old).unwrap();
        assert_eq!(log.live_records(), 0);
        store.complete(&old).unwrap(); // completing twice completes nothing more
        assert_eq!(log.stats().completions, 2);
    }

    fn one_branch(sequence: u64) -> Decision {
        let xid = Xid::decree(Origin { node: 1, incarnation: 2, session: 3, sequence });
        Decision { xid, branches: vec![BranchRecord { rm: "pg".into(), branch: 0 }] }
    }

    #[test]
    fn a_decision_with_a_sampled_context_is_written_with_it_and_read_back_by_recovery() {
        let log = Arc::new(RestartableLog::default());
        let store = LogDecisions::new(log.clone(), 1);
        let sampled = TraceContext { trace_id: [0xab; 16], span_id: [0xcd; 8], flags: 1 };
        let unsampled = TraceContext { flags: 0, ..sampled };
        let (traced, dropped) = (one_branch(1), one_branch(2));
        store.decide_traced(&traced, Some(&sampled)).unwrap();
        store.decide_traced(&dropped, Some(&unsampled)).unwrap();
        let records = log.take_recovered();
        assert_eq!(&records[0].payload[..4], b"DCD2");
        assert_eq!(records[1].payload, dropped.encode(), "an unsampled span is not kept");
        let recovered = RecoveredDecisions::from_records(records);
        assert_eq!(recovered.traces.get(&traced.xid), Some(&sampled));
        assert_eq!(recovered.decisions[&traced.xid], traced);
        assert_eq!(recovered.traces.len(), 1);
    }

    #[test]
    fn a_decision_without_a_context_is_the_dcd1_bytes() {
        let log = Arc::new(RestartableLog::default());
        let store = LogDecisions::new(log.clone(), 1);
        let (plain, untraced) = (one_branch(1), one_branch(2));
        store.decide(&plain).unwrap();
        store.decide_traced(&untraced, None).unwrap();
        let records = log.take_recovered();
        assert_eq!(records[0].payload, plain.encode());
        assert_eq!(records[1].payload, untraced.encode());
    }

    #[test]
    fn encode_into_matches_encode() {
        let xid = Xid::decree(Origin { node: 1, incarnation: 2, session: 3, sequence: 4 });
        let decision = Decision { xid, branches: vec![BranchRecord { rm: "pg".into(), branch: 7 }] };
        let mut buf = b"junk".to_vec();
        buf.clear();
        decision.encode_into(&mut buf);
        assert_eq!(buf, decision.encode());
        assert_eq!(Decision::decode(&buf).unwrap(), decision);
    }
}
