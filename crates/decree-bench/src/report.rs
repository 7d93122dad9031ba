//! Text and JSON output of both benchmarks.
//!
//! JSON is one object per line (JSON Lines), so a run can be piped into other tools while
//! it goes on; the table formats print each row as soon as its run ends. Neither holds
//! more than the current line: reports of long sweeps cost no memory.

use crate::compare::{ModeSummary, Spread};
use crate::log_bench::{LogPoint, RAW_ENGINE};
use crate::pair::Promotion;
use crate::stats::Summary;
use crate::tx::{BenchPoint, Skipped};
use crate::write_floor::{journal_floor, WriteFloor, RAW_DIRECT_IDLE};
use std::fmt::Write as _;

/// One JSON line for a log-benchmark result.
pub fn log_json(point: &LogPoint) -> String {
    // Serializing a struct of numbers and strings cannot fail.
    serde_json::to_string(point).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// One JSON line for a transaction-benchmark result.
pub fn bench_json(point: &BenchPoint) -> String {
    serde_json::to_string(point).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// The line that tells an engine was skipped (or failed) and why.
pub fn skipped_line(skipped: &Skipped) -> String {
    let what = if skipped.failed { "FAILED" } else { "skipped" };
    let mode = skipped.mode.as_ref().map(|m| format!(" mode={m}")).unwrap_or_default();
    format!(
        "{what}: engine {} rpo={}ms threads={}{mode}: {}",
        skipped.engine, skipped.rpo_ms, skipped.threads, skipped.reason
    )
}

/// The log-benchmark table, printed row by row; remembers the reference for the ratios.
#[derive(Debug, Default)]
pub struct LogTable {
    raw_records_per_sec: Option<f64>,
}

impl LogTable {
    /// The header line.
    pub fn header(&self) -> String {
        format!(
            "{:<14} {:>7} {:>6} {:>12} {:>10} {:>10} {:>10} {:>8}",
            "engine", "threads", "rpo_ms", "records/s", "p50_us", "p99_us", "p99.9_us", "vs_raw"
        )
    }

    /// One row; the reference row sets the denominator of later ratios.
    pub fn row(&mut self, point: &LogPoint) -> String {
        if point.engine == RAW_ENGINE {
            self.raw_records_per_sec = Some(point.records_per_sec);
        }
        let ratio = match self.raw_records_per_sec {
            Some(raw) if raw > 0.0 => format!("{:.2}x", point.records_per_sec / raw),
            _ => "-".into(),
        };
        format!(
            "{:<14} {:>7} {:>6} {:>12.1} {:>10.1} {:>10.1} {:>10.1} {:>8}",
            point.engine,
            point.threads,
            point.rpo_ms,
            point.records_per_sec,
            point.p50_us,
            point.p99_us,
            point.p999_us,
            ratio
        )
    }
}

/// The transaction-benchmark table: a header, then one block of five lines per run (and
/// the connection times of a state server's run).
pub fn bench_header() -> String {
    format!(
        "{:<12} {:<9} {:>6} {:>7} {:>10} {:<7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}\n{}",
        "engine",
        "mode",
        "rpo_ms",
        "threads",
        "tps",
        "call",
        "p25_us",
        "p50_us",
        "p75_us",
        "p95_us",
        "p99_us",
        "avg_us",
        "stddev_us",
        "-".repeat(128)
    )
}

/// The block of one run: open, begin, commit, close and total lines; for a state server,
/// then the time to open a connection to it (`connect`: a full TLS handshake in the tls
/// mode) and, in the tls mode, to open one that resumes a TLS session (`resumed`); for a
/// pair, then its promotion line ([`promotion_line`]).
pub fn bench_block(point: &BenchPoint) -> String {
    let mut out = String::new();
    let mut calls: Vec<(&str, &Summary)> = vec![
        ("open", &point.open),
        ("begin", &point.begin),
        ("commit", &point.commit),
        ("close", &point.close),
        ("total", &point.total),
    ];
    if let Some(handshake) = &point.handshake {
        calls.push(("connect", &handshake.connect));
        calls.extend(handshake.resumed.as_ref().map(|resumed| ("resumed", resumed)));
    }
    for (i, (call, s)) in calls.iter().enumerate() {
        let (engine, mode, rpo, threads, tps) = if i == 0 {
            (
                point.engine.clone(),
                point.mode.clone(),
                point.rpo_ms.to_string(),
                point.threads.to_string(),
                format!("{:.1}", point.tps),
            )
        } else {
            Default::default()
        };
        let _ = writeln!(
            out,
            "{engine:<12} {mode:<9} {rpo:>6} {threads:>7} {tps:>10} {call:<7} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
            s.p25, s.p50, s.p75, s.p95, s.p99, s.avg, s.stddev
        );
    }
    if let Some(promotion) = &point.promotion {
        let _ = writeln!(out, "{}", promotion_line(promotion));
    }
    out
}

/// What promoting a pair's member 1 took before a run, each time from sending `promote`.
pub fn promotion_line(p: &Promotion) -> String {
    format!(
        "promotion: first decision acknowledged by the promoted member {:.1} ms after promote (answered \
         {:.1} ms, strict with its backup {:.1} ms)",
        p.first_decision_ms, p.answered_ms, p.strict_ms
    )
}

/// The characteristic curve as text, one line per run: what LIXA's charts plot (tps
/// against the p95 of the total latency the TM adds), in milliseconds.
pub fn bench_summary(points: &[BenchPoint]) -> String {
    let mut out = format!(
        "{:<12} {:<9} {:>6} {:>7} {:>10} {:>12} {:>12} {:>12}\n",
        "engine", "mode", "rpo_ms", "threads", "tps", "total_p50_ms", "total_p95_ms", "total_p99_ms"
    );
    for p in points {
        let _ = writeln!(
            out,
            "{:<12} {:<9} {:>6} {:>7} {:>10.1} {:>12.3} {:>12.3} {:>12.3}",
            p.engine,
            p.mode,
            p.rpo_ms,
            p.threads,
            p.tps,
            p.total.p50 / 1e3,
            p.total.p95 / 1e3,
            p.total.p99 / 1e3
        );
    }
    out
}

/// The fixed-rate table, one line per run: target and achieved rate, commit latency from
/// the scheduled time and the service time of tx_commit, in microseconds.
pub fn rate_summary(points: &[BenchPoint]) -> String {
    let mut out = format!(
        "{:<14} {:<9} {:>6} {:>7} {:>10} {:>10} {:>9} {:>9} {:>10} {:>11} {:>11} {:>12}\n",
        "engine",
        "mode",
        "rpo_ms",
        "threads",
        "rate",
        "achieved",
        "p50_us",
        "p99_us",
        "p99.9_us",
        "svc_p50_us",
        "svc_p99_us",
        "svc_p99.9_us"
    );
    for p in points {
        let Some(r) = &p.rate else { continue };
        let _ = writeln!(
            out,
            "{:<14} {:<9} {:>6} {:>7} {:>10.1} {:>10.1} {:>9.1} {:>9.1} {:>10.1} {:>11.1} {:>11.1} {:>12.1}",
            p.engine,
            p.mode,
            p.rpo_ms,
            p.threads,
            r.rate_target,
            r.rate_achieved,
            r.commit_p50_us,
            r.commit_p99_us,
            r.commit_p999_us,
            r.commit_service_p50_us,
            r.commit_service_p99_us,
            r.commit_service_p999_us
        );
    }
    out
}

/// The raw round trips measured next to the fixed-rate runs, as rows of the fixed-rate
/// table (engine column "raw-round-trip", the transport in the mode column's place), then
/// each run's median and 99.9th percentile as multiples of its own reference.
pub fn round_trip_summary(points: &[BenchPoint]) -> String {
    let mut out = String::new();
    for r in points.iter().filter_map(|p| p.round_trip_floor.as_ref()) {
        let _ = writeln!(
            out,
            "{:<14} {:<9} {:>6} {:>7} {:>10.1} {:>10.1} {:>9.1} {:>9.1} {:>10.1} {:>11.1} {:>11.1} {:>12.1}",
            r.reference,
            r.transport,
            "-",
            r.threads,
            r.rate_target,
            r.rate_achieved,
            r.p50_us,
            r.p99_us,
            r.p999_us,
            r.service_p50_us,
            r.service_p99_us,
            r.service_p999_us
        );
    }
    for p in points {
        let (Some(rate), Some(r)) = (&p.rate, &p.round_trip_floor) else { continue };
        if r.p50_us > 0.0 && r.p999_us > 0.0 {
            let _ = writeln!(
                out,
                "{} {} rpo={}ms threads={}: p50 {:.2}x and p99.9 {:.2}x the raw {} round trip's; p99.9 {:.1}x its own p50",
                p.engine,
                p.mode,
                p.rpo_ms,
                p.threads,
                rate.commit_p50_us / r.p50_us,
                rate.commit_p999_us / r.p999_us,
                r.transport,
                rate.commit_p999_us / rate.commit_p50_us.max(f64::MIN_POSITIVE)
            );
        }
    }
    out
}

/// The raw synced-write references, then, for every run at `rpo = 0` on a durable engine,
/// its total p95 as a multiple of the journal's floor (the direct write when measured).
pub fn write_floor_summary(points: &[BenchPoint], floors: &[WriteFloor]) -> String {
    let mut out =
        format!("{:<14} {:>10} {:>9} {:>9} {:>9}\n", "reference", "writes/s", "p50_us", "p95_us", "p99_us");
    for f in floors {
        let _ = writeln!(
            out,
            "{:<14} {:>10.1} {:>9.1} {:>9.1} {:>9.1}",
            f.reference, f.writes_per_sec, f.p50_us, f.p95_us, f.p99_us
        );
    }
    let Some(floor) = journal_floor(floors).filter(|f| f.p95_us > 0.0) else { return out };
    let idle = floors.iter().find(|f| f.reference == RAW_DIRECT_IDLE && f.p95_us > 0.0);
    for p in points.iter().filter(|p| p.rpo_ms == 0 && p.engine != "volatile") {
        let _ = write!(
            out,
            "{} {} rpo=0ms threads={}: total p95 {:.3} ms = {:.2}x the {} write's p95",
            p.engine,
            p.mode,
            p.threads,
            p.total.p95 / 1000.0,
            p.total.p95 / floor.p95_us,
            floor.reference
        );
        if let Some(idle) = idle {
            let _ = write!(out, ", {:.2}x the {}'s", p.total.p95 / idle.p95_us, idle.reference);
        }
        if let Some(writes) = &p.log_writes {
            let _ = write!(out, "; {}", writes.describe("commit"));
        }
        out.push('\n');
    }
    out
}

/// `median<unit> (lowest-highest)` with `digits` decimals.
fn spread_text(s: &Spread, digits: usize, unit: &str) -> String {
    format!("{:.digits$}{unit} ({:.digits$}-{:.digits$})", s.median, s.min, s.max)
}

/// The lines of one mode over the rounds of a thread count: its medians (with their
/// range), its connection times, and its ratios to the first mode.
pub fn mode_summary_lines(s: &ModeSummary) -> String {
    let mut out = format!(
        "{} {} rpo={}ms threads={}, {} round(s), median (lowest-highest): tps {}, total p95 {}",
        s.mode,
        s.engine,
        s.rpo_ms,
        s.threads,
        s.rounds,
        spread_text(&s.tps, 1, ""),
        spread_text(&s.total_p95_us, 1, " us")
    );
    if let Some(p50) = &s.commit_p50_us {
        let _ = write!(out, ", commit p50 at the fixed rate {}", spread_text(p50, 1, " us"));
    }
    if let Some(p50) = &s.round_trip_p50_us {
        let _ = write!(out, ", bare round trip p50 {}", spread_text(p50, 1, " us"));
    }
    if let (Some(p50), Some(p95)) = (&s.connect_p50_us, &s.connect_p95_us) {
        let what = if s.resumed_p50_us.is_some() { "connect with a full TLS handshake" } else { "connect" };
        let _ = write!(out, "\n    {what}: p50 {:.1} us, p95 {:.1} us", p50.median, p95.median);
    }
    if let (Some(p50), Some(p95)) = (&s.resumed_p50_us, &s.resumed_p95_us) {
        let _ = write!(out, "; resuming a TLS session: p50 {:.1} us, p95 {:.1} us", p50.median, p95.median);
    }
    if let (Some(first), Some(strict)) = (&s.promotion_ms, &s.strict_ms) {
        let _ = write!(
            out,
            "\n    promotion to the first decision acknowledged {}; strict with its backup {}",
            spread_text(first, 1, " ms"),
            spread_text(strict, 1, " ms")
        );
    }
    if let (Some(versus), Some(tps)) = (&s.versus, &s.tps_ratio) {
        let _ = write!(out, "\n    {}/{versus}: tps {}", s.mode, spread_text(tps, 2, "x"));
        if let Some(p95) = &s.total_p95_ratio {
            let _ = write!(out, ", total p95 {}", spread_text(p95, 2, "x"));
        }
        if let Some(p50) = &s.commit_p50_ratio {
            let _ = write!(out, ", commit p50 at the fixed rate {}", spread_text(p50, 2, "x"));
        }
        if let Some(p50) = &s.round_trip_p50_ratio {
            let _ = write!(out, "; bare round trip p50 {} (the transport alone)", spread_text(p50, 2, "x"));
        }
    }
    out
}

/// One JSON line for a mode's summary.
pub fn mode_summary_json(s: &ModeSummary) -> String {
    serde_json::to_string(s).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(engine: &str, records_per_sec: f64) -> LogPoint {
        LogPoint {
            engine: engine.into(),
            threads: 1,
            rpo_ms: 0,
            records_per_sec,
            p50_us: 1.0,
            p95_us: 1.5,
            p99_us: 2.0,
            p999_us: 3.0,
        }
    }

    #[test]
    fn log_table_ratios_follow_the_reference() {
        let mut table = LogTable::default();
        assert!(table.row(&point("journal", 10.0)).ends_with(" -"), "no reference yet");
        assert!(table.row(&point(RAW_ENGINE, 4000.0)).ends_with("1.00x"));
        assert!(table.row(&point("journal", 6000.0)).ends_with("1.50x"));
        assert_eq!(table.header().split_whitespace().count(), 8);
    }
}
