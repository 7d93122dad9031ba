//! The benchmark's output: the table (header, one row per run, the ratio and summary lines
//! under a thread count, the durability lines before the table) and the same results as
//! JSON lines. Formatting only: what is measured and computed lives in the runner
//! (`mod.rs`), and what is printed where is the caller's choice (`decree bench`).

use super::{DbDurability, RmPoint, RmRatio, RmSummary};
use std::fmt::Write as _;

/// The line, printed before the table, that says how durable a database's local commits are.
pub fn durability_line(d: &DbDurability) -> String {
    if d.durable {
        format!("database {}: {}: local commits are durable", d.side, d.settings)
    } else {
        format!(
            "database {}: {}: local commits are NOT durable, so the independent runs skip a cost the \
             2PC runs pay (decree syncs its decision): the ratio then counts durability as well as \
             atomicity; run the databases durable to measure atomicity alone",
            d.side, d.settings
        )
    }
}

/// One JSON line for a database's durability.
pub fn durability_json(d: &DbDurability) -> String {
    serde_json::to_string(d).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// The table's header line.
pub fn table_header() -> String {
    format!(
        "{:>7} {:<12} {:>10} {:>10} {:>9} {:>9} {:>9} {:>12} {:>12} {:>12} {:>13} {:>6}\n{}",
        "threads",
        "mode",
        "transfers",
        "tps",
        "p50_us",
        "p95_us",
        "p99_us",
        "xfer_p50_us",
        "xfer_p99_us",
        "cpu_us/xfer",
        "host_us/xfer",
        "steal%",
        "-".repeat(131)
    )
}

/// One table row (commit latency percentiles, then the whole transfer's), followed for a
/// 2PC run by what its decisions cost the disk.
pub fn table_row(p: &RmPoint) -> String {
    let unknown = || "-".to_string();
    let mut row = format!(
        "{:>7} {:<12} {:>10} {:>10.1} {:>9.1} {:>9.1} {:>9.1} {:>12.1} {:>12.1} {:>12.1} {:>13} {:>6}",
        p.threads,
        p.mode,
        p.transfers,
        p.tps,
        p.p50_us,
        p.p95_us,
        p.p99_us,
        p.transfer_p50_us,
        p.transfer_p99_us,
        p.cpu_us_per_transfer,
        p.host_cpu_us_per_transfer.map_or_else(unknown, |us| format!("{us:.1}")),
        p.steal_pct.map_or_else(unknown, |pct| format!("{pct:.1}")),
    );
    if let Some(writes) = &p.log_writes {
        let _ = write!(row, "\n{:>7} {:<12} {}", "", "  log", writes.describe("transfer"));
    }
    row
}

/// The ratio lines under a thread count's three rows.
pub fn ratio_line(r: &RmRatio) -> String {
    format!(
        "{:>7} {:<12} native-2pc/independent tps = {:.2}x: the databases' own price, the ceiling\n\
         {:>7} {:<12} 2pc/independent tps = {:.2}x ({:.2} of the native ceiling), CPU per transfer = {:.2}x \
         (application) {:.2}x (machine)",
        r.threads,
        "ceiling",
        r.native_ratio,
        r.threads,
        "ratio",
        r.ratio,
        r.of_native,
        r.cpu_ratio,
        r.host_cpu_ratio
    )
}

/// The summary line under a thread count's rounds.
pub fn summary_line(s: &RmSummary) -> String {
    format!(
        "{:>7} {:<12} 2pc/independent tps over {} rounds: median {:.2}x (lowest {:.2}x, highest {:.2}x); \
         medians: native ceiling {:.2}x, {:.2} of it, machine CPU per transfer {:.2}x",
        s.threads,
        "median",
        s.rounds,
        s.ratio_median,
        s.ratio_min,
        s.ratio_max,
        s.native_ratio_median,
        s.of_native_median,
        s.host_cpu_ratio_median
    )
}

/// One JSON line for a summary.
pub fn summary_json(s: &RmSummary) -> String {
    serde_json::to_string(s).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// One JSON line for a run.
pub fn point_json(p: &RmPoint) -> String {
    serde_json::to_string(p).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// One JSON line for a ratio.
pub fn ratio_json(r: &RmRatio) -> String {
    serde_json::to_string(r).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log_use::LogWrites;
    use crate::rm_bench::RmMode;

    #[test]
    fn json_has_the_documented_fields() {
        let p = RmPoint {
            threads: 4,
            mode: RmMode::TwoPhase.name(),
            transfers: 10,
            elapsed_s: 1.0,
            tps: 10.0,
            p50_us: 1.0,
            p95_us: 2.0,
            p99_us: 3.0,
            transfer_p50_us: 4.0,
            transfer_p99_us: 5.0,
            cpu_us_per_transfer: 6.0,
            host_cpu_us_per_transfer: Some(12.5),
            steal_pct: None,
            log_writes: Some(LogWrites {
                log_writes_per_commit: 0.75,
                log_write_p50_us: Some(180),
                log_write_p95_us: Some(320),
            }),
        };
        let v: serde_json::Value = serde_json::from_str(&point_json(&p)).expect("valid JSON");
        assert_eq!(v["log_writes_per_commit"].as_f64(), Some(0.75));
        assert_eq!(v["host_cpu_us_per_transfer"].as_f64(), Some(12.5));
        assert!(v["steal_pct"].is_null(), "unknown steal is null: {v}");
        assert!(
            table_row(&p).lines().next().is_some_and(|l| l.ends_with("6.0          12.5      -")),
            "{p:?}"
        );
        assert!(table_row(&p)
            .ends_with("0.75 synced log writes per transfer, each p50 180 / p95 320 us under this load"));
        let independent = RmPoint { mode: RmMode::Independent.name(), log_writes: None, ..p.clone() };
        assert!(serde_json::from_str::<serde_json::Value>(&point_json(&independent))
            .expect("JSON")
            .get("log_writes_per_commit")
            .is_none());
        assert!(!table_row(&independent).contains('\n'), "one line for a run without a log");
        for key in ["threads", "mode", "tps", "p50_us", "p95_us", "p99_us"] {
            assert!(v.get(key).is_some(), "{key} missing in {v}");
        }
        assert_eq!(v["mode"], "2pc");
        let ratio = RmRatio {
            threads: 4,
            round: 1,
            ratio: 0.5,
            cpu_ratio: 2.25,
            native_ratio: 0.625,
            of_native: 0.8,
            host_cpu_ratio: 1.5,
        };
        let r: serde_json::Value = serde_json::from_str(&ratio_json(&ratio)).expect("valid JSON");
        assert_eq!((r["ratio"].as_f64(), r["cpu_ratio"].as_f64()), (Some(0.5), Some(2.25)));
        assert_eq!((r["native_ratio"].as_f64(), r["of_native"].as_f64()), (Some(0.625), Some(0.8)));
        assert_eq!(r["host_cpu_ratio"].as_f64(), Some(1.5));
        let line = ratio_line(&ratio);
        assert!(line.contains("native-2pc/independent tps = 0.62x"), "{line}");
        assert!(
            line.ends_with(
                "tps = 0.50x (0.80 of the native ceiling), CPU per transfer = 2.25x (application) 1.50x (machine)"
            ),
            "{line}"
        );
    }
}
