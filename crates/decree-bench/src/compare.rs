//! Modes side by side: the figures of alternated rounds, as medians with their range, and
//! each mode's ratios to the first mode of `--mode` (`decree bench --mode tcp,tls
//! --rounds 3`: what TLS costs next to plaintext TCP). A mode here is a [`Variant`]: with
//! `--replicas 1,2` a single server and a primary + backup pair alternate the same way
//! (`--mode unix --replicas 1,2`: what the backup costs next to one server).
//!
//! On a shared or virtual machine the speed drifts by tens of percent within a minute, so
//! one run of each mode says little. Every round runs every mode once, each round starting
//! with the next mode ([`round_order`]), and a ratio is taken within a round, between runs
//! close in time; the summary gives the median of the rounds' ratios and the lowest and
//! highest. Computation only: the runs are made in [`crate::tx`], the lines printed by
//! [`crate::report`].

use crate::client::Variant;
use crate::tx::BenchPoint;
use serde::Serialize;

/// The order of `modes` modes in round `round` (0-based): each round starts one mode
/// further, so that every mode takes each place equally often.
pub fn round_order(round: usize, modes: usize) -> Vec<usize> {
    (0..modes).map(|place| (round + place) % modes).collect()
}

/// One figure over the rounds: median, lowest and highest.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    /// The median (the mean of the two middle values for an even count).
    pub median: f64,
    /// The lowest value.
    pub min: f64,
    /// The highest value.
    pub max: f64,
}

impl Spread {
    /// The spread of `values`; `None` when there are none.
    pub fn of(values: &[f64]) -> Option<Spread> {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let (&min, &max) = (sorted.first()?, sorted.last()?);
        let mid = sorted.len() / 2;
        let median = if sorted.len() % 2 == 1 { sorted[mid] } else { (sorted[mid - 1] + sorted[mid]) / 2.0 };
        Some(Spread { median, min, max })
    }
}

/// One mode's runs at one engine, RPO and thread count, over the rounds (one JSON line).
#[derive(Debug, Clone, Serialize)]
pub struct ModeSummary {
    /// Always "modes", so that JSON readers tell it from a run's line.
    pub summary: &'static str,
    /// Log engine.
    pub engine: String,
    /// Recovery point objective in milliseconds.
    pub rpo_ms: u64,
    /// Threads of the runs.
    pub threads: usize,
    /// The mode summarised (`unix-pair` for a pair).
    pub mode: String,
    /// Servers holding each decision (2 for a pair).
    pub replicas: usize,
    /// Rounds with a run of this mode.
    pub rounds: usize,
    /// Completed cycles per second.
    pub tps: Spread,
    /// 95th percentile of the total latency the TM adds per cycle, in us.
    pub total_p95_us: Spread,
    /// Fixed rate only: median commit latency from its scheduled time, in us.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit_p50_us: Option<Spread>,
    /// Fixed rate only: the median of the bare round trip measured beside each run
    /// ([`crate::round_trip`]: over TLS for the tls mode), in us.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub round_trip_p50_us: Option<Spread>,
    /// State servers only: median time to open a connection (a full TLS handshake in the
    /// tls mode), in us.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connect_p50_us: Option<Spread>,
    /// State servers only: 95th percentile of the same, in us.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connect_p95_us: Option<Spread>,
    /// tls only: median time to open a connection that resumes a TLS session, in us.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resumed_p50_us: Option<Spread>,
    /// tls only: 95th percentile of the same, in us.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resumed_p95_us: Option<Spread>,
    /// A pair only: milliseconds from `promote` to the first decision acknowledged by the
    /// promoted member, one promotion per run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub promotion_ms: Option<Spread>,
    /// A pair only: milliseconds from `promote` until the primary was strict.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strict_ms: Option<Spread>,
    /// The mode the ratios divide by (the first of `--mode`); `None` for that mode itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub versus: Option<String>,
    /// This mode's tps over the reference's, per round.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tps_ratio: Option<Spread>,
    /// This mode's total p95 over the reference's, per round.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_p95_ratio: Option<Spread>,
    /// Fixed rate only: this mode's commit p50 over the reference's, per round.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit_p50_ratio: Option<Spread>,
    /// Fixed rate only: this mode's bare round trip p50 over the reference's, per round:
    /// what the transport alone costs (`--mode tcp,tls`: TLS without decree).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub round_trip_p50_ratio: Option<Spread>,
}

/// A figure of a run, picked out of its point (`None` where the run has no such figure).
type Figure = fn(&BenchPoint) -> Option<f64>;

/// The spread of `figure` over `runs`; `None` when no run has it.
fn spread(runs: &[&BenchPoint], figure: Figure) -> Option<Spread> {
    Spread::of(&runs.iter().filter_map(|p| figure(p)).collect::<Vec<_>>())
}

/// The spread of `figure`'s ratio between each run of `runs` and the run of `reference`
/// in the same round; `None` when no round has both (or the reference's figure is 0).
fn ratio(runs: &[&BenchPoint], reference: &[&BenchPoint], figure: Figure) -> Option<Spread> {
    let ratios: Vec<f64> = runs
        .iter()
        .filter_map(|run| {
            let base = reference.iter().find(|r| r.round == run.round).and_then(|r| figure(r))?;
            (base > 0.0).then(|| figure(run).map(|value| value / base)).flatten()
        })
        .collect();
    Spread::of(&ratios)
}

/// One summary per variant of `modes` that has runs in `points` (the runs of one engine,
/// RPO and thread count, every round), in the order of `modes`; the ratios of every
/// variant but the first are to the first.
pub fn summaries(modes: &[Variant], points: &[BenchPoint]) -> Vec<ModeSummary> {
    let runs_of = |mode: &Variant| points.iter().filter(|p| p.mode == mode.name()).collect::<Vec<_>>();
    let reference = modes.first().map(runs_of).unwrap_or_default();
    let mut out = Vec::new();
    for (index, mode) in modes.iter().enumerate() {
        let runs = runs_of(mode);
        let Some(first) = runs.first() else { continue };
        let versus = (index > 0).then_some(&reference[..]);
        let compared = |figure: Figure| versus.and_then(|reference| ratio(&runs, reference, figure));
        let tps: Figure = |p| Some(p.tps);
        let total_p95: Figure = |p| Some(p.total.p95);
        let commit_p50: Figure = |p| p.rate.map(|r| r.commit_p50_us);
        let round_trip_p50: Figure = |p| p.round_trip_floor.as_ref().map(|r| r.p50_us);
        out.push(ModeSummary {
            summary: "modes",
            engine: first.engine.clone(),
            rpo_ms: first.rpo_ms,
            threads: first.threads,
            mode: mode.name(),
            replicas: mode.replicas.count,
            rounds: runs.len(),
            tps: spread(&runs, tps).unwrap_or(Spread { median: 0.0, min: 0.0, max: 0.0 }),
            total_p95_us: spread(&runs, total_p95).unwrap_or(Spread { median: 0.0, min: 0.0, max: 0.0 }),
            commit_p50_us: spread(&runs, commit_p50),
            round_trip_p50_us: spread(&runs, round_trip_p50),
            connect_p50_us: spread(&runs, |p| p.handshake.map(|h| h.connect.p50)),
            connect_p95_us: spread(&runs, |p| p.handshake.map(|h| h.connect.p95)),
            resumed_p50_us: spread(&runs, |p| p.handshake.and_then(|h| h.resumed).map(|r| r.p50)),
            resumed_p95_us: spread(&runs, |p| p.handshake.and_then(|h| h.resumed).map(|r| r.p95)),
            promotion_ms: spread(&runs, |p| p.promotion.map(|p| p.first_decision_ms)),
            strict_ms: spread(&runs, |p| p.promotion.map(|p| p.strict_ms)),
            versus: (index > 0).then(|| modes[0].name()),
            tps_ratio: compared(tps),
            total_p95_ratio: compared(total_p95),
            commit_p50_ratio: compared(commit_p50),
            round_trip_p50_ratio: compared(round_trip_p50),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Mode;
    use crate::pair::Promotion;
    use crate::stats::Summary;
    use crate::tx::{RunLatencies, RunResult};
    use decree_log::EngineKind;
    use std::time::Duration;

    fn run(mode: Mode, round: usize, tps: f64, p95: f64) -> BenchPoint {
        let result = RunResult {
            threads: 4,
            cycles: tps as u64,
            elapsed: Duration::from_secs(1),
            latencies: RunLatencies::default(),
            log_use: None,
        };
        let mut point = BenchPoint::new(EngineKind::Journal, 0, mode, 2, &result);
        point.round = round;
        point.total = Summary { p95, ..point.total };
        point
    }

    #[test]
    fn rounds_rotate_the_modes() {
        let orders: Vec<Vec<usize>> = (0..3).map(|r| round_order(r, 2)).collect();
        assert_eq!(orders, vec![vec![0, 1], vec![1, 0], vec![0, 1]]);
        assert_eq!(round_order(4, 3), vec![1, 2, 0]);
        assert_eq!(round_order(5, 1), vec![0]);
    }

    #[test]
    fn spreads_are_medians_with_their_range() {
        assert_eq!(Spread::of(&[]), None);
        assert_eq!(Spread::of(&[3.0, 1.0, 2.0]), Some(Spread { median: 2.0, min: 1.0, max: 3.0 }));
        assert_eq!(Spread::of(&[4.0, 1.0]), Some(Spread { median: 2.5, min: 1.0, max: 4.0 }));
    }

    #[test]
    fn ratios_are_taken_within_a_round_against_the_first_mode() {
        let points = vec![
            run(Mode::Tcp, 1, 1000.0, 100.0),
            run(Mode::Tls, 1, 900.0, 110.0),
            run(Mode::Tls, 2, 800.0, 100.0),
            run(Mode::Tcp, 2, 1000.0, 100.0),
            run(Mode::Tcp, 3, 500.0, 200.0),
            run(Mode::Tls, 3, 475.0, 240.0),
        ];
        let both = summaries(&[Variant::single(Mode::Tcp), Variant::single(Mode::Tls)], &points);
        assert_eq!(both.len(), 2);
        let (tcp, tls) = (&both[0], &both[1]);
        assert_eq!((tcp.mode.as_str(), tcp.rounds, tcp.versus.as_deref()), ("tcp", 3, None));
        assert_eq!(tcp.tps, Spread { median: 1000.0, min: 500.0, max: 1000.0 });
        assert!(tcp.tps_ratio.is_none() && tcp.commit_p50_us.is_none() && tcp.connect_p50_us.is_none());
        assert_eq!(tls.versus.as_deref(), Some("tcp"));
        let tps = tls.tps_ratio.expect("a ratio per round");
        assert!((tps.median - 0.9).abs() < 1e-9 && (tps.min - 0.8).abs() < 1e-9, "{tps:?}");
        assert!((tps.max - 0.95).abs() < 1e-9, "{tps:?}");
        let p95 = tls.total_p95_ratio.expect("a ratio per round");
        assert!((p95.median - 1.1).abs() < 1e-9 && (p95.min - 1.0).abs() < 1e-9, "{p95:?}");
        assert!((p95.max - 1.2).abs() < 1e-9, "{p95:?}");
        assert!(tls.commit_p50_ratio.is_none(), "no fixed rate, no commit p50 ratio");
        let json = serde_json::to_value(tls).expect("JSON");
        assert_eq!((json["summary"].as_str(), json["versus"].as_str()), (Some("modes"), Some("tcp")));
        assert!(json.get("commit_p50_us").is_none(), "{json}");
        assert!(summaries(&[Variant::single(Mode::Unix)], &points).is_empty(), "no runs, no summary");
    }

    #[test]
    fn the_bare_round_trips_beside_the_runs_are_compared_within_each_round_too() {
        let floored = |mut point: BenchPoint, p50_us: f64| {
            point.round_trip_floor = Some(crate::round_trip::RoundTripPoint {
                reference: crate::round_trip::REFERENCE_NAME,
                transport: if point.mode == "tls" { "tls" } else { "tcp" },
                threads: 4,
                rate_target: 10_000.0,
                round_trips: 1,
                rate_achieved: 10_000.0,
                p50_us,
                p99_us: p50_us,
                p999_us: p50_us,
                service_p50_us: p50_us,
                service_p99_us: p50_us,
                service_p999_us: p50_us,
            });
            point
        };
        let points = vec![
            floored(run(Mode::Tcp, 1, 1000.0, 100.0), 20.0),
            floored(run(Mode::Tls, 1, 1000.0, 100.0), 25.0),
            floored(run(Mode::Tls, 2, 1000.0, 100.0), 22.0),
            floored(run(Mode::Tcp, 2, 1000.0, 100.0), 40.0),
        ];
        let both = summaries(&[Variant::single(Mode::Tcp), Variant::single(Mode::Tls)], &points);
        let (tcp, tls) = (&both[0], &both[1]);
        assert_eq!(tcp.round_trip_p50_us, Some(Spread { median: 30.0, min: 20.0, max: 40.0 }));
        assert!(tcp.round_trip_p50_ratio.is_none(), "the reference has no ratio");
        let ratio = tls.round_trip_p50_ratio.expect("a ratio per round");
        // Round 1: 25 / 20; round 2: 22 / 40 (within the round, not the medians' 23.5 / 30).
        assert!((ratio.max - 1.25).abs() < 1e-9 && (ratio.min - 0.55).abs() < 1e-9, "{ratio:?}");
        let json = serde_json::to_value(tls).expect("JSON");
        assert_eq!(json["round_trip_p50_us"]["median"].as_f64(), Some(23.5));
        let lines = crate::report::mode_summary_lines(tls);
        assert!(lines.contains("bare round trip p50 0.90x (0.55-1.25) (the transport alone)"), "{lines}");
    }

    #[test]
    fn a_pair_is_compared_to_the_single_server_with_its_promotion_times() {
        let pair = Variant { mode: Mode::Unix, replicas: crate::client::Replicas::PAIR };
        let promoted = |mut point: BenchPoint, first_decision_ms: f64| {
            (point.mode, point.replicas) = (pair.name(), 2);
            point.promotion = Some(Promotion { answered_ms: 1.0, first_decision_ms, strict_ms: 40.0 });
            point
        };
        let points = vec![
            run(Mode::Unix, 1, 1000.0, 100.0),
            promoted(run(Mode::Unix, 1, 700.0, 150.0), 5.0),
            promoted(run(Mode::Unix, 2, 600.0, 200.0), 9.0),
            run(Mode::Unix, 2, 1000.0, 100.0),
        ];
        let both = summaries(&[Variant::single(Mode::Unix), pair], &points);
        let (single, paired) = (&both[0], &both[1]);
        assert_eq!((single.mode.as_str(), single.replicas, single.promotion_ms), ("unix", 1, None));
        assert_eq!((paired.mode.as_str(), paired.replicas, paired.rounds), ("unix-pair", 2, 2));
        assert_eq!(paired.versus.as_deref(), Some("unix"));
        assert_eq!(paired.promotion_ms, Some(Spread { median: 7.0, min: 5.0, max: 9.0 }));
        assert_eq!(paired.strict_ms.map(|s| s.median), Some(40.0));
        let tps = paired.tps_ratio.expect("a ratio per round");
        assert!((tps.median - 0.65).abs() < 1e-9 && (tps.min - 0.6).abs() < 1e-9, "{tps:?}");
        let json = serde_json::to_value(paired).expect("JSON");
        assert_eq!(
            (json["replicas"].as_u64(), json["promotion_ms"]["median"].as_f64()),
            (Some(2), Some(7.0))
        );
    }
}
