//! The decision store of embedded mode: decisions go straight to the process's own log.
//!
//! [`LogDecisions`] maps the [`DecisionStore`] calls onto a [`decree_log::Log`]: a decision
//! is one appended record keyed by the transaction's [`Xid::log_key`], a completion is the
//! log's lazy completion of that key. The node id comes from the configuration, the
//! incarnation from the log (a new one at every open), and session ids from a counter,
//! which is enough since sessions only need to be unique within one incarnation.

use crate::store::{Decision, DecisionStore, StoreError};
use crate::xid::Xid;
use decree_log::{Log, LogError};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Encoded decisions larger than this give their buffer back instead of keeping it.
const ENCODE_BUFFER_BYTES_MAX: usize = 64 << 10;

thread_local! {
    /// One encode buffer per thread: decide then costs no allocation of its own.
    static ENCODE_BUFFER: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(1024));
}

/// [`DecisionStore`] over the process's own log (embedded mode).
pub struct LogDecisions {
    log: Arc<dyn Log>,
    node: u32,
    incarnation: u64,
    sessions: AtomicU64,
}

impl LogDecisions {
    /// A store writing to `log` and minting Xids for `node`.
    pub fn new(log: Arc<dyn Log>, node: u32) -> Self {
        let incarnation = log.incarnation();
        LogDecisions { log, node, incarnation, sessions: AtomicU64::new(1) }
    }

    /// The log behind this store (recovery reads what it recovered).
    pub fn log(&self) -> &Arc<dyn Log> {
        &self.log
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
        let key = decision.xid.log_key();
        ENCODE_BUFFER.with(|cell| match cell.try_borrow_mut() {
            Ok(mut buf) => {
                buf.clear();
                decision.encode_into(&mut buf);
                let result = self.log.append(key, &buf);
                if buf.capacity() > ENCODE_BUFFER_BYTES_MAX {
                    *buf = Vec::with_capacity(1024);
                }
                result.map_err(log_error)
            }
            // Re-entered from inside an append (a log calling back into us): use a fresh buffer.
            Err(_) => self.log.append(key, &decision.encode()).map_err(log_error),
        })
    }

    fn complete(&self, xid: &Xid) -> Result<(), StoreError> {
        self.log.complete(xid.log_key()).map_err(log_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::BranchRecord;
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
