//! The simulation's one source of randomness: splitmix64 from the seed, so that a seed
//! replays exactly. Not for cryptography; nothing else in the simulation may draw a random
//! number (the fault storage takes its own seed from here too).

/// A seeded generator (splitmix64: small, fast, and every seed a good stream).
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// The stream of `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed ^ 0x6A09_E667_F3BC_C909 }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `low..=high`.
    pub fn range(&mut self, low: u64, high: u64) -> u64 {
        assert!(low <= high, "empty range {low}..={high}");
        let span = high - low;
        if span == u64::MAX {
            return self.next_u64();
        }
        low + self.next_u64() % (span + 1)
    }

    /// True with probability `per_mille` / 1000.
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.next_u64() % 1000 < per_mille
    }

    /// One of `items`, uniformly.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        assert!(!items.is_empty(), "pick from nothing");
        &items[self.range(0, items.len() as u64 - 1) as usize]
    }

    /// An independent stream for a part of the simulation (a disk's crash choices).
    pub fn fork(&mut self) -> u64 {
        self.next_u64()
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn a_seed_replays_and_two_seeds_differ() {
        let (mut a, mut b, mut c) = (Rng::new(7), Rng::new(7), Rng::new(8));
        let first: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
        assert_eq!(first, (0..8).map(|_| b.next_u64()).collect::<Vec<_>>());
        assert_ne!(first, (0..8).map(|_| c.next_u64()).collect::<Vec<_>>());
        for _ in 0..1000 {
            let x = a.range(3, 9);
            assert!((3..=9).contains(&x));
        }
    }
}
