//! The real coordinator of decree-core in server mode: `TransactionManager::with_store`
//! over `RemoteDecisions`, so that switching from embedded to server mode is only a
//! change of store. Resource managers are decree-core's dummy.

mod common;

use decree_client::RemoteDecisions;
use decree_core::testing::dummy::BranchOutcome;
use decree_core::testing::DummyFactory;
use decree_core::{
    CommitKind, DecisionStore, Outcome, ResourceManager, RmFactory, Session, TmConfig, TransactionManager,
};
use decree_log::EngineKind;
use decree_server::ServerConfig;
use std::sync::Arc;

#[test]
fn the_coordinator_commits_through_the_state_server() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::new(dir.path().join("log"), EngineKind::Volatile);
    config.unix = Some(dir.path().join("decree.sock"));
    let (a, b) = (DummyFactory::named("a", 100_000), DummyFactory::named("b", 100_000));
    let factories: Vec<Arc<dyn RmFactory>> = vec![a.arc(), b.arc()];
    let server = decree_server::start(config, factories.clone()).unwrap();
    let endpoint = format!("unix:{}", server.unix_path().unwrap().display());
    let store = Arc::new(RemoteDecisions::connect(&endpoint).unwrap());
    let tm = TransactionManager::with_store(store.clone(), TmConfig::default(), factories).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (tm, a, b) = (tm.clone(), a.clone(), b.clone());
            std::thread::spawn(move || {
                let rms: Vec<Box<dyn ResourceManager>> =
                    vec![Box::new(a.connection()), Box::new(b.connection())];
                let mut session = Session::open(&tm, rms).unwrap();
                let mut xids = Vec::new();
                for _ in 0..100 {
                    let mut tx = session.begin().unwrap();
                    tx.enlist_all().unwrap();
                    let report = tx.commit().unwrap();
                    assert_eq!(report.kind, CommitKind::TwoPhase);
                    xids.push(report.xid);
                }
                session.close().unwrap();
                xids
            })
        })
        .collect();
    let xids: Vec<_> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
    assert_eq!(xids.len(), 400);
    for xid in &xids {
        assert_eq!(a.outcome(&xid.branch(0)), Some(BranchOutcome::Committed), "{xid}");
        assert_eq!(b.outcome(&xid.branch(1)), Some(BranchOutcome::Committed), "{xid}");
        assert_eq!(store.outcome(xid).unwrap(), Outcome::Committed, "{xid}");
    }
    assert_eq!(store.node(), server.node());
    server.shutdown().unwrap();
}

/// A branch that commits on its own while the coordinator rolls the transaction back (a
/// heuristic outcome) must make the server answer "heuristic": it saw no decision, and
/// would otherwise answer "rolled back" once the session has closed.
#[test]
fn a_heuristic_outcome_of_a_rollback_reaches_the_state_server() {
    use decree_core::testing::dummy::{Call, FaultAction, FaultRule};
    use decree_core::{HeuristicOutcome, TmError};
    let dir = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::new(dir.path().join("log"), EngineKind::Volatile);
    config.unix = Some(dir.path().join("decree.sock"));
    let (a, b) = (DummyFactory::named("a", 100), DummyFactory::named("b", 100));
    a.set_rules(vec![FaultRule::first(
        Call::Rollback,
        FaultAction::Heuristic(HeuristicOutcome::Committed),
        1,
    )]);
    b.set_rules(vec![FaultRule::first(Call::Prepare, FaultAction::VoteNo, 1)]);
    let factories: Vec<Arc<dyn RmFactory>> = vec![a.arc(), b.arc()];
    let server = decree_server::start(config, factories.clone()).unwrap();
    let endpoint = format!("unix:{}", server.unix_path().unwrap().display());
    let store = Arc::new(RemoteDecisions::connect(&endpoint).unwrap());
    let tm = TransactionManager::with_store(store.clone(), TmConfig::default(), factories).unwrap();
    let rms: Vec<Box<dyn ResourceManager>> = vec![Box::new(a.connection()), Box::new(b.connection())];
    let mut session = Session::open(&tm, rms).unwrap();
    let mut tx = session.begin().unwrap();
    tx.enlist_all().unwrap();
    let xid = match tx.commit() {
        Err(TmError::RolledBack { xid, .. }) => *xid,
        other => panic!("expected the vote no to roll the transaction back, got {other:?}"),
    };
    assert_eq!(a.outcome(&xid.branch(0)), Some(BranchOutcome::Heuristic(HeuristicOutcome::Committed)));
    session.close().unwrap();
    // The report rides with the session's last frames: the server reads it as it closes.
    common::eventually("the server answers heuristic", || store.outcome(&xid).unwrap() == Outcome::Heuristic);
    assert_eq!(store.outcome(&xid).unwrap(), Outcome::Heuristic, "and keeps answering it");
    server.shutdown().unwrap();
}

/// A server and a coordinator over it with dummy resource managers `a` and `b`.
fn coordinator(
    dir: &std::path::Path,
) -> (decree_server::ServerHandle, Arc<RemoteDecisions>, Arc<TransactionManager>, DummyFactory, DummyFactory)
{
    let mut config = ServerConfig::new(dir.join("log"), EngineKind::Volatile);
    config.unix = Some(dir.join("decree.sock"));
    let (a, b) = (DummyFactory::named("a", 100), DummyFactory::named("b", 100));
    let factories: Vec<Arc<dyn RmFactory>> = vec![a.arc(), b.arc()];
    let server = decree_server::start(config, factories.clone()).unwrap();
    let endpoint = format!("unix:{}", server.unix_path().unwrap().display());
    let store = Arc::new(RemoteDecisions::connect(&endpoint).unwrap());
    let tm = TransactionManager::with_store(store.clone(), TmConfig::default(), factories).unwrap();
    (server, store, tm, a, b)
}

/// Issue 31, item 1: a one-phase commit sent nothing to the server, which answered
/// "rolled back" for it once the session closed. The coordinator now tells the server
/// first: committed once the commit's answer came, unknown when it was lost.
#[test]
fn a_one_phase_commit_is_never_answered_rolled_back_by_the_server() {
    use decree_core::testing::dummy::{Call, FaultAction, FaultRule};
    use decree_core::TmError;
    let dir = tempfile::tempdir().unwrap();
    let (server, store, tm, a, _b) = coordinator(dir.path());
    assert_eq!(store.protocol_version(), 3);
    let mut session = Session::open(&tm, vec![Box::new(a.connection()) as Box<dyn ResourceManager>]).unwrap();
    let mut tx = session.begin().unwrap();
    tx.enlist(0).unwrap();
    let report = tx.commit().unwrap();
    assert_eq!(report.kind, CommitKind::OnePhase);
    // The commit's answer was lost although the branch committed.
    a.set_rules(vec![FaultRule::first(Call::Commit, FaultAction::FailAfter, 1)]);
    let mut tx = session.begin().unwrap();
    tx.enlist(0).unwrap();
    let lost = match tx.commit() {
        Err(TmError::OutcomeUnknown { xid, cause }) => {
            assert!(cause.contains("only the database knows"), "{cause}");
            *xid
        }
        other => panic!("expected OutcomeUnknown, got {other:?}"),
    };
    assert_eq!(a.outcome(&lost.branch(0)), Some(BranchOutcome::Committed));
    session.close().unwrap();
    common::eventually("the server answers committed for the one-phase commit", || {
        store.outcome(&report.xid).unwrap() == Outcome::Committed
    });
    common::eventually("and unknown for the lost one", || {
        store.outcome(&lost).unwrap() != Outcome::InProgress
    });
    assert_eq!(store.outcome(&lost).unwrap(), Outcome::Unknown, "never rolled back: it committed");
    server.shutdown().unwrap();
}

/// Issue 31, item 2: the server went away between begin and commit. The `Decide` cannot
/// reach it, so the transaction is rolled back at once (its branches too) instead of
/// "outcome unknown" with branches left prepared for the server's next recovery pass.
#[test]
fn a_decide_to_a_server_that_went_away_is_not_sent_and_rolls_back() {
    use decree_core::TmError;
    let dir = tempfile::tempdir().unwrap();
    let (server, _store, tm, a, b) = coordinator(dir.path());
    let rms: Vec<Box<dyn ResourceManager>> = vec![Box::new(a.connection()), Box::new(b.connection())];
    let mut session = Session::open(&tm, rms).unwrap();
    let mut tx = session.begin().unwrap();
    tx.enlist_all().unwrap();
    server.shutdown().unwrap();
    let xid = match tx.commit() {
        Err(TmError::NotSent { xid, cause }) => {
            assert!(cause.contains("closed the session"), "{cause}");
            *xid
        }
        other => panic!("expected NotSent, got {other:?}"),
    };
    assert_eq!(a.outcome(&xid.branch(0)), Some(BranchOutcome::RolledBack));
    assert_eq!(b.outcome(&xid.branch(1)), Some(BranchOutcome::RolledBack));
    assert!(a.prepared().is_empty() && b.prepared().is_empty(), "nothing left prepared");
}

/// Issue 32: a heuristic branch was told to forget before the server had its report, so a
/// crash in between lost the report everywhere. The coordinator now asks for the kept reply
/// (protocol version 3) and forgets only once the server keeps the outcome; a report the
/// server cannot keep (its disk fails) leaves the branch to recovery.
#[test]
fn a_heuristic_branch_is_forgotten_only_once_the_server_keeps_its_outcome() {
    use decree_core::testing::dummy::{Call, FaultAction, FaultRule};
    use decree_core::{HeuristicOutcome, TmError, Xid};
    use decree_log::testing::fault::FaultStorage;
    let dir = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::new(dir.path().join("log"), EngineKind::Journal);
    config.unix = Some(dir.path().join("decree.sock"));
    let storage = FaultStorage::new(11);
    storage.disable_direct_io();
    let (a, b) = (DummyFactory::named("a", 100), DummyFactory::named("b", 100));
    let factories: Vec<Arc<dyn RmFactory>> = vec![a.arc(), b.arc()];
    let server =
        decree_server::start_on_storage(config, Arc::new(storage.clone()), factories.clone()).unwrap();
    let endpoint = format!("unix:{}", server.unix_path().unwrap().display());
    let store = Arc::new(RemoteDecisions::connect(&endpoint).unwrap());
    assert_eq!(store.protocol_version(), 3);
    let tm = TransactionManager::with_store(store.clone(), TmConfig::default(), factories).unwrap();
    let rms: Vec<Box<dyn ResourceManager>> = vec![Box::new(a.connection()), Box::new(b.connection())];
    let mut session = Session::open(&tm, rms).unwrap();
    // b votes no, and a's rollback finds that a committed on its own.
    let mut heuristic_rollback = || -> Xid {
        a.set_rules(vec![FaultRule::first(
            Call::Rollback,
            FaultAction::Heuristic(HeuristicOutcome::Committed),
            1,
        )]);
        b.set_rules(vec![FaultRule::first(Call::Prepare, FaultAction::VoteNo, 1)]);
        let mut tx = session.begin().unwrap();
        tx.enlist_all().unwrap();
        match tx.commit() {
            Err(TmError::RolledBack { xid, .. }) => *xid,
            other => panic!("expected the vote no to roll the transaction back, got {other:?}"),
        }
    };
    let kept = heuristic_rollback();
    assert_eq!(a.counts().get(Call::Forget), 1, "the branch is forgotten once the server keeps its report");
    assert_eq!(store.outcome(&kept).unwrap(), Outcome::Heuristic, "kept: answered at once, no wait");

    storage.fail_syncs_after(0); // the outcome memory can no longer make anything durable
    let lost = heuristic_rollback();
    assert_eq!(a.outcome(&lost.branch(0)), Some(BranchOutcome::Heuristic(HeuristicOutcome::Committed)));
    assert_eq!(a.counts().get(Call::Forget), 1, "not forgotten: the server could not keep the report");
    drop(session);
    let _ = server.shutdown();
}

/// A one-phase commit whose branch decided on its own (here: rolled back) was remembered
/// "committed" by the server; it is now remembered heuristic, and the branch is forgotten
/// once the server keeps that (issue 32).
#[test]
fn a_heuristic_one_phase_commit_is_answered_heuristic_never_committed() {
    use decree_core::testing::dummy::{Call, FaultAction, FaultRule};
    use decree_core::{HeuristicOutcome, TmError};
    let dir = tempfile::tempdir().unwrap();
    let (server, store, tm, a, _b) = coordinator(dir.path());
    let mut session = Session::open(&tm, vec![Box::new(a.connection()) as Box<dyn ResourceManager>]).unwrap();
    a.set_rules(vec![FaultRule::first(
        Call::Commit,
        FaultAction::Heuristic(HeuristicOutcome::RolledBack),
        1,
    )]);
    let mut tx = session.begin().unwrap();
    tx.enlist(0).unwrap();
    let xid = match tx.commit() {
        Err(TmError::Heuristic { xid, .. }) => *xid,
        other => panic!("expected a heuristic rollback of the one-phase commit, got {other:?}"),
    };
    assert_eq!(store.outcome(&xid).unwrap(), Outcome::Heuristic);
    assert_eq!(a.counts().get(Call::Forget), 1);
    session.close().unwrap();
    assert_eq!(store.outcome(&xid).unwrap(), Outcome::Heuristic, "still heuristic after the session closed");
    server.shutdown().unwrap();
}
