//! What every mode's threads share: starting a run's threads together and merging what
//! they measured (`run_threads`, [`ThreadOut`]), when a thread stops (`more`), the
//! account ids of each transfer (`thread_rng`, `ids`: seeded per thread, so every mode
//! draws the same transfers), the one-row check of an update and the recording of a
//! finished transfer (`count`). The modes' loops themselves are in `local.rs` and
//! `two_phase.rs`.

use super::database::db_error;
use super::{RmBenchSpec, Side};
use crate::stats::Latencies;
use crate::tx::{panic_message, Stop};
use crate::BenchError;
use indicatif::ProgressBar;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Transfers between two updates of the progress bar.
const PROGRESS_EVERY: u64 = 64;

/// What the threads of one run measured, merged.
#[derive(Debug, Default)]
pub(super) struct ThreadOut {
    pub(super) transfers: u64,
    pub(super) commit: Latencies,
    pub(super) transfer: Latencies,
}

/// Starts `threads` threads running `body` together; merges what they measured and
/// returns it with the wall time from their release to the end of the last one.
pub(super) fn run_threads(
    threads: usize,
    body: impl Fn(usize, Instant, &AtomicBool) -> Result<ThreadOut, BenchError> + Sync,
) -> Result<(ThreadOut, Duration), BenchError> {
    let (outcomes, start, end) = crate::tx::run_together(threads, body);
    let mut merged = ThreadOut::default();
    for outcome in outcomes {
        let out = outcome.map_err(|panic| BenchError::Panicked(panic_message(&panic)))??;
        merged.transfers += out.transfers;
        merged.commit.merge(&out.commit);
        merged.transfer.merge(&out.transfer);
    }
    Ok((merged, end.saturating_duration_since(start)))
}

pub(super) fn more(stop: Stop, done: u64, start: Instant, failed: &AtomicBool) -> bool {
    let left = match stop {
        Stop::Cycles(n) => done < n,
        Stop::Duration(d) => start.elapsed() < d,
    };
    left && !failed.load(Ordering::Relaxed)
}

pub(super) fn one_row(changed: u64, side: Side, id: i32) -> Result<(), BenchError> {
    if changed != 1 {
        return Err(db_error(
            format!("updating account {id} in database {}", side.name()),
            format!("{changed} rows changed, expected 1 (was setup run with fewer accounts?)"),
        ));
    }
    Ok(())
}

/// The account-id generator of benchmark thread `index` (seed + index, so every mode
/// draws the same transfers).
pub(super) fn thread_rng(spec: &RmBenchSpec, index: usize) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(spec.seed.wrapping_add(index as u64))
}

/// The accounts of one transfer: the one debited in A, the one credited in B.
pub(super) fn ids(rng: &mut rand::rngs::StdRng, accounts: u32) -> [i32; 2] {
    let top = i32::try_from(accounts).unwrap_or(i32::MAX);
    [rng.gen_range(1..=top), rng.gen_range(1..=top)]
}

/// Records one finished transfer and moves the progress bar now and then.
pub(super) fn count(out: &mut ThreadOut, commit: Duration, transfer: Duration, progress: &ProgressBar) {
    out.commit.record(commit);
    out.transfer.record(transfer);
    out.transfers += 1;
    if out.transfers.is_multiple_of(PROGRESS_EVERY) {
        progress.inc(PROGRESS_EVERY);
    }
}
