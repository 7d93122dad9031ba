//! The backup's copy of the primary's decisions: applies each batch of the link to the
//! backup's own log and says when the batch is durable there, so that the backup
//! acknowledges only what its own disk holds.
//!
//! Decisions are an unordered set (live until completed), so the copy is a map from Xid to
//! the key the backup's own log files it under; the primary's keys never cross the link.
//! A batch is checked whole before anything of it is written: a record that does not
//! decode, or a decision filed under another Xid than its own, refuses the batch. Resent
//! batches are harmless: a decision appended twice is one decision on recovery
//! (`RecoveredDecisions` joins records of one Xid), a completion of a transaction the copy
//! does not hold is nothing to do. Outcome records go to the backup's outcome memory when
//! it keeps one ([`Replica::with_outcomes`]), so that a promoted member answers `Outcome`
//! for what the old primary had finished; the memory makes them durable on its own
//! schedule, and a batch's acknowledgement does not wait for it: the acknowledgement
//! confirms the batch's decisions, which no outcome record is (a failed memory fails the
//! next batch instead: fail-stop). A memory with as many records waiting for its flush as
//! it takes makes the batch wait for that flush (backpressure), never fail. Not here: the
//! link, the epochs (the rules decide which batches reach [`Replica::apply`]).

use crate::wire::{LinkRecord, RecordKind};
use decree_core::{Decision, KeyAllocator, RecoveredDecisions, Xid};
use decree_log::outcomes::OutcomeMemory;
use decree_log::{DurableCallback, Log, LogError, TxnKey};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Why a batch was refused before any of it was written, or the log failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReplicaError {
    /// A record of the batch is not what its kind says; nothing of the batch was written.
    #[error("replicated record {index} ({xid}): {reason}")]
    BadRecord { index: usize, xid: String, reason: String },
    /// The backup's log failed (fail-stop: the backup stops acknowledging).
    #[error(transparent)]
    Log(#[from] LogError),
}

/// The backup's live decisions over its own log.
pub struct Replica {
    log: Arc<dyn Log>,
    /// The backup's outcome memory, which replicated outcome records go to (`None`: they
    /// are refused, as by a copy without one).
    outcomes: Option<OutcomeMemory>,
    /// The outcome memory's first failure to make a record durable: every later batch is
    /// refused with it.
    outcomes_failed: Arc<Mutex<Option<LogError>>>,
    keys: KeyAllocator,
    /// The keys each live Xid's records are filed under (one, unless an earlier run of the
    /// log filed them under several): a completion completes them all. Ordered, so that
    /// what a catch-up forgets is written in the same order in every run (a seeded
    /// simulation replays exactly).
    live: BTreeMap<Xid, Vec<TxnKey>>,
}

impl Replica {
    /// The copy over `log`, just opened: what it recovered is the live set.
    pub fn open(log: Arc<dyn Log>) -> Replica {
        let recovered = RecoveredDecisions::from_records(log.take_recovered());
        let keys = KeyAllocator::new(recovered.all_keys());
        let live = recovered.keys.clone().into_iter().collect();
        for (key, error) in &recovered.undecodable {
            tracing::error!(key, %error, "undecodable record in the backup's log; left as is");
        }
        Replica { log, outcomes: None, outcomes_failed: Arc::new(Mutex::new(None)), keys, live }
    }

    /// Keeps the outcome records the primary sends in `outcomes` (the memory a promoted
    /// member answers `Outcome` from).
    pub fn with_outcomes(mut self, outcomes: OutcomeMemory) -> Replica {
        self.outcomes = Some(outcomes);
        self
    }

    /// The transactions this copy holds decided and not completed.
    pub fn live(&self) -> impl Iterator<Item = &Xid> {
        self.live.keys()
    }

    /// The highest incarnation (epoch) any live Xid carries: a promotion mints above it.
    pub fn highest_incarnation(&self) -> crate::epoch::Epoch {
        let highest = self.live.keys().filter_map(|x| x.origin()).map(|o| o.incarnation).max();
        crate::epoch::Epoch::from_raw(highest.unwrap_or(0))
    }

    /// Makes every outcome this copy remembered durable (the memory's flush), if it keeps
    /// an outcome memory: shutdown, and the pair's simulator's disk turns.
    pub fn sync_outcomes(&self) -> Result<(), LogError> {
        match &self.outcomes {
            Some(memory) => memory.sync(),
            None => Ok(()),
        }
    }

    /// How many transactions this copy holds.
    pub fn live_count(&self) -> usize {
        self.live.len()
    }

    /// Checks a batch whole before anything of it is written: a record that does not decode,
    /// or a decision filed under another Xid than its own, refuses it; so does an earlier
    /// failure of the outcome memory. What passes may be acknowledged as received before
    /// [`Replica::apply_checked`] writes it.
    pub fn check(&self, records: &[LinkRecord]) -> Result<CheckedBatch, ReplicaError> {
        if let Some(e) = self.outcomes_failed.lock().clone() {
            return Err(ReplicaError::Log(e));
        }
        let decisions = check_batch(records, self.outcomes.is_some())?;
        Ok(CheckedBatch { records: records.len(), decisions })
    }

    /// Applies one batch: decisions are appended (durable under the log's policy),
    /// completions and outcomes recorded lazily; `durable` is called once every decision of
    /// the batch is durable (at once for a batch with none: completions and outcomes need
    /// no sync before the acknowledgement), or with the log's error. A refused batch writes
    /// nothing and never calls `durable`.
    pub fn apply(&mut self, records: &[LinkRecord], durable: DurableCallback) -> Result<(), ReplicaError> {
        let checked = self.check(records)?;
        self.apply_checked(records, checked, durable)
    }

    /// [`Replica::apply`] for a batch [`Replica::check`] passed (`checked` is its verdict).
    pub fn apply_checked(
        &mut self,
        records: &[LinkRecord],
        checked: CheckedBatch,
        durable: DurableCallback,
    ) -> Result<(), ReplicaError> {
        assert_eq!(checked.records, records.len(), "the verdict is of another batch");
        // Counted in the loop that appends them (no second walk of the batch), and held
        // against the verdict before the waiter can be released.
        let mut decisions = 0;
        let waiter = Arc::new(BatchWaiter {
            pending: AtomicUsize::new(checked.decisions + 1),
            outcome: Mutex::new((Ok(()), Some(durable))),
        });
        for record in records {
            match record.kind {
                // check_batch decoded every decision and found it filed under its own Xid.
                RecordKind::Decision => {
                    decisions += 1;
                    let keys = &self.keys;
                    let key = self.live.entry(record.xid).or_insert_with(|| vec![keys.next()])[0];
                    let waiter = waiter.clone();
                    self.log.append_with(
                        key,
                        &record.payload,
                        Box::new(move |result| waiter.one_done(result)),
                    );
                }
                RecordKind::Completion => {
                    for key in self.live.remove(&record.xid).unwrap_or_default() {
                        self.log.complete(key)?;
                    }
                }
                RecordKind::Outcome => {
                    let memory =
                        self.outcomes.as_ref().expect("check_batch refuses outcomes without a memory");
                    let mut id = Vec::new();
                    record.xid.global().encode(&mut id);
                    remember_replicated(memory, &id, record.payload[0], &self.outcomes_failed)?;
                }
            }
        }
        assert_eq!(checked.decisions, decisions, "the verdict is of another batch");
        waiter.one_done(Ok(()));
        Ok(())
    }

    /// Rejoining a new primary: forgets every live transaction that `keep` (the primary's
    /// live set) does not hold; none of them was acknowledged. Returns how many it dropped.
    pub fn retain(&mut self, keep: &HashSet<Xid>) -> Result<usize, LogError> {
        let dropped: Vec<Xid> = self.live.keys().filter(|xid| !keep.contains(xid)).copied().collect();
        for xid in &dropped {
            for key in self.live.remove(xid).unwrap_or_default() {
                self.log.complete(key)?;
            }
        }
        Ok(dropped.len())
    }
}

/// Remembers one replicated outcome. When as many entries wait for the memory's flush as
/// it takes ([`LogError::Full`]), waits for that flush and tries again: a burst from the
/// primary is backpressure on the link (the link's task blocks its thread for that flush
/// and reads nothing meanwhile), never a failure of the backup. Only the memory's own
/// failure is returned.
fn remember_replicated(
    memory: &OutcomeMemory,
    id: &[u8],
    outcome: u8,
    failed: &Arc<Mutex<Option<LogError>>>,
) -> Result<(), LogError> {
    loop {
        let failed = failed.clone();
        let noted = Box::new(move |result: Result<(), LogError>| {
            if let Err(e) = result {
                tracing::error!(error = %e, "the backup's outcome memory failed");
                failed.lock().get_or_insert(e);
            }
        });
        match memory.remember(id, outcome, noted) {
            Err(LogError::Full(reason)) => {
                tracing::debug!(%reason, "the backup's outcome memory is full: waiting for its flush");
                memory.sync()?;
            }
            remembered => return remembered.map(|_| ()),
        }
    }
}

/// A batch that passed [`Replica::check`]: what [`Replica::apply_checked`] needs of the verdict.
#[derive(Debug)]
pub struct CheckedBatch {
    /// Records in the batch checked (the one applied must be that batch).
    records: usize,
    /// Decisions among them: the acknowledgement waits for each.
    decisions: usize,
}

/// Checks every record of a batch (outcomes only when the copy keeps them); returns how
/// many decisions it holds.
fn check_batch(records: &[LinkRecord], keeps_outcomes: bool) -> Result<usize, ReplicaError> {
    let mut decisions = 0;
    for (index, record) in records.iter().enumerate() {
        let bad = |reason: String| ReplicaError::BadRecord { index, xid: record.xid.to_string(), reason };
        match record.kind {
            RecordKind::Decision => {
                // Shipped as the primary's log holds it: either form (a traced one is `DCD2`).
                let (decision, _) =
                    Decision::decode_logged(&record.payload).map_err(|e| bad(format!("undecodable: {e}")))?;
                if decision.xid != record.xid {
                    return Err(bad(format!("the decision inside is of {}", decision.xid)));
                }
                decisions += 1;
            }
            RecordKind::Completion if record.payload.is_empty() => {}
            RecordKind::Completion => return Err(bad("a completion carries no payload".into())),
            RecordKind::Outcome if !keeps_outcomes => {
                return Err(bad("this copy keeps no outcome memory".into()))
            }
            RecordKind::Outcome if record.payload.len() != 1 || record.payload[0] == 0 => {
                return Err(bad("an outcome record carries one outcome byte, 1 to 255".into()))
            }
            RecordKind::Outcome => {}
        }
    }
    Ok(decisions)
}

/// Calls the batch's callback once its last decision is durable, with the first error.
struct BatchWaiter {
    pending: AtomicUsize,
    outcome: Mutex<(Result<(), LogError>, Option<DurableCallback>)>,
}

impl BatchWaiter {
    fn one_done(&self, result: Result<(), LogError>) {
        if let Err(e) = result {
            let mut outcome = self.outcome.lock();
            if outcome.0.is_ok() {
                outcome.0 = Err(e);
            }
        }
        if self.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            let (result, callback) = {
                let mut outcome = self.outcome.lock();
                (std::mem::replace(&mut outcome.0, Ok(())), outcome.1.take())
            };
            let callback = callback.expect("a batch's callback runs once");
            callback(result);
        }
    }
}

#[cfg(test)]
mod tests;
