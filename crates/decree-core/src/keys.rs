//! Log keys for decision records, allocated instead of derived from the Xid.
//!
//! A completion forgets every record under its key, so two live decisions must never
//! share one. A key computed from the Xid cannot promise that (a 64-bit key cannot hold
//! node, incarnation, session and sequence, and an in-doubt decision of an earlier
//! incarnation outlives its process). Keys are therefore handed out by a counter that
//! starts past every key recovered from the log and skips any recovered key it meets, so
//! a key is never reused while its record is live; whoever completes a transaction keeps
//! the key it was given with the decision.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};

/// Hands out log keys that no live record uses.
#[derive(Debug)]
pub struct KeyAllocator {
    next: AtomicU64,
    recovered: HashSet<u64>,
}

impl KeyAllocator {
    /// An allocator for a log whose live records (found at open) use `recovered` keys.
    pub fn new(recovered: impl IntoIterator<Item = u64>) -> Self {
        let recovered: HashSet<u64> = recovered.into_iter().collect();
        let start = recovered.iter().max().map_or(1, |k| k.wrapping_add(1));
        KeyAllocator { next: AtomicU64::new(start), recovered }
    }

    /// A key no live record and no earlier call of this allocator has (the counter would
    /// have to pass 2^64 allocations to come back to one of its own).
    pub fn next(&self) -> u64 {
        loop {
            let key = self.next.fetch_add(1, Ordering::Relaxed);
            if !self.recovered.contains(&key) {
                return key;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_start_past_the_recovered_ones_and_never_repeat() {
        let keys = KeyAllocator::new([5, 9, 7]);
        let got: Vec<u64> = (0..4).map(|_| keys.next()).collect();
        assert_eq!(got, vec![10, 11, 12, 13]);
        let empty = KeyAllocator::new([]);
        assert_eq!((empty.next(), empty.next()), (1, 2));
    }

    #[test]
    fn a_counter_that_wraps_skips_every_recovered_key() {
        let keys = KeyAllocator::new([u64::MAX, 0, 1, 3]);
        let got: Vec<u64> = (0..3).map(|_| keys.next()).collect();
        assert_eq!(got, vec![2, 4, 5], "0, 1 and 3 are live records' keys");
    }
}
