//! The free-slot allocator of the slots engine.
//!
//! Free slots sit in [`SHARDS`] small stacks, each behind its own mutex: a thread pops from
//! its home shard (assigned round-robin per thread) and only looks at the others when its
//! own is empty, and a freed slot goes back to its own shard. A shard holds whole pages
//! (slot `s` belongs to shard `(s / slots_per_page) % SHARDS`), so threads with different
//! home shards write different pages, and a thread that completes and appends in turn
//! reuses the same slot, on the same page.
//!
//! A free slot may carry a *lazy completion*: the slot still holds the head record of a
//! completed transaction whose trailer was not zeroed yet. Reusing the slot overwrites that
//! record, which completes it as well, so the zeroing is skipped; otherwise
//! [`FreeSlots::finish_lazy`] zeroes it, under the shard lock, before the engine's next
//! completion-making sync. The lock makes zeroing and reuse exclusive: a zero write can
//! never land after a new record's write. Apart from that, no lock is held across IO.
//!
//! Invariants: a slot is either in exactly one stack or in use, never both (checked with a
//! per-slot flag on every pop and push, so a double free panics instead of handing one slot
//! to two records). `pop` returns `None` only after every shard was seen empty; a slot freed
//! during that scan may be missed, so "full" can be reported a moment early, never late.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Number of free-list shards.
pub(crate) const SHARDS: usize = 16;

/// One shard: free slots, each with its lazy-completion flag, and how many are flagged.
#[derive(Default)]
struct Shard {
    stack: Vec<(u32, bool)>,
    lazy_count: usize,
}

/// Sharded stacks of free slot indexes.
pub(crate) struct FreeSlots {
    shards: Vec<Mutex<Shard>>,
    in_use: Vec<AtomicBool>,
    slots_per_page: u32,
}

fn home_shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static HOME: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    HOME.with(|h| *h)
}

fn shard_of(slot: u32, slots_per_page: u32) -> usize {
    (slot / slots_per_page) as usize % SHARDS
}

impl FreeSlots {
    /// `count` slots, `slots_per_page` to a page, of which those for which `live` holds
    /// start in use.
    pub(crate) fn new(count: u32, slots_per_page: u32, live: impl Fn(u32) -> bool) -> Self {
        assert!(slots_per_page > 0);
        let mut shards: Vec<Shard> = (0..SHARDS).map(|_| Shard::default()).collect();
        let mut in_use = Vec::with_capacity(count as usize);
        for slot in 0..count {
            in_use.push(AtomicBool::new(live(slot)));
        }
        // Push in descending order so that each stack hands out its lowest slots first,
        // which keeps a lightly used file dense (fewer pages touched).
        for slot in (0..count).rev() {
            if !in_use[slot as usize].load(Ordering::Relaxed) {
                shards[shard_of(slot, slots_per_page)].stack.push((slot, false));
            }
        }
        FreeSlots { shards: shards.into_iter().map(Mutex::new).collect(), in_use, slots_per_page }
    }

    /// Takes a free slot and whether it carries a lazy completion (which the caller's
    /// overwrite performs, or which the caller hands back with `push(slot, true)`), or
    /// `None` when every slot is in use.
    pub(crate) fn pop(&self) -> Option<(u32, bool)> {
        let home = home_shard();
        for i in 0..SHARDS {
            let mut shard = self.shards[(home + i) % SHARDS].lock();
            let Some((slot, lazy)) = shard.stack.pop() else { continue };
            if lazy {
                shard.lazy_count -= 1;
            }
            drop(shard);
            let was_used = self.in_use[slot as usize].swap(true, Ordering::AcqRel);
            assert!(!was_used, "slot {slot} was on a free list while in use");
            return Some((slot, lazy));
        }
        None
    }

    /// Gives a slot back; it must be in use. `lazy`: it still holds a completed head.
    pub(crate) fn push(&self, slot: u32, lazy: bool) {
        let was_used = self.in_use[slot as usize].swap(false, Ordering::AcqRel);
        assert!(was_used, "slot {slot} freed twice");
        let mut shard = self.shards[shard_of(slot, self.slots_per_page)].lock();
        shard.stack.push((slot, lazy));
        if lazy {
            shard.lazy_count += 1;
        }
    }

    /// Calls `zero` on every free slot carrying a lazy completion, under its shard's lock,
    /// and clears the flag where it returns true.
    pub(crate) fn finish_lazy(&self, mut zero: impl FnMut(u32) -> bool) {
        for shard in &self.shards {
            let mut shard = shard.lock();
            if shard.lazy_count == 0 {
                continue;
            }
            let mut finished = 0;
            for entry in shard.stack.iter_mut().filter(|(_, lazy)| *lazy) {
                if zero(entry.0) {
                    entry.1 = false;
                    finished += 1;
                }
            }
            shard.lazy_count -= finished;
        }
    }

    /// Free slots right now (a snapshot; for stats and tests).
    pub(crate) fn free_count(&self) -> usize {
        self.shards.iter().map(|s| s.lock().stack.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hands_out_each_slot_once_then_reports_full() {
        let free = FreeSlots::new(40, 4, |s| s == 7);
        let mut seen = std::collections::BTreeSet::new();
        while let Some((slot, lazy)) = free.pop() {
            assert!(!lazy);
            assert!(seen.insert(slot), "slot {slot} handed out twice");
        }
        assert_eq!(seen.len(), 39);
        assert!(!seen.contains(&7));
        free.push(3, false);
        assert_eq!(free.pop(), Some((3, false)));
        assert_eq!(free.free_count(), 0);
    }

    #[test]
    fn lazy_completions_are_finished_once_or_taken_by_a_reuse() {
        let free = FreeSlots::new(8, 4, |_| true);
        free.push(1, true);
        free.push(5, true);
        free.push(6, false);
        let mut zeroed = Vec::new();
        free.finish_lazy(|slot| {
            zeroed.push(slot);
            slot != 5 // pretend the zero write of slot 5 failed: it stays lazy
        });
        zeroed.sort();
        assert_eq!(zeroed, vec![1, 5]);
        let mut again = Vec::new();
        free.finish_lazy(|slot| {
            again.push(slot);
            true
        });
        assert_eq!(again, vec![5]);
        free.finish_lazy(|slot| panic!("slot {slot} finished twice"));
        let mut popped = Vec::new();
        while let Some(entry) = free.pop() {
            popped.push(entry);
        }
        assert!(popped.iter().all(|(_, lazy)| !lazy), "{popped:?}");
    }

    #[test]
    #[should_panic(expected = "freed twice")]
    fn double_free_panics() {
        let free = FreeSlots::new(4, 1, |_| false);
        free.push(1, false);
    }
}
