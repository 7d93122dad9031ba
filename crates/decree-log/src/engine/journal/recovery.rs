//! Recovery of the journal at open: find the segments to replay, replay them in order,
//! cut a torn tail, and refuse to open on corruption.
//!
//! The newest segment with a valid header decides the range `oldest_needed..=seq` to
//! replay; files outside the range (or with a torn header) are free for reuse. A segment
//! that has a successor in the range must parse cleanly up to the `previous_end` its
//! successor recorded; the last segment may end in a torn batch, which is dropped whole,
//! unless a later batch of the same segment proves (by its `synced_through`) that the bad
//! bytes had been durable: that is corruption, reported with the file and offset. A
//! segment reused without clearing normally ends at bytes of its previous life; only a
//! batch whose marker names this segment is a torn write (reported in `warnings`). Lost
//! data with nothing valid after it (a zero-filled or truncated end) is caught against
//! the watermark by the engine (see `engine/watermark.rs`).
//! Nothing is written here; the engine starts a fresh segment after recovery, whose header
//! records where the cut was made.

use super::format::{self, SegmentHeader, MARKER_BYTES, SEGMENT_HEADER_BYTES};
use super::Loc;
use crate::engine::watermark::End;
use crate::io::{Storage, StorageFile};
use crate::record::{self, Decoded, RecordKind};
use crate::LogError;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A segment file that recovery replayed and the engine keeps.
pub struct RecoveredSegment {
    pub seq: u64,
    pub path: PathBuf,
    pub file: Arc<dyn StorageFile>,
    pub capacity: u64,
}

/// A segment file whose content is no longer needed.
pub struct FreeFile {
    pub path: PathBuf,
    pub file: Arc<dyn StorageFile>,
    pub capacity: u64,
}

/// The records of one live transaction, in append order.
pub struct RecoveredTxn {
    pub txn: u64,
    pub records: Vec<(Loc, Vec<u8>)>,
}

/// Everything the engine needs to continue after recovery.
pub struct Recovery {
    /// Segments to keep, in sequence order.
    pub segments: Vec<RecoveredSegment>,
    /// End of the valid content of the last segment (0 when there is none).
    pub last_end: u64,
    /// Files that can be reused.
    pub free: Vec<FreeFile>,
    /// Live transactions in order of their first record.
    pub live: Vec<RecoveredTxn>,
    /// The next unused segment file id.
    pub next_file_id: u64,
    /// The sequence number the next segment gets.
    pub next_seq: u64,
    /// Torn batches cut from the end of the last segment (0 or 1).
    pub torn: u64,
    /// What was cut and why, for the operator (`decree recover list` shows them).
    pub warnings: Vec<String>,
}

impl Recovery {
    /// Where the valid content ends: the last segment's sequence number and end offset.
    pub fn end(&self) -> End {
        self.segments.last().map_or(End::default(), |s| End { seq: s.seq, offset: self.last_end })
    }
}

struct Candidate {
    path: PathBuf,
    file: Arc<dyn StorageFile>,
    len: u64,
    header: Option<SegmentHeader>,
}

/// Reads the journal in `dir` and rebuilds the live set.
pub fn recover(storage: &dyn Storage, dir: &Path) -> Result<Recovery, LogError> {
    let mut candidates = Vec::new();
    let mut next_file_id = 1;
    for path in storage.list(dir).map_err(|e| LogError::io(dir, e))? {
        let Some(id) = path.file_name().and_then(|n| n.to_str()).and_then(format::parse_file_name) else {
            continue;
        };
        next_file_id = next_file_id.max(id + 1);
        let file = storage.open(&path, false).map_err(|e| LogError::io(&path, e))?;
        let len = file.len().map_err(|e| LogError::io(&path, e))?;
        let mut head = vec![0u8; (len as usize).min(SEGMENT_HEADER_BYTES)];
        file.read_exact_at(&mut head, 0).map_err(|e| LogError::io(&path, e))?;
        let header = format::decode_header(&head);
        candidates.push(Candidate { path, file, len, header });
    }
    let newest = candidates.iter().filter_map(|c| c.header).max_by_key(|h| h.seq);
    let Some(newest) = newest else {
        let free = candidates.into_iter().map(|c| FreeFile { path: c.path, file: c.file, capacity: c.len });
        return Ok(Recovery {
            segments: Vec::new(),
            last_end: 0,
            free: free.collect(),
            live: Vec::new(),
            next_file_id,
            next_seq: 1,
            torn: 0,
            warnings: Vec::new(),
        });
    };
    let range = newest.oldest_needed..=newest.seq;
    let mut in_range: BTreeMap<u64, Candidate> = BTreeMap::new();
    let mut free = Vec::new();
    for candidate in candidates {
        match candidate.header {
            Some(h) if range.contains(&h.seq) => {
                if let Some(other) = in_range.get(&h.seq) {
                    return Err(LogError::Corrupted {
                        path: candidate.path,
                        offset: 0,
                        reason: format!(
                            "segment sequence {} is also claimed by {}",
                            h.seq,
                            other.path.display()
                        ),
                    });
                }
                in_range.insert(h.seq, candidate);
            }
            _ => free.push(FreeFile { path: candidate.path, file: candidate.file, capacity: candidate.len }),
        }
    }
    let mut live = LiveSet::default();
    let mut segments = Vec::new();
    let mut last_end = 0;
    let mut tail = Tail::Clean;
    for seq in range {
        let Some(candidate) = in_range.remove(&seq) else {
            return Err(LogError::Corrupted {
                path: dir.to_path_buf(),
                offset: 0,
                reason: format!(
                    "journal segment with sequence {seq} is missing (segment {} needs {}..={})",
                    newest.seq, newest.oldest_needed, newest.seq
                ),
            });
        };
        let bound = in_range.get(&(seq + 1)).and_then(|c| c.header).map(|h| h.previous_end);
        let mut buf = vec![0u8; candidate.len as usize];
        candidate.file.read_exact_at(&mut buf, 0).map_err(|e| LogError::io(&candidate.path, e))?;
        (last_end, tail) = scan_segment(&buf, seq, &candidate.path, bound, &mut live)?;
        segments.push(RecoveredSegment {
            seq,
            path: candidate.path,
            file: candidate.file,
            capacity: candidate.len,
        });
    }
    Ok(Recovery {
        segments,
        last_end,
        free,
        live: live.into_ordered(),
        next_file_id,
        next_seq: newest.seq + 1,
        torn: u64::from(matches!(tail, Tail::Torn(_))),
        warnings: match tail {
            Tail::Torn(warning) => vec![warning],
            Tail::Clean => Vec::new(),
        },
    })
}

/// How the last segment ends.
enum Tail {
    /// At zeroed space or at bytes of the file's previous life: where the writer stopped.
    Clean,
    /// In a batch of this segment that is incomplete or damaged (the warning says where).
    Torn(String),
}

/// The records of one transaction met so far: where each lies and its payload.
type Records = Vec<(Loc, Vec<u8>)>;

/// Live records met so far, with the order in which their transactions first appeared.
#[derive(Default)]
struct LiveSet {
    txns: HashMap<u64, (u64, Records)>,
    order_next: u64,
}

impl LiveSet {
    fn into_ordered(self) -> Vec<RecoveredTxn> {
        let mut txns: Vec<(u64, RecoveredTxn)> = self
            .txns
            .into_iter()
            .map(|(txn, (order, records))| (order, RecoveredTxn { txn, records }))
            .collect();
        txns.sort_by_key(|(order, _)| *order);
        txns.into_iter().map(|(_, t)| t).collect()
    }
}

/// Replays one segment; returns the end of its valid content and how it ends.
fn scan_segment(
    buf: &[u8],
    seq: u64,
    path: &Path,
    bound: Option<u64>,
    live: &mut LiveSet,
) -> Result<(u64, Tail), LogError> {
    let mut pos = SEGMENT_HEADER_BYTES;
    let (bad_at, batch_start, reason) = loop {
        if let Some(bound) = bound {
            if pos as u64 == bound {
                return Ok((bound, Tail::Clean));
            }
            if pos as u64 > bound {
                return Err(LogError::Corrupted {
                    path: path.to_path_buf(),
                    offset: bound,
                    reason: format!(
                        "a batch crosses offset {bound}, where the next segment says this one ends"
                    ),
                });
            }
        }
        let Some(marker) = format::decode_marker(&buf[pos.min(buf.len())..], seq) else {
            break (pos, pos, "no valid batch marker".to_string());
        };
        let start = pos + MARKER_BYTES;
        let end = start + marker.batch_len as usize;
        if end > buf.len() {
            break (pos, pos, format!("batch of {} bytes runs past the end of the file", marker.batch_len));
        }
        if let Some((at, why)) = first_bad_frame(buf, start, end, seq) {
            break (at, pos, why);
        }
        apply_batch(buf, start, end, seq, live);
        pos = end;
    };
    if let Some(bound) = bound {
        return Err(LogError::Corrupted {
            path: path.to_path_buf(),
            offset: bad_at as u64,
            reason: format!(
                "{reason}, but the next segment says this one holds valid records up to offset {bound}"
            ),
        });
    }
    // The last segment: a torn batch is expected after a crash, unless a later batch of this
    // segment was formed after the bad bytes had been made durable.
    for later in batch_start + 1..buf.len().saturating_sub(MARKER_BYTES - 1) {
        if let Some(marker) = format::decode_marker(&buf[later..], seq) {
            if marker.synced_through as usize > batch_start {
                return Err(LogError::Corrupted {
                    path: path.to_path_buf(),
                    offset: bad_at as u64,
                    reason: format!(
                        "{reason}; the valid batch at offset {later} records that offset {} was durable",
                        marker.synced_through
                    ),
                });
            }
        }
    }
    // A file is reused without being cleared, so the writer's last batch is normally
    // followed by zeros or by bytes of the file's previous life, whose markers name an older
    // sequence number: that is where the writer stopped, not damage. Only a batch this
    // segment started (its marker names this sequence number) and did not finish is torn.
    let started_here = bad_at != batch_start || format::looks_like_marker(&buf[batch_start..], seq);
    if !started_here {
        tracing::debug!(path = %path.display(), offset = batch_start, "journal: the last segment ends here");
        return Ok((batch_start as u64, Tail::Clean));
    }
    let warning = format!(
        "{}: cut a torn batch at offset {batch_start} ({reason} at offset {bad_at}); a write that was not yet durable",
        path.display()
    );
    tracing::warn!(path = %path.display(), offset = batch_start, %reason, "journal: cutting a torn tail");
    Ok((batch_start as u64, Tail::Torn(warning)))
}

/// The offset and reason of the first frame in `start..end` that is not a valid record.
fn first_bad_frame(buf: &[u8], start: usize, end: usize, seq: u64) -> Option<(usize, String)> {
    let mut p = start;
    while p < end {
        match record::decode(&buf[p..end], end - p) {
            Decoded::Frame(f, n) if matches!(f.kind, RecordKind::Data | RecordKind::Completion) => p += n,
            // Direct writes pad a batch to whole pages with a frame of the segment's own.
            Decoded::Frame(f, n) if f.kind == RecordKind::Padding && f.txn == seq => p += n,
            Decoded::Frame(f, _) => {
                return Some((p, format!("unexpected {:?} frame inside a batch", f.kind)))
            }
            Decoded::Zero => return Some((p, "zeroed bytes inside a batch".into())),
            Decoded::Truncated => return Some((p, "frame runs past the end of its batch".into())),
            Decoded::Invalid(why) => return Some((p, why)),
        }
    }
    None
}

/// Applies the frames of a batch already checked by `first_bad_frame`.
fn apply_batch(buf: &[u8], start: usize, end: usize, seq: u64, live: &mut LiveSet) {
    let mut p = start;
    while p < end {
        // `first_bad_frame` accepted these bytes; stop quietly if that ever disagreed.
        let Decoded::Frame(frame, n) = record::decode(&buf[p..end], end - p) else {
            debug_assert!(false, "batch frames were checked before they are applied");
            return;
        };
        match frame.kind {
            RecordKind::Data => {
                let loc = Loc { seq, offset: p as u32, len: n as u32 };
                let order = live.order_next;
                let entry = live.txns.entry(frame.txn).or_insert_with(|| (order, Vec::new()));
                if entry.0 == order {
                    live.order_next += 1;
                }
                entry.1.push((loc, frame.payload.to_vec()));
            }
            RecordKind::Completion => {
                live.txns.remove(&frame.txn);
            }
            RecordKind::Padding => {}
        }
        p += n;
    }
}
