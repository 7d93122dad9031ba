//! Think times and workload presets of the LIXA-style benchmark.
//!
//! A think time is a range `[min, max]` drawn uniformly at random for every wait; a zero
//! range means "do not wait at all" (saturation test), which is not the same as sleeping
//! for zero time (a syscall). Ranges are written `500-1500us`, `5-15ms`, `1s`, or `0`; a
//! unit is required on anything but zero so that `1000` is never misread.

use crate::BenchError;
use rand::Rng;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// The longest think time accepted: anything longer is a typo, not a benchmark.
pub const THINK_TIME_MAX: Duration = Duration::from_secs(60);

/// A uniform random wait between `min` and `max` (inclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThinkRange {
    /// Shortest wait.
    pub min: Duration,
    /// Longest wait.
    pub max: Duration,
}

impl ThinkRange {
    /// No wait at all.
    pub const ZERO: ThinkRange = ThinkRange { min: Duration::ZERO, max: Duration::ZERO };

    /// A range from microsecond bounds (presets use it).
    pub const fn from_us(min_us: u64, max_us: u64) -> Self {
        ThinkRange { min: Duration::from_micros(min_us), max: Duration::from_micros(max_us) }
    }

    /// True when the range never waits.
    pub fn is_zero(&self) -> bool {
        self.max.is_zero()
    }

    /// Draws one wait from the range.
    pub fn sample(&self, rng: &mut impl Rng) -> Duration {
        if self.min >= self.max {
            return self.min;
        }
        let min_ns = self.min.as_nanos() as u64;
        let max_ns = self.max.as_nanos() as u64;
        Duration::from_nanos(rng.gen_range(min_ns..=max_ns))
    }

    /// Waits for a drawn time; a zero range returns at once without a syscall.
    pub fn think(&self, rng: &mut impl Rng) {
        if self.is_zero() {
            return;
        }
        // std::thread::sleep overshoots by tens of microseconds, which is small next to
        // the 500 us lower bound of every preset.
        std::thread::sleep(self.sample(rng));
    }
}

fn parse_duration(text: &str, unit: &str, whole: &str) -> Result<Duration, BenchError> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| BenchError::Option(format!("think time {whole:?}: {text:?} is not a number")))?;
    if !value.is_finite() || value < 0.0 {
        return Err(BenchError::Option(format!("think time {whole:?}: {text:?} must be zero or positive")));
    }
    let ns_per_unit = match unit {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "" => {
            return Err(BenchError::Option(format!(
                "think time {whole:?} needs a unit (us, ms or s), e.g. 500-1500us"
            )))
        }
        other => {
            return Err(BenchError::Option(format!(
                "think time {whole:?}: unknown unit {other:?}, expected ns, us, ms or s"
            )))
        }
    };
    let ns = value * ns_per_unit;
    if ns > THINK_TIME_MAX.as_nanos() as f64 {
        return Err(BenchError::Option(format!(
            "think time {whole:?} exceeds the limit of {} s",
            THINK_TIME_MAX.as_secs()
        )));
    }
    Ok(Duration::from_nanos(ns.round() as u64))
}

impl FromStr for ThinkRange {
    type Err = BenchError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let whole = s.trim();
        if whole.is_empty() {
            return Err(BenchError::Option("empty think time; write e.g. 500-1500us or 0".into()));
        }
        if whole.chars().all(|c| c == '0' || c == '.') {
            return Ok(ThinkRange::ZERO);
        }
        let number_end = whole.rfind(|c: char| c.is_ascii_digit() || c == '.').map(|i| i + 1).unwrap_or(0);
        let (numbers, unit) = whole.split_at(number_end);
        let (min_text, max_text) = match numbers.split_once('-') {
            Some((a, b)) => (a, b),
            None => (numbers, numbers),
        };
        let min = parse_duration(min_text, unit.trim(), whole)?;
        let max = parse_duration(max_text, unit.trim(), whole)?;
        if min > max {
            return Err(BenchError::Option(format!("think time {whole:?}: minimum is above maximum")));
        }
        Ok(ThinkRange { min, max })
    }
}

impl fmt::Display for ThinkRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_zero() {
            return f.write_str("0");
        }
        let (min, max) = (self.min.as_micros(), self.max.as_micros());
        if min == max {
            write!(f, "{min}us")
        } else {
            write!(f, "{min}-{max}us")
        }
    }
}

/// The three LIXA workloads; they differ only in t2, the resource managers' work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// t2 = 500-1500 us: fast resource managers, the heaviest load on the TM.
    Extreme,
    /// t2 = 5-15 ms.
    High,
    /// t2 = 50-150 ms: slow resource managers.
    Medium,
}

impl Workload {
    /// t1, the application's think time, the same in every preset.
    pub fn t1(&self) -> ThinkRange {
        ThinkRange::from_us(500, 1500)
    }

    /// t2, the resource managers' simulated work between begin and commit.
    pub fn t2(&self) -> ThinkRange {
        match self {
            Workload::Extreme => ThinkRange::from_us(500, 1500),
            Workload::High => ThinkRange::from_us(5_000, 15_000),
            Workload::Medium => ThinkRange::from_us(50_000, 150_000),
        }
    }

    /// The name on the command line and in reports.
    pub fn name(&self) -> &'static str {
        match self {
            Workload::Extreme => "extreme",
            Workload::High => "high",
            Workload::Medium => "medium",
        }
    }
}

impl FromStr for Workload {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "extreme" => Ok(Workload::Extreme),
            "high" => Ok(Workload::High),
            "medium" => Ok(Workload::Medium),
            other => Err(BenchError::Option(format!(
                "unknown workload {other:?}; expected extreme, high or medium"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn parses_ranges_with_units() {
        assert_eq!("500-1500us".parse::<ThinkRange>().unwrap(), ThinkRange::from_us(500, 1500));
        assert_eq!("5-15ms".parse::<ThinkRange>().unwrap(), ThinkRange::from_us(5_000, 15_000));
        assert_eq!("0.5-1.5ms".parse::<ThinkRange>().unwrap(), ThinkRange::from_us(500, 1500));
        assert_eq!("2s".parse::<ThinkRange>().unwrap(), ThinkRange::from_us(2_000_000, 2_000_000));
        assert_eq!("700 us".parse::<ThinkRange>().unwrap(), ThinkRange::from_us(700, 700));
    }

    #[test]
    fn zero_means_no_wait() {
        for text in ["0", "0.0", "00"] {
            let range = text.parse::<ThinkRange>().unwrap();
            assert!(range.is_zero(), "{text}");
            assert_eq!(range, ThinkRange::ZERO);
        }
        assert!("0-0us".parse::<ThinkRange>().unwrap().is_zero());
    }

    #[test]
    fn rejects_bad_ranges() {
        for text in ["", "1000", "1500-500us", "abc", "5-15h", "-5us", "100s", "1-2-3us", "us"] {
            assert!(text.parse::<ThinkRange>().is_err(), "{text:?} should be rejected");
        }
    }

    #[test]
    fn samples_stay_in_range() {
        let range = ThinkRange::from_us(500, 1500);
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..1000 {
            let d = range.sample(&mut rng);
            assert!(d >= range.min && d <= range.max, "{d:?}");
        }
    }

    #[test]
    fn presets_match_lixa() {
        assert_eq!("extreme".parse::<Workload>().unwrap().t2(), ThinkRange::from_us(500, 1500));
        assert_eq!("high".parse::<Workload>().unwrap().t2(), ThinkRange::from_us(5_000, 15_000));
        assert_eq!("medium".parse::<Workload>().unwrap().t2(), ThinkRange::from_us(50_000, 150_000));
        for w in [Workload::Extreme, Workload::High, Workload::Medium] {
            assert_eq!(w.t1(), ThinkRange::from_us(500, 1500));
            assert_eq!(w.name().parse::<Workload>().unwrap(), w);
        }
        assert!("saturation".parse::<Workload>().is_err());
    }
}
