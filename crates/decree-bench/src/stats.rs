//! Latency histograms and the summaries the reports print.
//!
//! Every latency is recorded in nanoseconds into an HDR histogram (3 significant digits,
//! so any reported value is within 0.1 % of the exact one) and reported in microseconds.
//! Each benchmark thread records into its own histogram; the histograms are merged after
//! the threads end, so recording never takes a lock.

use hdrhistogram::Histogram;
use serde::Serialize;
use std::time::Duration;

/// The largest latency a histogram can hold; longer ones are clamped to it.
pub const LATENCY_NS_MAX: u64 = 600_000_000_000;

/// A latency histogram in nanoseconds.
#[derive(Debug, Clone)]
pub struct Latencies {
    histogram: Histogram<u64>,
}

impl Default for Latencies {
    fn default() -> Self {
        Self::new()
    }
}

impl Latencies {
    /// An empty histogram covering 1 ns to [`LATENCY_NS_MAX`].
    pub fn new() -> Self {
        // Bounds and precision are constants within hdrhistogram's limits, so this cannot fail.
        let histogram = Histogram::new_with_bounds(1, LATENCY_NS_MAX, 3).expect("constant histogram bounds");
        Latencies { histogram }
    }

    /// Records one latency (clamped to the histogram's range).
    pub fn record(&mut self, latency: Duration) {
        self.record_ns(latency.as_nanos().min(LATENCY_NS_MAX as u128) as u64);
    }

    /// Records one latency given in nanoseconds.
    pub fn record_ns(&mut self, ns: u64) {
        self.histogram.saturating_record(ns.clamp(1, LATENCY_NS_MAX));
    }

    /// Adds every sample of `other`.
    pub fn merge(&mut self, other: &Latencies) {
        // Both histograms have the same bounds, so adding cannot go out of range.
        self.histogram.add(&other.histogram).expect("histograms with equal bounds");
    }

    /// The number of samples.
    pub fn count(&self) -> u64 {
        self.histogram.len()
    }

    /// The value at `quantile` (0.0 to 1.0) in microseconds; 0 when empty.
    pub fn quantile_us(&self, quantile: f64) -> f64 {
        if self.count() == 0 {
            return 0.0;
        }
        self.histogram.value_at_quantile(quantile) as f64 / 1e3
    }

    /// The mean in microseconds; 0 when empty.
    pub fn mean_us(&self) -> f64 {
        if self.count() == 0 {
            return 0.0;
        }
        self.histogram.mean() / 1e3
    }

    /// The population standard deviation in microseconds; 0 when empty.
    pub fn stddev_us(&self) -> f64 {
        if self.count() == 0 {
            return 0.0;
        }
        self.histogram.stdev() / 1e3
    }

    /// The LIXA-style summary: quartiles, p95, p99, average and standard deviation.
    pub fn summary(&self) -> Summary {
        Summary {
            p25: self.quantile_us(0.25),
            p50: self.quantile_us(0.50),
            p75: self.quantile_us(0.75),
            p95: self.quantile_us(0.95),
            p99: self.quantile_us(0.99),
            avg: self.mean_us(),
            stddev: self.stddev_us(),
        }
    }
}

/// Percentiles, average and standard deviation of one latency, all in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    /// 25th percentile: about the best case.
    pub p25: f64,
    /// Median.
    pub p50: f64,
    /// 75th percentile.
    pub p75: f64,
    /// 95th percentile: LIXA's "worst case" and the X axis of the characteristic curve.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Arithmetic mean.
    pub avg: f64,
    /// Population standard deviation.
    pub stddev: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(actual: f64, expected: f64) -> bool {
        (actual - expected).abs() <= expected.abs() * 1e-3 + 1e-9
    }

    #[test]
    fn summary_of_one_to_one_hundred_us() {
        // Samples 1, 2, ..., 100 us. By hand: the q-quantile is the smallest sample with at
        // least q * 100 samples at or below it, so p25 = 25, p50 = 50, p75 = 75, p95 = 95,
        // p99 = 99; the mean is 5050 / 100 = 50.5; the population variance is
        // (100^2 - 1) / 12 = 833.25, so the standard deviation is 28.866 us.
        let mut lat = Latencies::new();
        for us in (1..=100u64).rev() {
            lat.record(Duration::from_micros(us));
        }
        let s = lat.summary();
        assert_eq!(lat.count(), 100);
        for (name, actual, expected) in [
            ("p25", s.p25, 25.0),
            ("p50", s.p50, 50.0),
            ("p75", s.p75, 75.0),
            ("p95", s.p95, 95.0),
            ("p99", s.p99, 99.0),
            ("avg", s.avg, 50.5),
            ("stddev", s.stddev, 833.25f64.sqrt()),
        ] {
            assert!(close(actual, expected), "{name}: {actual} != {expected}");
        }
    }

    #[test]
    fn skewed_sample_and_merge() {
        // Nine samples of 10 us and one of 1000 us, split over two histograms.
        // Mean = (90 + 1000) / 10 = 109; variance = (9 * 99^2 + 891^2) / 10 = 88209,
        // standard deviation = 297 us; p50 = 10, p95 = p99 = 1000.
        let (mut a, mut b) = (Latencies::new(), Latencies::new());
        for _ in 0..5 {
            a.record(Duration::from_micros(10));
        }
        for _ in 0..4 {
            b.record(Duration::from_micros(10));
        }
        b.record(Duration::from_micros(1000));
        a.merge(&b);
        let s = a.summary();
        assert_eq!(a.count(), 10);
        assert!(close(s.p50, 10.0), "{s:?}");
        assert!(close(s.p95, 1000.0), "{s:?}");
        assert!(close(s.avg, 109.0), "{s:?}");
        assert!(close(s.stddev, 297.0), "{s:?}");
    }

    #[test]
    fn empty_is_all_zero_and_huge_is_clamped() {
        let mut lat = Latencies::new();
        assert_eq!(lat.summary().p99, 0.0);
        lat.record(Duration::from_secs(10_000));
        assert_eq!(lat.count(), 1);
        assert!(lat.quantile_us(1.0) >= LATENCY_NS_MAX as f64 / 1e3 * 0.999);
    }
}
