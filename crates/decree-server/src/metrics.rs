//! Counters of the state server and the Prometheus text endpoint that shows them.
//!
//! The endpoint is a deliberately tiny HTTP/1.0 responder (GET /metrics only, requests
//! read up to `REQUEST_BYTES_MAX`, one response per connection), bound to a loopback
//! address and off unless configured: it must not become a second attack surface.
//!
//! It speaks the classic Prometheus text format by default, and OpenMetrics 1.0 when the
//! scrape's `Accept` header asks for `application/openmetrics-text` ([`Format`]): only
//! OpenMetrics carries exemplars, and the decide-latency histogram has one per bucket, the
//! trace of the newest sampled decide that fell in it (spans on only: with spans off
//! nothing is recorded, and the commit path takes no lock for it). The OpenMetrics body
//! is the classic one rewritten ([`to_openmetrics`]): counter families are named without
//! their `_total`, blank lines go, and `# EOF` ends it.
//!
//! A member of a pair binds the endpoint once, when it starts as a backup, and keeps it
//! through its promotion: it shows the pair's figures ([`PairFigures`], `decree_pair_*`)
//! in every role, and the state server's figures once it leads.

use crate::state::State;
use opentelemetry::trace::SpanContext;
use parking_lot::Mutex;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Upper bounds of the decide latency histogram buckets, in microseconds.
const LATENCY_BUCKETS_US: [u64; 14] =
    [10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 1_000_000];

/// Largest HTTP request the endpoint reads.
const REQUEST_BYTES_MAX: usize = 8192;

/// Totals since the server started.
#[derive(Default)]
pub(crate) struct Metrics {
    pub(crate) decides: AtomicU64,
    pub(crate) decide_errors: AtomicU64,
    pub(crate) completes: AtomicU64,
    pub(crate) completes_ignored: AtomicU64,
    pub(crate) decides_refused: AtomicU64,
    pub(crate) sessions_opened: AtomicU64,
    pub(crate) sessions_closed: AtomicU64,
    pub(crate) connections_refused: AtomicU64,
    pub(crate) handshakes_timed_out: AtomicU64,
    /// Connections of the TLS listener refused before a session: failed TLS handshakes,
    /// plaintext clients, names not allowed.
    pub(crate) tls_refused: AtomicU64,
    pub(crate) sessions_idle_closed: AtomicU64,
    pub(crate) protocol_errors: AtomicU64,
    pub(crate) phase_two_commits: AtomicU64,
    pub(crate) recovery_rollbacks: AtomicU64,
    /// Recovery passes run (at start, after closes and their rechecks, periodic, retries).
    pub(crate) recovery_passes: AtomicU64,
    pub(crate) heuristics: AtomicU64,
    /// `OnePhase` notices received (protocol version 3).
    pub(crate) one_phase_notices: AtomicU64,
    /// One-phase commits completed by their session (remembered committed).
    pub(crate) one_phase_completes: AtomicU64,
    /// Sessions the server closed itself without reading them to their end in time.
    pub(crate) sessions_closed_unread: AtomicU64,
    latency_buckets: [AtomicU64; LATENCY_BUCKETS_US.len() + 1],
    latency_sum_us: AtomicU64,
    /// The newest sampled decide of each bucket (spans on only).
    latency_exemplars: [Mutex<Option<Exemplar>>; LATENCY_BUCKETS_US.len() + 1],
}

/// A decide that a bucket of the latency histogram shows as its exemplar.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Exemplar {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    seconds: f64,
    /// When it was observed, in seconds since the Unix epoch.
    at_unix_seconds: f64,
}

impl Metrics {
    /// Records the time from receiving a decide to its durability; `sampled`: the span
    /// context of the decide's sampled span, which becomes its bucket's exemplar.
    pub(crate) fn observe_decide(&self, elapsed: Duration, sampled: Option<&SpanContext>) {
        let us = elapsed.as_micros().min(u64::MAX as u128) as u64;
        let i = LATENCY_BUCKETS_US.iter().position(|&b| us <= b).unwrap_or(LATENCY_BUCKETS_US.len());
        self.latency_buckets[i].fetch_add(1, Ordering::Relaxed);
        self.latency_sum_us.fetch_add(us, Ordering::Relaxed);
        if let Some(context) = sampled {
            let at = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
            *self.latency_exemplars[i].lock() = Some(Exemplar {
                trace_id: context.trace_id().to_bytes(),
                span_id: context.span_id().to_bytes(),
                // The sum's unit, so that the exemplar's value lies within its bucket.
                seconds: us as f64 / 1e6,
                at_unix_seconds: at.as_secs_f64(),
            });
        }
    }
}

/// The exposition format a scrape gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// The classic Prometheus text format, version 0.0.4 (the default).
    Prometheus,
    /// OpenMetrics 1.0, with exemplars.
    OpenMetrics,
}

impl Format {
    /// The format an HTTP request asks for: OpenMetrics when its `Accept` header names
    /// `application/openmetrics-text` with a quality above zero (Prometheus sends it first,
    /// with the classic text as a fallback), else the classic text.
    pub(crate) fn of_request(request: &[u8]) -> Format {
        let request = String::from_utf8_lossy(request);
        let accept = request
            .lines()
            .skip(1)
            .filter_map(|line| line.split_once(':'))
            .filter_map(|(name, value)| name.trim().eq_ignore_ascii_case("accept").then_some(value));
        let asks = accept.flat_map(|value| value.split(',')).any(|range| {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or("");
            let refused =
                parts.any(|p| p.strip_prefix("q=").and_then(|q| q.parse::<f64>().ok()) == Some(0.0));
            media.eq_ignore_ascii_case("application/openmetrics-text") && !refused
        });
        if asks {
            Format::OpenMetrics
        } else {
            Format::Prometheus
        }
    }

    /// The `Content-Type` of a body in this format.
    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// Rewrites a classic text body (of `render`, `render_pair` and the election's figures)
/// as OpenMetrics 1.0: a counter family is named without `_total` in its `HELP` and `TYPE`
/// lines while its samples keep it (a sample without one gets it), blank lines go, and
/// `# EOF` ends the body. Exemplars are written by [`render`] itself.
pub(crate) fn to_openmetrics(classic: &str) -> String {
    let mut out = String::with_capacity(classic.len() + 512);
    let counters: std::collections::HashSet<&str> = classic
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" counter"))
        .collect();
    let family = |name: &str| name.strip_suffix("_total").unwrap_or(name).to_string();
    for line in classic.lines().filter(|line| !line.trim().is_empty()) {
        if let Some(rest) = line.strip_prefix("# HELP ").or_else(|| line.strip_prefix("# TYPE ")) {
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            let kind = &line[..7];
            let name = if counters.contains(name) { family(name) } else { name.to_string() };
            let _ = writeln!(out, "{kind}{name} {tail}");
            continue;
        }
        assert!(!line.starts_with('#'), "a comment OpenMetrics does not allow: {line}");
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..end];
        if counters.contains(name) && !name.ends_with("_total") {
            let _ = writeln!(out, "{name}_total{}", &line[end..]);
        } else {
            let _ = writeln!(out, "{line}");
        }
    }
    out.push_str("# EOF\n");
    out
}

/// Renders every metric in the Prometheus text format, with the latency histogram's
/// exemplars when the body becomes OpenMetrics (`format`, then [`to_openmetrics`]).
pub(crate) fn render(state: &State, format: Format) -> String {
    let m = &state.metrics;
    let stats = state.log.stats();
    let mut out = String::with_capacity(4096);
    let mut counter = |name: &str, help: &str, v: u64| {
        let _ = writeln!(out, "# HELP decree_{name} {help}\n# TYPE decree_{name} counter\ndecree_{name} {v}");
    };
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    counter("commits_total", "Decisions made durable (commit points).", load(&m.decides));
    counter(
        "tls_refused_total",
        "TLS listener connections refused before a session (handshake failed, plaintext, name not allowed).",
        load(&m.tls_refused),
    );
    counter("decide_errors_total", "Decide requests that failed.", load(&m.decide_errors));
    counter("completions_total", "Transactions completed in the log.", load(&m.completes));
    counter(
        "completes_ignored_total",
        "Complete requests for transactions the sending session had not decided (ignored).",
        load(&m.completes_ignored),
    );
    counter(
        "decides_refused_total",
        "Decide requests refused before the log (bqual, no or duplicate branches, unknown resource manager).",
        load(&m.decides_refused),
    );
    counter("sessions_opened_total", "Client sessions opened.", load(&m.sessions_opened));
    counter("sessions_closed_total", "Client sessions closed.", load(&m.sessions_closed));
    counter(
        "connections_refused_total",
        "Connections refused over connections_max.",
        load(&m.connections_refused),
    );
    counter(
        "handshakes_timed_out_total",
        "Connections closed for not completing their Hello within handshake_timeout_ms.",
        load(&m.handshakes_timed_out),
    );
    counter(
        "sessions_idle_closed_total",
        "Sessions closed after idle_timeout_ms without a request (their undecided branches are rolled back).",
        load(&m.sessions_idle_closed),
    );
    counter("protocol_errors_total", "Connections closed for a protocol error.", load(&m.protocol_errors));
    counter("phase_two_commits_total", "Branches committed by the server.", load(&m.phase_two_commits));
    counter(
        "aborts_total",
        "Prepared branches without decision rolled back after their session closed.",
        load(&m.recovery_rollbacks),
    );
    counter(
        "recovery_passes_total",
        "Recovery passes (each lists every resource manager's prepared branches).",
        load(&m.recovery_passes),
    );
    counter(
        "heuristic_outcomes_total",
        "Heuristic outcomes reported by resource managers: each branch once, when its report is kept (a report not kept yet comes again with the next recovery pass and is not counted twice).",
        load(&m.heuristics),
    );
    counter("log_flushes_total", "Durable flushes of the log.", stats.flushes);
    counter("log_records_total", "Records appended to the log.", stats.records_appended);
    counter("log_bytes_written_total", "Bytes written by the log.", stats.bytes_written);
    let batch = if stats.flushes == 0 { 0.0 } else { stats.records_appended as f64 / stats.flushes as f64 };
    let _ = writeln!(
        out,
        "# HELP decree_log_batch_records Mean records per flush since start.\n# TYPE decree_log_batch_records gauge\n\
         decree_log_batch_records {batch:.3}"
    );
    let _ = writeln!(
        out,
        "# HELP decree_in_doubt Decided transactions whose owner is gone, phase two pending.\n\
         # TYPE decree_in_doubt gauge\ndecree_in_doubt {}",
        state.in_doubt()
    );
    let _ = writeln!(
        out,
        "# HELP decree_in_doubt_oldest_seconds How long the oldest in-doubt transaction has waited since its decision (0 when none).\n\
         # TYPE decree_in_doubt_oldest_seconds gauge\ndecree_in_doubt_oldest_seconds {:.3}",
        state.in_doubt_oldest().as_secs_f64()
    );
    let _ = writeln!(
        out,
        "# HELP decree_recovery_rechecks_pending Recovery passes asked for after sessions closed, not run yet.\n\
         # TYPE decree_recovery_rechecks_pending gauge\ndecree_recovery_rechecks_pending {}",
        state.rechecks_pending()
    );
    let _ = writeln!(
        out,
        "# HELP decree_sessions_live Connected client sessions.\n# TYPE decree_sessions_live gauge\n\
         decree_sessions_live {}",
        state.live_sessions()
    );
    render_one_phase(&mut out, m);
    render_rm_calls(&mut out);
    render_latency(&mut out, m, format);
    out
}

/// Appends the branch calls this process made, by the epoch of the branch's Xid.
fn render_rm_calls(out: &mut String) {
    let _ = writeln!(
        out,
        "# HELP decree_rm_branch_calls_total Branch commits, rollbacks and forgets this process sent to resource managers, by the epoch of the branch's Xid against the one it led (newer must stay 0).\n\
         # TYPE decree_rm_branch_calls_total counter"
    );
    for (relation, n) in crate::rm_calls::counts() {
        let _ = writeln!(out, "decree_rm_branch_calls_total{{xid_epoch=\"{}\"}} {n}", relation.name());
    }
}

/// Appends the counters of protocol version 3's one-phase notices and of the sessions the
/// server closed without reading them to their end.
fn render_one_phase(out: &mut String, m: &Metrics) {
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    for (name, help, v) in [
        (
            "one_phase_notices_total",
            "OnePhase notices received: transactions a session commits in one phase.",
            load(&m.one_phase_notices),
        ),
        (
            "one_phase_completes_total",
            "One-phase commits their session completed (remembered committed).",
            load(&m.one_phase_completes),
        ),
        (
            "sessions_closed_unread_total",
            "Sessions the server closed that did not close their end within close_drain_ms (undecided Xids answered unknown).",
            load(&m.sessions_closed_unread),
        ),
    ] {
        let _ = writeln!(out, "# HELP decree_{name} {help}\n# TYPE decree_{name} counter\ndecree_{name} {v}");
    }
}

/// Appends the decide latency histogram (with its exemplars in OpenMetrics).
fn render_latency(out: &mut String, m: &Metrics, format: Format) {
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let _ = writeln!(
        out,
        "# HELP decree_decide_seconds Time from receiving a decide to its durability.\n\
         # TYPE decree_decide_seconds histogram"
    );
    let exemplar = |i: usize| match format {
        Format::OpenMetrics => m.latency_exemplars[i].lock().map(|e| {
            format!(
                " # {{trace_id=\"{}\",span_id=\"{}\"}} {} {:.3}",
                hex_of(&e.trace_id),
                hex_of(&e.span_id),
                e.seconds,
                e.at_unix_seconds
            )
        }),
        Format::Prometheus => None,
    };
    let mut cumulative = 0;
    for (i, bound) in LATENCY_BUCKETS_US.iter().enumerate() {
        cumulative += load(&m.latency_buckets[i]);
        let _ = writeln!(
            out,
            "decree_decide_seconds_bucket{{le=\"{}\"}} {cumulative}{}",
            *bound as f64 / 1e6,
            exemplar(i).unwrap_or_default()
        );
    }
    cumulative += load(&m.latency_buckets[LATENCY_BUCKETS_US.len()]);
    let _ = writeln!(
        out,
        "decree_decide_seconds_bucket{{le=\"+Inf\"}} {cumulative}{}",
        exemplar(LATENCY_BUCKETS_US.len()).unwrap_or_default()
    );
    let _ = writeln!(out, "decree_decide_seconds_sum {}", load(&m.latency_sum_us) as f64 / 1e6);
    let _ = writeln!(out, "decree_decide_seconds_count {cumulative}");
}

/// Lowercase hex of `bytes`, as trace ids are shown everywhere.
fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What the endpoint answers: the classic text of every metric now (with exemplars when
/// the format asks for them; [`serve`] rewrites it for OpenMetrics).
pub(crate) type Render = Arc<dyn Fn(Format) -> String + Send + Sync>;

/// The endpoint's text for a single server.
pub(crate) fn of_state(state: Arc<State>) -> Render {
    Arc::new(move |format| render(&state, format))
}

/// What a pair member's metrics say of the pair (filled in by `pair.rs`).
pub(crate) struct PairFigures {
    /// The member's id in its pair.
    pub(crate) member: u8,
    /// The highest epoch it has seen (the one it leads, as a primary), raw.
    pub(crate) epoch_raw: u64,
    /// A link to the peer is open.
    pub(crate) link_connected: bool,
    pub(crate) link_opens_total: u64,
    pub(crate) link_ends_total: u64,
    pub(crate) role: PairRole,
}

/// The role-specific figures of a pair member.
pub(crate) enum PairRole {
    Backup {
        /// It holds everything its primary holds (live set received, no batch missing).
        caught_up: bool,
        /// Decisions its copy holds.
        live_decisions: usize,
    },
    Primary {
        /// It waits for its backup before acknowledging (it does not run alone).
        strict: bool,
        /// Records sent or queued, not acknowledged by the backup.
        lag_records: usize,
        /// How long the oldest of them has waited.
        lag: Duration,
        /// Decisions whose answer waits for the backup's confirmation.
        decisions_waiting: usize,
    },
}

/// The role labels of `decree_pair_role`; while a member changes role it shows "changing".
const PAIR_ROLES: [&str; 3] = ["backup", "primary", "changing"];

/// Appends a pair member's figures; `None` while it changes role.
pub(crate) fn render_pair(out: &mut String, figures: Option<&PairFigures>) {
    let current = match figures.map(|f| &f.role) {
        Some(PairRole::Backup { .. }) => "backup",
        Some(PairRole::Primary { .. }) => "primary",
        None => "changing",
    };
    let _ = writeln!(
        out,
        "# HELP decree_pair_role The role this pair member plays now (1 for its role).\n\
         # TYPE decree_pair_role gauge"
    );
    for role in PAIR_ROLES {
        let _ = writeln!(out, "decree_pair_role{{role=\"{role}\"}} {}", u8::from(role == current));
    }
    let Some(f) = figures else { return };
    let mut gauge = |name: &str, help: &str, value: &dyn std::fmt::Display| {
        let _ =
            writeln!(out, "# HELP decree_{name} {help}\n# TYPE decree_{name} gauge\ndecree_{name} {value}");
    };
    gauge("pair_member", "This member's id in its pair.", &f.member);
    gauge(
        "pair_epoch",
        "The highest epoch this member has seen (the one it leads, as a primary), raw: count << 8 | member.",
        &f.epoch_raw,
    );
    gauge(
        "pair_link_connected",
        "1 while a replication link to the peer is open.",
        &u8::from(f.link_connected),
    );
    match &f.role {
        PairRole::Backup { caught_up, live_decisions } => {
            gauge(
                "pair_caught_up",
                "1 once this backup holds everything its primary holds (it may be promoted without --force).",
                &u8::from(*caught_up),
            );
            gauge("pair_live_decisions", "Decisions this backup's copy holds.", live_decisions);
        }
        PairRole::Primary { strict, lag_records, lag, decisions_waiting } => {
            gauge(
                "pair_strict",
                "1 while this primary waits for its backup before acknowledging (0: it runs alone).",
                &u8::from(*strict),
            );
            gauge(
                "pair_lag_records",
                "Records sent or queued for the backup, not acknowledged by it.",
                lag_records,
            );
            gauge(
                "pair_lag_seconds",
                "How long the oldest record not acknowledged by the backup has waited (0 when none).",
                &lag.as_secs_f64(),
            );
            gauge(
                "pair_decisions_waiting",
                "Decisions whose answer waits for the backup's confirmation.",
                decisions_waiting,
            );
        }
    }
    let mut counter = |name: &str, help: &str, value: u64| {
        let _ =
            writeln!(out, "# HELP decree_{name} {help}\n# TYPE decree_{name} counter\ndecree_{name} {value}");
    };
    counter(
        "pair_link_opens_total",
        "Replication links opened since this member started.",
        f.link_opens_total,
    );
    counter(
        "pair_link_ends_total",
        "Replication links that ended, and openings that failed or were refused (a primary redials every 100 ms), since this member started.",
        f.link_ends_total,
    );
}

/// Serves `/metrics` on `listener` until the task is dropped.
pub(crate) async fn serve(listener: TcpListener, render: Render) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let render = render.clone();
        tokio::spawn(async move {
            let mut request = Vec::with_capacity(512);
            let mut chunk = [0u8; 1024];
            let read = async {
                while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < REQUEST_BYTES_MAX {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            request.extend_from_slice(&chunk[..n.min(REQUEST_BYTES_MAX - request.len())])
                        }
                    }
                }
            };
            if tokio::time::timeout(Duration::from_secs(5), read).await.is_err() {
                return;
            }
            let response = if request.starts_with(b"GET /metrics ") || request.starts_with(b"GET /metrics\r")
            {
                let format = Format::of_request(&request);
                let body = match format {
                    Format::Prometheus => render(format),
                    Format::OpenMetrics => to_openmetrics(&render(format)),
                };
                format!(
                    "HTTP/1.0 200 OK\r\nContent-Type: {}\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n{body}",
                    format.content_type(),
                    body.len()
                )
            } else {
                "HTTP/1.0 404 Not Found\r\nContent-Length: 10\r\nConnection: close\r\n\r\nnot found\n"
                    .to_string()
            };
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanId, TraceFlags, TraceId, TraceState};

    #[test]
    fn the_accept_header_chooses_openmetrics_only_when_it_asks_for_it() {
        let prometheus = "GET /metrics HTTP/1.1\r\nHost: a\r\nAccept: application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1\r\n\r\n";
        assert_eq!(Format::of_request(prometheus.as_bytes()), Format::OpenMetrics);
        assert_eq!(
            Format::of_request(b"GET /metrics HTTP/1.0\r\naccept: Application/OpenMetrics-Text\r\n\r\n"),
            Format::OpenMetrics
        );
        for classic in [
            "GET /metrics HTTP/1.0\r\n\r\n",
            "GET /metrics HTTP/1.0\r\nAccept: */*\r\n\r\n",
            "GET /metrics HTTP/1.0\r\nAccept: text/plain, application/openmetrics-text;q=0\r\n\r\n",
            "GET /metrics HTTP/1.0\r\nX-Note: Accept: application/openmetrics-text\r\n\r\n",
        ] {
            assert_eq!(Format::of_request(classic.as_bytes()), Format::Prometheus, "{classic}");
        }
    }

    #[test]
    fn openmetrics_names_counter_families_without_total_and_ends_with_eof() {
        let classic = "# HELP decree_a_total A.\n# TYPE decree_a_total counter\ndecree_a_total 3\n\n\
                       # HELP decree_b B.\n# TYPE decree_b counter\ndecree_b{x=\"1\"} 4\n\
                       # HELP decree_c C.\n# TYPE decree_c gauge\ndecree_c 0.5\n";
        assert_eq!(
            to_openmetrics(classic),
            "# HELP decree_a A.\n# TYPE decree_a counter\ndecree_a_total 3\n\
             # HELP decree_b B.\n# TYPE decree_b counter\ndecree_b_total{x=\"1\"} 4\n\
             # HELP decree_c C.\n# TYPE decree_c gauge\ndecree_c 0.5\n# EOF\n"
        );
    }

    fn context(n: u8) -> SpanContext {
        let trace_id = TraceId::from_bytes([n; 16]);
        SpanContext::new(trace_id, SpanId::from_bytes([n; 8]), TraceFlags::SAMPLED, false, TraceState::NONE)
    }

    #[test]
    fn the_newest_sampled_decide_of_a_bucket_is_its_exemplar_in_openmetrics_only() {
        let m = Metrics::default();
        m.observe_decide(Duration::from_micros(300), Some(&context(1)));
        m.observe_decide(Duration::from_micros(400), Some(&context(2)));
        m.observe_decide(Duration::from_micros(5), None);
        let mut open = String::new();
        render_latency(&mut open, &m, Format::OpenMetrics);
        let bucket = |le: &str| {
            let start = format!("decree_decide_seconds_bucket{{le=\"{le}\"}} ");
            open.lines().find(|l| l.starts_with(&start)).unwrap().to_string()
        };
        // Cumulative: the 5 µs decide counts in this bucket too.
        let newest =
            format!(" 3 # {{trace_id=\"{}\",span_id=\"{}\"}} 0.0004 ", "02".repeat(16), "02".repeat(8));
        assert!(bucket("0.0005").contains(&newest), "{open}");
        assert!(!bucket("0.00001").contains('#'), "an unsampled decide leaves no exemplar: {open}");
        assert_eq!(open.matches(" # {").count(), 1, "{open}");
        let mut classic = String::new();
        render_latency(&mut classic, &m, Format::Prometheus);
        assert!(!classic.contains(" # {"), "{classic}");
        assert_eq!(classic.lines().count(), open.lines().count());
    }
}
