//! The commit protocol against the volatile log and dummy resource managers: which paths
//! write to the log, how failures in each phase are handled, and that nothing is hidden.
//!
//! The bugs guarded against: a log write on a path that needs none (one phase, read-only),
//! a decision written after a "no" vote, a branch left prepared after an abort, phase two
//! given up on an unavailable RM, and a heuristic outcome swallowed.

mod common;

use common::*;
use decree_core::testing::dummy::{BranchOutcome, Call, DummyConfig, DummyFactory, FaultAction, FaultRule};
use decree_core::{
    BranchCalls, CommitKind, HeuristicOutcome, RmError, RmFactory, Session, TmConfig, TmError,
    TransactionManager, TxContext,
};
use decree_log::engine::volatile::VolatileLog;
use decree_log::Log;
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

#[test]
fn one_branch_commits_in_one_phase_without_a_log_write() {
    let a = dummy("a");
    let (log, tm) = volatile_tm(&[&a]);
    let mut tx = TxContext::open(&tm, connections(&[&a])).unwrap();
    for _ in 0..5 {
        let xid = tx.begin().unwrap();
        let report = tx.commit().unwrap();
        assert_eq!(report.kind, CommitKind::OnePhase);
        assert_eq!(report.xid, xid);
        assert_eq!(outcome(&a, &xid, 0), Some(BranchOutcome::Committed));
    }
    assert_eq!(log.stats().records_appended, 0);
    assert_eq!(a.counts().get(Call::Prepare), 0, "one-phase commit never prepares");
    tx.close().unwrap();
}

#[test]
fn two_branches_append_one_decision_and_complete_it() {
    let (a, b) = (dummy("a"), dummy("b"));
    let (log, tm) = volatile_tm(&[&a, &b]);
    let mut tx = TxContext::open(&tm, connections(&[&a, &b])).unwrap();
    let mut xids = Vec::new();
    for n in 1..=10u64 {
        let xid = tx.begin().unwrap();
        let report = tx.commit().unwrap();
        assert_eq!(report.kind, CommitKind::TwoPhase);
        assert_eq!(report.phase_two_pending, 0);
        let stats = log.stats();
        assert_eq!(stats.records_appended, n);
        assert_eq!(stats.completions, n);
        assert_eq!(log.live_records(), 0);
        xids.push(xid);
    }
    for xid in &xids {
        assert_eq!(outcome(&a, xid, 0), Some(BranchOutcome::Committed));
        assert_eq!(outcome(&b, xid, 1), Some(BranchOutcome::Committed));
    }
    assert!(a.prepared().is_empty() && b.prepared().is_empty());
    tx.close().unwrap();
}

#[test]
fn a_no_vote_rolls_back_every_branch_and_writes_nothing() {
    let (a, b, c) = (dummy("a"), dummy("bank-b"), dummy("c"));
    b.set_rules(vec![FaultRule::first(Call::Prepare, FaultAction::VoteNo, 1)]);
    let (log, tm) = volatile_tm(&[&a, &b, &c]);
    let mut tx = TxContext::open(&tm, connections(&[&a, &b, &c])).unwrap();
    let xid = tx.begin().unwrap();
    let err = tx.commit().unwrap_err();
    match &err {
        TmError::RolledBack { rm, branch, call, cause, .. } => {
            assert_eq!(rm, "bank-b");
            assert_eq!(*branch, 1);
            assert_eq!(*call, "prepare");
            assert!(matches!(cause, RmError::RolledBack(_)));
        }
        other => panic!("expected RolledBack, got {other:?}"),
    }
    assert!(err.to_string().contains("bank-b"), "message names the RM: {err}");
    assert_eq!(log.stats().records_appended, 0);
    for (f, branch) in [(&a, 0), (&b, 1), (&c, 2)] {
        assert_eq!(outcome(f, &xid, branch), Some(BranchOutcome::RolledBack), "{branch}");
        assert!(f.prepared().is_empty());
    }
    // The context is usable again and the next transaction commits.
    tx.begin().unwrap();
    assert_eq!(tx.commit().unwrap().kind, CommitKind::TwoPhase);
}

#[test]
fn read_only_votes_skip_phase_two_and_all_read_only_writes_nothing() {
    let (a, b) = (dummy("a"), dummy("b"));
    let (log, tm) = volatile_tm(&[&a, &b]);
    let mut tx = TxContext::open(&tm, connections(&[&a, &b])).unwrap();

    a.set_rules(vec![FaultRule::first(Call::Prepare, FaultAction::VoteReadOnly, 1)]);
    let xid = tx.begin().unwrap();
    assert_eq!(tx.commit().unwrap().kind, CommitKind::TwoPhase);
    assert_eq!(a.counts().get(Call::Commit), 0, "read-only branch left phase two");
    assert_eq!(b.counts().get(Call::Commit), 1);
    assert_eq!(outcome(&b, &xid, 1), Some(BranchOutcome::Committed));
    assert_eq!(log.stats().records_appended, 1);

    let both = FaultRule::first(Call::Prepare, FaultAction::VoteReadOnly, 1);
    a.set_rules(vec![both]);
    b.set_rules(vec![both]);
    tx.begin().unwrap();
    assert_eq!(tx.commit().unwrap().kind, CommitKind::ReadOnly);
    assert_eq!(log.stats().records_appended, 1, "all read-only: no decision");
    assert_eq!(b.counts().get(Call::Commit), 1);
}

#[test]
fn phase_two_unavailable_is_retried_until_it_succeeds() {
    let (a, b) = (dummy("a"), dummy("b"));
    let (log, tm) = volatile_tm(&[&a, &b]);
    let mut tx = TxContext::open(&tm, connections(&[&a, &b])).unwrap();
    // b refuses phase two until the rule is lifted.
    b.set_rules(vec![FaultRule::sometimes(Call::Commit, FaultAction::Fail, 1.0)]);
    let xid = tx.begin().unwrap();
    let report = tx.commit().unwrap();
    assert_eq!(report.kind, CommitKind::TwoPhase);
    assert_eq!(report.phase_two_pending, 1);
    assert_eq!(outcome(&a, &xid, 0), Some(BranchOutcome::Committed));
    assert_eq!(b.prepared(), vec![xid.branch(1)]);
    // The decision stays in the log while phase two is pending.
    assert_eq!(log.live_records(), 1);
    assert_eq!(log.stats().completions, 0);
    assert_eq!(tm.pending(), 1);

    b.set_rules(Vec::new());
    assert!(tm.wait_idle(WAIT), "background phase two finished");
    assert_eq!(outcome(&b, &xid, 1), Some(BranchOutcome::Committed));
    assert!(b.prepared().is_empty());
    assert_eq!(log.live_records(), 0);
    assert_eq!(log.stats().completions, 1);
}

#[test]
fn phase_two_failing_the_first_k_commits_recovers_through_new_connections() {
    let (a, b) = (dummy("a"), dummy("b"));
    let (log, tm) = volatile_tm(&[&a, &b]);
    let mut tx = TxContext::open(&tm, connections(&[&a, &b])).unwrap();
    b.set_rules(vec![FaultRule::first(Call::Commit, FaultAction::Crash, 4)]);
    let xid = tx.begin().unwrap();
    assert_eq!(tx.commit().unwrap().phase_two_pending, 1);
    assert!(tm.wait_idle(WAIT));
    assert_eq!(outcome(&b, &xid, 1), Some(BranchOutcome::Committed));
    assert!(b.counts().get(Call::Commit) >= 5, "4 failures then a success");
    assert!(tm.retries() >= 4);
    assert_eq!(log.stats().completions, 1);
}

#[test]
fn a_lost_phase_two_reply_counts_as_committed_on_retry() {
    let (a, b) = (dummy("a"), dummy("b"));
    let (log, tm) = volatile_tm(&[&a, &b]);
    let mut tx = TxContext::open(&tm, connections(&[&a, &b])).unwrap();
    b.set_rules(vec![FaultRule::first(Call::Commit, FaultAction::FailAfter, 1)]);
    let xid = tx.begin().unwrap();
    assert_eq!(tx.commit().unwrap().phase_two_pending, 1);
    assert!(tm.wait_idle(WAIT));
    assert_eq!(outcome(&b, &xid, 1), Some(BranchOutcome::Committed));
    assert_eq!(log.stats().completions, 1);
}

#[test]
fn heuristic_outcomes_are_surfaced() {
    let (a, b) = (dummy("a"), dummy("bank-b"));
    let (_log, tm) = volatile_tm(&[&a, &b]);
    let mut tx = TxContext::open(&tm, connections(&[&a, &b])).unwrap();

    b.set_rules(vec![FaultRule::first(
        Call::Commit,
        FaultAction::Heuristic(HeuristicOutcome::RolledBack),
        1,
    )]);
    tx.begin().unwrap();
    match tx.commit() {
        Err(TmError::Heuristic { reports, .. }) => {
            assert_eq!(reports.len(), 1);
            assert_eq!(reports[0].rm, "bank-b");
            assert_eq!(reports[0].outcome, HeuristicOutcome::RolledBack);
        }
        other => panic!("expected a heuristic error, got {other:?}"),
    }
    assert_eq!(b.counts().get(Call::Forget), 1, "the heuristic branch is forgotten once reported");

    b.set_rules(vec![FaultRule::first(Call::Commit, FaultAction::Heuristic(HeuristicOutcome::Committed), 1)]);
    tx.begin().unwrap();
    let report = tx.commit().unwrap();
    assert_eq!(report.heuristics.len(), 1, "an agreeing heuristic is still reported");
    assert_eq!(report.heuristics[0].outcome, HeuristicOutcome::Committed);
    assert_eq!(tm.take_heuristics().len(), 2, "both are kept for the operator");
}

#[test]
fn heuristic_found_by_a_background_retry_is_kept() {
    let (a, b) = (dummy("a"), dummy("b"));
    let (_log, tm) = volatile_tm(&[&a, &b]);
    let mut tx = TxContext::open(&tm, connections(&[&a, &b])).unwrap();
    b.set_rules(vec![
        FaultRule::first(Call::Commit, FaultAction::Fail, 1),
        FaultRule::first(Call::Commit, FaultAction::Heuristic(HeuristicOutcome::Mixed), 1),
    ]);
    tx.begin().unwrap();
    assert_eq!(tx.commit().unwrap().phase_two_pending, 1);
    assert!(tm.wait_idle(WAIT));
    let found = tm.take_heuristics();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].outcome, HeuristicOutcome::Mixed);
}

#[test]
fn one_phase_failures_are_reported() {
    let a = dummy("solo");
    let (_log, tm) = volatile_tm(&[&a]);
    let mut tx = TxContext::open(&tm, connections(&[&a])).unwrap();
    a.set_rules(vec![FaultRule::first(Call::Commit, FaultAction::VoteNo, 1)]);
    tx.begin().unwrap();
    assert!(matches!(tx.commit(), Err(TmError::RolledBack { ref rm, .. }) if rm == "solo"));
    a.set_rules(vec![FaultRule::first(Call::Commit, FaultAction::Fail, 1)]);
    tx.begin().unwrap();
    assert!(matches!(tx.commit(), Err(TmError::OutcomeUnknown { .. })));
    tx.begin().unwrap();
    tx.commit().unwrap();
}

#[test]
fn prepare_failure_of_an_unavailable_rm_rolls_back_the_prepared_ones() {
    let (a, b) = (dummy("a"), dummy("b"));
    let (log, tm) = volatile_tm(&[&a, &b]);
    let mut tx = TxContext::open(&tm, connections(&[&a, &b])).unwrap();
    // b prepares but the reply is lost; a's rollback fails once and goes to the background.
    b.set_rules(vec![FaultRule::first(Call::Prepare, FaultAction::FailAfter, 1)]);
    a.set_rules(vec![FaultRule::first(Call::Rollback, FaultAction::Fail, 1)]);
    let xid = tx.begin().unwrap();
    assert!(matches!(tx.commit(), Err(TmError::RolledBack { ref rm, call: "prepare", .. }) if rm == "b"));
    assert!(tm.wait_idle(WAIT));
    assert_eq!(outcome(&a, &xid, 0), Some(BranchOutcome::RolledBack));
    assert_eq!(outcome(&b, &xid, 1), Some(BranchOutcome::RolledBack));
    assert!(a.prepared().is_empty() && b.prepared().is_empty());
    assert_eq!(log.stats().records_appended, 0);
}

#[test]
fn parallel_prepare_gives_the_same_results() {
    // Every policy of driving the branches, including the automatic one whichever way
    // the machine's load makes it go, must commit and roll back the same branches.
    for policy in [BranchCalls::Parallel, BranchCalls::Sequential, BranchCalls::Auto] {
        let make = |name: &str| {
            DummyFactory::new(DummyConfig {
                history_max: HISTORY_MAX,
                parallel: true,
                ..DummyConfig::new(name)
            })
        };
        let (a, b, c) = (make("a"), make("b"), make("c"));
        let log = Arc::new(VolatileLog::new());
        let factories: Vec<Arc<dyn RmFactory>> = [&a, &b, &c].iter().map(|f| f.arc()).collect();
        let config = TmConfig { branch_calls: policy, ..common::quick_config() };
        let tm = TransactionManager::embedded(log.clone(), config, factories).expect("coordinator starts");
        let mut tx = TxContext::open(&tm, connections(&[&a, &b, &c])).unwrap();
        let xid = tx.begin().unwrap();
        tx.commit().unwrap();
        for (f, branch) in [(&a, 0), (&b, 1), (&c, 2)] {
            assert_eq!(outcome(f, &xid, branch), Some(BranchOutcome::Committed), "{policy:?}");
        }
        c.set_rules(vec![FaultRule::first(Call::Prepare, FaultAction::VoteNo, 1)]);
        let xid = tx.begin().unwrap();
        assert!(matches!(tx.commit(), Err(TmError::RolledBack { ref rm, .. }) if rm == "c"), "{policy:?}");
        for (f, branch) in [(&a, 0), (&b, 1), (&c, 2)] {
            assert_eq!(outcome(f, &xid, branch), Some(BranchOutcome::RolledBack), "{policy:?}");
        }
        assert_eq!(log.stats().records_appended, 1, "{policy:?}");
    }
}

/// The bug guarded against: starting the branches in parallel and losing track of those
/// that started when another one failed (they would stay open in their RMs, or a branch
/// number would be handed out twice). Three RMs preferring parallel calls, the middle
/// one's start fails once: the error names it, the other two are enlisted and roll back
/// with the transaction; in a second transaction the failure is retried by enlisting the
/// middle one again, which gets a fresh number, and all three commit.
#[test]
fn a_failed_parallel_start_keeps_the_started_branches_enlisted() {
    let make = |name: &str| {
        DummyFactory::new(DummyConfig { history_max: HISTORY_MAX, parallel: true, ..DummyConfig::new(name) })
    };
    let (a, b, c) = (make("a"), make("b"), make("c"));
    let log = Arc::new(VolatileLog::new());
    let factories: Vec<Arc<dyn RmFactory>> = [&a, &b, &c].iter().map(|f| f.arc()).collect();
    let config = TmConfig { branch_calls: BranchCalls::Parallel, ..common::quick_config() };
    let tm = TransactionManager::embedded(log.clone(), config, factories).expect("coordinator starts");
    let mut session = Session::open(&tm, connections(&[&a, &b, &c])).unwrap();

    b.set_rules(vec![FaultRule::first(Call::Start, FaultAction::Fail, 1)]);
    let mut t = session.begin().unwrap();
    let xid = t.xid();
    match t.enlist_all() {
        Err(TmError::Rm { ref rm, call: "start", .. }) if rm == "b" => {}
        other => panic!("the failed start must be reported, got {other:?}"),
    }
    t.rollback().unwrap();
    assert_eq!(outcome(&a, &xid, 0), Some(BranchOutcome::RolledBack));
    assert_eq!(outcome(&c, &xid, 2), Some(BranchOutcome::RolledBack), "numbered in connection order");
    assert_eq!(b.counts().get(Call::Rollback), 0, "b never started");

    b.set_rules(vec![FaultRule::first(Call::Start, FaultAction::Fail, 1)]);
    let mut t = session.begin().unwrap();
    let xid = t.xid();
    assert!(t.enlist_all().is_err());
    assert_eq!(t.enlist(1).unwrap(), 3, "a number not handed out before");
    assert_eq!(t.commit().unwrap().kind, CommitKind::TwoPhase);
    for (f, branch) in [(&a, 0), (&b, 3), (&c, 2)] {
        assert_eq!(outcome(f, &xid, branch), Some(BranchOutcome::Committed), "{}", f.name());
    }
    assert_eq!(log.stats().records_appended, 1);
    session.close().unwrap();
}

#[test]
fn object_api_enlists_a_subset_and_rolls_back_on_drop() {
    let (a, b, c) = (dummy("a"), dummy("b"), dummy("c"));
    let (log, tm) = volatile_tm(&[&a, &b, &c]);
    let mut session = Session::open(&tm, connections(&[&a, &b, &c])).unwrap();

    let mut t = session.begin().unwrap();
    assert_eq!(t.enlist(2).unwrap(), 0);
    assert_eq!(t.enlist(0).unwrap(), 1);
    assert_eq!(t.enlist(2).unwrap(), 0, "enlisting twice keeps the branch");
    let xid = t.xid();
    assert_eq!(t.commit().unwrap().kind, CommitKind::TwoPhase);
    assert_eq!(outcome(&c, &xid, 0), Some(BranchOutcome::Committed));
    assert_eq!(outcome(&a, &xid, 1), Some(BranchOutcome::Committed));
    assert_eq!(b.counts().get(Call::Start), 0);

    let xid = {
        let mut t = session.begin().unwrap();
        t.enlist_all().unwrap();
        t.xid()
    };
    assert_eq!(session.current(), None, "dropping the handle ended the transaction");
    assert_eq!(outcome(&b, &xid, 1), Some(BranchOutcome::RolledBack));
    assert_eq!(log.stats().records_appended, 1);
    session.close().unwrap();
}

#[test]
fn threads_commit_concurrently_with_one_decision_each() {
    let (a, b) = (dummy("a"), dummy("b"));
    let (log, tm) = volatile_tm(&[&a, &b]);
    let per_thread = 200u64;
    std::thread::scope(|s| {
        for _ in 0..4 {
            let tm = Arc::clone(&tm);
            let (a, b) = (a.clone(), b.clone());
            s.spawn(move || {
                let mut tx = TxContext::open(&tm, connections(&[&a, &b])).unwrap();
                for _ in 0..per_thread {
                    tx.begin().unwrap();
                    tx.commit().unwrap();
                }
                tx.close().unwrap();
            });
        }
    });
    assert_eq!(log.stats().records_appended, 4 * per_thread);
    assert_eq!(log.stats().completions, 4 * per_thread);
    let committed = a.history().values().filter(|o| **o == BranchOutcome::Committed).count();
    assert_eq!(committed as u64, 4 * per_thread, "every Xid distinct and committed");
}

#[test]
fn finish_later_commits_a_stored_decision_in_the_background() {
    use decree_core::{BranchRecord, Decision, Origin, ResourceManager, Xid};
    let (a, b) = (dummy("a"), dummy("b"));
    let (log, tm) = volatile_tm(&[&a, &b]);
    let xid = Xid::decree(Origin { node: 7, incarnation: 1, session: 42, sequence: 1 });
    for (f, branch) in [(&a, 0u16), (&b, 1u16)] {
        let mut rm = f.connection();
        rm.prepare(&xid.branch(branch)).unwrap();
    }
    let decision = Decision {
        xid,
        branches: vec![
            BranchRecord { rm: "a".into(), branch: 0 },
            BranchRecord { rm: "b".into(), branch: 1 },
        ],
    };
    tm.store().decide(&decision).unwrap();
    assert!(tm.finish_later(&decision));
    assert!(tm.wait_idle(WAIT));
    assert_eq!(outcome(&a, &xid, 0), Some(BranchOutcome::Committed));
    assert_eq!(outcome(&b, &xid, 1), Some(BranchOutcome::Committed));
    assert_eq!(log.live_records(), 0, "completed once both branches committed");
}

#[test]
fn a_down_rm_costs_one_connection_attempt_per_retry_pass() {
    let (a, b) = (dummy("a"), dummy("b"));
    let (log, tm) = volatile_tm(&[&a, &b]);
    let mut tx = TxContext::open(&tm, connections(&[&a, &b])).unwrap();
    b.set_rules(vec![
        FaultRule::sometimes(Call::Commit, FaultAction::Fail, 1.0),
        FaultRule::sometimes(Call::Open, FaultAction::Fail, 1.0),
    ]);
    for _ in 0..50 {
        tx.begin().unwrap();
        assert_eq!(tx.commit().unwrap().phase_two_pending, 1);
    }
    let (opens_before, passes_before) = (b.counts().get(Call::Open), tm.retry_passes());
    let deadline = std::time::Instant::now() + WAIT;
    while tm.retries() < 500 {
        assert!(std::time::Instant::now() < deadline, "the retry thread stopped retrying");
        std::thread::sleep(Duration::from_millis(5));
    }
    // How many jobs fall due together depends on timing; what must hold whatever it is:
    // a down RM is tried once per pass, however many of its jobs that pass holds. (A pass
    // may be running while the counters are read, hence the one of slack.)
    let opens = b.counts().get(Call::Open) - opens_before;
    let passes = tm.retry_passes() - passes_before;
    assert!(opens <= passes + 1, "{opens} connection attempts in {passes} retry passes");
    assert!(passes < tm.retries(), "jobs due together share a pass: {passes} passes, {} jobs", tm.retries());
    b.set_rules(Vec::new());
    assert!(tm.wait_idle(WAIT));
    assert_eq!(log.live_records(), 0);
}
