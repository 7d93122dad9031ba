//! The commit hot path allocates nothing once warm.
//!
//! The benchmark target (about 1 µs per begin + two-phase commit per thread) leaves no
//! room for heap traffic, and an allocation per transaction creeps in easily (a cloned
//! name, a fresh vector of votes, an encoded decision). A counting allocator measures the
//! coordinator and the dummy RMs alone, over a decision store that keeps only counters.

mod common;

use common::*;
use decree_core::testing::DummyFactory;
use decree_core::{Decision, DecisionStore, RmFactory, StoreError, TransactionManager, TxContext, Xid};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// A decision store that only counts (the log's own allocations are not measured here).
#[derive(Default)]
struct CountingStore {
    decided: AtomicU64,
    completed: AtomicU64,
    sessions: AtomicU64,
}

impl DecisionStore for CountingStore {
    fn node(&self) -> u32 {
        7
    }
    fn incarnation(&self) -> u64 {
        1
    }
    fn open_session(&self) -> Result<u64, StoreError> {
        Ok(self.sessions.fetch_add(1, Ordering::Relaxed))
    }
    fn close_session(&self, _session: u64) {}
    fn decide(&self, decision: &Decision) -> Result<(), StoreError> {
        assert_eq!(decision.branches.len(), 2);
        self.decided.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn complete(&self, _xid: &Xid) -> Result<(), StoreError> {
        self.completed.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

#[test]
fn begin_and_two_phase_commit_allocate_nothing_once_warm() {
    // No outcome history: the dummies' history table would allocate.
    let (a, b) = (DummyFactory::named("a", 0), DummyFactory::named("b", 0));
    let store = Arc::new(CountingStore::default());
    let factories: Vec<Arc<dyn RmFactory>> = vec![a.arc(), b.arc()];
    let tm = TransactionManager::with_store(store.clone(), quick_config(), factories).unwrap();
    let mut tx = TxContext::open(&tm, connections(&[&a, &b])).unwrap();
    for _ in 0..1000 {
        tx.begin().unwrap();
        tx.commit().unwrap();
    }
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let rounds = 10_000u64;
    for _ in 0..rounds {
        tx.begin().unwrap();
        tx.commit().unwrap();
    }
    let allocations = ALLOCATIONS.load(Ordering::Relaxed) - before;
    assert_eq!(store.decided.load(Ordering::Relaxed), 1000 + rounds);
    assert_eq!(store.completed.load(Ordering::Relaxed), 1000 + rounds);
    // Other test threads may allocate meanwhile; this binary has only this test, and the
    // retry thread sleeps. Allow a handful, far below one per transaction.
    assert!(allocations < rounds / 100, "{allocations} allocations in {rounds} transactions");
}
