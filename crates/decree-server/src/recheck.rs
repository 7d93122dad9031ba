//! When the recovery worker looks again after sessions closed: a bounded schedule of
//! rechecks that coalesces close requests. Pure (the caller passes the time), so that it is
//! tested without IO.
//!
//! Why rechecks: a session's close triggers a pass at once, but a `PREPARE TRANSACTION`
//! that the dead client sent may still be running in the database and land after that
//! pass; without another look, its branch would hold its locks until the periodic pass.
//! So every close asks for passes at `first`, `2 first`, `4 first`, ... after it.
//!
//! Why coalescing: a recheck is a whole pass (it lists every resource manager's prepared
//! branches), so one pass serves every recheck already due, and a recheck may come a
//! little late without harm. A recheck due `delay` after a close asks for a pass in the
//! window `[due, due + delay / 2]`; requests whose windows overlap share one window (their
//! intersection), so it never runs before any of its requests is due nor later than any
//! allows. However many sessions close, about three windows per rung are pending at once
//! (a window spans half its delay of closes and lives for its delay), so 10,000 closes in a
//! second cost a handful of passes, not 50,000. The schedule holds at most
//! [`RECHECKS_PENDING_MAX`] windows: past it (a worker stuck in a long pass while closes
//! go on), a request joins the earliest window that is not due before it, which may run
//! later than asked but never earlier, so memory stays bounded and nothing is skipped.

use std::time::{Duration, Instant};

/// Most recheck windows pending at once.
pub(crate) const RECHECKS_PENDING_MAX: usize = 256;

/// A pass anywhere in `[not_before, not_after]` serves every request merged into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Window {
    not_before: Instant,
    not_after: Instant,
}

impl Window {
    fn overlaps(&self, other: &Window) -> bool {
        self.not_before <= other.not_after && other.not_before <= self.not_after
    }

    fn intersect(&mut self, other: &Window) {
        self.not_before = self.not_before.max(other.not_before);
        self.not_after = self.not_after.min(other.not_after);
    }
}

/// The rechecks asked for by closed sessions and not yet served by a pass.
#[derive(Debug)]
pub(crate) struct RecheckSchedule {
    /// Delay of the first recheck after a close.
    first: Duration,
    /// Rechecks per close, each delay twice the previous.
    count: u32,
    /// Pending windows, sorted by `not_before`.
    windows: Vec<Window>,
}

impl RecheckSchedule {
    /// A schedule of `count` rechecks per close, the first `first` after it.
    pub(crate) fn new(first: Duration, count: u32) -> Self {
        RecheckSchedule { first, count, windows: Vec::new() }
    }

    /// The delays after a close at which rechecks are due: `first`, doubling.
    fn delays(&self) -> impl Iterator<Item = Duration> {
        let first = self.first;
        (0..self.count).map(move |i| first.saturating_mul(1u32.checked_shl(i).unwrap_or(u32::MAX)))
    }

    /// Asks for the rechecks of a session closed at `closed_at`.
    pub(crate) fn after_close(&mut self, closed_at: Instant) {
        let delays: Vec<Duration> = self.delays().collect();
        for delay in delays {
            let due = closed_at + delay;
            self.add(Window { not_before: due, not_after: due + delay / 2 });
        }
    }

    /// Merges `wanted` into an overlapping window, else adds it; past the limit, leaves it
    /// to the earliest window not due before it (or moves the latest window to it).
    fn add(&mut self, wanted: Window) {
        if let Some(w) = self.windows.iter_mut().find(|w| w.overlaps(&wanted)) {
            w.intersect(&wanted);
        } else if self.windows.len() < RECHECKS_PENDING_MAX {
            self.windows.push(wanted);
        } else if !self.windows.iter().any(|w| w.not_before >= wanted.not_before) {
            // Full, and every window is due before this request: a pass before it is due
            // might miss the branch it waits for, so the latest window waits for it.
            if let Some(last) = self.windows.last_mut() {
                last.not_before = wanted.not_before;
                last.not_after = last.not_after.max(wanted.not_after);
            }
        } // else full, and a later window's pass serves it (late, never early).
        self.windows.sort_unstable_by_key(|w| w.not_before);
    }

    /// When the next pass is due for a recheck, if any is pending.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.windows.first().map(|w| w.not_before)
    }

    /// Forgets every recheck served by a pass that started at `started` (those due by
    /// then: the pass lists every branch after that instant). Returns how many windows.
    pub(crate) fn served(&mut self, started: Instant) -> usize {
        let before = self.windows.len();
        self.windows.retain(|w| w.not_before > started);
        before - self.windows.len()
    }

    /// Windows pending.
    pub(crate) fn pending(&self) -> usize {
        self.windows.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Runs passes exactly when due and returns their times.
    fn run_passes(schedule: &mut RecheckSchedule) -> Vec<Instant> {
        let mut passes = Vec::new();
        while let Some(due) = schedule.next_due() {
            assert!(schedule.served(due) > 0);
            passes.push(due);
        }
        passes
    }

    #[test]
    fn one_close_asks_for_rechecks_at_doubling_delays() {
        let t = Instant::now();
        let mut s = RecheckSchedule::new(ms(1000), 5);
        s.after_close(t);
        assert_eq!(s.pending(), 5);
        let passes = run_passes(&mut s);
        let after: Vec<Duration> = passes.iter().map(|p| *p - t).collect();
        assert_eq!(after, vec![ms(1000), ms(2000), ms(4000), ms(8000), ms(16000)]);
        assert_eq!(s.next_due(), None);
    }

    #[test]
    fn no_rechecks_when_the_count_is_zero() {
        let mut s = RecheckSchedule::new(ms(1000), 0);
        s.after_close(Instant::now());
        assert_eq!((s.pending(), s.next_due()), (0, None));
    }

    #[test]
    fn a_pass_serves_every_recheck_already_due_and_no_later_one() {
        let t = Instant::now();
        let mut s = RecheckSchedule::new(ms(1000), 5);
        s.after_close(t);
        assert_eq!(s.served(t + ms(999)), 0, "nothing is due before the first delay");
        assert_eq!(s.served(t + ms(5000)), 3, "the 1, 2 and 4 s rechecks");
        assert_eq!(s.next_due(), Some(t + ms(8000)));
    }

    /// 10,000 sessions closing within a second cause a few passes, and every close still
    /// gets each of its rechecks in its window: not before it is due, at most half its
    /// delay after.
    #[test]
    fn closes_close_together_share_passes_and_each_is_served_in_its_window() {
        let t = Instant::now();
        let mut s = RecheckSchedule::new(ms(1000), 5);
        let closes: Vec<Instant> = (0..10_000u64).map(|i| t + Duration::from_micros(i * 100)).collect();
        for &c in &closes {
            s.after_close(c);
            assert!(s.pending() <= 15, "{} windows pending", s.pending());
        }
        let passes = run_passes(&mut s);
        assert!(passes.len() <= 10, "{} passes for 50,000 rechecks", passes.len());
        for &c in &closes {
            for delay in [1000, 2000, 4000, 8000, 16000].map(ms) {
                let (due, late) = (c + delay, c + delay + delay / 2);
                assert!(
                    passes.iter().any(|&p| p >= due && p <= late),
                    "a recheck due {delay:?} after a close has no pass in its window"
                );
            }
        }
    }

    /// Closes that keep coming while no pass runs (the worker stuck in a long pass) never
    /// hold more than the limit, and the last close's last recheck is still pending, not
    /// earlier than due.
    #[test]
    fn the_schedule_stays_bounded_and_never_runs_a_recheck_early() {
        let t = Instant::now();
        let mut s = RecheckSchedule::new(ms(1), 16);
        let mut last = t;
        for i in 0..20_000u64 {
            last = t + ms(i * 7);
            s.after_close(last);
            assert!(s.pending() <= RECHECKS_PENDING_MAX);
        }
        assert_eq!(s.pending(), RECHECKS_PENDING_MAX);
        let latest = s.windows.last().unwrap().not_before;
        assert!(latest >= last + ms(1 << 15), "the last recheck moved earlier than due");
        assert!(s.windows.iter().all(|w| w.not_before <= w.not_after));
    }
}
