//! What a run's commits cost the coordinator's own log: its synced writes and how long
//! they took under the run's load. Both benchmarks that own a log (`decree bench` embedded,
//! `decree bench --rm`) report it the same way, next to their same-run floors.

use decree_log::{Log, WriteTimes};
use serde::Serialize;

/// Totals read from a log at one moment; two of them bracket a run.
#[derive(Debug, Clone, Default)]
pub struct LogUse {
    /// Durable flushes (synced writes) so far.
    pub flushes: u64,
    /// Their durations so far.
    pub write_times: WriteTimes,
}

impl LogUse {
    /// The log's totals now.
    pub fn of(log: &dyn Log) -> LogUse {
        LogUse { flushes: log.stats().flushes, write_times: log.write_times() }
    }

    /// What happened since `earlier`, a reading of the same log.
    pub fn since(&self, earlier: &LogUse) -> LogUse {
        LogUse {
            flushes: self.flushes.saturating_sub(earlier.flushes),
            write_times: self.write_times.since(&earlier.write_times),
        }
    }

    /// The report for a run that committed `commits` transactions (None without commits).
    pub fn per_commit(&self, commits: u64) -> Option<LogWrites> {
        (commits > 0).then(|| LogWrites {
            log_writes_per_commit: self.flushes as f64 / commits as f64,
            log_write_p50_us: self.write_times.quantile_us(0.50),
            log_write_p95_us: self.write_times.quantile_us(0.95),
        })
    }
}

/// The per-run report, flattened into a run's JSON object.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LogWrites {
    /// Synced log writes per commit: one decision per commit at most, fewer when group
    /// commit batches them.
    pub log_writes_per_commit: f64,
    /// Median time of those writes in us (the journal under rpo 0 times them): the device
    /// under the run's own load, to set beside the idle floor.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_write_p50_us: Option<u64>,
    /// Their 95th percentile in us.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_write_p95_us: Option<u64>,
}

impl LogWrites {
    /// "0.55 synced log writes per commit, each p50 160 / p95 270 us under this load", with
    /// `unit` in place of "commit".
    pub fn describe(&self, unit: &str) -> String {
        let mut text = format!("{:.2} synced log writes per {unit}", self.log_writes_per_commit);
        if let (Some(p50), Some(p95)) = (self.log_write_p50_us, self.log_write_p95_us) {
            text.push_str(&format!(", each p50 {p50} / p95 {p95} us under this load"));
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_without_commits_reports_nothing_and_text_follows_the_unit() {
        assert_eq!(LogUse { flushes: 3, ..LogUse::default() }.per_commit(0), None);
        let writes = LogUse { flushes: 3, ..LogUse::default() }.per_commit(4).expect("commits");
        assert_eq!(writes.log_writes_per_commit, 0.75);
        assert_eq!(writes.describe("transfer"), "0.75 synced log writes per transfer");
        let timed = LogWrites { log_write_p50_us: Some(180), log_write_p95_us: Some(320), ..writes };
        assert_eq!(
            timed.describe("commit"),
            "0.75 synced log writes per commit, each p50 180 / p95 320 us under this load"
        );
    }
}
