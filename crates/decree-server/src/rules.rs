//! The server's rules as pure functions: what to answer about an outcome, whether a
//! decision may be accepted. No IO, no locks: `state.rs` gathers the facts and the
//! connection executes the verdict, so the rules are tested here on every combination.

use decree_core::{Decision, HeuristicOutcome, Outcome};
use decree_proto::ErrorCode;
use std::collections::HashSet;

/// Who owns an Xid, as far as this server run can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    /// Not a decree Xid of this node: nothing here can say anything about it.
    Foreign,
    /// Minted in an earlier incarnation of this node's log.
    Earlier,
    /// Minted by a live session of this incarnation; `evicted` says whether an outcome
    /// of that session has been evicted from the memory (then "not decided" is unproven).
    Live { evicted: bool },
    /// Minted by a session of this incarnation whose connection has closed.
    Closed,
    /// Names a session this run never opened (or a later incarnation): a guess or a forgery.
    NeverIssued,
}

/// What an outcome entry in the server's memory says (its byte in the outcome file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Remembered {
    /// Every branch committed.
    Committed,
    /// The server rolled the transaction's prepared branches back itself (presumed abort),
    /// or an operator did.
    RolledBack,
    /// At least one branch decided on its own.
    Heuristic(HeuristicOutcome),
}

impl Remembered {
    /// The outcome byte stored in the memory.
    pub(crate) fn to_byte(self) -> u8 {
        match self {
            Remembered::Committed => 1,
            Remembered::RolledBack => 2,
            Remembered::Heuristic(HeuristicOutcome::Committed) => 3,
            Remembered::Heuristic(HeuristicOutcome::RolledBack) => 4,
            Remembered::Heuristic(HeuristicOutcome::Mixed) => 5,
        }
    }

    /// The entry for a stored byte; `None` for a byte no version of the server writes.
    pub(crate) fn from_byte(b: u8) -> Option<Self> {
        Some(match b {
            1 => Remembered::Committed,
            2 => Remembered::RolledBack,
            3 => Remembered::Heuristic(HeuristicOutcome::Committed),
            4 => Remembered::Heuristic(HeuristicOutcome::RolledBack),
            5 => Remembered::Heuristic(HeuristicOutcome::Mixed),
            _ => return None,
        })
    }
}

/// Everything the outcome rule looks at, gathered by the state in a safe order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Facts {
    /// Who owns the Xid.
    pub(crate) owner: Owner,
    /// A decision for it is live (a session's or one the server is finishing).
    pub(crate) decided: bool,
    /// A branch of a live decision reported a heuristic outcome already.
    pub(crate) heuristic_seen: bool,
    /// What the durable memory of outcomes says.
    pub(crate) remembered: Option<Remembered>,
    /// Its decision's write failed (`LogFailed`) in this run: it may be on disk or not.
    pub(crate) doubtful: bool,
    /// An outcome of this incarnation has been evicted from the memory.
    pub(crate) incarnation_evicted: bool,
    /// The first recovery pass of this run has ended.
    pub(crate) first_pass_done: bool,
    /// Its database may have committed it in one phase, with no decision here: its session
    /// sent `OnePhase` for it, overflowed its marks, or was closed by the server before its
    /// socket was read to the end (a notice may have been lost unread).
    pub(crate) one_phase: bool,
}

/// The answer to `Outcome`: the first rule that holds, and unknown when none does, so
/// that every answer is true.
pub(crate) fn outcome(f: &Facts) -> Outcome {
    if f.heuristic_seen || matches!(f.remembered, Some(Remembered::Heuristic(_))) {
        return Outcome::Heuristic;
    }
    if f.decided || f.remembered == Some(Remembered::Committed) {
        return Outcome::Committed;
    }
    if f.remembered == Some(Remembered::RolledBack) {
        return Outcome::RolledBack;
    }
    if f.doubtful {
        // Written or not, only a restart that reads the log can tell.
        return Outcome::Unknown;
    }
    // No Decide can arrive any more (the session is closed) and none arrived (it would be
    // live, remembered or doubtful, and nothing of this incarnation was forgotten), and no
    // database committed it in one phase (no notice came, and none can be lost unread).
    if f.owner == Owner::Closed && !f.incarnation_evicted && !f.one_phase {
        return Outcome::RolledBack;
    }
    if f.owner == (Owner::Live { evicted: false }) {
        return Outcome::InProgress;
    }
    if !f.first_pass_done && f.owner != Owner::Foreign {
        // The server is still settling what it found at start: ask again.
        return Outcome::InProgress;
    }
    Outcome::Unknown
}

/// Why a `Decide` is refused: the error code and a message that names the problem.
pub(crate) type Refusal = (ErrorCode, String);

/// Checks a decision of this session before it is written: it names the global
/// transaction, at least one branch, each branch number once, and only resource managers
/// the server can finish phase two on (else, should the client die, the decision would
/// stay in the log forever).
pub(crate) fn check_decision(decision: &Decision, known_rm: impl Fn(&str) -> bool) -> Result<(), Refusal> {
    let xid = &decision.xid;
    if !xid.bqual().is_empty() {
        let why = format!(
            "decision for {xid} carries a branch qualifier of {} bytes; a decision names the global transaction (empty bqual)",
            xid.bqual().len()
        );
        return Err((ErrorCode::BranchQualifier, why));
    }
    if decision.branches.is_empty() {
        return Err((ErrorCode::NoBranches, format!("decision for {xid} names no branch")));
    }
    let mut seen = HashSet::with_capacity(decision.branches.len());
    for b in &decision.branches {
        if !seen.insert(b.branch) {
            let why = format!("decision for {xid} names branch number {} twice", b.branch);
            return Err((ErrorCode::DuplicateBranch, why));
        }
    }
    for b in &decision.branches {
        if !known_rm(&b.rm) {
            let why = format!(
                "decision for {xid} names resource manager {:?}, which this server has no [[rm]] for: it could never finish that branch",
                b.rm
            );
            return Err((ErrorCode::UnknownRm, why));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use decree_core::{BranchRecord, Origin, Xid};

    const OWNERS: [Owner; 6] = [
        Owner::Foreign,
        Owner::Earlier,
        Owner::Live { evicted: false },
        Owner::Live { evicted: true },
        Owner::Closed,
        Owner::NeverIssued,
    ];
    const REMEMBERED: [Option<Remembered>; 4] = [
        None,
        Some(Remembered::Committed),
        Some(Remembered::RolledBack),
        Some(Remembered::Heuristic(HeuristicOutcome::Mixed)),
    ];

    /// Every combination of facts, so that each rule is checked against all the others.
    fn every_fact() -> Vec<Facts> {
        let mut all = Vec::new();
        for owner in OWNERS {
            for remembered in REMEMBERED {
                for bits in 0..64u32 {
                    let bit = |i: u32| bits & (1 << i) != 0;
                    all.push(Facts {
                        owner,
                        decided: bit(0),
                        heuristic_seen: bit(1),
                        remembered,
                        doubtful: bit(2),
                        incarnation_evicted: bit(3),
                        first_pass_done: bit(4),
                        one_phase: bit(5),
                    });
                }
            }
        }
        all
    }

    #[test]
    fn every_answer_follows_from_the_facts_that_prove_it() {
        for f in every_fact() {
            let answer = outcome(&f);
            let heuristic = f.heuristic_seen || matches!(f.remembered, Some(Remembered::Heuristic(_)));
            match answer {
                Outcome::Heuristic => assert!(heuristic, "{f:?}"),
                Outcome::Committed => {
                    assert!(!heuristic && (f.decided || f.remembered == Some(Remembered::Committed)), "{f:?}")
                }
                Outcome::RolledBack => {
                    // Never with a decision, and only when remembered or provably never decided.
                    assert!(!f.decided && !heuristic, "{f:?}");
                    assert!(
                        f.remembered == Some(Remembered::RolledBack)
                            || (f.owner == Owner::Closed
                                && !f.incarnation_evicted
                                && !f.doubtful
                                && !f.one_phase
                                && f.remembered.is_none()),
                        "{f:?}"
                    );
                }
                Outcome::InProgress => {
                    assert!(!f.decided && f.remembered.is_none() && !f.doubtful, "{f:?}");
                    assert!(
                        f.owner == (Owner::Live { evicted: false })
                            || (!f.first_pass_done && f.owner != Owner::Foreign),
                        "{f:?}"
                    );
                }
                Outcome::Unknown => {
                    assert!(!f.decided && !heuristic, "{f:?}");
                    assert!(f.remembered != Some(Remembered::Committed), "{f:?}");
                }
            }
        }
    }

    #[test]
    fn the_defects_of_the_issue_get_true_answers() {
        let base = Facts {
            owner: Owner::Earlier,
            decided: false,
            heuristic_seen: false,
            remembered: None,
            doubtful: false,
            incarnation_evicted: false,
            first_pass_done: true,
            one_phase: false,
        };
        // Committed, completed, then a restart: the memory answers, not presumed abort.
        let committed = Facts { remembered: Some(Remembered::Committed), ..base };
        assert_eq!(outcome(&committed), Outcome::Committed);
        // An earlier incarnation's Xid that nothing remembers is unknown, never rolled back.
        assert_eq!(outcome(&base), Outcome::Unknown);
        // A decision whose write failed is unknown even while its session lives.
        let doubtful = Facts { owner: Owner::Live { evicted: false }, doubtful: true, ..base };
        assert_eq!(outcome(&doubtful), Outcome::Unknown);
        // A branch found rolled back during phase two makes the transaction heuristic.
        let heuristic = Facts { decided: true, heuristic_seen: true, ..base };
        assert_eq!(outcome(&heuristic), Outcome::Heuristic);
        // A closed session's undecided Xid is rolled back until this incarnation forgets.
        let closed = Facts { owner: Owner::Closed, ..base };
        assert_eq!(outcome(&closed), Outcome::RolledBack);
        assert_eq!(outcome(&Facts { incarnation_evicted: true, ..closed }), Outcome::Unknown);
        // Before the first recovery pass the server says "ask again", except for strangers.
        assert_eq!(outcome(&Facts { first_pass_done: false, ..base }), Outcome::InProgress);
        let foreign = Facts { owner: Owner::Foreign, first_pass_done: false, ..base };
        assert_eq!(outcome(&foreign), Outcome::Unknown);
        assert_eq!(outcome(&Facts { owner: Owner::NeverIssued, ..base }), Outcome::Unknown);
    }

    #[test]
    fn a_one_phase_notice_is_never_answered_rolled_back_and_one_lost_in_a_restart_costs_nothing() {
        let base = Facts {
            owner: Owner::Closed,
            decided: false,
            heuristic_seen: false,
            remembered: None,
            doubtful: false,
            incarnation_evicted: false,
            first_pass_done: true,
            one_phase: true,
        };
        // The bug of issue 31: a one-phase commit answered "rolled back" once its session
        // closed. With the notice (or a session the server could not read to its end) the
        // database alone knows.
        assert_eq!(outcome(&base), Outcome::Unknown);
        assert_eq!(outcome(&Facts { one_phase: false, ..base }), Outcome::RolledBack);
        // While the session lives the client may still be committing.
        assert_eq!(outcome(&Facts { owner: Owner::Live { evicted: false }, ..base }), Outcome::InProgress);
        // After the client's Complete the memory answers.
        let completed = Facts { remembered: Some(Remembered::Committed), ..base };
        assert_eq!(outcome(&completed), Outcome::Committed);
        // A notice lost in a restart: the Xid is of an earlier incarnation, for which "rolled
        // back" is never answered without a memory, notice or not.
        for one_phase in [false, true] {
            assert_eq!(outcome(&Facts { owner: Owner::Earlier, one_phase, ..base }), Outcome::Unknown);
        }
        // The server rolled its prepared branches back itself: that memory is true.
        let rolled = Facts { remembered: Some(Remembered::RolledBack), ..base };
        assert_eq!(outcome(&rolled), Outcome::RolledBack);
    }

    #[test]
    fn remembered_bytes_round_trip_and_unknown_bytes_are_refused() {
        for r in REMEMBERED.into_iter().flatten().chain([
            Remembered::Heuristic(HeuristicOutcome::Committed),
            Remembered::Heuristic(HeuristicOutcome::RolledBack),
        ]) {
            assert_eq!(Remembered::from_byte(r.to_byte()), Some(r));
        }
        assert_eq!(Remembered::from_byte(0), None);
        assert_eq!(Remembered::from_byte(6), None);
    }

    fn decision(bqual: &[u8], branches: &[(u16, &str)]) -> Decision {
        let global = Xid::decree(Origin { node: 1, incarnation: 2, session: 3, sequence: 4 });
        let xid = Xid::new(global.format_id(), global.gtrid(), bqual).unwrap();
        let branches =
            branches.iter().map(|(b, rm)| BranchRecord { rm: rm.to_string(), branch: *b }).collect();
        Decision { xid, branches }
    }

    #[test]
    fn decisions_are_refused_with_a_code_that_names_the_problem() {
        let known = |rm: &str| rm == "pg-a" || rm == "pg-b";
        assert_eq!(check_decision(&decision(b"", &[(0, "pg-a"), (1, "pg-b")]), known), Ok(()));
        let code = |d: Decision| check_decision(&d, known).unwrap_err().0;
        assert_eq!(code(decision(&[0, 1], &[(0, "pg-a")])), ErrorCode::BranchQualifier);
        assert_eq!(code(decision(b"", &[])), ErrorCode::NoBranches);
        assert_eq!(code(decision(b"", &[(0, "pg-a"), (0, "pg-b")])), ErrorCode::DuplicateBranch);
        let (c, why) = check_decision(&decision(b"", &[(0, "pg-a"), (1, "nowhere")]), known).unwrap_err();
        assert_eq!(c, ErrorCode::UnknownRm);
        assert!(why.contains("\"nowhere\""), "{why}");
    }
}
