//! The decisions of two-phase commit as pure functions: no IO, no clocks, no threads.
//!
//! The session and the recovery code execute what these functions decide, so the rules
//! of the protocol live in one place and are tested without resource managers or disks:
//! which commit path a transaction takes, how phase-one votes are tallied and what a
//! phase-two answer means. What recovery does with a transaction after the fact is the
//! recovery engine's (`recovery::engine`), built on these.

use crate::rm::{HeuristicOutcome, RmError, Vote};

/// How a commit proceeds, given how many branches are enlisted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitPath {
    /// No branch: nothing to do.
    Empty,
    /// One branch: one-phase commit, no prepare and no log write.
    OnePhase,
    /// Several branches: prepare, decide, phase two.
    TwoPhase,
}

/// The commit path for `branches` enlisted branches.
pub fn commit_path(branches: usize) -> CommitPath {
    match branches {
        0 => CommitPath::Empty,
        1 => CommitPath::OnePhase,
        _ => CommitPath::TwoPhase,
    }
}

/// The tally of phase one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The vote at this position (in the order given) was a "no" or an error: roll back.
    Abort {
        /// Position of the first failed vote among the enlisted branches.
        position: usize,
    },
    /// Every branch voted read-only: the transaction is finished, no decision needed.
    AllReadOnly,
    /// At least one branch prepared and none refused: decide commit for the `voters`.
    Commit {
        /// Branches that voted commit (they need phase two).
        voters: usize,
    },
}

/// Tallies the phase-one answers; the first failure wins. Unanswered votes (`None`) are
/// treated as failures, since a branch that did not answer may not be prepared.
pub fn tally<'a, I>(votes: I) -> Verdict
where
    I: IntoIterator<Item = &'a Option<Result<Vote, RmError>>>,
{
    let mut voters = 0;
    for (position, vote) in votes.into_iter().enumerate() {
        match vote {
            Some(Ok(Vote::Commit)) => voters += 1,
            Some(Ok(Vote::ReadOnly)) => {}
            Some(Err(_)) | None => return Verdict::Abort { position },
        }
    }
    if voters == 0 {
        Verdict::AllReadOnly
    } else {
        Verdict::Commit { voters }
    }
}

/// Whether a branch must be rolled back after phase one failed: every branch except those
/// already finished (rolled back by the RM, or read-only).
pub fn needs_rollback(vote: &Option<Result<Vote, RmError>>) -> bool {
    !matches!(vote, Some(Ok(Vote::ReadOnly)) | Some(Err(RmError::RolledBack(_))))
}

/// What one phase-two answer (commit or rollback of a decided branch) means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PhaseTwoStep {
    /// The branch is finished (including "unknown Xid": an earlier attempt finished it).
    Done,
    /// The RM could not do it now: retry later; the decision stays in the log meanwhile.
    Retry,
    /// The RM decided on its own: report it and forget the branch.
    Heuristic(HeuristicOutcome),
}

/// Interprets a phase-two answer for a branch whose decision was `commit` (true) or
/// rollback (false).
pub fn phase_two_step(result: &Result<(), RmError>, commit: bool) -> PhaseTwoStep {
    match result {
        Ok(()) | Err(RmError::UnknownXid(_)) => PhaseTwoStep::Done,
        Err(RmError::Heuristic(h)) => PhaseTwoStep::Heuristic(*h),
        // A prepared branch that the RM rolled back although the decision was commit is
        // a heuristic rollback, whatever the RM calls it; for a rollback it is the goal.
        Err(RmError::RolledBack(_)) if commit => PhaseTwoStep::Heuristic(HeuristicOutcome::RolledBack),
        Err(RmError::RolledBack(_)) => PhaseTwoStep::Done,
        Err(RmError::Unavailable(_)) | Err(RmError::Protocol(_)) => PhaseTwoStep::Retry,
    }
}

/// Whether a heuristic outcome contradicts the decision (and so must be an error).
pub fn heuristic_is_damage(outcome: HeuristicOutcome, commit: bool) -> bool {
    match outcome {
        HeuristicOutcome::Committed => !commit,
        HeuristicOutcome::RolledBack => commit,
        HeuristicOutcome::Mixed => true,
    }
}

/// The heuristic outcome of a transaction after one more branch reported `next`: the
/// same outcome on every branch stays that outcome, different ones make it mixed.
pub fn combine_heuristic(so_far: Option<HeuristicOutcome>, next: HeuristicOutcome) -> HeuristicOutcome {
    match so_far {
        None => next,
        Some(h) if h == next => h,
        Some(_) => HeuristicOutcome::Mixed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no() -> Option<Result<Vote, RmError>> {
        Some(Err(RmError::RolledBack("no".into())))
    }

    #[test]
    fn heuristics_combine_into_mixed_only_when_they_differ() {
        use HeuristicOutcome::*;
        assert_eq!(combine_heuristic(None, RolledBack), RolledBack);
        assert_eq!(combine_heuristic(Some(Committed), Committed), Committed);
        assert_eq!(combine_heuristic(Some(Committed), RolledBack), Mixed);
        assert_eq!(combine_heuristic(Some(Mixed), Committed), Mixed);
    }

    #[test]
    fn paths_follow_branch_count() {
        assert_eq!(commit_path(0), CommitPath::Empty);
        assert_eq!(commit_path(1), CommitPath::OnePhase);
        assert_eq!(commit_path(2), CommitPath::TwoPhase);
        assert_eq!(commit_path(9), CommitPath::TwoPhase);
    }

    #[test]
    fn tally_every_combination_of_three_votes() {
        let choices = [Some(Ok(Vote::Commit)), Some(Ok(Vote::ReadOnly)), no(), None];
        for a in &choices {
            for b in &choices {
                for c in &choices {
                    let votes = [a.clone(), b.clone(), c.clone()];
                    let verdict = tally(&votes);
                    let first_bad = votes.iter().position(|v| !matches!(v, Some(Ok(_))));
                    let commits = votes.iter().filter(|v| matches!(v, Some(Ok(Vote::Commit)))).count();
                    match first_bad {
                        Some(p) => assert_eq!(verdict, Verdict::Abort { position: p }),
                        None if commits == 0 => assert_eq!(verdict, Verdict::AllReadOnly),
                        None => assert_eq!(verdict, Verdict::Commit { voters: commits }),
                    }
                }
            }
        }
    }

    #[test]
    fn rollback_spares_only_finished_branches() {
        assert!(!needs_rollback(&Some(Ok(Vote::ReadOnly))));
        assert!(!needs_rollback(&no()));
        assert!(needs_rollback(&Some(Ok(Vote::Commit))));
        assert!(needs_rollback(&Some(Err(RmError::Unavailable("lost reply".into())))));
        assert!(needs_rollback(&None));
    }

    #[test]
    fn phase_two_answers() {
        let un = Err(RmError::Unavailable("down".into()));
        assert_eq!(phase_two_step(&Ok(()), true), PhaseTwoStep::Done);
        assert_eq!(phase_two_step(&Err(RmError::UnknownXid("x".into())), true), PhaseTwoStep::Done);
        assert_eq!(phase_two_step(&un, true), PhaseTwoStep::Retry);
        assert_eq!(
            phase_two_step(&Err(RmError::RolledBack("x".into())), true),
            PhaseTwoStep::Heuristic(HeuristicOutcome::RolledBack)
        );
        assert_eq!(phase_two_step(&Err(RmError::RolledBack("x".into())), false), PhaseTwoStep::Done);
        assert!(heuristic_is_damage(HeuristicOutcome::Mixed, true));
        assert!(!heuristic_is_damage(HeuristicOutcome::Committed, true));
        assert!(heuristic_is_damage(HeuristicOutcome::Committed, false));
    }
}
