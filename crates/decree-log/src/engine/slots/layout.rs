//! The on-disk layout of `slots.dat`: the header, the encoding of one slot, and how a slot
//! read at open is classified. No IO policy lives here beyond creating the file.
//!
//! ```text
//! offset 0            header: one frame (kind data, txn 0) whose payload is magic
//!                     "decree-slots-v1\0", version u32, slot_bytes u32, slots_count u32
//! offset 2048         the same header again (backup, written and synced first)
//! offset 4096 + i*S   slot i (S = slot_bytes), always written whole, in one write:
//!   [0, 8)            stamp: the record's sequence number
//!   [8, 8+n)          one frame (kind data, txn, payload = sequence u64, head sequence
//!                     u64, the appended bytes)
//!   [8+n, S-8)        zeros
//!   [S-8, S)          trailer: the sequence number again (zeroed by completion)
//! ```
//!
//! Sequence numbers start at 1 and only grow, and each is written once. The *head* of a
//! transaction is its first record (head sequence = own sequence); later records name
//! their head, and a record is live only while its head is. Completion zeroes the head's
//! trailer, or overwrites the head's slot with a new record: either is one write, so a
//! transaction completes atomically however many records it has. The other slots of the
//! transaction are left as they are, dead with their head.
//!
//! Classification of a slot at open ([`SlotContent`]):
//! - stamp, frame sequence and trailer equal (non-zero), frame valid: a record;
//! - stamp and trailer equal and non-zero but the frame invalid: both ends of one write
//!   are there and the middle is damaged: corruption, open refuses;
//! - all zero: free;
//! - anything else (a prefix or suffix of a write over older bytes, a zeroed trailer): a
//!   torn write or a completed head, treated as free.
//!
//! A torn write leaves a prefix or a suffix of the slot (the fault storage cuts at any
//! byte, disks at sector boundaries). A prefix changes the stamp before anything else and
//! a suffix the trailer, so a torn write never shows equal non-zero ends around a bad
//! frame: it is never taken for corruption. A slot of three or more sectors torn in the
//! middle only would be reported as corruption: the safe direction (refuse to open, name
//! the file) rather than silently dropping a decided transaction. Damage confined to the
//! stamp or the trailer is not told apart from a torn write.

use crate::io::{Storage, StorageFile};
use crate::record::{self, Decoded, RecordKind};
use crate::LogError;
use std::path::Path;

/// Name of the slot file inside the log directory.
pub const SLOTS_FILE: &str = "slots.dat";
/// Bytes reserved at the start of the file for the header (one page, so slots stay aligned).
pub const HEADER_AREA_BYTES: u64 = 4096;
/// Where the backup copy of the header starts, inside the header area.
const HEADER_BACKUP_OFFSET: u64 = 2048;
/// Bytes in a slot besides the appended bytes: stamp, frame header, two sequence numbers,
/// trailer.
pub const SLOT_OVERHEAD_BYTES: usize = STAMP_BYTES + record::HEADER_BYTES + 16 + TRAILER_BYTES;
/// Bytes of the stamp at the start of each slot.
const STAMP_BYTES: usize = 8;
/// Bytes of the trailer at the end of each slot.
pub const TRAILER_BYTES: usize = 8;
const MAGIC: &[u8; 16] = b"decree-slots-v1\0";
const FORMAT_VERSION: u32 = 1;
const HEADER_PAYLOAD_BYTES: usize = 16 + 4 + 4 + 4;

/// One slot's bytes for a record: stamp, frame, zeros, trailer; exactly `slot_bytes` long.
pub fn encode_slot(slot_bytes: usize, txn: u64, sequence: u64, head: u64, payload: &[u8]) -> Vec<u8> {
    assert!(sequence > 0 && head > 0 && head <= sequence, "sequence {sequence} head {head}");
    assert!(payload.len() + SLOT_OVERHEAD_BYTES <= slot_bytes);
    let mut body = Vec::with_capacity(16 + payload.len());
    body.extend_from_slice(&sequence.to_le_bytes());
    body.extend_from_slice(&head.to_le_bytes());
    body.extend_from_slice(payload);
    let mut out = Vec::with_capacity(slot_bytes);
    out.extend_from_slice(&sequence.to_le_bytes());
    record::encode(&mut out, RecordKind::Data, txn, &body);
    out.resize(slot_bytes - TRAILER_BYTES, 0);
    out.extend_from_slice(&sequence.to_le_bytes());
    debug_assert_eq!(out.len(), slot_bytes);
    out
}

/// Offset of the trailer inside a slot.
pub fn trailer_at(slot_bytes: usize) -> usize {
    slot_bytes - TRAILER_BYTES
}

/// A record found in a slot.
#[derive(Debug)]
pub struct SlotRecord<'a> {
    /// The transaction key.
    pub txn: u64,
    /// This record's sequence number (unique, increasing across the log's life).
    pub sequence: u64,
    /// The sequence number of its transaction's head record (its own if it is the head).
    pub head: u64,
    /// The appended bytes.
    pub payload: &'a [u8],
}

/// What one slot holds at open.
#[derive(Debug)]
pub enum SlotContent<'a> {
    /// Never written.
    Free,
    /// A record whose stamp and trailer match its frame.
    Record(SlotRecord<'a>),
    /// A torn write or a completed head, treated as free; `highest` is the largest
    /// sequence number its bytes name (new sequence numbers must exceed it).
    Dead { reason: String, highest: u64 },
    /// Damaged between the two intact ends of one write.
    Corrupted(String),
}

fn word64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// Classifies one slot's bytes (see the module documentation).
pub fn decode_slot(buf: &[u8]) -> SlotContent<'_> {
    if buf.len() < SLOT_OVERHEAD_BYTES {
        return SlotContent::Dead { reason: format!("{} bytes cannot hold a slot", buf.len()), highest: 0 };
    }
    let stamp = word64(buf, 0);
    let trailer = word64(buf, trailer_at(buf.len()));
    let frame_area = &buf[STAMP_BYTES..trailer_at(buf.len())];
    let decoded = record::decode(frame_area, frame_area.len() - record::HEADER_BYTES);
    let record = match &decoded {
        Decoded::Frame(frame, _) if frame.kind == RecordKind::Data && frame.payload.len() >= 16 => {
            let sequence = word64(frame.payload, 0);
            let head = word64(frame.payload, 8);
            Some(SlotRecord { txn: frame.txn, sequence, head, payload: &frame.payload[16..] })
        }
        _ => None,
    };
    let named = record.as_ref().map_or(0, |r| r.sequence.max(r.head));
    let highest = stamp.max(trailer).max(named);
    match record {
        Some(record) if stamp != 0 && stamp == trailer && trailer == record.sequence => {
            if record.head == 0 || record.head > record.sequence {
                let reason = format!("head sequence {} after own sequence {}", record.head, record.sequence);
                return SlotContent::Corrupted(reason);
            }
            SlotContent::Record(record)
        }
        Some(record) => SlotContent::Dead {
            reason: format!("stamp {stamp}, sequence {}, trailer {trailer}", record.sequence),
            highest,
        },
        None if stamp != 0 && stamp == trailer => SlotContent::Corrupted(format!(
            "record {trailer} is damaged between its intact ends: {decoded:?}"
        )),
        None if stamp == 0 && trailer == 0 && decoded == Decoded::Zero => SlotContent::Free,
        None => {
            SlotContent::Dead { reason: format!("stamp {stamp}, trailer {trailer}: {decoded:?}"), highest }
        }
    }
}

fn header_frame(slot_bytes: u32, slots_count: u32) -> Vec<u8> {
    let mut payload = Vec::with_capacity(HEADER_PAYLOAD_BYTES);
    payload.extend_from_slice(MAGIC);
    payload.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    payload.extend_from_slice(&slot_bytes.to_le_bytes());
    payload.extend_from_slice(&slots_count.to_le_bytes());
    let mut out = Vec::new();
    record::encode(&mut out, RecordKind::Data, 0, &payload);
    out
}

/// Decodes one header copy: `Ok(None)` for zeros, `Err(reason)` when unreadable.
fn decode_header(buf: &[u8]) -> Result<Option<(u32, u32)>, String> {
    match record::decode(buf, HEADER_PAYLOAD_BYTES) {
        Decoded::Zero => Ok(None),
        Decoded::Frame(frame, _)
            if frame.payload.len() == HEADER_PAYLOAD_BYTES && frame.payload[..16] == *MAGIC =>
        {
            let word = |at: usize| u32::from_le_bytes(frame.payload[at..at + 4].try_into().expect("4 bytes"));
            if word(16) != FORMAT_VERSION {
                return Err(format!("unknown slot file version {}", word(16)));
            }
            Ok(Some((word(20), word(24))))
        }
        Decoded::Frame(..) => Err("not a decree slot file header".into()),
        other => Err(format!("unreadable header: {other:?}")),
    }
}

/// The geometry (slot_bytes, slots_count) stored in the header: `None` for a file whose
/// creation never finished.
///
/// The header exists twice: the backup copy is written and synced before the primary at
/// offset 0, so a torn primary (a crash while growing the file) falls back to the backup,
/// and a zero primary means creation never finished (no record can exist yet: records are
/// written only after open returns).
fn read_geometry(file: &dyn StorageFile, path: &Path) -> Result<Option<(u32, u32)>, LogError> {
    let len = file.len().map_err(|e| LogError::io(path, e))?;
    let mut buf = vec![0u8; len.min(HEADER_AREA_BYTES) as usize];
    file.read_exact_at(&mut buf, 0).map_err(|e| LogError::io(path, e))?;
    let backup_at = (HEADER_BACKUP_OFFSET as usize).min(buf.len());
    let (primary, backup) = buf.split_at(backup_at);
    match decode_header(primary) {
        Ok(geometry) => Ok(geometry),
        Err(primary_reason) => match decode_header(backup) {
            Ok(Some(geometry)) => {
                tracing::warn!(path = %path.display(), reason = %primary_reason, "primary slot header torn; using the backup copy");
                Ok(Some(geometry))
            }
            Ok(None) | Err(_) => Err(LogError::Corrupted {
                path: path.to_path_buf(),
                offset: 0,
                reason: format!("both slot file headers are unreadable: {primary_reason}"),
            }),
        },
    }
}

fn sync_error(path: &Path, e: std::io::Error) -> LogError {
    LogError::SyncFailed { path: path.to_path_buf(), message: e.to_string() }
}

/// Writes both header copies, backup first, each synced before the next.
fn write_headers(
    file: &dyn StorageFile,
    path: &Path,
    slot_bytes: u32,
    slots_count: u32,
) -> Result<(), LogError> {
    let frame = header_frame(slot_bytes, slots_count);
    for offset in [HEADER_BACKUP_OFFSET, 0] {
        file.write_all_at(&frame, offset).map_err(|e| LogError::io(path, e))?;
        file.sync_data().map_err(|e| sync_error(path, e))?;
    }
    Ok(())
}

/// Creates, grows or checks `slots.dat` so that it holds `slots_count` slots of `slot_bytes`.
pub fn prepare_file(
    storage: &dyn Storage,
    dir: &Path,
    file: &dyn StorageFile,
    path: &Path,
    slot_bytes: u32,
    slots_count: u32,
) -> Result<(), LogError> {
    let total = HEADER_AREA_BYTES + u64::from(slots_count) * u64::from(slot_bytes);
    let count_on_disk = match read_geometry(file, path)? {
        None => None,
        Some((bytes_on_disk, count_on_disk)) => {
            if bytes_on_disk != slot_bytes {
                return Err(LogError::Config(format!(
                    "{} was created with slot_bytes = {bytes_on_disk} but the configuration asks for \
                     {slot_bytes}; the slot size of an existing log cannot change",
                    path.display()
                )));
            }
            if count_on_disk > slots_count {
                return Err(LogError::Config(format!(
                    "{} holds {count_on_disk} slots but the configuration asks for {slots_count}; \
                     a slot file cannot shrink",
                    path.display()
                )));
            }
            let needed = HEADER_AREA_BYTES + u64::from(count_on_disk) * u64::from(slot_bytes);
            let len = file.len().map_err(|e| LogError::io(path, e))?;
            if len < needed {
                return Err(LogError::Corrupted {
                    path: path.to_path_buf(),
                    offset: len,
                    reason: format!("the file has {len} bytes but its header describes {needed}"),
                });
            }
            Some(count_on_disk)
        }
    };
    if count_on_disk == Some(slots_count) {
        return Ok(());
    }
    // New or growing: zero-fill the space first (synced by preallocate), then write the
    // headers, so that a header never describes space that is not there.
    file.preallocate(total).map_err(|e| LogError::io(path, e))?;
    write_headers(file, path, slot_bytes, slots_count)?;
    storage.sync_dir(dir).map_err(|e| sync_error(dir, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_round_trips_and_its_zeroed_trailer_kills_it() {
        let mut slot = encode_slot(256, 9, 5, 3, b"decision");
        match decode_slot(&slot) {
            SlotContent::Record(r) => {
                assert_eq!((r.txn, r.sequence, r.head, r.payload), (9, 5, 3, &b"decision"[..]));
            }
            other => panic!("expected a record, got {other:?}"),
        }
        let at = trailer_at(256);
        slot[at..].fill(0);
        assert!(matches!(decode_slot(&slot), SlotContent::Dead { highest: 5, .. }));
        assert!(matches!(decode_slot(&[0u8; 256]), SlotContent::Free));
    }

    #[test]
    fn every_prefix_or_suffix_of_a_reuse_write_is_whole_or_dead_never_corrupt() {
        let live_old = encode_slot(256, 1, 10, 7, &[0x11; 200]);
        let mut completed_old = live_old.clone();
        completed_old[trailer_at(256)..].fill(0);
        // 266 shares its low byte with 10: a one-byte tear leaves the old stamp.
        for new_sequence in [11, 266] {
            let new = encode_slot(256, 2, new_sequence, new_sequence, &[0x22; 150]);
            for old in [&live_old, &completed_old, &vec![0u8; 256]] {
                for cut in 0..=256 {
                    let mut prefix = old.clone();
                    prefix[..cut].copy_from_slice(&new[..cut]);
                    let mut suffix = old.clone();
                    suffix[cut..].copy_from_slice(&new[cut..]);
                    for (what, bytes) in [("prefix", &prefix), ("suffix", &suffix)] {
                        match decode_slot(bytes) {
                            SlotContent::Record(r) => {
                                let whole_old = r.sequence == 10 && r.payload == [0x11; 200];
                                assert!(bytes == &new || whole_old, "{what} {cut}: a mix decoded as {r:?}");
                            }
                            SlotContent::Corrupted(reason) => {
                                panic!("{what} {cut}: a torn write taken for corruption: {reason}")
                            }
                            SlotContent::Free | SlotContent::Dead { .. } => {}
                        }
                    }
                }
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_slots_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            if let SlotContent::Record(r) = decode_slot(&bytes) {
                proptest::prop_assert!(r.head <= r.sequence && r.payload.len() <= bytes.len());
            }
        }
    }

    #[test]
    fn damage_between_intact_ends_is_corruption() {
        let mut slot = encode_slot(256, 1, 10, 10, &[0x11; 200]);
        slot[120] ^= 0x40;
        assert!(matches!(decode_slot(&slot), SlotContent::Corrupted(_)));
    }
}
