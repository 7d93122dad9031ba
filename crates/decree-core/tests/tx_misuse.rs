//! Misuse of the TX-style API returns errors and leaves the context usable; it never
//! panics. The bug guarded against: a state machine that accepts a call out of order and
//! then commits or leaks a transaction nobody asked for.

mod common;

use common::*;
use decree_core::testing::dummy::{Call, FaultAction, FaultRule};
use decree_core::{TmError, TxContext, TxState};

#[test]
fn commit_and_rollback_without_begin_are_refused() {
    let a = dummy("a");
    let (_log, tm) = volatile_tm(&[&a]);
    let mut tx = TxContext::open(&tm, connections(&[&a])).unwrap();
    assert!(matches!(tx.commit(), Err(TmError::NoTransaction { call: "commit" })));
    assert!(matches!(tx.rollback(), Err(TmError::NoTransaction { call: "rollback" })));
    assert_eq!(tx.info().state, TxState::Idle);
    assert_eq!(tx.info().xid, None);
}

#[test]
fn begin_twice_is_refused_and_keeps_the_first_transaction() {
    let a = dummy("a");
    let (_log, tm) = volatile_tm(&[&a]);
    let mut tx = TxContext::open(&tm, connections(&[&a])).unwrap();
    let first = tx.begin().unwrap();
    match tx.begin() {
        Err(TmError::AlreadyActive { xid }) => assert_eq!(*xid, first),
        other => panic!("expected AlreadyActive, got {other:?}"),
    }
    assert_eq!(tx.info().xid, Some(first));
    assert_eq!(tx.info().state, TxState::Active);
    assert_eq!(tx.commit().unwrap().xid, first);
}

#[test]
fn close_with_an_open_transaction_is_refused() {
    let a = dummy("a");
    let (_log, tm) = volatile_tm(&[&a]);
    let mut tx = TxContext::open(&tm, connections(&[&a])).unwrap();
    let xid = tx.begin().unwrap();
    assert!(matches!(tx.close(), Err(TmError::TransactionOpen { .. })));
    assert_eq!(tx.info().state, TxState::Active);
    tx.rollback().unwrap();
    assert_eq!(outcome(&a, &xid, 0), Some(decree_core::testing::dummy::BranchOutcome::RolledBack));
    let closes = a.counts().get(Call::Close);
    tx.close().unwrap();
    assert_eq!(a.counts().get(Call::Close), closes + 1, "close closed the connection");
}

#[test]
fn calls_after_close_are_refused() {
    let a = dummy("a");
    let (_log, tm) = volatile_tm(&[&a]);
    let mut tx = TxContext::open(&tm, connections(&[&a])).unwrap();
    tx.close().unwrap();
    assert_eq!(tx.info().state, TxState::Closed);
    assert!(matches!(tx.begin(), Err(TmError::Closed { call: "begin" })));
    assert!(matches!(tx.commit(), Err(TmError::Closed { .. })));
    assert!(matches!(tx.rollback(), Err(TmError::Closed { .. })));
    assert!(matches!(tx.close(), Err(TmError::Closed { call: "close" })));
}

#[test]
fn a_failed_start_leaves_no_transaction_and_names_the_rm() {
    let (a, b) = (dummy("a"), dummy("bank-b"));
    let (_log, tm) = volatile_tm(&[&a, &b]);
    let mut tx = TxContext::open(&tm, connections(&[&a, &b])).unwrap();
    b.set_rules(vec![FaultRule::first(Call::Start, FaultAction::Fail, 1)]);
    match tx.begin() {
        Err(TmError::Rm { rm, call: "start", .. }) => assert_eq!(rm, "bank-b"),
        other => panic!("expected a start error, got {other:?}"),
    }
    assert_eq!(tx.info().state, TxState::Idle);
    assert_eq!(a.counts().get(Call::Rollback), 1, "the started branch was rolled back");
    tx.begin().unwrap();
    tx.commit().unwrap();
}

#[test]
fn an_rm_without_a_factory_or_failing_to_open_is_refused_at_open() {
    let (a, stray) = (dummy("a"), dummy("stray"));
    let (_log, tm) = volatile_tm(&[&a]);
    assert!(matches!(TxContext::open(&tm, connections(&[&a, &stray])), Err(TmError::Config(_))));
    a.set_rules(vec![FaultRule::first(Call::Open, FaultAction::Fail, 1)]);
    assert!(matches!(TxContext::open(&tm, connections(&[&a])), Err(TmError::Rm { call: "open", .. })));
    assert!(TxContext::open(&tm, connections(&[&a])).is_ok());
}

#[test]
fn a_crashed_connection_is_replaced_by_reconnect() {
    let (a, b) = (dummy("a"), dummy("b"));
    let (_log, tm) = volatile_tm(&[&a, &b]);
    let mut tx = TxContext::open(&tm, connections(&[&a, &b])).unwrap();
    b.set_rules(vec![FaultRule::first(Call::Prepare, FaultAction::Crash, 1)]);
    tx.begin().unwrap();
    assert!(matches!(tx.commit(), Err(TmError::RolledBack { call: "prepare", .. })));
    assert!(matches!(tx.begin(), Err(TmError::Rm { call: "start", .. })), "the connection stays broken");
    assert!(matches!(tx.reconnect(5), Err(TmError::Config(_))));
    tx.reconnect(1).unwrap();
    let xid = tx.begin().unwrap();
    assert!(matches!(tx.reconnect(0), Err(TmError::TransactionOpen { .. })));
    tx.commit().unwrap();
    assert_eq!(outcome(&b, &xid, 1), Some(decree_core::testing::dummy::BranchOutcome::Committed));
    assert!(tm.wait_idle(std::time::Duration::from_secs(10)));
    assert!(b.prepared().is_empty(), "the branch of the crashed connection was rolled back");
}
