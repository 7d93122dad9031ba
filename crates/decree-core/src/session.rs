//! A session: one thread's connections to its resource managers and the commit protocol
//! it runs over them (the object API).
//!
//! A [`Session`] owns one connection per resource manager for its whole life. Each
//! [`Transaction`] begun on it mints an Xid in memory (nothing durable: presumed abort),
//! enlists some of the connections as branches (branch `i` gets bqual `i`), and commits:
//! one branch commits in one phase with no log write; several branches prepare, and the
//! decision record is written to the store only when at least one branch voted to commit
//! and none refused. That write is the commit point and the only synchronous one; phase
//! two follows, failures of it go to the coordinator's background retry thread, and the
//! completion record is written lazily once every branch is finished.
//!
//! The hot path allocates nothing once warm: the vote vectors and the decision (with its
//! RM name strings) are kept in the session and reused.
//!
//! Invariants of the branch bookkeeping (asserted where it changes, see
//! `Session::assert_branches`): `enlisted` counts exactly the connections that have a branch
//! number; every number is below `next_branch` and used once, since numbers are handed out
//! in increasing order and never again within the transaction (not even those of failed
//! starts); `next_branch` stays within [`BRANCHES_MAX`], so a number never wraps nor
//! reaches `NOT_ENLISTED`. Asking for more branch numbers than that is an error.

use crate::cpu_spare;
use crate::error::{HeuristicReport, TmError};
use crate::fanout::{Fanout, Spread};
use crate::limits::{LimitError, BRANCHES_MAX};
use crate::protocol::{self, CommitPath, PhaseTwoStep, Verdict};
use crate::rm::{BranchCall, HeuristicOutcome, ResourceManager, RmError, Vote};
use crate::store::{BranchRecord, Decision, StoreError};
use crate::tm::{BranchCalls, TransactionManager};
use crate::trace::{self, TxTrace};
use crate::xid::{Origin, Xid};
use std::sync::Arc;

/// Marks a connection that is not a branch of the current transaction.
const NOT_ENLISTED: u16 = u16::MAX;

// Branch numbers are `0..BRANCHES_MAX`: none of them is the marker.
const _: () = assert!(BRANCHES_MAX <= NOT_ENLISTED as usize);
// `assert_branches` marks the numbers in a bitset of 64-bit words.
const _: () = assert!(BRANCHES_MAX.is_multiple_of(64));

/// How a commit went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitKind {
    /// No branch was enlisted.
    Empty,
    /// One branch, committed in one phase; nothing was logged.
    OnePhase,
    /// Every branch voted read-only; nothing was logged.
    ReadOnly,
    /// Two-phase commit with a decision record.
    TwoPhase,
}

/// The result of a successful commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitReport {
    /// The global transaction.
    pub xid: Xid,
    /// Which path the commit took.
    pub kind: CommitKind,
    /// Branches whose phase two failed and is being retried in the background; the
    /// transaction is committed (the decision is durable) but their locks are still held.
    pub phase_two_pending: usize,
    /// Heuristic outcomes that agree with the decision (a branch committed on its own);
    /// contradicting ones make the commit return [`TmError::Heuristic`] instead.
    pub heuristics: Vec<HeuristicReport>,
}

/// One thread's connections and transaction state.
pub struct Session {
    tm: Arc<TransactionManager>,
    id: u64,
    sequence: u64,
    rms: Vec<Box<dyn ResourceManager>>,
    /// Branch number of each connection in the current transaction, or `NOT_ENLISTED`.
    branch_of: Vec<u16>,
    /// The branch Xid of each enlisted connection, computed once at enlistment.
    branch_xids: Vec<Xid>,
    /// Branches enlisted in the current transaction: the entries of `branch_of` that are
    /// not `NOT_ENLISTED` (asserted).
    enlisted: u16,
    /// The branch number the next enlistment gets, at most [`BRANCHES_MAX`] (asserted;
    /// more is refused). Equal to `enlisted` except after a parallel enlistment in which
    /// some start failed: the numbers handed out then stay taken (their branches may exist
    /// in the RMs), so later ones must not reuse them.
    next_branch: u16,
    current: Option<Xid>,
    parallel: Vec<bool>,
    /// Helper threads for the branches driven in parallel.
    fanout: Fanout,
    votes: Vec<Option<Result<Vote, RmError>>>,
    acks: Vec<Option<Result<(), RmError>>>,
    decision: Decision,
    open: bool,
    /// The connections were closed by `close_rms` while the session stays open.
    rms_closed: bool,
    /// The current transaction's spans; always `None` while spans are off.
    trace: Option<Box<TxTrace>>,
}

impl Session {
    /// Opens every connection (XA xa_open; pass connections not yet opened, or RMs whose
    /// `open` is idempotent) and a session in the decision store.
    pub fn open(
        tm: &Arc<TransactionManager>,
        mut rms: Vec<Box<dyn ResourceManager>>,
    ) -> Result<Self, TmError> {
        let branches_max = tm.config().branches_max;
        if rms.len() > branches_max {
            return Err(TmError::Config(format!(
                "{} resource managers given, a session takes at most {branches_max}",
                rms.len()
            )));
        }
        for rm in &rms {
            if tm.factory(rm.name()).is_none() {
                return Err(TmError::Config(format!(
                    "resource manager {:?} has no factory registered with the coordinator \
                     (needed for recovery and phase-two retries)",
                    rm.name()
                )));
            }
        }
        let id = tm.store().open_session()?;
        for i in 0..rms.len() {
            if let Err(cause) = rms[i].open() {
                for rm in &mut rms[..i] {
                    let _ = rm.close();
                }
                tm.store().close_session(id);
                return Err(TmError::Rm { rm: rms[i].name().to_string(), call: "open", xid: None, cause });
            }
        }
        let n = rms.len();
        let parallel = rms.iter().map(|rm| rm.prefers_parallel()).collect();
        Ok(Session {
            tm: tm.clone(),
            id,
            sequence: 0,
            rms,
            branch_of: vec![NOT_ENLISTED; n],
            branch_xids: vec![Xid::decree(Origin { node: 0, incarnation: 0, session: 0, sequence: 0 }); n],
            enlisted: 0,
            next_branch: 0,
            current: None,
            parallel,
            fanout: Fanout::default(),
            votes: vec![None; n],
            acks: vec![None; n],
            decision: Decision {
                xid: Xid::decree(Origin { node: 0, incarnation: 0, session: 0, sequence: 0 }),
                branches: Vec::new(),
            },
            open: true,
            rms_closed: false,
            trace: None,
        })
    }

    /// The session id (part of every Xid it mints).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The coordinator this session belongs to.
    pub fn tm(&self) -> &Arc<TransactionManager> {
        &self.tm
    }

    /// The current transaction, if one is begun.
    pub fn current(&self) -> Option<Xid> {
        self.current
    }

    /// Whether the session is still open.
    pub fn is_open(&self) -> bool {
        self.open
    }

    /// Whether the session is open but its connections were closed by [`Session::close_rms`].
    pub fn rms_closed(&self) -> bool {
        self.open && self.rms_closed
    }

    /// Number of connections.
    pub fn rm_count(&self) -> usize {
        self.rms.len()
    }

    /// Connection `index`, to do the application's work on it.
    pub fn rm_mut(&mut self, index: usize) -> Option<&mut (dyn ResourceManager + 'static)> {
        self.rms.get_mut(index).map(|b| b.as_mut())
    }

    /// Begins a transaction (object API); enlist connections on the returned handle.
    pub fn begin(&mut self) -> Result<Transaction<'_>, TmError> {
        self.begin_xid()?;
        Ok(Transaction { session: self, finished: false })
    }

    /// Mints the next Xid; nothing durable is written (presumed abort).
    pub(crate) fn begin_xid(&mut self) -> Result<(), TmError> {
        if !self.open || self.rms_closed {
            return Err(TmError::Closed { call: "begin" });
        }
        if let Some(xid) = self.current {
            return Err(TmError::AlreadyActive { xid: Box::new(xid) });
        }
        self.sequence += 1;
        let store = self.tm.store();
        assert_eq!((self.enlisted, self.next_branch), (0, 0), "a new transaction starts with no branch");
        // Minted in place and read back by reference: the 140-byte Xid is not copied through
        // locals on the way (callgrind counted two `memcpy` calls a transaction for that).
        let xid = self.current.insert(Xid::decree(Origin {
            node: store.node(),
            incarnation: store.incarnation(),
            session: self.id,
            sequence: self.sequence,
        }));
        self.trace = TxTrace::begin(xid, self.rms.len());
        Ok(())
    }

    /// The Xid of the transaction under way, if any.
    pub(crate) fn current_xid(&self) -> Option<Xid> {
        self.current
    }

    /// Enlists connection `index` as the next branch and starts it (XA xa_start).
    pub(crate) fn enlist(&mut self, index: usize) -> Result<u16, TmError> {
        let Some(xid) = &self.current else { return Err(TmError::NoTransaction { call: "enlist" }) };
        let Some(rm) = self.rms.get_mut(index) else {
            return Err(TmError::Config(format!("no connection number {index} in this session")));
        };
        if self.branch_of[index] != NOT_ENLISTED {
            return Ok(self.branch_of[index]);
        }
        let branch = self.next_branch;
        // Reached only when failed starts used up the numbers (a session holds at most
        // `branches_max` <= BRANCHES_MAX connections).
        if usize::from(branch) >= BRANCHES_MAX {
            return Err(LimitError::TooManyBranches { count: usize::from(branch) + 1 }.into());
        }
        self.branch_xids[index] = xid.branch(branch);
        if let Err(cause) = rm.start(&self.branch_xids[index]) {
            return Err(self.start_error(index, cause));
        }
        self.branch_of[index] = branch;
        self.enlisted += 1;
        self.next_branch += 1;
        assert!(self.enlisted <= self.next_branch && usize::from(self.next_branch) <= BRANCHES_MAX);
        Ok(branch)
    }

    /// The error of connection `index`'s failed start of its branch.
    fn start_error(&self, index: usize, cause: RmError) -> TmError {
        TmError::Rm {
            rm: self.rms[index].name().to_string(),
            call: "start",
            xid: Some(Box::new(self.branch_xids[index])),
            cause,
        }
    }

    /// Enlists and starts every connection not enlisted yet, numbered in connection order.
    /// The starts run at once under the same rule as prepare and phase two (see
    /// [`Session::spread`]), else one after another. When a start
    /// fails, every branch that did start stays enlisted, so that a rollback reaches it, and
    /// the error names the first failure in connection order.
    pub(crate) fn enlist_all(&mut self) -> Result<(), TmError> {
        let Some(xid) = self.current else { return Err(TmError::NoTransaction { call: "enlist" }) };
        let waiting = |s: &Session, i: usize| s.branch_of[i] == NOT_ENLISTED;
        let candidates = (0..self.rms.len()).filter(|&i| waiting(self, i) && self.parallel[i]).count();
        let Some(spread) = self.spread(candidates) else {
            for i in 0..self.rms.len() {
                self.enlist(i)?;
            }
            self.assert_branches();
            return Ok(());
        };
        let first = self.next_branch;
        let wanted = usize::from(first) + (0..self.rms.len()).filter(|&i| waiting(self, i)).count();
        if wanted > BRANCHES_MAX {
            return Err(LimitError::TooManyBranches { count: wanted }.into());
        }
        let mut number = first;
        for i in 0..self.rms.len() {
            if waiting(self, i) {
                self.branch_xids[i] = xid.branch(number);
                number += 1;
            }
        }
        let (branch_of, acks) = (&self.branch_of, &mut self.acks);
        acks.iter_mut().for_each(|a| *a = None);
        self.fanout.run(
            &mut self.rms,
            &self.branch_xids,
            |i| branch_of[i] == NOT_ENLISTED,
            BranchCall::Start,
            spread,
            |i, answer| acks[i] = Some(answer.into_ack()),
        );
        let mut first_error = None;
        let mut number = first;
        for i in 0..self.rms.len() {
            if !waiting(self, i) {
                continue;
            }
            match self.acks[i].take() {
                Some(Ok(())) => {
                    self.branch_of[i] = number;
                    self.enlisted += 1;
                }
                failed => {
                    let cause = match failed {
                        Some(Err(cause)) => cause,
                        _ => RmError::Protocol("no answer to start".into()),
                    };
                    if first_error.is_none() {
                        first_error = Some(self.start_error(i, cause));
                    }
                }
            }
            number += 1;
        }
        assert_eq!(usize::from(number), wanted, "one fresh number per connection started");
        self.next_branch = number;
        self.assert_branches();
        first_error.map_or(Ok(()), Err)
    }

    /// Asserts the invariants of the branch bookkeeping (see the module documentation).
    /// Linear in the session's connections: run once per enlistment round and per commit
    /// or rollback, not per call.
    fn assert_branches(&self) {
        let mut seen = [0u64; BRANCHES_MAX / 64];
        let mut enlisted = 0usize;
        for &branch in &self.branch_of {
            if branch == NOT_ENLISTED {
                continue;
            }
            assert!(branch < self.next_branch, "branch number {branch} was not handed out yet");
            let (word, bit) = (usize::from(branch) / 64, 1u64 << (branch % 64));
            assert_eq!(seen[word] & bit, 0, "branch number {branch} used twice");
            seen[word] |= bit;
            enlisted += 1;
        }
        assert_eq!(enlisted, usize::from(self.enlisted), "enlisted count equals the enlisted branches");
        assert!(self.enlisted <= self.next_branch && usize::from(self.next_branch) <= BRANCHES_MAX);
        assert!(self.current.is_some() || self.next_branch == 0, "branch numbers only within a transaction");
    }

    /// Commits the current transaction (see the module documentation for the protocol).
    pub(crate) fn commit_current(&mut self) -> Result<CommitReport, TmError> {
        if self.trace.is_none() {
            // Spans off: a tail call, so that the result is not moved once more.
            return self.commit_traced();
        }
        let result = self.commit_traced();
        if let Some(t) = self.trace.take() {
            let (outcome, error) = match &result {
                Ok(_) => ("committed", None),
                Err(e @ (TmError::RolledBack { .. } | TmError::NotSent { .. })) => {
                    ("rolled_back", Some(e.to_string()))
                }
                Err(e @ TmError::Heuristic { .. }) => ("heuristic", Some(e.to_string())),
                Err(e) => ("unknown", Some(e.to_string())),
            };
            t.end(outcome, error);
        }
        result
    }

    /// [`Session::commit_current`] but for ending the transaction's span.
    fn commit_traced(&mut self) -> Result<CommitReport, TmError> {
        let Some(xid) = self.current else { return Err(TmError::NoTransaction { call: "commit" }) };
        self.assert_branches();
        for i in 0..self.rms.len() {
            let b = self.branch_of[i];
            if b == NOT_ENLISTED {
                continue;
            }
            if let Err(cause) = self.rms[i].end(&self.branch_xids[i]) {
                self.votes.iter_mut().for_each(|v| *v = None);
                return Err(self.abort(xid, i, "end", cause));
            }
        }
        match protocol::commit_path(self.enlisted as usize) {
            CommitPath::Empty => {
                self.clear();
                Ok(CommitReport {
                    xid,
                    kind: CommitKind::Empty,
                    phase_two_pending: 0,
                    heuristics: Vec::new(),
                })
            }
            CommitPath::OnePhase => self.commit_one_phase(&xid),
            CommitPath::TwoPhase => self.commit_two_phase(&xid),
        }
    }

    fn commit_one_phase(&mut self, xid: &Xid) -> Result<CommitReport, TmError> {
        let i = self.branch_of.iter().position(|&b| b != NOT_ENLISTED).unwrap_or(0);
        let bx = self.branch_xids[i];
        // The notice goes out whole before the branch commits: a notice not sent leaves
        // the transaction undecided, so it rolls back.
        let wire = self.trace.as_ref().and_then(|t| t.wire());
        let told = match self.tm.store().one_phase_traced(xid, wire.as_ref()) {
            Ok(told) => told,
            Err(e) => return Err(self.not_sent(*xid, e)),
        };
        self.trace_started(i);
        let result = self.rms[i].commit(&bx, true);
        self.trace_branch(i, "commit", result.as_ref().err());
        let name = self.rms[i].name().to_string();
        self.clear();
        // The commit's answer is in: the server remembers it committed (lazily), or what
        // the branch decided on its own, told or not (an older server then answers
        // heuristic rather than rolled back); a heuristic branch is forgotten only once the
        // store keeps that (the embedded log, which answers nothing, at once).
        let forget = match &result {
            Ok(()) if told => {
                if let Err(e) = self.complete_in_store(xid, None) {
                    tracing::debug!(%xid, error = %e, "cannot complete a one-phase commit; the server answers unknown for it");
                }
                false
            }
            Err(RmError::Heuristic(h)) => self.complete_heuristic_in_store(*xid, *h),
            _ => false,
        };
        let rolled_back = |call, cause| TmError::RolledBack {
            xid: Box::new(*xid),
            rm: name.clone(),
            branch: bx.branch_number().unwrap_or(0),
            call,
            cause,
        };
        match result {
            Ok(()) => Ok(CommitReport {
                xid: *xid,
                kind: CommitKind::OnePhase,
                phase_two_pending: 0,
                heuristics: Vec::new(),
            }),
            Err(RmError::Heuristic(outcome)) => {
                let branch = bx.branch_number().unwrap_or(0);
                let report = HeuristicReport { xid: *xid, rm: name.clone(), branch, outcome };
                self.tm.shared().report_heuristic(report.clone());
                if forget {
                    let _ = self.rms[i].forget(&bx);
                }
                if protocol::heuristic_is_damage(outcome, true) {
                    Err(TmError::Heuristic { xid: Box::new(*xid), reports: vec![report] })
                } else {
                    Ok(CommitReport {
                        xid: *xid,
                        kind: CommitKind::OnePhase,
                        phase_two_pending: 0,
                        heuristics: vec![report],
                    })
                }
            }
            Err(RmError::Unavailable(cause)) => Err(TmError::OutcomeUnknown {
                xid: Box::new(*xid),
                cause: if told {
                    format!("one-phase commit on {name:?} lost its reply: {cause}; one-phase: only the database knows")
                } else {
                    format!(
                        "one-phase commit on {name:?} lost its reply: {cause}; one-phase: only the database knows \
                         (the decision store was not told of this transaction and cannot answer for it)"
                    )
                },
            }),
            Err(cause @ (RmError::RolledBack(_) | RmError::UnknownXid(_))) => {
                Err(rolled_back("commit (one-phase)", cause))
            }
            Err(cause @ RmError::Protocol(_)) => {
                let _ = self.rms[i].rollback(&bx);
                Err(rolled_back("commit (one-phase)", cause))
            }
        }
    }

    /// Phase one: asks every enlisted branch to prepare (at once under `spread`) and
    /// keeps the votes; each call gets its span when spans are on.
    fn prepare_enlisted(&mut self, spread: Option<Spread>) {
        self.trace_all_started(|s, i| s.branch_of[i] != NOT_ENLISTED);
        if let Some(spread) = spread {
            let (branch_of, votes, trace) = (&self.branch_of, &mut self.votes, &mut self.trace);
            votes.iter_mut().for_each(|v| *v = None);
            self.fanout.run(
                &mut self.rms,
                &self.branch_xids,
                |i| branch_of[i] != NOT_ENLISTED,
                BranchCall::Prepare,
                spread,
                |i, answer| {
                    if let Some(t) = trace {
                        t.call_answered(i);
                    }
                    votes[i] = Some(answer.into_vote())
                },
            );
        } else {
            for i in 0..self.rms.len() {
                self.votes[i] =
                    (self.branch_of[i] != NOT_ENLISTED).then(|| self.rms[i].prepare(&self.branch_xids[i]));
                if let Some(t) = &mut self.trace {
                    t.call_answered(i);
                }
            }
        }
        if self.trace.is_some() {
            for i in 0..self.rms.len() {
                if self.branch_of[i] != NOT_ENLISTED {
                    let error = match &self.votes[i] {
                        Some(Err(e)) => Some(e.clone()),
                        _ => None,
                    };
                    self.trace_branch(i, "prepare", error.as_ref());
                }
            }
        }
    }

    /// Phase two: commits every branch that voted commit (at once under `spread`) and
    /// keeps the answers in `acks`.
    fn commit_voters(&mut self, spread: Option<Spread>) {
        let voted_commit = |v: &Option<Result<Vote, RmError>>| matches!(v, Some(Ok(Vote::Commit)));
        self.trace_all_started(|s, i| voted_commit(&s.votes[i]));
        if let Some(spread) = spread {
            let (votes, acks, trace) = (&self.votes, &mut self.acks, &mut self.trace);
            acks.iter_mut().for_each(|a| *a = None);
            self.fanout.run(
                &mut self.rms,
                &self.branch_xids,
                |i| voted_commit(&votes[i]),
                BranchCall::Commit,
                spread,
                |i, answer| {
                    if let Some(t) = trace {
                        t.call_answered(i);
                    }
                    acks[i] = Some(answer.into_ack())
                },
            );
        } else {
            for i in 0..self.rms.len() {
                self.acks[i] =
                    voted_commit(&self.votes[i]).then(|| self.rms[i].commit(&self.branch_xids[i], false));
                if let Some(t) = &mut self.trace {
                    t.call_answered(i);
                }
            }
        }
    }

    fn commit_two_phase(&mut self, xid: &Xid) -> Result<CommitReport, TmError> {
        // Phase one.
        let spread = self.spread_enlisted();
        self.prepare_enlisted(spread);
        let verdict = protocol::tally(self.enlisted_votes());
        let voters = match verdict {
            Verdict::Abort { position } => {
                let i = self.nth_enlisted(position);
                let cause = match &self.votes[i] {
                    Some(Err(e)) => e.clone(),
                    _ => RmError::Protocol("no answer to prepare".into()),
                };
                return Err(self.abort(*xid, i, "prepare", cause));
            }
            Verdict::AllReadOnly => {
                self.clear();
                return Ok(CommitReport {
                    xid: *xid,
                    kind: CommitKind::ReadOnly,
                    phase_two_pending: 0,
                    heuristics: Vec::new(),
                });
            }
            Verdict::Commit { voters } => voters,
        };
        // The commit point: fill the reused decision and store it.
        self.fill_decision(xid, voters);
        self.decide(xid)?;
        // Phase two on the branches that voted commit.
        self.commit_voters(spread);
        let mut retry: Vec<BranchRecord> = Vec::new();
        let mut heuristics = Vec::new();
        let mut forget = Vec::new();
        for i in 0..self.rms.len() {
            let Some(result) = self.acks[i].take() else { continue };
            if self.trace.is_some() {
                self.trace_branch(i, "commit", result.as_ref().err());
            }
            let branch = self.branch_of[i];
            match protocol::phase_two_step(&result, true) {
                PhaseTwoStep::Done => {}
                PhaseTwoStep::Retry => {
                    tracing::warn!(
                        xid = %self.branch_xids[i],
                        rm = self.rms[i].name(),
                        error = ?result,
                        "phase two failed; retrying in the background"
                    );
                    retry.push(BranchRecord { rm: self.rms[i].name().to_string(), branch });
                }
                PhaseTwoStep::Heuristic(outcome) => {
                    let report =
                        HeuristicReport { xid: *xid, rm: self.rms[i].name().to_string(), branch, outcome };
                    self.tm.shared().report_heuristic(report.clone());
                    heuristics.push(report);
                    forget.push(i);
                }
            }
        }
        let phase_two_pending = retry.len();
        let heuristic = heuristics.iter().fold(None, |h, r| Some(protocol::combine_heuristic(h, r.outcome)));
        if retry.is_empty() {
            let kept = match heuristic {
                Some(h) => self.complete_heuristic_in_store(*xid, h),
                None => {
                    if let Err(e) = self.complete_in_store(xid, None) {
                        tracing::warn!(%xid, error = %e, "completion not written; recovery will redo phase two");
                    }
                    false
                }
            };
            self.forget_heuristic_branches(kept, &forget);
        }
        self.clear();
        if !retry.is_empty() {
            self.tm.defer(*xid, true, retry, heuristic, self.client_trace());
        }
        if heuristics.iter().any(|h| protocol::heuristic_is_damage(h.outcome, true)) {
            return Err(TmError::Heuristic { xid: Box::new(*xid), reports: heuristics });
        }
        Ok(CommitReport { xid: *xid, kind: CommitKind::TwoPhase, phase_two_pending, heuristics })
    }

    /// Rolls back the current transaction; nothing durable is written.
    pub(crate) fn rollback_current(&mut self) -> Result<(), TmError> {
        let Some(xid) = self.current else { return Err(TmError::NoTransaction { call: "rollback" }) };
        self.assert_branches();
        for i in 0..self.rms.len() {
            let b = self.branch_of[i];
            if b != NOT_ENLISTED {
                // An error of end is not fatal here: rollback follows either way.
                let _ = self.rms[i].end(&self.branch_xids[i]);
            }
            self.votes[i] = None;
        }
        if self.trace.is_none() {
            return self.roll_back_enlisted(xid);
        }
        let result = self.roll_back_enlisted(xid);
        if let Some(t) = self.trace.take() {
            t.end("rolled_back", result.as_ref().err().map(ToString::to_string));
        }
        result
    }

    /// Rolls back every enlisted branch after a failure and returns the error naming the
    /// branch that failed.
    /// Stores the filled decision: the commit point. A decision that was not sent rolls
    /// back; one whose store failed otherwise may or may not be durable, so its branches
    /// are left prepared for recovery (or the state server) to settle, never rolled back.
    fn decide(&mut self, xid: &Xid) -> Result<(), TmError> {
        let span = self.trace.as_ref().map(|t| t.store_call("decree.decide"));
        let wire = span.as_ref().and_then(trace::wire_of);
        let result = self.tm.store().decide_traced(&self.decision, wire.as_ref());
        if let Some(span) = span {
            trace::end_store_call(span, result.as_ref().err().map(ToString::to_string));
        }
        match result {
            Ok(()) => Ok(()),
            Err(e @ StoreError::NotSent(_)) => Err(self.not_sent(*xid, e)),
            Err(e) => {
                self.clear();
                Err(TmError::OutcomeUnknown { xid: Box::new(*xid), cause: e.to_string() })
            }
        }
    }

    /// Rolls back every branch of a transaction whose decision (or one-phase notice) never
    /// reached the store: nothing was decided.
    fn not_sent(&mut self, xid: Xid, e: StoreError) -> TmError {
        if let Err(rollback) = self.roll_back_enlisted(xid) {
            tracing::warn!(%xid, error = %rollback, "rollback after a decision not sent reported an error");
        }
        TmError::NotSent { xid: Box::new(xid), cause: e.to_string() }
    }

    fn abort(&mut self, xid: Xid, failed: usize, call: &'static str, cause: RmError) -> TmError {
        let (rm, branch) = (self.rms[failed].name().to_string(), self.branch_of[failed]);
        if let Err(e) = self.roll_back_enlisted(xid) {
            tracing::warn!(%xid, error = %e, "rollback after a failed {call} reported an error");
        }
        TmError::RolledBack { xid: Box::new(xid), rm, branch, call, cause }
    }

    /// Rolls back every enlisted branch except those already finished (per `votes`);
    /// failed rollbacks go to the background thread. Clears the transaction.
    fn roll_back_enlisted(&mut self, xid: Xid) -> Result<(), TmError> {
        let mut retry = Vec::new();
        let mut first_error = None;
        let mut heuristic = None;
        let mut forget = Vec::new();
        for i in 0..self.rms.len() {
            let b = self.branch_of[i];
            if b == NOT_ENLISTED || !protocol::needs_rollback(&self.votes[i]) {
                continue;
            }
            let bx = self.branch_xids[i];
            self.trace_started(i);
            let result = self.rms[i].rollback(&bx);
            self.trace_branch(i, "rollback", result.as_ref().err());
            match protocol::phase_two_step(&result, false) {
                PhaseTwoStep::Done => {}
                PhaseTwoStep::Retry => {
                    retry.push(BranchRecord { rm: self.rms[i].name().to_string(), branch: b });
                }
                PhaseTwoStep::Heuristic(outcome) => {
                    heuristic = Some(protocol::combine_heuristic(heuristic, outcome));
                    forget.push(i);
                    let report =
                        HeuristicReport { xid, rm: self.rms[i].name().to_string(), branch: b, outcome };
                    self.tm.shared().report_heuristic(report.clone());
                    if protocol::heuristic_is_damage(outcome, false) && first_error.is_none() {
                        first_error = Some(TmError::Heuristic { xid: Box::new(xid), reports: vec![report] });
                    }
                }
            }
        }
        self.clear();
        if !retry.is_empty() {
            // The RM will also drop a branch that was never prepared when its connection
            // dies; the background rollback covers branches that may be prepared.
            self.tm.defer(xid, false, retry, heuristic, self.client_trace());
        } else if let Some(h) = heuristic {
            // Without this the state server, which saw no decision, would answer "rolled
            // back" for a transaction a branch committed on its own.
            let kept = self.complete_heuristic_in_store(xid, h);
            self.forget_heuristic_branches(kept, &forget);
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Tells the store that `xid` is finished with a heuristic outcome, and whether the
    /// store keeps it for good (then its branches may be forgotten); an error is logged and
    /// means not kept.
    fn complete_heuristic_in_store(&self, xid: Xid, heuristic: HeuristicOutcome) -> bool {
        let span = self.trace.as_ref().map(|t| t.store_call("decree.complete"));
        let wire = span.as_ref().and_then(trace::wire_of);
        let result = self.tm.store().complete_heuristic_kept(&xid, heuristic, wire.as_ref());
        if let Some(span) = span {
            trace::end_store_call(span, result.as_ref().err().map(ToString::to_string));
        }
        result.unwrap_or_else(|e| {
            tracing::warn!(%xid, error = %e, "heuristic outcome not reported to the store; recovery reports it again");
            false
        })
    }

    /// Tells the resource managers of connections `which` to forget their heuristic
    /// branches, once the store keeps the outcome (`kept`); otherwise they stay for the
    /// state server's recovery, which finds them and reports them again (issue 32).
    fn forget_heuristic_branches(&mut self, kept: bool, which: &[usize]) {
        if !kept {
            if !which.is_empty() {
                tracing::info!(
                    branches = which.len(),
                    "heuristic branches left for recovery: the store did not say it keeps their outcome"
                );
            }
            return;
        }
        for &i in which {
            let _ = self.rms[i].forget(&self.branch_xids[i]);
        }
    }

    /// Tells the store that `xid` is finished (with its heuristic outcome), inside a
    /// `decree.complete` span when spans are on.
    fn complete_in_store(&self, xid: &Xid, heuristic: Option<HeuristicOutcome>) -> Result<(), StoreError> {
        let span = self.trace.as_ref().map(|t| t.store_call("decree.complete"));
        let wire = span.as_ref().and_then(trace::wire_of);
        let result = self.tm.store().complete_traced(xid, heuristic, wire.as_ref());
        if let Some(span) = span {
            trace::end_store_call(span, result.as_ref().err().map(ToString::to_string));
        }
        result
    }

    /// Notes that connection `i`'s branch call starts (spans on only).
    fn trace_started(&mut self, i: usize) {
        if let Some(t) = &mut self.trace {
            t.call_started(i);
        }
    }

    /// Notes that the branch calls of every connection `which` picks start (spans on only).
    fn trace_all_started(&mut self, which: impl Fn(&Session, usize) -> bool) {
        if self.trace.is_none() {
            return;
        }
        for i in 0..self.rms.len() {
            if which(self, i) {
                self.trace_started(i);
            }
        }
    }

    /// Emits the span of connection `i`'s branch call `operation` (spans on only).
    fn trace_branch(&mut self, i: usize, operation: &'static str, error: Option<&RmError>) {
        if let Some(t) = &mut self.trace {
            let rm = &self.rms[i];
            t.call_ended(
                i,
                operation,
                rm.name(),
                rm.db_system(),
                self.branch_of[i],
                error.map(ToString::to_string),
            );
        }
    }

    /// The wire context of the transaction's span (spans on), for the background thread's
    /// spans to link to when phase two is handed over.
    fn client_trace(&self) -> Option<trace::TraceContext> {
        self.trace.as_ref().and_then(|t| t.wire())
    }

    fn clear(&mut self) {
        self.current = None;
        self.enlisted = 0;
        self.next_branch = 0;
        self.branch_of.iter_mut().for_each(|b| *b = NOT_ENLISTED);
    }

    /// How the enlisted branches' prepare and phase-two calls run at once, or `None` for
    /// one after another (see [`Session::spread`]).
    fn spread_enlisted(&self) -> Option<Spread> {
        let candidates =
            self.branch_of.iter().zip(&self.parallel).filter(|(b, p)| **b != NOT_ENLISTED && **p).count();
        self.spread(candidates)
    }

    /// The session's [`BranchCalls`] policy for a round of calls on `candidates` branches
    /// that prefer parallel calls, asked now: `None` runs the calls one after another.
    fn spread(&self, candidates: usize) -> Option<Spread> {
        if candidates < 2 {
            return None;
        }
        match self.tm.config().branch_calls {
            BranchCalls::Parallel => Some(Spread { split_phase: false, helpers: true }),
            BranchCalls::Sequential => None,
            BranchCalls::Auto => Some(Spread { split_phase: true, helpers: cpu_spare::cpu_to_spare() }),
        }
    }

    fn enlisted_votes(&self) -> impl Iterator<Item = &Option<Result<Vote, RmError>>> {
        self.votes.iter().zip(&self.branch_of).filter(|(_, b)| **b != NOT_ENLISTED).map(|(v, _)| v)
    }

    fn nth_enlisted(&self, position: usize) -> usize {
        self.branch_of
            .iter()
            .enumerate()
            .filter(|(_, b)| **b != NOT_ENLISTED)
            .nth(position)
            .map(|(i, _)| i)
            .unwrap_or(0)
    }

    /// Writes the voters into the session's decision, reusing its strings.
    fn fill_decision(&mut self, xid: &Xid, voters: usize) {
        self.decision.xid = *xid;
        let mut k = 0;
        for i in 0..self.rms.len() {
            if !matches!(self.votes[i], Some(Ok(Vote::Commit))) || self.branch_of[i] == NOT_ENLISTED {
                continue;
            }
            let name = self.rms[i].name();
            let branch = self.branch_of[i];
            if let Some(record) = self.decision.branches.get_mut(k) {
                record.rm.clear();
                record.rm.push_str(name);
                record.branch = branch;
            } else {
                self.decision.branches.push(BranchRecord { rm: name.to_string(), branch });
            }
            k += 1;
        }
        self.decision.branches.truncate(k);
        assert_eq!(k, voters, "decision names exactly the branches that voted commit");
    }

    /// Replaces connection `index` by a new one from its factory (after the RM restarted
    /// or the connection broke); refused while a transaction is active.
    pub fn reconnect(&mut self, index: usize) -> Result<(), TmError> {
        if !self.open || self.rms_closed {
            return Err(TmError::Closed { call: "reconnect" });
        }
        if let Some(xid) = self.current {
            return Err(TmError::TransactionOpen { xid: Box::new(xid) });
        }
        let Some(old) = self.rms.get_mut(index) else {
            return Err(TmError::Config(format!("no connection number {index} in this session")));
        };
        let name = old.name().to_string();
        let factory = self
            .tm
            .factory(&name)
            .ok_or_else(|| TmError::Config(format!("resource manager {name:?} has no factory registered")))?;
        let fresh = factory.connect().map_err(|cause| TmError::Rm {
            rm: name.clone(),
            call: "open",
            xid: None,
            cause,
        })?;
        if fresh.name() != name {
            return Err(TmError::Config(format!(
                "factory {name:?} made a connection named {:?}",
                fresh.name()
            )));
        }
        let _ = old.close();
        self.parallel[index] = fresh.prefers_parallel();
        *old = fresh;
        Ok(())
    }

    /// Closes every connection (XA xa_close) and the store session.
    pub fn close(&mut self) -> Result<(), TmError> {
        if !self.open {
            return Err(TmError::Closed { call: "close" });
        }
        if let Some(xid) = self.current {
            return Err(TmError::TransactionOpen { xid: Box::new(xid) });
        }
        self.open = false;
        let first = if self.rms_closed { None } else { self.close_each_rm() };
        self.rms_closed = false;
        self.tm.store().close_session(self.id);
        first.map_or(Ok(()), Err)
    }

    /// Closes every connection (XA xa_close) but keeps the session, its store session and
    /// its buffers, so that [`Session::reopen_rms`] opens them again without allocating:
    /// TX's tx_close followed by tx_open on the same thread, as in LIXA's benchmark loop.
    /// Nothing can begin until the connections are reopened.
    pub fn close_rms(&mut self) -> Result<(), TmError> {
        if !self.open || self.rms_closed {
            return Err(TmError::Closed { call: "close" });
        }
        if let Some(xid) = self.current {
            return Err(TmError::TransactionOpen { xid: Box::new(xid) });
        }
        self.rms_closed = true;
        self.close_each_rm().map_or(Ok(()), Err)
    }

    /// Opens again (XA xa_open) the connections closed by [`Session::close_rms`]; when one
    /// fails, those already opened are closed again and the connections stay closed.
    pub fn reopen_rms(&mut self) -> Result<(), TmError> {
        if !self.open {
            return Err(TmError::Closed { call: "open" });
        }
        if !self.rms_closed {
            return Err(TmError::Config("the connections of this session are already open".into()));
        }
        for i in 0..self.rms.len() {
            if let Err(cause) = self.rms[i].open() {
                for rm in &mut self.rms[..i] {
                    let _ = rm.close();
                }
                return Err(TmError::Rm {
                    rm: self.rms[i].name().to_string(),
                    call: "open",
                    xid: None,
                    cause,
                });
            }
        }
        self.rms_closed = false;
        Ok(())
    }

    /// xa_close on every connection; the first error, if any.
    fn close_each_rm(&mut self) -> Option<TmError> {
        let mut first = None;
        for rm in &mut self.rms {
            if let Err(cause) = rm.close() {
                first.get_or_insert(TmError::Rm {
                    rm: rm.name().to_string(),
                    call: "close",
                    xid: None,
                    cause,
                });
            }
        }
        first
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.current.is_some() {
            let _ = self.rollback_current();
        }
        if self.open {
            let _ = self.close();
        }
    }
}

/// One transaction of a [`Session`] (object API); rolled back if dropped unfinished.
pub struct Transaction<'s> {
    session: &'s mut Session,
    finished: bool,
}

impl Transaction<'_> {
    /// The global Xid.
    pub fn xid(&self) -> Xid {
        self.session.current.unwrap_or_else(|| unreachable!("a Transaction exists only while one is begun"))
    }

    /// Enlists connection `index` as a branch (XA xa_start); returns its branch number.
    pub fn enlist(&mut self, index: usize) -> Result<u16, TmError> {
        self.session.enlist(index)
    }

    /// Enlists every connection of the session.
    pub fn enlist_all(&mut self) -> Result<(), TmError> {
        self.session.enlist_all()
    }

    /// Connection `index`, to do the application's work on it.
    pub fn rm_mut(&mut self, index: usize) -> Option<&mut (dyn ResourceManager + 'static)> {
        self.session.rm_mut(index)
    }

    /// Commits; see [`CommitReport`] and [`TmError`] for the outcomes.
    pub fn commit(mut self) -> Result<CommitReport, TmError> {
        self.finished = true;
        self.session.commit_current()
    }

    /// Rolls back; nothing durable is written.
    pub fn rollback(mut self) -> Result<(), TmError> {
        self.finished = true;
        self.session.rollback_current()
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        if !self.finished {
            if let Err(e) = self.session.rollback_current() {
                tracing::warn!(error = %e, "rollback of a dropped transaction failed");
            }
        }
    }
}
