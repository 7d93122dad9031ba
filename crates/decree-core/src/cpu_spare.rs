//! Whether the machine has CPU to spare right now: the choice between driving a
//! transaction's branches at the same time (helper threads, see `fanout.rs`) or one after
//! another on the caller's thread, under [`crate::BranchCalls::Auto`].
//!
//! A hand-off to a helper costs two thread wake-ups and a context switch each way. When a
//! core is idle to run the helper, that buys a round trip of latency per phase; when every
//! core is busy it is pure overhead. With both databases on a 2-core machine (`decree
//! bench --rm postgres`), parallel calls at 16 threads cost more application CPU per
//! transfer and completed fewer transfers than sequential ones, while at 1 thread they were
//! faster (docs/measurements.md, "Branch calls on a busy machine").
//!
//! The gauge is the machine's idle share since the previous sample (`/proc/stat`, idle
//! plus iowait over all CPU time), sampled at most every [`SAMPLE_INTERVAL`] by whichever
//! caller finds the sample due; everyone else reads the cached answer (a clock read and two
//! relaxed atomic loads, no lock). Until two samples exist, or where `/proc/stat` cannot be read, it says "spare".

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Idle share of all CPU time below which the machine counts as busy.
pub const IDLE_SHARE_MIN: f64 = 0.2;
/// Shortest time between two samples of `/proc/stat`.
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(100);

/// Cumulative CPU counters of `/proc/stat`'s first line, in ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTicks {
    /// idle + iowait.
    pub idle: u64,
    /// user + nice + system + idle + iowait + irq + softirq + steal.
    pub total: u64,
}

/// Parses the aggregate `cpu` line of `/proc/stat`; `None` when it is missing or short.
pub fn parse_proc_stat(text: &str) -> Option<CpuTicks> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> =
        line.split_whitespace().skip(1).take(8).map(|f| f.parse().ok()).collect::<Option<_>>()?;
    if fields.len() < 5 {
        return None;
    }
    Some(CpuTicks { idle: fields[3] + fields[4], total: fields.iter().sum() })
}

/// The idle share between two samples; `None` when no time passed (or the counters went
/// backwards, which they should not).
pub fn idle_share(before: CpuTicks, after: CpuTicks) -> Option<f64> {
    let total = after.total.checked_sub(before.total).filter(|t| *t > 0)?;
    let idle = after.idle.checked_sub(before.idle)?;
    Some((idle as f64 / total as f64).min(1.0))
}

struct Gauge {
    /// The previous sample's counters.
    last: Mutex<Option<CpuTicks>>,
    /// When the next sample is due, in nanoseconds since [`epoch`]: callers before then
    /// read `spare` without touching the lock.
    next_sample_ns: AtomicU64,
    spare: AtomicBool,
}

static GAUGE: Gauge =
    Gauge { last: Mutex::new(None), next_sample_ns: AtomicU64::new(0), spare: AtomicBool::new(true) };

/// The process-wide origin of `next_sample_ns`.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn read_proc_stat() -> Option<CpuTicks> {
    parse_proc_stat(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// Whether a core looks idle enough to run a branch helper (see the module notes).
pub fn cpu_to_spare() -> bool {
    let now_ns = Instant::now().saturating_duration_since(epoch()).as_nanos() as u64;
    // On the commit path: one clock read and two relaxed loads, unless a sample is due;
    // then one caller takes it and the others go on with the last answer.
    if now_ns >= GAUGE.next_sample_ns.load(Ordering::Relaxed) {
        if let Some(mut last) = GAUGE.last.try_lock() {
            GAUGE.next_sample_ns.store(now_ns + SAMPLE_INTERVAL.as_nanos() as u64, Ordering::Relaxed);
            if let Some(ticks) = read_proc_stat() {
                if let Some(share) = (*last).and_then(|before| idle_share(before, ticks)) {
                    GAUGE.spare.store(share >= IDLE_SHARE_MIN, Ordering::Relaxed);
                }
                *last = Some(ticks);
            }
        }
    }
    GAUGE.spare.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_aggregate_line_is_parsed_and_per_cpu_lines_ignored() {
        let text = "cpu  100 5 50 800 20 3 2 0 7 0\ncpu0 1 2 3 4 5 6 7 8 9 10\nintr 1\n";
        assert_eq!(parse_proc_stat(text), Some(CpuTicks { idle: 820, total: 980 }));
        assert_eq!(parse_proc_stat("cpu0 1 2 3 4 5\n"), None, "no aggregate line");
        assert_eq!(parse_proc_stat("cpu  1 2 3\n"), None, "too short");
        assert_eq!(parse_proc_stat("cpu  1 2 x 4 5\n"), None, "not a number");
    }

    #[test]
    fn idle_share_is_the_idle_part_of_the_elapsed_ticks() {
        let before = CpuTicks { idle: 800, total: 1000 };
        assert_eq!(idle_share(before, CpuTicks { idle: 850, total: 1200 }), Some(0.25));
        assert_eq!(idle_share(before, before), None, "no time passed");
        assert_eq!(idle_share(before, CpuTicks { idle: 700, total: 1100 }), None, "idle went backwards");
    }

    #[test]
    fn the_gauge_answers_on_this_machine() {
        // Whatever the load, two calls more than an interval apart must not fail or block,
        // and /proc/stat is readable on Linux.
        assert!(read_proc_stat().is_some());
        let _ = cpu_to_spare();
        std::thread::sleep(SAMPLE_INTERVAL);
        let _ = cpu_to_spare();
        assert!(GAUGE.last.lock().is_some(), "a sample was taken");
    }
}
