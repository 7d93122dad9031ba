//! The pure rules of recovery and of phase two after the fact: no IO, no clocks, no
//! threads (openraft's `Engine` is the model). Input: what is known of a transaction (its
//! decision, present, absent or in doubt; whether its owner can still decide) and the
//! answers of its resource managers; output: the calls to make. The runtime
//! (`runtime.rs`) executes them for every process that finishes transactions.
//!
//! Invariants (asserted where state changes): nothing here ever commits a branch without
//! a decision; a branch whose owner may still decide, or whose decision is in doubt, is
//! never rolled back; a transaction is completed only once every branch it names is
//! finished.

use crate::error::HeuristicReport;
use crate::protocol::{self, PhaseTwoStep};
use crate::rm::{HeuristicOutcome, RmError};
use crate::store::BranchRecord;
use crate::xid::{Origin, Xid};

/// What is known of a transaction's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecisionFact {
    /// A commit decision is durable.
    Commit,
    /// No decision exists, and none can appear unless its owner still decides.
    Absent,
    /// A decision was written or sent but is not known durable (a failed write, an
    /// unconfirmed replication): never treated as absent.
    InDoubt,
}

/// The rule that says when the owner of an undecided transaction can no longer decide it:
/// embedded, its incarnation is older than the log's; in the state server, its session's
/// connection has closed; after a failover, its epoch is older than the fenced one.
pub trait Liveness {
    /// True when the owner of transactions of `origin` is gone for good.
    fn owner_gone(&self, origin: &Origin) -> bool;
}

/// The embedded coordinator's rule: every incarnation before the current one is dead
/// (the log is opened by one process at a time, and each open bumps the incarnation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OlderIncarnation {
    /// The incarnation of the log's current owner.
    pub current: u64,
}

impl Liveness for OlderIncarnation {
    fn owner_gone(&self, origin: &Origin) -> bool {
        origin.incarnation < self.current
    }
}

impl<F: Fn(&Origin) -> bool> Liveness for F {
    fn owner_gone(&self, origin: &Origin) -> bool {
        self(origin)
    }
}

/// What to do with a prepared branch found in a resource manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FoundStep {
    /// Its transaction has a commit decision: the decision's phase two commits it.
    Decided,
    /// Ours, no decision, owner gone: presumed abort.
    RollBack,
    /// Another coordinator's, or an owner that may still decide, or a decision in doubt.
    LeaveAlone,
}

/// The fate of a prepared branch found by the coordinator of `node`: `ours` when its Xid
/// carries `node`'s origin. The caller evaluates `owner_gone` before looking the decision
/// up, so that a decision made just before the owner went away is seen.
pub fn found_branch(ours: bool, owner_gone: bool, decision: DecisionFact) -> FoundStep {
    match (ours, decision) {
        (false, _) => FoundStep::LeaveAlone,
        (true, DecisionFact::Commit) => FoundStep::Decided,
        (true, DecisionFact::InDoubt) => FoundStep::LeaveAlone,
        (true, DecisionFact::Absent) if owner_gone => FoundStep::RollBack,
        (true, DecisionFact::Absent) => FoundStep::LeaveAlone,
    }
}

/// The origin of `xid` when it is a branch of `node`'s transactions.
pub fn origin_of(xid: &Xid, node: u32) -> Option<Origin> {
    xid.origin().filter(|o| o.node == node)
}

/// A call the runtime makes, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Commit (`commit`) or roll back this branch of the transaction.
    Call {
        /// The branch.
        branch: BranchRecord,
        /// Commit when true, roll back when false.
        commit: bool,
    },
    /// The RM's connection failed: drop it, and skip that RM for the rest of the pass.
    DropConnection(String),
    /// The RM decided on its own and its report is kept: tell it to forget the branch.
    Forget(BranchRecord),
    /// Report a heuristic outcome (logged and kept by the runtime's recorder), then give
    /// the recorder's answer to [`PhaseTwo::on_heuristic_kept`].
    Heuristic(HeuristicReport),
    /// Every branch is finished: record the completion (with the combined heuristic).
    Complete {
        /// The transaction.
        xid: Xid,
        /// What its branches decided on their own, if any did.
        heuristic: Option<HeuristicOutcome>,
    },
    /// Branches are left: try them again after the backoff.
    RetryLater,
}

/// Phase two of one transaction after the fact: commit the branches of a decision, or
/// roll back those of a transaction whose phase one failed, until none is left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhaseTwo {
    xid: Xid,
    commit: bool,
    left: Vec<BranchRecord>,
    heuristic: Option<HeuristicOutcome>,
    /// Branches given to `calls` and not yet answered in this pass.
    asked: usize,
}

impl PhaseTwo {
    /// Phase two of `xid` on `branches`: commit them when `commit`, else roll them back.
    pub fn new(xid: Xid, commit: bool, branches: Vec<BranchRecord>) -> PhaseTwo {
        PhaseTwo { xid, commit, left: branches, heuristic: None, asked: 0 }
    }

    /// The same, continuing after branches finished so far decided `heuristic` on their own.
    pub fn with_heuristic(mut self, heuristic: Option<HeuristicOutcome>) -> PhaseTwo {
        self.heuristic = heuristic;
        self
    }

    /// The transaction.
    pub fn xid(&self) -> &Xid {
        &self.xid
    }

    /// Whether the branches are committed (else rolled back).
    pub fn commits(&self) -> bool {
        self.commit
    }

    /// Branches not finished yet.
    pub fn left(&self) -> &[BranchRecord] {
        &self.left
    }

    /// Starts a pass: the calls to make, one per branch left.
    pub fn calls(&mut self) -> Vec<Command> {
        assert_eq!(self.asked, 0, "a pass of {} started before the last one ended", self.xid);
        self.asked = self.left.len();
        self.left.iter().map(|b| Command::Call { branch: b.clone(), commit: self.commit }).collect()
    }

    /// The answer of `branch`'s call: what follows from it.
    pub fn on_answer(&mut self, branch: &BranchRecord, result: &Result<(), RmError>) -> Vec<Command> {
        let at = self.left.iter().position(|b| b == branch);
        let at =
            at.unwrap_or_else(|| panic!("an answer for branch {branch:?} that {} did not ask", self.xid));
        assert!(self.asked > 0, "more answers than calls for {}", self.xid);
        self.asked -= 1;
        match protocol::phase_two_step(result, self.commit) {
            PhaseTwoStep::Done => {
                self.left.remove(at);
                Vec::new()
            }
            PhaseTwoStep::Retry => vec![Command::DropConnection(branch.rm.clone())],
            PhaseTwoStep::Heuristic(outcome) => {
                // The branch stays left until its report is kept: a resource manager told
                // to forget it first would take the only record of its outcome with it if
                // this process died before the report was durable, or, in a pair, before
                // the backup held it (issue 32, defect 7).
                self.heuristic = Some(protocol::combine_heuristic(self.heuristic, outcome));
                let report =
                    HeuristicReport { xid: self.xid, rm: branch.rm.clone(), branch: branch.branch, outcome };
                vec![Command::Heuristic(report)]
            }
        }
    }

    /// The recorder's answer to the `Heuristic` report of `branch`: kept for good (durable,
    /// and in a pair held by the backup), the branch is finished and its RM told to forget
    /// it; not kept, it stays left, and the next pass asks its RM again (which reports the
    /// same outcome until told to forget it).
    pub fn on_heuristic_kept(&mut self, branch: &BranchRecord, kept: bool) -> Vec<Command> {
        if !kept {
            return Vec::new();
        }
        let at = self.left.iter().position(|b| b == branch);
        let at =
            at.unwrap_or_else(|| panic!("a heuristic report of {branch:?} that {} did not ask", self.xid));
        self.left.remove(at);
        vec![Command::Forget(branch.clone())]
    }

    /// Ends a pass: complete the transaction when every branch is finished (a rollback
    /// only when a branch decided on its own: a plain rollback leaves nothing to record),
    /// else retry later. `None` when a finished rollback needs nothing recorded.
    pub fn end_pass(&mut self) -> Option<Command> {
        assert_eq!(self.asked, 0, "the pass of {} ended with calls unanswered", self.xid);
        if !self.left.is_empty() {
            return Some(Command::RetryLater);
        }
        (self.commit || self.heuristic.is_some())
            .then_some(Command::Complete { xid: self.xid, heuristic: self.heuristic })
    }

    /// Forgets the answers of a pass cut short (stop requested): the branches stay left.
    pub fn abandon_pass(&mut self) {
        self.asked = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xid() -> Xid {
        Xid::decree(Origin { node: 1, incarnation: 3, session: 9, sequence: 4 })
    }

    fn branch(rm: &str, n: u16) -> BranchRecord {
        BranchRecord { rm: rm.into(), branch: n }
    }

    /// Every RM answer a phase-two call can get.
    fn answers() -> Vec<(&'static str, Result<(), RmError>)> {
        vec![
            ("ok", Ok(())),
            ("unknown xid", Err(RmError::UnknownXid("gone".into()))),
            ("unavailable", Err(RmError::Unavailable("down".into()))),
            ("protocol error", Err(RmError::Protocol("garbled".into()))),
            ("rolled back", Err(RmError::RolledBack("by the RM".into()))),
            ("heuristic commit", Err(RmError::Heuristic(HeuristicOutcome::Committed))),
            ("heuristic rollback", Err(RmError::Heuristic(HeuristicOutcome::RolledBack))),
            ("heuristic mixed", Err(RmError::Heuristic(HeuristicOutcome::Mixed))),
        ]
    }

    #[test]
    fn found_branches_every_combination() {
        use DecisionFact::*;
        for ours in [false, true] {
            for gone in [false, true] {
                for fact in [Commit, Absent, InDoubt] {
                    let step = found_branch(ours, gone, fact);
                    let expected = match (ours, fact, gone) {
                        (false, _, _) => FoundStep::LeaveAlone,
                        (true, Commit, _) => FoundStep::Decided,
                        (true, InDoubt, _) => FoundStep::LeaveAlone,
                        (true, Absent, true) => FoundStep::RollBack,
                        (true, Absent, false) => FoundStep::LeaveAlone,
                    };
                    assert_eq!(step, expected, "ours {ours}, gone {gone}, {fact:?}");
                    // The two safety rules, stated on their own.
                    if step == FoundStep::RollBack {
                        assert!(gone && fact == Absent, "rolled back a branch that may still commit");
                    }
                }
            }
        }
    }

    #[test]
    fn liveness_rules() {
        let o = |incarnation| Origin { node: 1, incarnation, session: 1, sequence: 1 };
        let embedded = OlderIncarnation { current: 5 };
        assert!(embedded.owner_gone(&o(4)));
        assert!(!embedded.owner_gone(&o(5)));
        assert!(!embedded.owner_gone(&o(6)));
        let server = |origin: &Origin| origin.session == 1;
        assert!(server.owner_gone(&o(5)));
        let foreign = Xid::new(7, b"someone-else", b"b").unwrap();
        assert_eq!(origin_of(&foreign, 1), None);
        assert_eq!(origin_of(&xid().branch(0), 2), None);
        assert_eq!(origin_of(&xid().branch(0), 1), xid().origin());
    }

    /// The bug this guards against (issue 32, defect 7): the RM was told to forget a
    /// heuristic branch before its report was kept, so a crash in between lost the only
    /// record of what the branch did.
    #[test]
    fn a_heuristic_branch_is_forgotten_only_once_its_report_is_kept() {
        let b = branch("a", 0);
        let mut p = PhaseTwo::new(xid(), true, vec![b.clone()]);
        let heuristic = Err(RmError::Heuristic(HeuristicOutcome::RolledBack));
        let report =
            HeuristicReport { xid: xid(), rm: "a".into(), branch: 0, outcome: HeuristicOutcome::RolledBack };
        p.calls();
        assert_eq!(p.on_answer(&b, &heuristic), vec![Command::Heuristic(report.clone())], "no Forget yet");
        assert_eq!(p.on_heuristic_kept(&b, false), vec![], "not kept: nothing forgotten");
        assert_eq!(p.end_pass(), Some(Command::RetryLater));
        assert_eq!(p.left(), std::slice::from_ref(&b), "asked again next pass");
        assert_eq!(p.calls(), vec![Command::Call { branch: b.clone(), commit: true }]);
        assert_eq!(p.on_answer(&b, &heuristic), vec![Command::Heuristic(report)]);
        assert_eq!(p.on_heuristic_kept(&b, true), vec![Command::Forget(b.clone())]);
        assert_eq!(
            p.end_pass(),
            Some(Command::Complete { xid: xid(), heuristic: Some(HeuristicOutcome::RolledBack) }),
            "the same outcome twice is that outcome, not mixed"
        );
    }

    #[test]
    fn each_answer_of_a_commit_or_rollback_emits_its_calls() {
        for commit in [true, false] {
            for (name, answer) in answers() {
                let b = branch("a", 0);
                let mut p = PhaseTwo::new(xid(), commit, vec![b.clone()]);
                assert_eq!(p.calls(), vec![Command::Call { branch: b.clone(), commit }]);
                let mut out = p.on_answer(&b, &answer);
                if let [Command::Heuristic(_)] = out.as_slice() {
                    out.extend(p.on_heuristic_kept(&b, true));
                }
                let end = p.end_pass();
                let heuristic = match &answer {
                    Err(RmError::Heuristic(h)) => Some(*h),
                    Err(RmError::RolledBack(_)) if commit => Some(HeuristicOutcome::RolledBack),
                    _ => None,
                };
                let retry = matches!(answer, Err(RmError::Unavailable(_) | RmError::Protocol(_)));
                let context = format!("{} / {name}", if commit { "commit" } else { "rollback" });
                if retry {
                    assert_eq!(out, vec![Command::DropConnection("a".into())], "{context}");
                    assert_eq!(end, Some(Command::RetryLater), "{context}");
                    assert_eq!(p.left(), std::slice::from_ref(&b), "{context}");
                    continue;
                }
                assert!(p.left().is_empty(), "{context}");
                match heuristic {
                    Some(outcome) => {
                        let report = HeuristicReport { xid: xid(), rm: "a".into(), branch: 0, outcome };
                        assert_eq!(
                            out,
                            vec![Command::Heuristic(report), Command::Forget(b.clone())],
                            "{context}"
                        );
                        assert_eq!(end, Some(Command::Complete { xid: xid(), heuristic }), "{context}");
                    }
                    None => {
                        assert!(out.is_empty(), "{context}: {out:?}");
                        let expected = commit.then_some(Command::Complete { xid: xid(), heuristic: None });
                        assert_eq!(end, expected, "{context}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_transaction_completes_only_when_every_branch_is_finished_and_heuristics_combine() {
        let (a, b) = (branch("a", 0), branch("b", 1));
        let mut p = PhaseTwo::new(xid(), true, vec![a.clone(), b.clone()]);
        assert_eq!(p.calls().len(), 2);
        p.on_answer(&a, &Err(RmError::Heuristic(HeuristicOutcome::Committed)));
        p.on_heuristic_kept(&a, true);
        p.on_answer(&b, &Err(RmError::Unavailable("down".into())));
        assert_eq!(p.end_pass(), Some(Command::RetryLater));
        assert_eq!(p.calls(), vec![Command::Call { branch: b.clone(), commit: true }]);
        p.on_answer(&b, &Err(RmError::RolledBack("on its own".into())));
        p.on_heuristic_kept(&b, true);
        assert_eq!(
            p.end_pass(),
            Some(Command::Complete { xid: xid(), heuristic: Some(HeuristicOutcome::Mixed) })
        );
    }

    /// The whole table: a prepared branch of ours found with each decision state and each
    /// owner state, then each RM answer to the call that follows (the decision's commit,
    /// or the presumed-abort rollback), and the calls the engine emits.
    #[test]
    fn every_decision_owner_and_answer_combination() {
        use DecisionFact::*;
        let b = branch("a", 0);
        for fact in [Commit, Absent, InDoubt] {
            for gone in [false, true] {
                let step = found_branch(true, gone, fact);
                for (name, answer) in answers() {
                    let context = format!("{fact:?}, owner gone {gone}, {name}");
                    let commit = match step {
                        FoundStep::LeaveAlone => {
                            assert!(fact == InDoubt || !gone, "{context}: left alone without reason");
                            continue; // no call at all, whatever the RM would answer
                        }
                        FoundStep::Decided => true,
                        FoundStep::RollBack => false,
                    };
                    assert!(
                        commit == (fact == Commit),
                        "{context}: commit without a decision, or the reverse"
                    );
                    let mut p = PhaseTwo::new(xid(), commit, vec![b.clone()]);
                    let calls = p.calls();
                    assert_eq!(calls, vec![Command::Call { branch: b.clone(), commit }], "{context}");
                    let mut emitted = p.on_answer(&b, &answer);
                    if let [Command::Heuristic(_)] = emitted.as_slice() {
                        emitted.extend(p.on_heuristic_kept(&b, true));
                    }
                    emitted.extend(p.end_pass());
                    let expected: Vec<Command> = match (&answer, commit) {
                        (Ok(()) | Err(RmError::UnknownXid(_)), true) => {
                            vec![Command::Complete { xid: xid(), heuristic: None }]
                        }
                        (Ok(()) | Err(RmError::UnknownXid(_)) | Err(RmError::RolledBack(_)), false) => vec![],
                        (Err(RmError::Unavailable(_) | RmError::Protocol(_)), _) => {
                            vec![Command::DropConnection("a".into()), Command::RetryLater]
                        }
                        (Err(e), _) => {
                            let outcome = match e {
                                RmError::Heuristic(h) => *h,
                                _ => HeuristicOutcome::RolledBack, // a commit the RM rolled back
                            };
                            let report = HeuristicReport { xid: xid(), rm: "a".into(), branch: 0, outcome };
                            vec![
                                Command::Heuristic(report),
                                Command::Forget(b.clone()),
                                Command::Complete { xid: xid(), heuristic: Some(outcome) },
                            ]
                        }
                    };
                    assert_eq!(emitted, expected, "{context}");
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "did not ask")]
    fn an_answer_for_a_branch_not_asked_is_a_bug() {
        let mut p = PhaseTwo::new(xid(), true, vec![branch("a", 0)]);
        p.calls();
        p.on_answer(&branch("b", 1), &Ok(()));
    }
}
