//! The two modes that run without decree, one thread's loop each, on plain connections
//! (`LocalUpdate` in `database.rs`): "independent" (a local commit on A, then one on B) and
//! "native-2pc" (the databases' own prepare and commit-prepared statements, issued by the
//! thread in decree's order, with no coordinator and no decision log). The decree mode is
//! in `two_phase.rs`; what the loops share is in `threads.rs`.

use super::database::Database;
use super::threads::{count, ids, more, one_row, thread_rng, ThreadOut};
use super::{RmBenchSpec, Side};
use crate::BenchError;
use indicatif::ProgressBar;
use std::fmt::Write as _;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

/// Transaction names of the native two-phase mode; never a decree gid (`decree:`), so
/// decree's recovery and leftover checks leave them alone.
const NATIVE_GID_PREFIX: &str = "decree-bench-native-";

/// One thread of the independent mode: a local transaction on A, then one on B.
pub(super) fn independent_loop(
    spec: &RmBenchSpec,
    dbs: [&dyn Database; 2],
    index: usize,
    start: Instant,
    failed: &AtomicBool,
    progress: &ProgressBar,
) -> Result<ThreadOut, BenchError> {
    let mut locals = [dbs[0].local()?, dbs[1].local()?];
    let mut rng = thread_rng(spec, index);
    let mut out = ThreadOut::default();
    while more(spec.stop, out.transfers, start, failed) {
        let ids = ids(&mut rng, spec.accounts);
        let begun = Instant::now();
        let mut commit_time = Duration::ZERO;
        for ((local, id), side) in locals.iter_mut().zip(ids).zip(Side::BOTH) {
            local.begin()?;
            one_row(local.update(id)?, side, id)?;
            let committing = Instant::now();
            local.commit()?;
            commit_time += committing.elapsed();
        }
        count(&mut out, commit_time, begun.elapsed(), progress);
    }
    Ok(out)
}

/// One thread of the native two-phase mode: both transactions begun, updated, prepared,
/// then both committed, in decree's order, by this thread alone.
pub(super) fn native_loop(
    spec: &RmBenchSpec,
    dbs: [&dyn Database; 2],
    index: usize,
    start: Instant,
    failed: &AtomicBool,
    progress: &ProgressBar,
) -> Result<ThreadOut, BenchError> {
    let mut locals = [dbs[0].local()?, dbs[1].local()?];
    let mut rng = thread_rng(spec, index);
    let mut out = ThreadOut::default();
    // One name per side: PostgreSQL wants a gid unique in the cluster, and A and B may share one.
    let mut gids = [String::new(), String::new()];
    let outcome = (|| {
        while more(spec.stop, out.transfers, start, failed) {
            let ids = ids(&mut rng, spec.accounts);
            for (gid, side) in gids.iter_mut().zip(Side::BOTH) {
                gid.clear();
                let _ = write!(
                    gid,
                    "{NATIVE_GID_PREFIX}{:08x}-{index}-{}-{}",
                    spec.node,
                    out.transfers,
                    side.name()
                );
            }
            let begun = Instant::now();
            for (local, gid) in locals.iter_mut().zip(&gids) {
                local.begin_native(gid)?;
            }
            for ((local, id), side) in locals.iter_mut().zip(ids).zip(Side::BOTH) {
                one_row(local.update(id)?, side, id)?;
            }
            let committing = Instant::now();
            for (local, gid) in locals.iter_mut().zip(&gids) {
                local.prepare_native(gid)?;
            }
            for (local, gid) in locals.iter_mut().zip(&gids) {
                local.commit_native(gid)?;
            }
            let end = Instant::now();
            count(
                &mut out,
                end.saturating_duration_since(committing),
                end.saturating_duration_since(begun),
                progress,
            );
        }
        Ok(())
    })();
    if outcome.is_err() {
        for (local, gid) in locals.iter_mut().zip(&gids) {
            local.abandon_native(gid);
        }
    }
    outcome.map(|()| out)
}
