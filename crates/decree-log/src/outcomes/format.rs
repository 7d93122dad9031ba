//! The on-disk layout of `outcomes.dat`: the encoding of one slot and how a slot read at
//! open is classified. No IO lives here; the layout is documented byte by byte in the
//! parent module ([`crate::outcomes`]).

use crate::record::{self, Decoded, RecordKind};

/// Name of the outcome memory's file inside its directory.
pub const OUTCOMES_FILE: &str = "outcomes.dat";
/// Bytes of one slot: a frame of at most 161 bytes, then zeros.
pub const SLOT_BYTES: usize = 192;
/// The longest id an entry holds (an XA Xid: format id, two lengths, 64 + 64 bytes).
pub const ID_BYTES_MAX: usize = 134;
/// Bytes of the payload before the id: sequence u64, outcome u8, id_len u8.
const PAYLOAD_FIXED_BYTES: usize = 10;
/// The longest payload of an entry frame.
const PAYLOAD_MAX: usize = PAYLOAD_FIXED_BYTES + ID_BYTES_MAX;
/// The frame's transaction-key field holds this tag ("DCROUT01" little-endian), so that a
/// frame of another file (a slot log, a journal) copied here is not taken for an entry.
pub(crate) const ENTRY_TAG: u64 = u64::from_le_bytes(*b"DCROUT01");

const _: () = assert!(record::HEADER_BYTES + PAYLOAD_MAX <= SLOT_BYTES, "an entry must fit a slot");

/// What one slot holds at open.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum SlotContent<'a> {
    /// All zeros: never written.
    Empty,
    /// A whole entry that belongs in this slot.
    Entry { sequence: u64, outcome: u8, id: &'a [u8] },
    /// Anything else (a torn write, media damage); the reason says what failed.
    Damaged(String),
}

/// Writes the slot of one entry into `out` (exactly [`SLOT_BYTES`]): frame, then zeros.
pub(crate) fn encode_slot(out: &mut [u8], sequence: u64, outcome: u8, id: &[u8]) {
    assert_eq!(out.len(), SLOT_BYTES, "a slot is written whole");
    assert!(sequence > 0 && outcome > 0, "sequence {sequence}, outcome {outcome}");
    assert!(!id.is_empty() && id.len() <= ID_BYTES_MAX, "an id of {} bytes", id.len());
    let mut payload = [0u8; PAYLOAD_MAX];
    payload[0..8].copy_from_slice(&sequence.to_le_bytes());
    payload[8] = outcome;
    payload[9] = id.len() as u8;
    payload[PAYLOAD_FIXED_BYTES..PAYLOAD_FIXED_BYTES + id.len()].copy_from_slice(id);
    let payload = &payload[..PAYLOAD_FIXED_BYTES + id.len()];
    let frame_len = record::frame_len(payload.len());
    record::encode_into(&mut out[..frame_len], RecordKind::Data, ENTRY_TAG, payload);
    out[frame_len..].fill(0);
}

/// Classifies the bytes of slot `index` of a file of `capacity` slots.
///
/// Bytes after a valid frame are not checked: a write of a shorter entry over a longer one
/// torn so that only its zero tail landed leaves the older entry whole, which is still a
/// true memory.
pub(crate) fn decode_slot(buf: &[u8], index: u32, capacity: u32) -> SlotContent<'_> {
    assert!(index < capacity, "slot {index} of {capacity}");
    if buf.iter().all(|&b| b == 0) {
        return SlotContent::Empty;
    }
    let frame = match record::decode(buf, PAYLOAD_MAX) {
        Decoded::Frame(frame, _) => frame,
        Decoded::Zero => return SlotContent::Damaged("zero frame header before non-zero bytes".into()),
        Decoded::Truncated => return SlotContent::Damaged("frame runs past the slot".into()),
        Decoded::Invalid(reason) => return SlotContent::Damaged(reason),
    };
    if frame.kind != RecordKind::Data || frame.txn != ENTRY_TAG {
        return SlotContent::Damaged(format!(
            "not an outcome entry (kind {:?}, tag {:#x})",
            frame.kind, frame.txn
        ));
    }
    let payload = frame.payload;
    if payload.len() < PAYLOAD_FIXED_BYTES {
        return SlotContent::Damaged(format!("payload of {} bytes is too short", payload.len()));
    }
    let sequence = u64::from_le_bytes(payload[0..8].try_into().expect("8 bytes"));
    let outcome = payload[8];
    let id_len = payload[9] as usize;
    if sequence == 0 || outcome == 0 {
        return SlotContent::Damaged(format!(
            "sequence {sequence}, outcome {outcome}: zero is never written"
        ));
    }
    if id_len == 0 || id_len > ID_BYTES_MAX || payload.len() != PAYLOAD_FIXED_BYTES + id_len {
        return SlotContent::Damaged(format!("id length {id_len} in a payload of {} bytes", payload.len()));
    }
    let home = sequence % u64::from(capacity);
    if home != u64::from(index) {
        return SlotContent::Damaged(format!("sequence {sequence} belongs in slot {home}"));
    }
    SlotContent::Entry { sequence, outcome, id: &payload[PAYLOAD_FIXED_BYTES..] }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(sequence: u64, outcome: u8, id: &[u8]) -> Vec<u8> {
        let mut out = vec![0xAA; SLOT_BYTES];
        encode_slot(&mut out, sequence, outcome, id);
        out
    }

    #[test]
    fn an_entry_round_trips_at_the_documented_offsets() {
        let id = [7u8; ID_BYTES_MAX];
        let bytes = slot(21, 3, &id);
        assert_eq!(decode_slot(&bytes, 1, 4), SlotContent::Entry { sequence: 21, outcome: 3, id: &id });
        let len = 1 + 8 + PAYLOAD_FIXED_BYTES + ID_BYTES_MAX;
        assert_eq!(bytes[0..4], (len as u32).to_le_bytes());
        assert_eq!(bytes[8], RecordKind::Data as u8);
        assert_eq!(&bytes[9..17], b"DCROUT01");
        assert_eq!(bytes[17..25], 21u64.to_le_bytes());
        assert_eq!((bytes[25], bytes[26]), (3, ID_BYTES_MAX as u8));
        assert_eq!(bytes[27..27 + ID_BYTES_MAX], id);
        assert!(bytes[27 + ID_BYTES_MAX..].iter().all(|&b| b == 0), "the tail is zeroed");
        assert_eq!(decode_slot(&[0u8; SLOT_BYTES], 0, 4), SlotContent::Empty);
    }

    #[test]
    fn an_entry_in_the_wrong_slot_or_with_a_flipped_bit_is_damaged() {
        let bytes = slot(6, 1, b"xid");
        assert!(matches!(decode_slot(&bytes, 2, 4), SlotContent::Entry { .. }));
        assert!(
            matches!(decode_slot(&bytes, 3, 4), SlotContent::Damaged(reason) if reason.contains("slot 2"))
        );
        for at in 0..27 + 3 {
            let mut bad = bytes.clone();
            bad[at] ^= 0x08;
            assert!(matches!(decode_slot(&bad, 2, 4), SlotContent::Damaged(_)), "flip at byte {at}");
        }
        let mut header_zeroed = bytes.clone();
        header_zeroed[..8].fill(0);
        assert!(matches!(decode_slot(&header_zeroed, 2, 4), SlotContent::Damaged(_)));
    }

    #[test]
    fn a_frame_of_another_file_is_not_an_entry() {
        let mut payload = Vec::new();
        payload.extend_from_slice(&5u64.to_le_bytes());
        payload.extend_from_slice(&[1, 3]);
        payload.extend_from_slice(b"xid");
        let mut bytes = Vec::new();
        record::encode(&mut bytes, RecordKind::Data, 5, &payload);
        bytes.resize(SLOT_BYTES, 0);
        assert!(matches!(decode_slot(&bytes, 1, 4), SlotContent::Damaged(reason) if reason.contains("tag")));
    }

    /// A torn write leaves a prefix or a suffix of the new slot over the old one: the
    /// result must read as the old entry, the new entry, empty or damaged, never a mix.
    #[test]
    fn every_prefix_or_suffix_of_an_overwrite_is_whole_or_damaged() {
        let olds = [slot(3, 1, &[0x11; ID_BYTES_MAX]), slot(3, 2, b"short"), vec![0u8; SLOT_BYTES]];
        // 7 and 259 share their low byte with 3 (mod 256), and all map to slot 3 of 4.
        for (new_sequence, new_id) in [(7u64, &b"new-id"[..]), (259, &[0x22; 100][..])] {
            let new = slot(new_sequence, 9, new_id);
            for old in &olds {
                for cut in 0..=SLOT_BYTES {
                    let mut prefix = old.clone();
                    prefix[..cut].copy_from_slice(&new[..cut]);
                    let mut suffix = old.clone();
                    suffix[cut..].copy_from_slice(&new[cut..]);
                    for (what, bytes) in [("prefix", &prefix), ("suffix", &suffix)] {
                        let decoded = decode_slot(bytes, 3, 4);
                        match decoded {
                            SlotContent::Entry { sequence, outcome, id } => {
                                let is_new = (sequence, outcome, id) == (new_sequence, 9, new_id);
                                let is_old = decoded == decode_slot(old, 3, 4);
                                assert!(
                                    is_new || is_old,
                                    "{what} {cut}: a mix decoded as sequence {sequence}"
                                );
                            }
                            SlotContent::Empty => assert!(old.iter().all(|&b| b == 0), "{what} {cut}"),
                            SlotContent::Damaged(_) => {}
                        }
                    }
                }
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_slots_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), SLOT_BYTES)) {
            if let SlotContent::Entry { sequence, id, .. } = decode_slot(&bytes, 1, 2) {
                proptest::prop_assert!(sequence % 2 == 1 && !id.is_empty() && id.len() <= ID_BYTES_MAX);
            }
        }
    }
}
