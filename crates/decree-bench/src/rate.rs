//! The fixed-rate mode of the transaction benchmark (`decree bench --rate N`).
//!
//! As in the X Platform latency tests (messages at 10,000/s, latency percentiles reported
//! next to a separate saturated throughput test), the rate is fixed rather than "as fast as
//! possible": N transactions per second spread evenly over the threads, each thread on its
//! own schedule of N/threads per second, the threads' slots staggered so that the commits
//! of all threads are evenly spaced. There are no think times: a thread waits for its next
//! slot and then commits.
//!
//! Two latencies are reported for each commit:
//! - the *service time*: the tx_commit call alone, from the moment it started;
//! - the *scheduled latency*: from the slot the commit was due at to its end. When a
//!   stall makes a thread fall behind, its next commits start late and this latency counts
//!   the wait, so a stall is not hidden by the benchmark itself slowing down (coordinated
//!   omission). This is the one the `commit_p50_us`, `commit_p99_us` and `commit_p999_us`
//!   fields report.
//!
//! The schedule never skips slots: a thread behind schedule commits back to back until it
//! has caught up, so the achieved rate falls below the target only when the system cannot
//! sustain it.
//!
//! Waiting: `std::thread::sleep` wakes tens of microseconds late (timer slack and the
//! scheduler), which at 10,000/s would be a large part of each interval. The wait sleeps
//! until [`SPIN_BEFORE`] ahead of the slot (with the thread's timer slack lowered to 1 ns),
//! then yields in a loop until the slot.

use crate::BenchError;
use std::time::{Duration, Instant};

/// How long before its slot a thread stops sleeping and starts yielding in a loop.
pub const SPIN_BEFORE: Duration = Duration::from_micros(50);

/// The highest rate the mode accepts, over all threads.
pub const RATE_MAX: f64 = 10_000_000.0;

/// One thread's slots: `first + k * interval` for k = 0, 1, 2, ...
#[derive(Debug, Clone)]
pub struct Schedule {
    next: Instant,
    interval: Duration,
}

impl Schedule {
    /// The schedule of thread `index` of `threads` for `rate` transactions per second in
    /// all, starting at `start`; thread i's first slot is offset by i / rate.
    pub fn new(rate: f64, threads: usize, index: usize, start: Instant) -> Result<Self, BenchError> {
        if !(rate.is_finite() && rate > 0.0 && rate <= RATE_MAX) {
            return Err(BenchError::Option(format!(
                "--rate {rate}: expected more than 0 and at most {RATE_MAX}"
            )));
        }
        if threads == 0 || index >= threads {
            return Err(BenchError::Option(format!("thread {index} of {threads}")));
        }
        let interval = Duration::from_secs_f64(threads as f64 / rate);
        let offset = Duration::from_secs_f64(index as f64 / rate);
        lower_timer_slack();
        Ok(Schedule { next: start + offset, interval })
    }

    /// The time between two slots of this thread.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Waits until the next slot (returns at once when it has passed) and returns it.
    pub fn wait_next(&mut self) -> Instant {
        let slot = self.next;
        self.next += self.interval;
        wait_until(slot);
        slot
    }
}

/// Waits until `deadline`: sleeps until [`SPIN_BEFORE`] ahead of it, then yields in a loop.
pub fn wait_until(deadline: Instant) {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        let left = deadline - now;
        if left > SPIN_BEFORE {
            std::thread::sleep(left - SPIN_BEFORE);
        } else {
            std::thread::yield_now();
        }
    }
}

/// Lowers this thread's timer slack to 1 ns, so that short sleeps end on time (the default
/// 50 us slack would make every sleep late by up to that much). Best effort.
fn lower_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes an integer argument and changes only this thread.
    let _ = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_evenly_spread_over_the_threads() {
        let start = Instant::now();
        // 1000/s over 4 threads: each thread every 4 ms, thread i offset by i ms.
        let s0 = Schedule::new(1000.0, 4, 0, start).unwrap();
        let s3 = Schedule::new(1000.0, 4, 3, start).unwrap();
        assert_eq!(s0.interval(), Duration::from_millis(4));
        assert_eq!(s3.next - start, Duration::from_millis(3));
        assert_eq!(s0.next, start);
    }

    #[test]
    fn slots_advance_and_a_late_thread_does_not_skip_them() {
        let start = Instant::now() - Duration::from_millis(10);
        let mut s = Schedule::new(1000.0, 1, 0, start).unwrap();
        // The first slots are in the past: returned at once, one interval apart.
        let a = s.wait_next();
        let b = s.wait_next();
        assert_eq!(a, start);
        assert_eq!(b - a, Duration::from_millis(1));
    }

    #[test]
    fn waiting_reaches_the_deadline() {
        let deadline = Instant::now() + Duration::from_micros(300);
        wait_until(deadline);
        assert!(Instant::now() >= deadline);
    }

    #[test]
    fn bad_rates_are_refused() {
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY, 2e7] {
            assert!(Schedule::new(rate, 1, 0, Instant::now()).is_err(), "{rate}");
        }
        assert!(Schedule::new(10.0, 2, 2, Instant::now()).is_err());
    }
}
