//! The floor under an `rpo = 0` commit: one synced write of the disk the log is on,
//! measured in the same run as the transaction benchmark.
//!
//! A durable two-phase commit waits for at least one synced write, and under load usually
//! for the end of the write in flight as well; on a virtual disk whose write latency moves
//! from minute to minute, a commit percentile means little without the disk's own. So
//! `decree bench`, when a run uses a durable engine at `rpo = 0`, first measures, in a
//! fresh directory next to the runs' logs, one thread doing `pwrite` + `fdatasync` of a
//! 600-byte record (about a two-branch decision) and, where the file system allows it,
//! `O_DIRECT | O_DSYNC` page writes (what the journal does), back to back and then each
//! after [`IDLE_BEFORE_WRITE`] of idleness, for [`WRITE_FLOOR_DURATION`] each, and reports
//! their percentiles next to the commit's. The idle variant is there because this VM's
//! disk answers a write that follows an idle millisecond markedly later than one that
//! follows another at once (docs/measurements.md, "Synced write after idle"), and in the
//! LIXA workloads every commit follows think time. Nothing of decree runs here; nothing
//! asserts on speed.

use crate::log_bench::{raw_direct, raw_direct_paced, raw_fdatasync, LogPoint, RAW_DIRECT_ENGINE};
use crate::tx::fresh_dir;
use crate::BenchError;
use serde::Serialize;
use std::path::Path;
use std::time::Duration;

/// How long each raw writer runs.
pub const WRITE_FLOOR_DURATION: Duration = Duration::from_secs(1);
/// Idle time before each write of the paced direct writer: the middle of the LIXA think
/// times (500-1500 us), about what a commit of a lightly loaded run follows.
pub const IDLE_BEFORE_WRITE: Duration = Duration::from_millis(1);
/// Name of the paced direct writer in reports.
pub const RAW_DIRECT_IDLE: &str = "raw-direct-idle";
/// Bytes of each `pwrite` + `fdatasync` record: about a two-branch decision record.
pub const RECORD_BYTES: usize = 600;
/// Size of the pre-allocated reference file (written over in a loop).
const FILE_BYTES: u64 = 8 << 20;
/// Name of the directory the reference file lives in, under the benchmark's work dir.
const DIR_NAME: &str = "raw-write";

/// One raw writer's figures.
#[derive(Debug, Clone, Serialize)]
pub struct WriteFloor {
    /// `raw-fdatasync` or `raw-direct` (the same names as `decree bench-log`).
    pub reference: String,
    /// Synced writes per second from one thread.
    pub writes_per_sec: f64,
    /// Median write latency, in us.
    pub p50_us: f64,
    /// 95th percentile, in us (the percentile of LIXA's characteristic curve).
    pub p95_us: f64,
    /// 99th percentile, in us.
    pub p99_us: f64,
}

impl From<LogPoint> for WriteFloor {
    fn from(point: LogPoint) -> Self {
        WriteFloor {
            reference: point.engine,
            writes_per_sec: point.records_per_sec,
            p50_us: point.p50_us,
            p95_us: point.p95_us,
            p99_us: point.p99_us,
        }
    }
}

/// Measures both raw writers in a fresh directory under `parent` (removed afterwards);
/// the direct one is missing where the file system refuses `O_DIRECT`.
pub fn measure(parent: &Path, duration: Duration) -> Result<Vec<WriteFloor>, BenchError> {
    let dir = fresh_dir(parent, DIR_NAME)?;
    let measured = (|| {
        let mut floors = vec![WriteFloor::from(raw_fdatasync(&dir, RECORD_BYTES, FILE_BYTES, duration)?)];
        if let Some(direct) = raw_direct(&dir, FILE_BYTES, duration)? {
            floors.push(WriteFloor::from(direct));
            let paced = raw_direct_paced(&dir, FILE_BYTES, duration, IDLE_BEFORE_WRITE, RAW_DIRECT_IDLE)?;
            floors.extend(paced.map(WriteFloor::from));
        }
        Ok(floors)
    })();
    let removed = std::fs::remove_dir_all(&dir);
    let floors = measured?;
    removed.map_err(|e| BenchError::io("cannot remove", &dir, e))?;
    Ok(floors)
}

/// The writer a journal at `rpo = 0` pays for: the direct one when it was measured.
pub fn journal_floor(floors: &[WriteFloor]) -> Option<&WriteFloor> {
    floors.iter().find(|f| f.reference == RAW_DIRECT_ENGINE).or_else(|| floors.first())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_writers_are_measured_and_the_directory_is_removed() {
        // Under the crate's own directory: a real disk (a tmpfs /tmp would refuse O_DIRECT).
        let parent = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let floors = measure(parent.path(), Duration::from_millis(100)).unwrap();
        assert!(
            floors.len() == 1 || floors.len() == 3,
            "fdatasync, then both direct ones or none: {floors:?}"
        );
        assert_eq!(floors[0].reference, crate::log_bench::RAW_ENGINE);
        for floor in &floors {
            assert!(floor.writes_per_sec > 0.0, "{floor:?}");
            assert!(floor.p50_us > 0.0 && floor.p50_us <= floor.p95_us && floor.p95_us <= floor.p99_us);
        }
        let expected = if floors.len() == 3 { RAW_DIRECT_ENGINE } else { crate::log_bench::RAW_ENGINE };
        assert_eq!(journal_floor(&floors).map(|f| f.reference.as_str()), Some(expected));
        assert_eq!(std::fs::read_dir(parent.path()).unwrap().count(), 0, "reference directory left behind");
    }
}
