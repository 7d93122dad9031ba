//! The member's `PAIR` record as the running member holds it, and the one way to change it.
//!
//! Two things raise it while a member runs: a newer epoch heard on the link (the link's
//! task) and the operator's promotion (the control socket's). Each reads the record,
//! computes the next one and stores it durably before anyone sees it. Done in two steps
//! under separate locks, both could start from the same record and the later store would
//! win: a promotion could move `seen` back below an epoch the link had just recorded, or
//! drop a forced promotion's record, and the two writes shared one temporary file (issue 32,
//! defect 7). [`StateCell::change`] reads, computes and stores under one lock; readers take
//! a copy without waiting for a store. crates/decree-pair-loom compiles this file over
//! loom's locks and checks every interleaving of the two changes.

use crate::state_file::PairState;
use crate::sync::Mutex;

/// The member's `PAIR` record, changed one store at a time.
pub struct StateCell {
    /// What was last stored; readers copy it.
    current: Mutex<PairState>,
    /// Held from the read of `current` to the end of the store: one change at a time.
    changing: Mutex<()>,
}

impl StateCell {
    /// The cell over `state`, the record as loaded (or first stored) at start.
    pub fn new(state: PairState) -> StateCell {
        StateCell { current: Mutex::new(state), changing: Mutex::new(()) }
    }

    /// The record as last stored.
    pub fn get(&self) -> PairState {
        *crate::sync::lock(&self.current)
    }

    /// Computes the next record from the current one with `next` (`None`: nothing to
    /// change), stores it with `store(previous, next)`, and only then makes it current.
    /// No other change runs between the read and the store, so none is lost and `seen`
    /// never goes down, whatever the order of two callers.
    pub fn change<E>(
        &self,
        next: impl FnOnce(PairState) -> Result<Option<PairState>, E>,
        store: impl FnOnce(&PairState, &PairState) -> Result<(), E>,
    ) -> Result<Option<PairState>, E> {
        let _changing = crate::sync::lock(&self.changing);
        let previous = self.get();
        let Some(next) = next(previous)? else { return Ok(None) };
        assert!(next.seen >= previous.seen, "the seen epoch only grows: {previous:?} -> {next:?}");
        assert_eq!(next.member, previous.member, "a record belongs to one member");
        store(&previous, &next)?;
        *crate::sync::lock(&self.current) = next;
        Ok(Some(next))
    }
}
