//! Random sequences of TX calls on several contexts, with random faults injected into the
//! resource managers, never panic and keep atomicity: every transaction whose commit
//! returned `Ok` has no branch rolled back, every transaction rolled back (or whose commit
//! reported a rollback) has no branch committed, and once the faults stop and background
//! work is done, no branch is left prepared and no decision is left in the log.
//!
//! The bug guarded against: a failure path (lost reply, crashed connection, failed
//! rollback) that leaves one branch committed and another rolled back, or a prepared
//! branch nobody will ever finish.

mod common;

use common::*;
use decree_core::testing::dummy::{BranchOutcome, Call, DummyConfig, DummyFactory, FaultAction, FaultRule};
use decree_core::{RmFactory, TmError, TransactionManager, TxContext, TxState, Xid};
use decree_log::engine::volatile::VolatileLog;
use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

const CONTEXTS: usize = 2;
const RMS: usize = 3;

#[derive(Debug, Clone, Copy)]
enum Op {
    Begin(usize),
    Commit(usize),
    Rollback(usize),
    Info(usize),
    Close(usize),
    Reopen(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let ctx = 0..CONTEXTS;
    prop_oneof![
        4 => ctx.clone().prop_map(Op::Begin),
        4 => ctx.clone().prop_map(Op::Commit),
        1 => ctx.clone().prop_map(Op::Rollback),
        1 => ctx.clone().prop_map(Op::Info),
        1 => ctx.clone().prop_map(Op::Close),
        1 => ctx.prop_map(Op::Reopen),
    ]
}

fn fault() -> impl Strategy<Value = FaultRule> {
    let call = prop_oneof![
        Just(Call::Start),
        Just(Call::End),
        Just(Call::Prepare),
        Just(Call::Commit),
        Just(Call::Rollback),
    ];
    let action = prop_oneof![
        Just(FaultAction::VoteNo),
        Just(FaultAction::VoteReadOnly),
        Just(FaultAction::Fail),
        Just(FaultAction::FailAfter),
        Just(FaultAction::Crash),
    ];
    (call, action, 0.05f64..0.5).prop_map(|(call, action, probability)| {
        // A "no" to phase-two commit is a heuristic rollback, tested on its own elsewhere.
        let action = match (call, action) {
            (Call::Commit, FaultAction::VoteNo) => FaultAction::Fail,
            _ => action,
        };
        FaultRule { call, action, probability, times_max: u64::MAX }
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Committed,
    RolledBack,
    Unknown,
}

fn run(
    seed: u64,
    parallel: bool,
    faults: Vec<(usize, FaultRule)>,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let factories: Vec<DummyFactory> = (0..RMS)
        .map(|i| {
            DummyFactory::new(DummyConfig {
                seed: seed.wrapping_add(i as u64 * 1000),
                history_max: HISTORY_MAX,
                parallel,
                ..DummyConfig::new(format!("rm{i}"))
            })
        })
        .collect();
    for (i, f) in factories.iter().enumerate() {
        f.set_rules(faults.iter().filter(|(rm, _)| *rm == i).map(|(_, r)| *r).collect());
    }
    let refs: Vec<&DummyFactory> = factories.iter().collect();
    let log = Arc::new(VolatileLog::new());
    let arcs: Vec<Arc<dyn RmFactory>> = factories.iter().map(|f| f.arc()).collect();
    let tm = TransactionManager::embedded(log.clone(), quick_config(), arcs).unwrap();
    let open = |tm: &Arc<TransactionManager>| TxContext::open(tm, connections(&refs));
    let mut contexts: Vec<Option<TxContext>> = (0..CONTEXTS).map(|_| open(&tm).ok()).collect();
    let mut expect: HashMap<Xid, Expect> = HashMap::new();

    for op in ops {
        match op {
            Op::Begin(c) | Op::Commit(c) | Op::Rollback(c) | Op::Info(c) | Op::Close(c) => {
                let Some(ctx) = contexts[c].as_mut() else { continue };
                let current = ctx.info().xid;
                if ctx.info().state == TxState::Closed {
                    let refused = match op {
                        Op::Begin(_) => ctx.begin().map(|_| ()),
                        Op::Commit(_) => ctx.commit().map(|_| ()),
                        Op::Rollback(_) => ctx.rollback(),
                        Op::Close(_) => ctx.close(),
                        _ => Err(TmError::Closed { call: "info" }),
                    };
                    prop_assert!(matches!(refused, Err(TmError::Closed { .. })), "{:?}", refused);
                    continue;
                }
                match op {
                    Op::Begin(_) => match ctx.begin() {
                        Ok(xid) => {
                            prop_assert!(current.is_none());
                            expect.insert(xid, Expect::Unknown);
                        }
                        Err(TmError::AlreadyActive { .. }) => prop_assert!(current.is_some()),
                        Err(_) => prop_assert_eq!(ctx.info().xid, current),
                    },
                    Op::Commit(_) => {
                        let result = ctx.commit();
                        prop_assert_eq!(ctx.info().xid, None, "a commit always ends the transaction");
                        if let Some(xid) = current {
                            let e = match result {
                                Ok(_) => Expect::Committed,
                                Err(TmError::RolledBack { .. }) => Expect::RolledBack,
                                Err(TmError::OutcomeUnknown { .. }) => Expect::Unknown,
                                Err(other) => return Err(TestCaseError::fail(format!("commit: {other}"))),
                            };
                            expect.insert(xid, e);
                        } else {
                            prop_assert!(
                                matches!(result, Err(TmError::NoTransaction { .. })),
                                "{:?}",
                                result
                            );
                        }
                    }
                    Op::Rollback(_) => {
                        let result = ctx.rollback();
                        prop_assert_eq!(ctx.info().xid, None);
                        match current {
                            Some(xid) => {
                                expect.insert(xid, Expect::RolledBack);
                            }
                            None => prop_assert!(
                                matches!(result, Err(TmError::NoTransaction { .. })),
                                "{:?}",
                                result
                            ),
                        }
                    }
                    Op::Info(_) => {
                        let info = ctx.info();
                        prop_assert_eq!(info.state == TxState::Active, info.xid.is_some());
                    }
                    Op::Close(_) => {
                        let result = ctx.close();
                        if current.is_some() {
                            prop_assert!(
                                matches!(result, Err(TmError::TransactionOpen { .. })),
                                "{:?}",
                                result
                            );
                        } else {
                            prop_assert_eq!(ctx.info().state, TxState::Closed);
                        }
                    }
                    Op::Reopen(_) => unreachable!(),
                }
            }
            Op::Reopen(c) => {
                if let Some(xid) = contexts[c].as_ref().and_then(|ctx| ctx.info().xid) {
                    // Dropping a context with a transaction rolls it back.
                    expect.insert(xid, Expect::RolledBack);
                }
                contexts[c] = None;
                contexts[c] = open(&tm).ok();
            }
        }
    }
    for ctx in contexts.iter().flatten() {
        if let Some(xid) = ctx.info().xid {
            expect.insert(xid, Expect::RolledBack);
        }
    }
    drop(contexts);
    for f in &factories {
        f.set_rules(Vec::new());
    }
    prop_assert!(tm.wait_idle(Duration::from_secs(20)), "background work finished");

    for (xid, e) in &expect {
        for (i, f) in factories.iter().enumerate() {
            let got = f.outcome(&xid.branch(i as u16));
            match e {
                Expect::Committed => prop_assert!(
                    matches!(got, None | Some(BranchOutcome::Committed)),
                    "{xid} committed but branch {i} is {got:?}"
                ),
                Expect::RolledBack => prop_assert!(
                    got != Some(BranchOutcome::Committed),
                    "{xid} rolled back but branch {i} committed"
                ),
                Expect::Unknown => {}
            }
        }
    }
    for f in &factories {
        prop_assert!(f.prepared().is_empty(), "left prepared: {:?}", f.prepared());
    }
    prop_assert_eq!(log.live_records(), 0, "every decision completed");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_tx_calls_keep_atomicity(
        seed in any::<u64>(),
        parallel in any::<bool>(),
        faults in proptest::collection::vec((0..RMS, fault()), 0..4),
        ops in proptest::collection::vec(op(), 1..40),
    ) {
        run(seed, parallel, faults, ops)?;
    }
}
