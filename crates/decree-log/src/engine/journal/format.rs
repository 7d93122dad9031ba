//! On-disk layout of journal segments, on top of the shared record framing.
//!
//! A segment file is `journal-NNNNNNNN.seg` (NNNNNNNN is a file id, not its order: files
//! are reused). It starts with a header frame and then holds batches:
//!
//! ```text
//! header  Padding frame, txn = segment sequence number, payload (24 bytes, LE):
//!         magic "DCRJRNL1", oldest_needed (u64), previous_end (u64)
//! batch   marker: Padding frame, txn = segment sequence number, payload (8 bytes, LE):
//!         batch_len (u32: bytes of frames after the marker), synced_through (u32)
//!         then batch_len bytes of Data and Completion frames, possibly ending with a
//!         Padding frame (txn = segment sequence number) that fills the batch to a page
//!         boundary when it was written with O_DIRECT
//! ```
//!
//! Sequence numbers order segments and are never reused, so frames left in a recycled
//! file by its previous life (whose markers carry an older sequence number) are never
//! taken for new ones: a batch counts only if its marker names the segment's sequence
//! number, and its frames count only inside the length its marker gives.
//! `oldest_needed` is the oldest segment recovery must replay (older ones are free);
//! `previous_end` is where the valid content of the previous segment ends (it was synced
//! before this header was written), so recovery knows that anything bad before that
//! offset is corruption, and anything after it is a torn tail that was cut.
//! `synced_through` is the offset of the segment that was durable when the batch was
//! formed: a bad frame before a later marker's `synced_through` was once durable, so it
//! is corruption rather than a torn write.

use crate::record::{self, Decoded, RecordKind, HEADER_BYTES};

/// Identifies a journal segment header ("DCRJRNL1").
pub const MAGIC: u64 = u64::from_le_bytes(*b"DCRJRNL1");
/// Bytes of the segment header frame.
pub const SEGMENT_HEADER_BYTES: usize = HEADER_BYTES + 24;
/// Bytes of a batch marker frame.
pub const MARKER_BYTES: usize = HEADER_BYTES + 8;

/// What the header of a segment says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    /// The segment's sequence number (order of writing, never reused).
    pub seq: u64,
    /// The oldest segment still needed by recovery when this one was started.
    pub oldest_needed: u64,
    /// Where the previous segment's valid content ends.
    pub previous_end: u64,
}

/// What a batch marker says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchMarker {
    /// Bytes of frames following the marker.
    pub batch_len: u32,
    /// Offset of the segment that was durable when the batch was formed.
    pub synced_through: u32,
}

/// Appends the header frame of a segment to `out`.
pub fn encode_header(out: &mut Vec<u8>, header: &SegmentHeader) {
    assert!(header.oldest_needed <= header.seq, "oldest needed segment is newer than the segment");
    let mut payload = [0u8; 24];
    payload[0..8].copy_from_slice(&MAGIC.to_le_bytes());
    payload[8..16].copy_from_slice(&header.oldest_needed.to_le_bytes());
    payload[16..24].copy_from_slice(&header.previous_end.to_le_bytes());
    record::encode(out, RecordKind::Padding, header.seq, &payload);
}

/// Decodes the header at the start of a segment, `None` when it is not a valid header.
pub fn decode_header(buf: &[u8]) -> Option<SegmentHeader> {
    let Decoded::Frame(frame, SEGMENT_HEADER_BYTES) = record::decode(buf, 64) else {
        return None;
    };
    if frame.kind != RecordKind::Padding || frame.payload.len() != 24 {
        return None;
    }
    let word = |i: usize| u64::from_le_bytes(frame.payload[i..i + 8].try_into().expect("8 bytes"));
    if word(0) != MAGIC || word(8) > frame.txn {
        return None;
    }
    Some(SegmentHeader { seq: frame.txn, oldest_needed: word(8), previous_end: word(16) })
}

/// Overwrites the first `MARKER_BYTES` of `slot` with the marker of a batch of segment `seq`.
pub fn write_marker(slot: &mut [u8], seq: u64, marker: BatchMarker, scratch: &mut Vec<u8>) {
    scratch.clear();
    let mut payload = [0u8; 8];
    payload[0..4].copy_from_slice(&marker.batch_len.to_le_bytes());
    payload[4..8].copy_from_slice(&marker.synced_through.to_le_bytes());
    record::encode(scratch, RecordKind::Padding, seq, &payload);
    slot[..MARKER_BYTES].copy_from_slice(scratch);
}

/// Decodes a marker of segment `seq` at the start of `buf`; `None` for anything else.
pub fn decode_marker(buf: &[u8], seq: u64) -> Option<BatchMarker> {
    if !looks_like_marker(buf, seq) {
        return None;
    }
    let Decoded::Frame(frame, MARKER_BYTES) = record::decode(buf, 64) else {
        return None;
    };
    if frame.kind != RecordKind::Padding || frame.txn != seq || frame.payload.len() != 8 {
        return None;
    }
    Some(BatchMarker {
        batch_len: u32::from_le_bytes(frame.payload[0..4].try_into().expect("4 bytes")),
        synced_through: u32::from_le_bytes(frame.payload[4..8].try_into().expect("4 bytes")),
    })
}

/// A cheap filter before the checksum, used when scanning every offset for markers, and
/// the sign that a batch of segment `seq` was started at `buf` even when its marker is torn.
pub fn looks_like_marker(buf: &[u8], seq: u64) -> bool {
    buf.len() >= MARKER_BYTES
        && buf[0..4] == ((MARKER_BYTES - 8) as u32).to_le_bytes()
        && buf[8] == RecordKind::Padding as u8
        && buf[9..17] == seq.to_le_bytes()
}

/// The file name of segment file `file_id`.
pub fn file_name(file_id: u64) -> String {
    format!("journal-{file_id:08}.seg")
}

/// The file id of a segment file name, `None` for other files.
pub fn parse_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("journal-")?.strip_suffix(".seg")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_marker_round_trip() {
        let header = SegmentHeader { seq: 9, oldest_needed: 7, previous_end: 4242 };
        let mut buf = Vec::new();
        encode_header(&mut buf, &header);
        assert_eq!(buf.len(), SEGMENT_HEADER_BYTES);
        assert_eq!(decode_header(&buf), Some(header));
        let mut slot = vec![0u8; MARKER_BYTES + 3];
        let marker = BatchMarker { batch_len: 600, synced_through: 41 };
        write_marker(&mut slot, 9, marker, &mut Vec::new());
        assert_eq!(decode_marker(&slot, 9), Some(marker));
        assert_eq!(decode_marker(&slot, 8), None, "a marker of another life must not match");
        assert_eq!(decode_header(&slot), None);
        slot[20] ^= 1;
        assert_eq!(decode_marker(&slot, 9), None);
    }

    #[test]
    fn file_names() {
        assert_eq!(file_name(1), "journal-00000001.seg");
        assert_eq!(parse_file_name("journal-00000001.seg"), Some(1));
        assert_eq!(parse_file_name("journal-.seg"), None);
        assert_eq!(parse_file_name("INCARNATION"), None);
    }
}
