//! Where the coordinator's durable decisions go.
//!
//! In embedded mode the coordinator writes decision records to its own
//! [`decree_log::Log`]; with a state server, the client library sends them to the server,
//! which writes them to its log. Both sit behind [`DecisionStore`], so the coordinator's
//! code is the same in both modes.
//!
//! A decision record keeps the limits of [`crate::limits`]: a store refuses a decision
//! past them before anything is written ([`Decision::check_limits`]), writing one asserts
//! them, and reading one back refuses a record that breaks them as malformed, so a record
//! never stores anything other than the decision it was given.
//!
//! A record has two forms. `DCD1` is the decision alone: the wire's `Decide` body, and what
//! the log holds for a decision that came without a sampled trace context (so that a
//! server, or an embedded coordinator, with tracing off writes exactly what it always
//! wrote). `DCD2`, in the log only,
//! is the same body with the client's trace context after it ([`Decision::encode_logged`]),
//! so that recovery after a restart, or by the other member of a pair after a failover,
//! links its spans to the client's (issue 36). Every reader of the log decodes both
//! ([`Decision::decode_logged`]); the wire takes `DCD1` only ([`Decision::decode`]).

use crate::limits::{
    self, LimitError, BRANCHES_MAX, DECISION_BYTES_MAX, DECISION_RECORD_BYTES_MAX, RM_NAME_BYTES_MAX,
};
use crate::rm::HeuristicOutcome;
use crate::trace::{TraceContext, TRACE_CONTEXT_BYTES};
use crate::xid::Xid;
use decree_log::LiveRecord;
use std::collections::HashMap;

/// One branch named in a decision record: which resource, which branch number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BranchRecord {
    /// The resource manager's configured name (recovery finds its factory by this name).
    pub rm: String,
    /// The branch qualifier number within the global transaction.
    pub branch: u16,
}

/// The commit point of a two-phase commit: "`xid` commits, with these branches".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The global transaction (empty bqual).
    pub xid: Xid,
    /// Branches that voted to commit and still need phase two.
    pub branches: Vec<BranchRecord>,
}

/// Why a decision could not be stored or found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The log failed (it is fail-stop: no later decision succeeds).
    #[error("decision log failed: {0}")]
    Log(String),
    /// The state server could not be reached or the connection was lost.
    #[error("state server unreachable: {0}")]
    Unreachable(String),
    /// A stored decision could not be decoded.
    #[error("malformed decision record: {0}")]
    Malformed(String),
    /// The decision is past a limit of the record ([`crate::limits`]); nothing was written
    /// or sent.
    #[error("decision refused before anything was written: {0}")]
    Limit(#[from] LimitError),
    /// The decision (or a one-phase notice) was not sent: the session had ended before it
    /// was written, or its write failed. The transaction is undecided; the coordinator rolls
    /// it back.
    #[error("not sent, so not decided: {0}")]
    NotSent(String),
}

/// What is known of a transaction's outcome when a client asks again by Xid; every answer
/// is true, and `Unknown` is given whenever the server cannot prove one of the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A decision record exists or its completion is remembered: the transaction commits.
    Committed,
    /// The owning session is live and has not decided yet, or the server has not finished
    /// its first recovery pass since it started.
    InProgress,
    /// The server rolled it back itself, or no decision can exist for it any more.
    RolledBack,
    /// A branch decided on its own (a heuristic outcome) during phase two.
    Heuristic,
    /// The server cannot prove any of the other answers (memory evicted, another
    /// incarnation, a decision whose write failed and that only a restart can settle).
    Unknown,
}

/// The durable side of the coordinator: the embedded log or a state server.
pub trait DecisionStore: Send + Sync {
    /// The node id this coordinator mints Xids with.
    fn node(&self) -> u32;
    /// The incarnation of the log behind this store (a new one at every restart).
    fn incarnation(&self) -> u64;
    /// A session id unique within this incarnation.
    fn open_session(&self) -> Result<u64, StoreError>;
    /// The session ended (its undecided transactions are presumed aborted).
    fn close_session(&self, session: u64);
    /// Stores the decision durably; returns once it is durable under the sync policy.
    fn decide(&self, decision: &Decision) -> Result<(), StoreError>;
    /// Records that every branch of `xid` is finished; lazy, never waits for the disk.
    fn complete(&self, xid: &Xid) -> Result<(), StoreError>;
    /// Records that every branch of `xid` is finished and that at least one of them
    /// decided on its own (`outcome`), so that the store can answer "heuristic" when
    /// asked; stores that keep no outcomes just complete.
    fn complete_heuristic(&self, xid: &Xid, outcome: HeuristicOutcome) -> Result<(), StoreError> {
        let _ = outcome;
        self.complete(xid)
    }
    /// [`DecisionStore::complete_traced`] with a heuristic, returning whether the store now
    /// keeps that outcome for good (durable, and in a pair held by the backup): only then
    /// may the branches' resource managers be told to forget them, or a crash in between
    /// loses the report everywhere. False leaves the branches to the state server's
    /// recovery, which finds and reports them again. False by default, the safe answer for
    /// a store that wraps another and does not pass this on; the embedded log, which
    /// answers no outcome questions and so has nothing to lose, says true.
    fn complete_heuristic_kept(
        &self,
        xid: &Xid,
        outcome: HeuristicOutcome,
        trace: Option<&TraceContext>,
    ) -> Result<bool, StoreError> {
        self.complete_traced(xid, Some(outcome), trace).map(|()| false)
    }
    /// Says that `xid` is about to commit its one branch in one phase, before the branch
    /// commits, so that a state server never answers it rolled back afterwards (protocol
    /// version 3's `OnePhase`). Returns whether the store was told, in which case the
    /// coordinator calls [`DecisionStore::complete`] once the commit succeeded; an error
    /// means the notice did not go out and the transaction must roll back. Stores that
    /// answer no outcome questions (the embedded log) need not be told.
    fn one_phase(&self, xid: &Xid) -> Result<bool, StoreError> {
        let _ = xid;
        Ok(false)
    }
    /// [`DecisionStore::decide`] with the trace context of the coordinator's decide span,
    /// for a store that passes it on (a state server's client puts it on the wire, so the
    /// server's spans join the trace; the embedded log writes a sampled one in the record,
    /// `DCD2`); the others ignore it.
    fn decide_traced(&self, decision: &Decision, trace: Option<&TraceContext>) -> Result<(), StoreError> {
        let _ = trace;
        self.decide(decision)
    }
    /// [`DecisionStore::complete`] (or [`DecisionStore::complete_heuristic`] when
    /// `heuristic` is given) with the trace context of the coordinator's completion span.
    fn complete_traced(
        &self,
        xid: &Xid,
        heuristic: Option<HeuristicOutcome>,
        trace: Option<&TraceContext>,
    ) -> Result<(), StoreError> {
        let _ = trace;
        match heuristic {
            Some(h) => self.complete_heuristic(xid, h),
            None => self.complete(xid),
        }
    }
    /// [`DecisionStore::one_phase`] with the trace context of the transaction's span.
    fn one_phase_traced(&self, xid: &Xid, trace: Option<&TraceContext>) -> Result<bool, StoreError> {
        let _ = trace;
        self.one_phase(xid)
    }
}

/// The magic of a decision record's wire form, and of its log form without a trace context.
const MAGIC: &[u8; 4] = b"DCD1";

/// The magic of the log-only traced form: the `DCD1` body, then the client's trace context.
const TRACED_MAGIC: &[u8; 4] = b"DCD2";

/// The decisions a log held at open, with the log keys their records were written under:
/// what every owner of a log (the embedded coordinator, the state server, `decree
/// recover`) rebuilds before it finishes or resolves them.
#[derive(Debug, Default)]
pub struct RecoveredDecisions {
    /// Decisions by global Xid; records of one Xid are joined (each branch number once).
    pub decisions: HashMap<Xid, Decision>,
    /// The keys of each Xid's records: completing the transaction completes them all.
    pub keys: HashMap<Xid, Vec<u64>>,
    /// Records that are not decisions: their key and why.
    pub undecodable: Vec<(u64, StoreError)>,
    /// The client's trace context of each decision whose record kept one (`DCD2`; the first
    /// found when a transaction has several records): what recovery's spans link to.
    pub traces: HashMap<Xid, TraceContext>,
}

impl RecoveredDecisions {
    /// Decodes the records a log recovered at open.
    pub fn from_records(records: Vec<LiveRecord>) -> Self {
        let mut recovered = RecoveredDecisions::default();
        for record in records {
            let d = match Decision::decode_logged(&record.payload) {
                Ok((d, trace)) => {
                    if let Some(trace) = trace {
                        recovered.traces.entry(d.xid).or_insert(trace);
                    }
                    d
                }
                Err(e) => {
                    recovered.undecodable.push((record.txn, e));
                    continue;
                }
            };
            recovered.keys.entry(d.xid).or_default().push(record.txn);
            match recovered.decisions.get_mut(&d.xid) {
                Some(existing) => existing.join(d),
                None => {
                    recovered.decisions.insert(d.xid, d);
                }
            }
        }
        recovered
    }

    /// Every key a live record uses (decodable or not): no allocator may hand these out.
    pub fn all_keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.keys.values().flatten().copied().chain(self.undecodable.iter().map(|(k, _)| *k))
    }
}

impl Decision {
    /// Checks the decision against the record's limits: at most [`BRANCHES_MAX`] branches,
    /// names of at most [`RM_NAME_BYTES_MAX`] bytes. Every store calls it before writing
    /// or sending a decision it was handed; [`Decision::encode`] asserts it.
    pub fn check_limits(&self) -> Result<(), LimitError> {
        limits::check_branch_count(self.branches.len())?;
        for b in &self.branches {
            limits::check_rm_name(&b.rm)?;
        }
        Ok(())
    }

    /// The wire's payload, and the log's without a trace context: magic "DCD1", Xid
    /// (binary), branch count (u16 BE), then per branch the branch number (u16 BE), the name
    /// length (u8) and the name (UTF-8).
    ///
    /// Panics when the decision is past a limit ([`Decision::check_limits`]): the fields
    /// could only hold it truncated, so the caller must have refused it before.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.branches.len() * 24);
        self.encode_into(&mut out);
        out
    }

    /// Appends the payload of [`Decision::encode`] to `out`, so that a hot path can reuse
    /// one buffer instead of allocating per decision. Panics like [`Decision::encode`].
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let count = self.branches.len();
        assert!(
            count <= BRANCHES_MAX,
            "a decision of {count} branches exceeds BRANCHES_MAX = {BRANCHES_MAX}: check_limits() was skipped"
        );
        let start = out.len();
        out.extend_from_slice(MAGIC);
        self.xid.encode(out);
        out.extend_from_slice(&(count as u16).to_be_bytes());
        for b in &self.branches {
            let name = b.rm.as_bytes();
            assert!(
                name.len() <= RM_NAME_BYTES_MAX,
                "a resource manager name of {} bytes exceeds RM_NAME_BYTES_MAX = {RM_NAME_BYTES_MAX}: \
                 check_limits() was skipped",
                name.len()
            );
            out.extend_from_slice(&b.branch.to_be_bytes());
            out.push(name.len() as u8);
            out.extend_from_slice(name);
        }
        assert!(
            out.len() - start <= DECISION_BYTES_MAX,
            "a record within the limits fits DECISION_BYTES_MAX"
        );
    }

    /// The log payload of this decision with `trace`, the client's sampled trace context
    /// when its `Decide` carried one: the traced form `DCD2` (the `DCD1` body, then the
    /// context: trace id 16 bytes, span id 8, flags 1) with one, exactly
    /// [`Decision::encode`]'s bytes without. Panics like [`Decision::encode`].
    pub fn encode_logged(&self, trace: Option<&TraceContext>) -> Vec<u8> {
        let Some(trace) = trace else { return self.encode() };
        let mut out = Vec::with_capacity(64 + TRACE_CONTEXT_BYTES + self.branches.len() * 24);
        self.encode_traced_into(trace, &mut out);
        out
    }

    /// Appends the traced form `DCD2` of [`Decision::encode_logged`] to `out`.
    pub fn encode_traced_into(&self, trace: &TraceContext, out: &mut Vec<u8>) {
        let start = out.len();
        self.encode_into(out);
        // The same body under the other magic: one encoder of the fields for both forms.
        out[start..start + MAGIC.len()].copy_from_slice(TRACED_MAGIC);
        trace.encode_into(out);
        assert!(
            out.len() - start <= DECISION_RECORD_BYTES_MAX,
            "a traced record within the limits fits DECISION_RECORD_BYTES_MAX"
        );
    }

    /// Adds the branches of another decision of the same transaction (written again) that
    /// this one does not name yet. The result is what recovery finishes, never written as
    /// one record: each record kept the limits, their union may name more than
    /// [`BRANCHES_MAX`] branches (at most one per branch number).
    pub fn join(&mut self, other: Decision) {
        for b in other.branches {
            if !self.branches.iter().any(|x| x.branch == b.branch) {
                self.branches.push(b);
            }
        }
    }

    /// Decodes the wire's form, `DCD1` ([`Decision::encode`]); the log's traced form is
    /// refused here, by name ([`Decision::decode_logged`] reads it).
    pub fn decode(buf: &[u8]) -> Result<Self, StoreError> {
        let Some(rest) = buf.strip_prefix(MAGIC) else {
            return Err(malformed(if buf.starts_with(TRACED_MAGIC) {
                "a DCD2 record (the log's traced form) where DCD1 is expected"
            } else {
                "missing DCD1 magic"
            }));
        };
        let (decision, rest) = Decision::decode_body(rest)?;
        if !rest.is_empty() {
            return Err(malformed("trailing bytes after the last branch"));
        }
        assert!(buf.len() <= DECISION_BYTES_MAX, "a record within the limits fits DECISION_BYTES_MAX");
        Ok(decision)
    }

    /// Decodes a log payload of either form ([`Decision::encode_logged`]): the decision,
    /// and the client's trace context when the record is `DCD2`. A record of another form,
    /// or a `DCD2` whose context is cut short, followed by more bytes or zero, is refused.
    pub fn decode_logged(buf: &[u8]) -> Result<(Self, Option<TraceContext>), StoreError> {
        let Some(rest) = buf.strip_prefix(TRACED_MAGIC) else {
            if !buf.starts_with(MAGIC) {
                return Err(malformed("missing DCD1 or DCD2 magic"));
            }
            return Decision::decode(buf).map(|d| (d, None));
        };
        let (decision, rest) = Decision::decode_body(rest)?;
        let trace = TraceContext::decode(rest).map_err(malformed)?;
        assert!(
            buf.len() <= DECISION_RECORD_BYTES_MAX,
            "a traced record within the limits fits DECISION_RECORD_BYTES_MAX"
        );
        Ok((decision, Some(trace)))
    }

    /// Decodes the body after the magic (Xid, count, branches); returns the decision and
    /// the bytes after its last branch.
    fn decode_body(buf: &[u8]) -> Result<(Self, &[u8]), StoreError> {
        let (xid, used) = Xid::decode(buf).map_err(|e| StoreError::Malformed(e.to_string()))?;
        let mut rest = &buf[used..];
        if rest.len() < 2 {
            return Err(malformed("branch count missing"));
        }
        let count = u16::from_be_bytes([rest[0], rest[1]]) as usize;
        limits::check_branch_count(count).map_err(|e| StoreError::Malformed(e.to_string()))?;
        rest = &rest[2..];
        let mut branches = Vec::with_capacity(count);
        for _ in 0..count {
            let (branch, after) = decode_branch(rest)?;
            branches.push(branch);
            rest = after;
        }
        // What was read holds the limits the writer asserted, as checked above.
        assert!(branches.len() == count && count <= BRANCHES_MAX);
        Ok((Decision { xid, branches }, rest))
    }
}

/// Decodes one branch (number, name length, name); returns it and the bytes after it.
fn decode_branch(rest: &[u8]) -> Result<(BranchRecord, &[u8]), StoreError> {
    if rest.len() < 3 {
        return Err(malformed("branch truncated"));
    }
    let branch = u16::from_be_bytes([rest[0], rest[1]]);
    let len = rest[2] as usize;
    if len > RM_NAME_BYTES_MAX {
        return Err(StoreError::Malformed(format!(
            "resource manager name of {len} bytes exceeds RM_NAME_BYTES_MAX = {RM_NAME_BYTES_MAX}"
        )));
    }
    let rest = &rest[3..];
    if rest.len() < len {
        return Err(malformed("branch name truncated"));
    }
    let rm =
        std::str::from_utf8(&rest[..len]).map_err(|_| malformed("branch name is not UTF-8"))?.to_string();
    Ok((BranchRecord { rm, branch }, &rest[len..]))
}

/// A malformed record's error, saying what is wrong with it.
fn malformed(what: &str) -> StoreError {
    StoreError::Malformed(what.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xid::Origin;
    use proptest::prelude::*;

    #[test]
    fn decision_round_trips() {
        let xid = Xid::decree(Origin { node: 1, incarnation: 2, session: 3, sequence: 4 });
        let d = Decision {
            xid,
            branches: vec![
                BranchRecord { rm: "pg-a".into(), branch: 0 },
                BranchRecord { rm: "pg-b".into(), branch: 1 },
            ],
        };
        assert_eq!(Decision::decode(&d.encode()).unwrap(), d);
        assert!(Decision::decode(&d.encode()[..10]).is_err());
    }

    fn two_branches() -> Decision {
        let xid = Xid::decree(Origin { node: 1, incarnation: 2, session: 3, sequence: 4 });
        let branches = vec![
            BranchRecord { rm: "pg-a".into(), branch: 0 },
            BranchRecord { rm: "pg-b".into(), branch: 1 },
        ];
        Decision { xid, branches }
    }

    fn sampled() -> TraceContext {
        TraceContext { trace_id: [0xab; 16], span_id: [0xcd; 8], flags: 1 }
    }

    #[test]
    fn both_log_forms_round_trip_and_the_untraced_one_is_the_wire_form() {
        let d = two_branches();
        let untraced = d.encode_logged(None);
        assert_eq!(untraced, d.encode(), "no context: the very bytes of DCD1");
        assert_eq!(&untraced[..4], b"DCD1");
        assert_eq!(Decision::decode_logged(&untraced).unwrap(), (d.clone(), None));
        let traced = d.encode_logged(Some(&sampled()));
        assert_eq!(&traced[..4], b"DCD2");
        assert_eq!(traced.len(), untraced.len() + TRACE_CONTEXT_BYTES);
        assert_eq!(&traced[4..untraced.len()], &untraced[4..], "the DCD1 body, then the context");
        assert_eq!(&traced[untraced.len()..], [[0xab; 16].as_slice(), &[0xcd; 8], &[1]].concat());
        assert_eq!(Decision::decode_logged(&traced).unwrap(), (d, Some(sampled())));
    }

    #[test]
    fn a_malformed_traced_record_is_refused_by_name() {
        let d = two_branches();
        let traced = d.encode_logged(Some(&sampled()));
        let refused = |bytes: &[u8]| match Decision::decode_logged(bytes) {
            Err(StoreError::Malformed(why)) => why,
            other => panic!("{other:?}"),
        };
        let body_end = traced.len() - TRACE_CONTEXT_BYTES;
        assert_eq!(refused(&traced[..traced.len() - 1]), "trace context truncated");
        assert_eq!(refused(&traced[..body_end]), "trace context truncated");
        assert_eq!(refused(&[&traced[..], &[0]].concat()), "trailing bytes after the trace context");
        for zeroed in [body_end..body_end + 16, body_end + 16..body_end + 24] {
            let mut bytes = traced.clone();
            bytes[zeroed].fill(0);
            assert_eq!(refused(&bytes), "trace context with a zero trace or span id");
        }
        assert_eq!(refused(&b"DCD3rest"[..]), "missing DCD1 or DCD2 magic");
        assert!(Decision::decode_logged(&traced[..9]).is_err(), "a body cut short");
        // The wire takes DCD1 only, and says what it was handed.
        let Err(StoreError::Malformed(why)) = Decision::decode(&traced) else { panic!("DCD2 on the wire") };
        assert_eq!(why, "a DCD2 record (the log's traced form) where DCD1 is expected");
    }

    #[test]
    fn recovery_keeps_the_context_of_a_traced_record() {
        let d = two_branches();
        let records = vec![
            LiveRecord { txn: 7, payload: d.encode_logged(Some(&sampled())) },
            LiveRecord { txn: 9, payload: d.encode() },
        ];
        let r = RecoveredDecisions::from_records(records);
        assert_eq!(r.traces.get(&d.xid), Some(&sampled()));
        assert_eq!(r.decisions[&d.xid], d);
        assert_eq!(r.keys[&d.xid], vec![7, 9]);
        let untraced = RecoveredDecisions::from_records(vec![LiveRecord { txn: 1, payload: d.encode() }]);
        assert!(untraced.traces.is_empty());
    }

    #[test]
    fn recovered_records_join_by_xid_and_keep_every_key() {
        let xid = Xid::decree(Origin { node: 1, incarnation: 2, session: 3, sequence: 4 });
        let record = |txn, branches: &[(u16, &str)]| LiveRecord {
            txn,
            payload: Decision {
                xid,
                branches: branches
                    .iter()
                    .map(|(b, rm)| BranchRecord { rm: rm.to_string(), branch: *b })
                    .collect(),
            }
            .encode(),
        };
        let records = vec![
            record(7, &[(0, "a"), (1, "b")]),
            record(9, &[(1, "b"), (2, "c")]),
            LiveRecord { txn: 11, payload: b"not a decision".to_vec() },
        ];
        let r = RecoveredDecisions::from_records(records);
        let branches: Vec<u16> = r.decisions[&xid].branches.iter().map(|b| b.branch).collect();
        assert_eq!(branches, vec![0, 1, 2], "each branch once");
        assert_eq!(r.keys[&xid], vec![7, 9]);
        assert_eq!(r.undecodable.len(), 1);
        let mut all: Vec<u64> = r.all_keys().collect();
        all.sort();
        assert_eq!(all, vec![7, 9, 11], "an undecodable record's key stays taken");
    }

    proptest! {
        #[test]
        fn arbitrary_payloads_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = Decision::decode(&bytes);
            let _ = Decision::decode_logged(&bytes);
            let _ = Decision::decode_logged(&[b"DCD2".as_slice(), &bytes].concat());
        }

        /// Within the limits a record stores exactly its decision; past them, it is refused
        /// by `check_limits` (what every store calls) and never written.
        #[test]
        fn decisions_within_the_limits_read_back_unchanged(
            names in proptest::collection::vec("[a-z0-9é.-]{0,70}", 0..40),
            gtrid in proptest::collection::vec(any::<u8>(), 0..=64),
        ) {
            let xid = Xid::new(5, &gtrid, &[]).unwrap();
            let branches: Vec<BranchRecord> =
                names.into_iter().enumerate().map(|(i, rm)| BranchRecord { rm, branch: i as u16 }).collect();
            let decision = Decision { xid, branches };
            let within = decision.branches.iter().all(|b| b.rm.len() <= RM_NAME_BYTES_MAX);
            prop_assert_eq!(decision.check_limits().is_ok(), within);
            if within {
                let bytes = decision.encode();
                prop_assert!(bytes.len() <= DECISION_BYTES_MAX);
                prop_assert_eq!(Decision::decode(&bytes).unwrap(), decision.clone());
                let context = TraceContext { trace_id: [7; 16], span_id: [9; 8], flags: 1 };
                let traced = decision.encode_logged(Some(&context));
                prop_assert!(traced.len() <= DECISION_RECORD_BYTES_MAX);
                prop_assert_eq!(Decision::decode_logged(&traced).unwrap(), (decision, Some(context)));
            }
        }
    }
}
