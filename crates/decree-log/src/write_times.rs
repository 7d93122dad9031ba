//! How long the synced writes of a log took: a fixed histogram of atomics, so that a
//! benchmark can set the device's behaviour under its own load beside the raw floor it
//! measured idle. It is a report, not a control: nothing in the log reads it back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Width of the fine buckets, and the range they cover.
const FINE_WIDTH_US: u64 = 10;
const FINE_BUCKETS: usize = 100;
/// The tiers after the fine one: (bucket width, buckets), 1 to 10 ms, then 10 to 100 ms.
const TIERS: [(u64, usize); 3] = [(FINE_WIDTH_US, FINE_BUCKETS), (100, 90), (1_000, 90)];
/// Every tier's buckets and one for 100 ms and more.
const BUCKETS: usize = TIERS[0].1 + TIERS[1].1 + TIERS[2].1 + 1;
/// Where the last bucket starts, in microseconds.
const OVERFLOW_US: u64 =
    TIERS[0].0 * TIERS[0].1 as u64 + TIERS[1].0 * TIERS[1].1 as u64 + TIERS[2].0 * TIERS[2].1 as u64;

/// The bucket of a duration: 10 us wide below 1 ms, 100 us below 10 ms, 1 ms below 100 ms.
fn bucket_of(elapsed: Duration) -> usize {
    let mut us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
    let mut first = 0;
    for (width, buckets) in TIERS {
        if us < width * buckets as u64 {
            return first + (us / width) as usize;
        }
        us -= width * buckets as u64;
        first += buckets;
    }
    BUCKETS - 1
}

/// The upper edge of bucket `index` in microseconds (what a quantile reports); the last
/// bucket reports where it starts, 100 ms.
fn bucket_top_us(index: usize) -> u64 {
    let (mut start_us, mut first) = (0, 0);
    for (width, buckets) in TIERS {
        if index < first + buckets {
            return start_us + (index - first + 1) as u64 * width;
        }
        start_us += width * buckets as u64;
        first += buckets;
    }
    OVERFLOW_US
}

/// The live counters an engine records into (relaxed atomics).
#[derive(Debug)]
pub(crate) struct WriteTimeCounters {
    counts: [AtomicU64; BUCKETS],
}

impl Default for WriteTimeCounters {
    fn default() -> Self {
        WriteTimeCounters { counts: std::array::from_fn(|_| AtomicU64::new(0)) }
    }
}

impl WriteTimeCounters {
    /// Counts one synced write that took `elapsed`.
    pub(crate) fn record(&self, elapsed: Duration) {
        self.counts[bucket_of(elapsed)].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts so far.
    pub(crate) fn snapshot(&self) -> WriteTimes {
        WriteTimes { counts: self.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect() }
    }
}

/// Synced write times since open, as counts per bucket (empty for engines that keep none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteTimes {
    counts: Vec<u64>,
}

impl WriteTimes {
    /// Writes counted.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The writes counted since `earlier` (a snapshot of the same log).
    pub fn since(&self, earlier: &WriteTimes) -> WriteTimes {
        let counts = self
            .counts
            .iter()
            .enumerate()
            .map(|(i, c)| c.saturating_sub(earlier.counts.get(i).copied().unwrap_or(0)))
            .collect();
        WriteTimes { counts }
    }

    /// The `q` quantile (0..=1) in microseconds, as the upper edge of its bucket (10 us
    /// resolution below 1 ms, 100 us below 10 ms, 1 ms below 100 ms; 100 ms and more
    /// reads 100 ms); None when nothing was counted.
    pub fn quantile_us(&self, q: f64) -> Option<u64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (index, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Some(bucket_top_us(index));
            }
        }
        unreachable!("the rank is at most the total")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_fine_coarse_and_overflow() {
        assert_eq!(bucket_of(Duration::from_micros(0)), 0);
        assert_eq!(bucket_of(Duration::from_micros(9)), 0);
        assert_eq!(bucket_of(Duration::from_micros(175)), 17);
        assert_eq!(bucket_of(Duration::from_micros(999)), 99);
        assert_eq!(bucket_of(Duration::from_micros(1_000)), 100);
        assert_eq!(bucket_of(Duration::from_micros(9_999)), 189);
        assert_eq!(bucket_of(Duration::from_micros(10_000)), 190);
        assert_eq!(bucket_of(Duration::from_micros(99_999)), 279);
        assert_eq!(bucket_of(Duration::from_millis(100)), BUCKETS - 1);
        assert_eq!(bucket_of(Duration::from_secs(5)), BUCKETS - 1);
        assert_eq!(bucket_top_us(17), 180);
        assert_eq!(bucket_top_us(100), 1_100);
        assert_eq!(bucket_top_us(189), 10_000);
        assert_eq!(bucket_top_us(190), 11_000);
        assert_eq!(bucket_top_us(279), 100_000);
        assert_eq!(bucket_top_us(BUCKETS - 1), OVERFLOW_US);
    }

    #[test]
    fn quantiles_read_the_counts_since_a_snapshot() {
        let counters = WriteTimeCounters::default();
        assert_eq!(counters.snapshot().quantile_us(0.5), None);
        counters.record(Duration::from_millis(500)); // before the window
        let before = counters.snapshot();
        for us in [100, 110, 120, 130, 140, 150, 160, 170, 180, 2_500] {
            counters.record(Duration::from_micros(us));
        }
        let window = counters.snapshot().since(&before);
        assert_eq!(window.count(), 10);
        assert_eq!(window.quantile_us(0.5), Some(150));
        assert_eq!(window.quantile_us(0.9), Some(190));
        assert_eq!(window.quantile_us(0.95), Some(2_600));
        assert_eq!(window.quantile_us(1.0), Some(2_600), "the 500 ms write is outside the window");
    }
}
