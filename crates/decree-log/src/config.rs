//! What a log is asked to be: engine, directory, sync policy and size limits.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// When an append is acknowledged, which is the recovery point objective (RPO).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncPolicy {
    /// rpo=0: acknowledge only after the record is on stable storage.
    Immediate,
    /// rpo=N ms: acknowledge after the write; the data is synced at most this much later.
    Window(Duration),
}

impl SyncPolicy {
    /// The RPO in milliseconds, as benchmarks report it.
    pub fn rpo_ms(&self) -> u64 {
        match self {
            SyncPolicy::Immediate => 0,
            SyncPolicy::Window(d) => d.as_millis() as u64,
        }
    }
    /// Builds the policy from an RPO in milliseconds (0 means Immediate).
    pub fn from_rpo_ms(ms: u64) -> Self {
        if ms == 0 {
            SyncPolicy::Immediate
        } else {
            SyncPolicy::Window(Duration::from_millis(ms))
        }
    }
}

/// The engines behind the [`crate::Log`] trait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EngineKind {
    /// Append-only pre-allocated segments, group commit, segment recycling.
    Journal,
    /// Fixed-size slots in one pre-allocated file, pwrite + fdatasync per record.
    SlotsFsync,
    /// Fixed-size slots in one memory-mapped file, msync per record.
    SlotsMmap,
    /// One file per record, fsync'd (the classic baseline).
    File,
    /// Memory only: the upper bound, and tests.
    Volatile,
}

impl EngineKind {
    /// Every engine, in the order benchmarks list them.
    pub const ALL: [EngineKind; 5] = [
        EngineKind::Journal,
        EngineKind::SlotsFsync,
        EngineKind::SlotsMmap,
        EngineKind::File,
        EngineKind::Volatile,
    ];

    /// The name used on command lines and in reports.
    pub fn name(&self) -> &'static str {
        match self {
            EngineKind::Journal => "journal",
            EngineKind::SlotsFsync => "slots-fsync",
            EngineKind::SlotsMmap => "slots-mmap",
            EngineKind::File => "file",
            EngineKind::Volatile => "volatile",
        }
    }
}

impl FromStr for EngineKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EngineKind::ALL.iter().copied().find(|e| e.name() == s).ok_or_else(|| {
            format!(
                "unknown log engine {s:?}; expected one of journal, slots-fsync, slots-mmap, file, volatile"
            )
        })
    }
}

impl std::fmt::Display for EngineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Everything needed to open a log.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// The directory the log owns (created if missing, locked while open).
    pub dir: PathBuf,
    /// Which engine stores the records.
    pub engine: EngineKind,
    /// When appends are acknowledged.
    pub sync: SyncPolicy,
    /// Size of one journal segment file.
    pub segment_bytes: u64,
    /// Size of one slot of the slot engines (a record must fit in one slot).
    pub slot_bytes: u32,
    /// Number of slots of the slot engines (the most live records at once).
    pub slots_count: u32,
    /// Largest payload accepted by `append`.
    pub record_bytes_max: u32,
    /// Lets the journal write rpo=0 batches with `O_DIRECT | O_DSYNC` (whole pages, one
    /// system call, durable when it returns; faster than `pwrite` + `fdatasync` on the
    /// development VM, docs/measurements.md, "Direct writes"); off, it writes and syncs,
    /// which writes fewer bytes (no page padding).
    pub direct_io: bool,
    /// Journal under `rpo = 0`: how long completion records may wait in memory for the next
    /// synced batch once the log is idle, before they are written on their own. Riding
    /// with decisions, they cost no device write; a crash loses at most this window of
    /// them, and recovery then finishes those (already finished) transactions again.
    pub completion_idle_ms: u32,
}

/// The default of [`LogConfig::record_bytes_max`] (64 KiB): decree-core asserts that a
/// decision record at every limit fits in it.
pub const RECORD_BYTES_MAX_DEFAULT: u32 = 64 << 10;

impl LogConfig {
    /// Defaults suited to decision records of a few hundred bytes.
    pub fn new(dir: impl Into<PathBuf>, engine: EngineKind, sync: SyncPolicy) -> Self {
        LogConfig {
            dir: dir.into(),
            engine,
            sync,
            segment_bytes: 8 << 20,
            slot_bytes: 1024,
            slots_count: 65536,
            record_bytes_max: RECORD_BYTES_MAX_DEFAULT,
            direct_io: true,
            completion_idle_ms: 10,
        }
    }
}
