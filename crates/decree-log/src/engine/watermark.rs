//! The watermark: what a log directory held at its last clean close or checkpoint, kept
//! apart from the log itself so that lost durable data can be told from a torn last write.
//!
//! A torn or zeroed tail is expected after a crash and is cut quietly; the same bytes in a
//! log that was closed cleanly, or before a position that was known durable, mean that
//! acknowledged records were lost (a zero-filled or truncated file, a missing segment).
//! Recovery alone cannot tell the two apart when nothing valid follows the damage, so every
//! durable engine records a [`Mark`] here:
//! - at open, after recovery and before the first write, a mark that is not clean (any
//!   crash from then on is a crash, not a clean close);
//! - during the run, checkpoints of the durable end where the engine has one (the journal);
//! - at a clean close, after the final sync, the end position and the live record count.
//!
//! [`contradiction`] is the rule, a pure function: after a clean close, recovery must find
//! exactly the recorded end and live count and no torn write; after a crash, it must find at
//! least the last checkpointed end. Anything else is refused by the engine, naming the file
//! and the offset.
//!
//! On disk, `WATERMARK` in the log directory holds two 512-byte slots written in turn, each
//! one framed record (length, CRC32C; see [`crate::record`]) whose transaction key is the
//! mark's generation and whose payload is (LE) `clean` (u8), `live` (u64), `end.seq` (u64),
//! `end.offset` (u64), `incarnation` (u64). The valid slot with the higher generation is the
//! mark; a write torn by a crash leaves the other slot intact. A log directory without the
//! file (new, or written by an older decree) has no mark and is not checked.

use crate::io::{Storage, StorageFile};
use crate::record::{self, Decoded, RecordKind};
use crate::LogError;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The file name of the watermark in a log directory.
pub const WATERMARK_FILE: &str = "WATERMARK";
/// Bytes of one slot; two slots make the file.
const SLOT_BYTES: usize = 512;
/// Bytes of a mark's payload.
const PAYLOAD_BYTES: usize = 1 + 8 + 8 + 8 + 8;

/// Where a log's valid content ends, in the engine's terms: the journal's segment sequence
/// number and offset; engines without a position leave both 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct End {
    /// The segment (journal) holding the end.
    pub seq: u64,
    /// The offset in that segment where valid content ends.
    pub offset: u64,
}

impl std::fmt::Display for End {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "segment {} offset {}", self.seq, self.offset)
    }
}

/// What the log held when the mark was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    /// Written at a clean close: nothing was written after it.
    pub clean: bool,
    /// Live records (journal: live transactions) at that moment.
    pub live: u64,
    /// The durable end at that moment.
    pub end: End,
    /// The incarnation that wrote the mark.
    pub incarnation: u64,
}

/// What recovery found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// Live records (journal: live transactions), counted the way the engine counts them.
    pub live: u64,
    /// Where the valid content ends.
    pub end: End,
    /// Torn writes found (cut or deleted).
    pub torn: u64,
}

/// Why `found` cannot follow from `mark` without losing durable data, or `None`. `has_end`
/// says whether the engine has an end position to compare.
pub fn contradiction(mark: &Mark, found: &Found, has_end: bool) -> Option<String> {
    if mark.clean {
        let by = format!("the log was closed cleanly by incarnation {}", mark.incarnation);
        if has_end && found.end != mark.end {
            return Some(format!(
                "{by} with its valid content ending at {}, but it now ends at {}",
                mark.end, found.end
            ));
        }
        if found.live != mark.live {
            return Some(format!("{by} with {} live records, but {} were found", mark.live, found.live));
        }
        if found.torn > 0 {
            return Some(format!("{by}, yet {} torn writes were found", found.torn));
        }
        return None;
    }
    if has_end && found.end < mark.end {
        return Some(format!(
            "{} was durable (checkpoint of incarnation {}), but the valid content now ends at {}",
            mark.end, mark.incarnation, found.end
        ));
    }
    None
}

/// The open watermark file of a log directory.
pub struct Watermark {
    path: PathBuf,
    file: Arc<dyn StorageFile>,
    /// Generation of the last mark written or read.
    generation: u64,
    last: Option<Mark>,
}

impl Watermark {
    /// Opens (creating durably if needed) the watermark of `dir` and reads its mark.
    pub fn open(storage: &dyn Storage, dir: &Path) -> Result<Watermark, LogError> {
        let path = dir.join(WATERMARK_FILE);
        let exists = storage.list(dir).map_err(|e| LogError::io(dir, e))?.iter().any(|p| p == &path);
        let file = storage.open(&path, true).map_err(|e| LogError::io(&path, e))?;
        if !exists {
            file.set_len(2 * SLOT_BYTES as u64).map_err(|e| LogError::io(&path, e))?;
            file.sync_all().map_err(|e| sync_error(&path, e))?;
            storage.sync_dir(dir).map_err(|e| sync_error(dir, e))?;
            return Ok(Watermark { path, file, generation: 0, last: None });
        }
        let len = file.len().map_err(|e| LogError::io(&path, e))?;
        let mut buf = vec![0u8; 2 * SLOT_BYTES];
        let readable = (len as usize).min(buf.len());
        file.read_exact_at(&mut buf[..readable], 0).map_err(|e| LogError::io(&path, e))?;
        if len < buf.len() as u64 {
            file.set_len(buf.len() as u64).map_err(|e| LogError::io(&path, e))?;
        }
        let (generation, last) = read_slots(&buf).map_err(|reason| LogError::Corrupted {
            path: path.clone(),
            offset: 0,
            reason,
        })?;
        Ok(Watermark { path, file, generation, last })
    }

    /// The mark read at open or written last.
    pub fn last(&self) -> Option<Mark> {
        self.last
    }

    /// The watermark file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// At open, after recovery and before the log's first write: refuses with
    /// [`LogError::Lost`] at the place `lost_at` names (file and offset) when `found`
    /// contradicts the last mark, else records that the log runs (from here on a crash is
    /// a crash: the last clean close no longer holds).
    pub fn begin_run(
        &mut self,
        found: &Found,
        has_end: bool,
        incarnation: u64,
        lost_at: impl FnOnce() -> (PathBuf, u64),
    ) -> Result<(), LogError> {
        if let Some(reason) = self.last.and_then(|mark| contradiction(&mark, found, has_end)) {
            let (path, offset) = lost_at();
            return Err(LogError::Lost { path, offset, reason });
        }
        self.write(Mark { clean: false, live: found.live, end: found.end, incarnation })
    }

    /// After the final sync of a clean close: records the end and the live count. A
    /// failure only costs the next open its exact check, so it is logged, not returned.
    pub fn close_cleanly(&mut self, live: u64, end: End, incarnation: u64) {
        if let Err(err) = self.write(Mark { clean: true, live, end, incarnation }) {
            tracing::error!(%err, path = %self.path.display(), "cannot record the clean close; the next open checks less");
        }
    }

    /// Writes `mark` into the older slot and syncs it. An error is a sync failure of the log
    /// (fail-stop: the caller stops the log).
    pub fn write(&mut self, mark: Mark) -> Result<(), LogError> {
        let generation = self.generation + 1;
        let mut buf = Vec::with_capacity(SLOT_BYTES);
        record::encode(&mut buf, RecordKind::Data, generation, &encode_payload(&mark));
        buf.resize(SLOT_BYTES, 0);
        let at = (generation % 2) * SLOT_BYTES as u64;
        self.file.write_all_at(&buf, at).map_err(|e| LogError::io(&self.path, e))?;
        self.file.sync_data().map_err(|e| sync_error(&self.path, e))?;
        self.generation = generation;
        self.last = Some(mark);
        Ok(())
    }
}

fn sync_error(path: &Path, e: std::io::Error) -> LogError {
    LogError::SyncFailed { path: path.to_path_buf(), message: e.to_string() }
}

fn encode_payload(mark: &Mark) -> [u8; PAYLOAD_BYTES] {
    let mut out = [0u8; PAYLOAD_BYTES];
    out[0] = u8::from(mark.clean);
    out[1..9].copy_from_slice(&mark.live.to_le_bytes());
    out[9..17].copy_from_slice(&mark.end.seq.to_le_bytes());
    out[17..25].copy_from_slice(&mark.end.offset.to_le_bytes());
    out[25..33].copy_from_slice(&mark.incarnation.to_le_bytes());
    out
}

fn decode_payload(p: &[u8]) -> Option<Mark> {
    if p.len() != PAYLOAD_BYTES || p[0] > 1 {
        return None;
    }
    let word = |i: usize| u64::from_le_bytes(p[i..i + 8].try_into().expect("8 bytes"));
    Some(Mark {
        clean: p[0] == 1,
        live: word(1),
        end: End { seq: word(9), offset: word(17) },
        incarnation: word(25),
    })
}

/// The newest valid mark of the two slots and its generation; an error when a slot holds
/// something that is neither empty nor a valid mark and no valid mark is left.
fn read_slots(buf: &[u8]) -> Result<(u64, Option<Mark>), String> {
    let mut best: Option<(u64, Mark)> = None;
    let mut damaged = Vec::new();
    for (i, slot) in buf.chunks_exact(SLOT_BYTES).enumerate() {
        match record::decode(slot, SLOT_BYTES) {
            Decoded::Frame(f, _) if f.kind == RecordKind::Data => match decode_payload(f.payload) {
                Some(mark) if best.is_none_or(|(g, _)| f.txn > g) => best = Some((f.txn, mark)),
                Some(_) => {}
                None => damaged.push(format!("slot {i}: a mark of {} bytes", f.payload.len())),
            },
            Decoded::Zero => {}
            Decoded::Frame(f, _) => damaged.push(format!("slot {i}: a {:?} frame", f.kind)),
            Decoded::Truncated => damaged.push(format!("slot {i}: cut short")),
            Decoded::Invalid(why) => damaged.push(format!("slot {i}: {why}")),
        }
    }
    match best {
        Some((generation, mark)) => Ok((generation, Some(mark))),
        None if damaged.is_empty() => Ok((0, None)),
        None => Err(format!("no valid watermark: {}", damaged.join("; "))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::StdStorage;

    fn mark(clean: bool, live: u64, seq: u64, offset: u64) -> Mark {
        Mark { clean, live, end: End { seq, offset }, incarnation: 3 }
    }

    fn found(live: u64, seq: u64, offset: u64, torn: u64) -> Found {
        Found { live, end: End { seq, offset }, torn }
    }

    #[test]
    fn after_a_clean_close_only_the_exact_end_and_count_are_consistent() {
        let m = mark(true, 500, 4, 8192);
        assert_eq!(contradiction(&m, &found(500, 4, 8192, 0), true), None);
        let shorter = contradiction(&m, &found(77, 4, 1024, 0), true).expect("a shorter log is lost data");
        assert!(
            shorter.contains("segment 4 offset 8192") && shorter.contains("segment 4 offset 1024"),
            "{shorter}"
        );
        assert!(contradiction(&m, &found(500, 4, 9000, 0), true).is_some(), "writes after a clean close");
        assert!(contradiction(&m, &found(499, 4, 8192, 0), true).unwrap().contains("500 live records"));
        assert!(contradiction(&m, &found(500, 4, 8192, 1), true).unwrap().contains("torn"));
        assert!(contradiction(&m, &found(500, 0, 0, 0), false).is_none(), "no end to compare");
        assert!(contradiction(&m, &found(12, 0, 0, 0), false).is_some(), "the count still counts");
    }

    #[test]
    fn after_a_crash_the_end_may_grow_or_be_cut_after_the_checkpoint_only() {
        let m = mark(false, 10, 4, 8192);
        assert_eq!(contradiction(&m, &found(3, 4, 8192, 1), true), None, "torn after the checkpoint");
        assert_eq!(contradiction(&m, &found(0, 5, 64, 0), true), None, "a later segment");
        assert!(contradiction(&m, &found(10, 4, 4096, 0), true).unwrap().contains("was durable"));
        assert!(contradiction(&m, &found(10, 3, 100_000, 0), true).is_some(), "segment 4 is gone");
        assert_eq!(contradiction(&m, &found(0, 0, 0, 5), false), None, "counts change freely after a crash");
    }

    #[test]
    fn marks_alternate_slots_and_survive_a_torn_one() {
        let dir = tempfile::tempdir().unwrap();
        let storage = StdStorage;
        let mut w = Watermark::open(&storage, dir.path()).unwrap();
        assert_eq!(w.last(), None);
        w.write(mark(false, 1, 1, 100)).unwrap();
        w.write(mark(true, 2, 1, 200)).unwrap();
        drop(w);
        assert_eq!(Watermark::open(&storage, dir.path()).unwrap().last(), Some(mark(true, 2, 1, 200)));
        // Tear the newer slot (generation 2 lives in slot 0): the older mark is read.
        let path = dir.path().join(WATERMARK_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[20] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let mut w = Watermark::open(&storage, dir.path()).unwrap();
        assert_eq!(w.last(), Some(mark(false, 1, 1, 100)));
        // The next write goes over the torn slot, never over the valid one.
        w.write(mark(false, 5, 2, 64)).unwrap();
        assert_eq!(Watermark::open(&storage, dir.path()).unwrap().last(), Some(mark(false, 5, 2, 64)));
        // Both slots damaged: refused, naming the problem.
        std::fs::write(&path, vec![0x5a; 2 * SLOT_BYTES]).unwrap();
        let err = Watermark::open(&storage, dir.path()).err().expect("damaged watermark");
        assert!(err.to_string().contains("no valid watermark"), "{err}");
    }
}
