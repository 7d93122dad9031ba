//! Record framing shared by every durable engine.
//!
//! One frame on disk, little-endian:
//!
//! ```text
//! offset size field
//! 0      4    len      bytes after this 8-byte prefix (1 + 8 + payload length)
//! 4      4    crc      CRC32C of len (4 bytes LE) followed by kind, txn and payload
//! 8      1    kind     1 = data, 2 = completion, 3 = padding (skip to end of block)
//! 9      8    txn      transaction key
//! 17     n    payload
//! ```
//!
//! A frame whose `len` is zero marks unwritten (pre-allocated, zero-filled) space. The
//! CRC covers the length too, so a damaged length is caught instead of skipping garbage.
//! This module only encodes and decodes; deciding whether a bad frame is a torn tail or
//! corruption in the middle is the engine's job, since only it knows what follows.

/// Bytes before the payload: len, crc, kind, txn.
pub const HEADER_BYTES: usize = 17;

/// What a frame says about its transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RecordKind {
    /// A record to hand back at recovery while its transaction is live.
    Data = 1,
    /// Every earlier record of the transaction is complete.
    Completion = 2,
    /// Filler up to the end of a block or segment; carries no transaction.
    Padding = 3,
}

impl RecordKind {
    fn from_byte(b: u8) -> Option<Self> {
        match b {
            1 => Some(RecordKind::Data),
            2 => Some(RecordKind::Completion),
            3 => Some(RecordKind::Padding),
            _ => None,
        }
    }
}

/// A decoded frame borrowing its payload from the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// What the frame says.
    pub kind: RecordKind,
    /// The transaction key.
    pub txn: u64,
    /// The payload bytes.
    pub payload: &'a [u8],
}

/// The outcome of decoding at one position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A valid frame and the number of bytes it occupies.
    Frame(Frame<'a>, usize),
    /// Zeroed space: nothing was ever written here.
    Zero,
    /// The buffer ends before the frame does (a torn write at the tail, or a short buffer).
    Truncated,
    /// The bytes are not a valid frame; the reason names what failed.
    Invalid(String),
}

/// The number of bytes `encode` writes for a payload of `payload_len` bytes.
pub fn frame_len(payload_len: usize) -> usize {
    HEADER_BYTES + payload_len
}

/// Appends one frame to `out`.
pub fn encode(out: &mut Vec<u8>, kind: RecordKind, txn: u64, payload: &[u8]) {
    let start = out.len();
    let len = (1 + 8 + payload.len()) as u32;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.push(kind as u8);
    out.extend_from_slice(&txn.to_le_bytes());
    out.extend_from_slice(payload);
    let crc = checksum(&out[start..start + 4], &out[start + 8..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    debug_assert_eq!(out.len() - start, frame_len(payload.len()));
}

/// Writes one frame into `out`, which must be exactly its length (no allocation: the
/// journal pads direct writes in place).
pub fn encode_into(out: &mut [u8], kind: RecordKind, txn: u64, payload: &[u8]) {
    assert_eq!(out.len(), frame_len(payload.len()), "the slice must hold exactly one frame");
    let len = (1 + 8 + payload.len()) as u32;
    out[0..4].copy_from_slice(&len.to_le_bytes());
    out[8] = kind as u8;
    out[9..17].copy_from_slice(&txn.to_le_bytes());
    out[17..].copy_from_slice(payload);
    let crc = checksum(&out[0..4], &out[8..]);
    out[4..8].copy_from_slice(&crc.to_le_bytes());
}

/// Writes one padding frame filling exactly `total` bytes (at least `HEADER_BYTES`).
pub fn encode_padding(out: &mut Vec<u8>, total: usize) {
    assert!(total >= HEADER_BYTES, "padding of {total} bytes cannot hold a frame header");
    let zeros = vec![0u8; total - HEADER_BYTES];
    encode(out, RecordKind::Padding, 0, &zeros);
}

fn checksum(len_bytes: &[u8], body: &[u8]) -> u32 {
    let crc = crc32c::crc32c(len_bytes);
    crc32c::crc32c_append(crc, body)
}

/// Decodes the frame at the start of `buf`, refusing frames longer than `len_max` bytes.
pub fn decode(buf: &[u8], len_max: usize) -> Decoded<'_> {
    if buf.len() < 8 {
        return if buf.iter().all(|&b| b == 0) { Decoded::Zero } else { Decoded::Truncated };
    }
    let len = u32::from_le_bytes(buf[0..4].try_into().unwrap()) as usize;
    let crc = u32::from_le_bytes(buf[4..8].try_into().unwrap());
    if len == 0 {
        return if crc == 0 { Decoded::Zero } else { Decoded::Invalid("zero length with a checksum".into()) };
    }
    if len < 9 {
        return Decoded::Invalid(format!("length {len} is shorter than a frame body (9)"));
    }
    if len > len_max + 9 {
        return Decoded::Invalid(format!("length {len} exceeds the record limit {}", len_max + 9));
    }
    if buf.len() < 8 + len {
        return Decoded::Truncated;
    }
    let body = &buf[8..8 + len];
    if checksum(&buf[0..4], body) != crc {
        return Decoded::Invalid("checksum mismatch".into());
    }
    let Some(kind) = RecordKind::from_byte(body[0]) else {
        return Decoded::Invalid(format!("unknown record kind {}", body[0]));
    };
    let txn = u64::from_le_bytes(body[1..9].try_into().unwrap());
    Decoded::Frame(Frame { kind, txn, payload: &body[9..] }, 8 + len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn encoding_in_place_matches_encoding_into_a_vec() {
        for len in [0usize, 1, 100, 4000] {
            let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut vec = Vec::new();
            encode(&mut vec, RecordKind::Padding, 42, &payload);
            let mut slice = vec![0xAAu8; frame_len(len)];
            encode_into(&mut slice, RecordKind::Padding, 42, &payload);
            assert_eq!(slice, vec, "payload of {len} bytes");
        }
    }

    #[test]
    fn round_trip() {
        let mut buf = Vec::new();
        encode(&mut buf, RecordKind::Data, 42, b"decision");
        assert_eq!(buf.len(), frame_len(8));
        match decode(&buf, 1024) {
            Decoded::Frame(f, n) => {
                assert_eq!(n, buf.len());
                assert_eq!(f, Frame { kind: RecordKind::Data, txn: 42, payload: b"decision" });
            }
            other => panic!("expected a frame, got {other:?}"),
        }
    }

    #[test]
    fn flipped_bit_is_invalid_and_short_is_truncated() {
        let mut buf = Vec::new();
        encode(&mut buf, RecordKind::Completion, 7, &[1, 2, 3]);
        let mut bad = buf.clone();
        bad[12] ^= 0x10;
        assert!(matches!(decode(&bad, 1024), Decoded::Invalid(_)));
        assert_eq!(decode(&buf[..buf.len() - 1], 1024), Decoded::Truncated);
        assert_eq!(decode(&[0u8; 32], 1024), Decoded::Zero);
    }

    #[test]
    fn padding_fills_exactly() {
        let mut buf = Vec::new();
        encode_padding(&mut buf, 100);
        assert_eq!(buf.len(), 100);
        assert!(matches!(decode(&buf, 1024), Decoded::Frame(Frame { kind: RecordKind::Padding, .. }, 100)));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Decoded::Frame(_, n) = decode(&bytes, 128) {
                prop_assert!(n <= bytes.len());
            }
        }

        #[test]
        fn encoded_frames_decode(txn in any::<u64>(), payload in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut buf = Vec::new();
            encode(&mut buf, RecordKind::Data, txn, &payload);
            match decode(&buf, 200) {
                Decoded::Frame(f, n) => {
                    prop_assert_eq!(n, buf.len());
                    prop_assert_eq!(f.txn, txn);
                    prop_assert_eq!(f.payload, &payload[..]);
                }
                other => prop_assert!(false, "decode failed: {:?}", other),
            }
        }
    }
}
