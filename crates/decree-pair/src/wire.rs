//! The replication link's frames: what the primary and its backup say to each other.
//!
//! A link frame is `length u32 BE` (the bytes after the length field), `version u8` (1),
//! `type u8`, then the body; integers are big-endian as in the client protocol. Every
//! frame carries the sender's epoch (in `Refuse`, the epoch the refusing member has seen),
//! which the receiver checks first ([`crate::rules::fence`]). Not here: the socket, TLS,
//! the order in which members send what (the rules and the runtime).
//!
//! The decoder never trusts a length: a frame longer than [`LINK_FRAME_BYTES_MAX`], a
//! batch of more than [`BATCH_RECORDS_MAX`] records or a payload longer than
//! [`PAYLOAD_BYTES_MAX`] is refused before anything is allocated for it, and every field
//! is checked against the bytes left.

use crate::epoch::{Epoch, MemberId};
use crate::rules::PeerMessage;
use decree_core::Xid;
use std::sync::Arc;

/// The frame version this decree writes and reads.
pub const LINK_VERSION: u8 = 1;

/// Bytes of the frame header: length, version, type.
pub const LINK_HEADER_BYTES: usize = 4 + 1 + 1;

/// The longest link frame, header included: a batch of many decisions fits, a stream of
/// garbage does not make the receiver allocate more.
pub const LINK_FRAME_BYTES_MAX: usize = 4 << 20;

/// Records in one batch at most.
pub const BATCH_RECORDS_MAX: usize = 4096;

/// The longest record payload (a decision record is at most a client frame).
pub const PAYLOAD_BYTES_MAX: usize = 64 << 10;

const _: () = assert!(
    decree_core::DECISION_RECORD_BYTES_MAX <= PAYLOAD_BYTES_MAX,
    "a decision record at every limit, in its traced log form too, ships in one link record"
);

/// What a replicated record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// A decision: the payload is the decision record as the log stores it.
    Decision = 1,
    /// The transaction is finished: empty payload.
    Completion = 2,
    /// An outcome the primary remembers for `Outcome` questions: one outcome byte.
    Outcome = 3,
}

impl RecordKind {
    fn from_byte(b: u8) -> Option<RecordKind> {
        match b {
            1 => Some(RecordKind::Decision),
            2 => Some(RecordKind::Completion),
            3 => Some(RecordKind::Outcome),
            _ => None,
        }
    }
}

/// One record of a batch: what happened to which transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkRecord {
    /// What the record is.
    pub kind: RecordKind,
    /// The transaction it is about (the backup keeps its own log keys, so records name
    /// transactions by Xid).
    pub xid: Xid,
    /// The record's bytes (see [`RecordKind`]).
    pub payload: Vec<u8>,
}

/// A message of the replication link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkMessage {
    /// When a link opens, each way: who the sender is and what it knows. `run` names the
    /// sender's process (new at every start): a primary elected on etcd records its
    /// backup in sync by it, so that a restarted backup is never taken for the one that
    /// caught up (0: no run id).
    Hello { epoch: Epoch, member: MemberId, node: u32, next_sequence: u64, run: u64 },
    /// Primary to backup: the records of one batch (shared with the primary's copy kept
    /// for a resend, so that sending copies no record).
    Batch { epoch: Epoch, sequence: u64, records: Arc<[LinkRecord]> },
    /// Primary to backup: with the batches up to `up_to`, the live set is complete.
    CaughtUp { epoch: Epoch, up_to: u64 },
    /// Backup to primary: batches up to `sequence` are durable.
    Ack { epoch: Epoch, sequence: u64 },
    /// Either way: the sender's epoch is older than `seen`; its message was dropped.
    Refuse { seen: Epoch },
}

/// Why bytes are not a link frame; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("replication link frame: {0}")]
pub struct LinkError(pub String);

impl LinkMessage {
    fn type_byte(&self) -> u8 {
        match self {
            LinkMessage::Hello { .. } => 1,
            LinkMessage::Batch { .. } => 2,
            LinkMessage::CaughtUp { .. } => 3,
            LinkMessage::Ack { .. } => 4,
            LinkMessage::Refuse { .. } => 5,
        }
    }

    /// The epoch the message carries and what the rules see of it (a `Refuse` carries the
    /// refuser's epoch: a newer one deposes the refused member).
    pub fn rule_view(&self) -> (Epoch, PeerMessage) {
        match self {
            LinkMessage::Hello { epoch, next_sequence, .. } => {
                (*epoch, PeerMessage::Hello { next_sequence: *next_sequence })
            }
            LinkMessage::Batch { epoch, sequence, .. } => {
                (*epoch, PeerMessage::Batch { sequence: *sequence })
            }
            LinkMessage::CaughtUp { epoch, up_to } => (*epoch, PeerMessage::CaughtUp { up_to: *up_to }),
            LinkMessage::Ack { epoch, sequence } => (*epoch, PeerMessage::Ack { sequence: *sequence }),
            LinkMessage::Refuse { seen } => (*seen, PeerMessage::Refused),
        }
    }

    /// Appends the frame of this message to `out`. Panics past the limits, which the
    /// sender keeps (a batch is cut before it grows past them).
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; 4]);
        out.push(LINK_VERSION);
        out.push(self.type_byte());
        match self {
            LinkMessage::Hello { epoch, member, node, next_sequence, run } => {
                out.extend_from_slice(&epoch.raw().to_be_bytes());
                out.push(member.get());
                out.extend_from_slice(&node.to_be_bytes());
                out.extend_from_slice(&next_sequence.to_be_bytes());
                out.extend_from_slice(&run.to_be_bytes());
            }
            LinkMessage::Batch { epoch, sequence, records } => {
                assert!(records.len() <= BATCH_RECORDS_MAX, "a batch of {} records", records.len());
                out.extend_from_slice(&epoch.raw().to_be_bytes());
                out.extend_from_slice(&sequence.to_be_bytes());
                out.extend_from_slice(&(records.len() as u16).to_be_bytes());
                for record in records.iter() {
                    assert!(
                        record.payload.len() <= PAYLOAD_BYTES_MAX,
                        "a payload of {} bytes",
                        record.payload.len()
                    );
                    out.push(record.kind as u8);
                    record.xid.encode(out);
                    out.extend_from_slice(&(record.payload.len() as u32).to_be_bytes());
                    out.extend_from_slice(&record.payload);
                }
            }
            LinkMessage::CaughtUp { epoch, up_to } => {
                out.extend_from_slice(&epoch.raw().to_be_bytes());
                out.extend_from_slice(&up_to.to_be_bytes());
            }
            LinkMessage::Ack { epoch, sequence } => {
                out.extend_from_slice(&epoch.raw().to_be_bytes());
                out.extend_from_slice(&sequence.to_be_bytes());
            }
            LinkMessage::Refuse { seen } => out.extend_from_slice(&seen.raw().to_be_bytes()),
        }
        let frame_bytes = out.len() - start;
        assert!(frame_bytes <= LINK_FRAME_BYTES_MAX, "a link frame of {frame_bytes} bytes");
        out[start..start + 4].copy_from_slice(&((frame_bytes - 4) as u32).to_be_bytes());
    }

    /// Decodes the frame at the start of `buf`: `Ok(None)` while more bytes are needed,
    /// else the message and the bytes it used.
    pub fn decode(buf: &[u8]) -> Result<Option<(LinkMessage, usize)>, LinkError> {
        if buf.len() < 4 {
            return Ok(None);
        }
        let frame_bytes = u32::from_be_bytes(buf[0..4].try_into().unwrap()) as usize + 4;
        if frame_bytes > LINK_FRAME_BYTES_MAX {
            return Err(LinkError(format!("length {frame_bytes} exceeds {LINK_FRAME_BYTES_MAX}")));
        }
        if frame_bytes < LINK_HEADER_BYTES {
            return Err(LinkError(format!("length {frame_bytes} is shorter than the header")));
        }
        if buf.len() >= 5 && buf[4] != LINK_VERSION {
            return Err(LinkError(format!("version {} (this decree speaks {LINK_VERSION})", buf[4])));
        }
        if buf.len() < frame_bytes {
            return Ok(None);
        }
        let mut body = Reader { buf: &buf[LINK_HEADER_BYTES..frame_bytes] };
        let message = match buf[5] {
            1 => LinkMessage::Hello {
                epoch: body.epoch()?,
                member: MemberId::new(body.u8("member")?).ok_or_else(|| LinkError("member id 0".into()))?,
                node: body.u32("node")?,
                next_sequence: body.u64("next_sequence")?,
                run: body.u64("run")?,
            },
            2 => {
                let (epoch, sequence) = (body.epoch()?, body.u64("sequence")?);
                let count = body.u16("record count")? as usize;
                if count > BATCH_RECORDS_MAX {
                    return Err(LinkError(format!(
                        "{count} records in a batch, at most {BATCH_RECORDS_MAX}"
                    )));
                }
                let mut records = Vec::with_capacity(count);
                for _ in 0..count {
                    records.push(body.record()?);
                }
                LinkMessage::Batch { epoch, sequence, records: records.into() }
            }
            3 => LinkMessage::CaughtUp { epoch: body.epoch()?, up_to: body.u64("up_to")? },
            4 => LinkMessage::Ack { epoch: body.epoch()?, sequence: body.u64("sequence")? },
            5 => LinkMessage::Refuse { seen: body.epoch()? },
            other => return Err(LinkError(format!("unknown type {other}"))),
        };
        if !body.buf.is_empty() {
            return Err(LinkError(format!("{} bytes after the body of type {}", body.buf.len(), buf[5])));
        }
        Ok(Some((message, frame_bytes)))
    }
}

/// Reads fields off the front of a body, each checked against the bytes left.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, field: &str) -> Result<&'a [u8], LinkError> {
        if self.buf.len() < n {
            return Err(LinkError(format!("{field}: {n} bytes needed, {} left", self.buf.len())));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }
    fn u8(&mut self, field: &str) -> Result<u8, LinkError> {
        Ok(self.take(1, field)?[0])
    }
    fn u16(&mut self, field: &str) -> Result<u16, LinkError> {
        Ok(u16::from_be_bytes(self.take(2, field)?.try_into().unwrap()))
    }
    fn u32(&mut self, field: &str) -> Result<u32, LinkError> {
        Ok(u32::from_be_bytes(self.take(4, field)?.try_into().unwrap()))
    }
    fn u64(&mut self, field: &str) -> Result<u64, LinkError> {
        Ok(u64::from_be_bytes(self.take(8, field)?.try_into().unwrap()))
    }
    fn epoch(&mut self) -> Result<Epoch, LinkError> {
        Ok(Epoch::from_raw(self.u64("epoch")?))
    }
    fn record(&mut self) -> Result<LinkRecord, LinkError> {
        let kind_byte = self.u8("record kind")?;
        let kind =
            RecordKind::from_byte(kind_byte).ok_or_else(|| LinkError(format!("record kind {kind_byte}")))?;
        let (xid, used) = Xid::decode(self.buf).map_err(|e| LinkError(format!("record xid: {e}")))?;
        self.take(used, "record xid")?;
        let len = self.u32("payload length")? as usize;
        if len > PAYLOAD_BYTES_MAX {
            return Err(LinkError(format!("payload of {len} bytes, at most {PAYLOAD_BYTES_MAX}")));
        }
        let payload = self.take(len, "payload")?.to_vec();
        Ok(LinkRecord { kind, xid, payload })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use decree_core::Origin;

    fn xid(sequence: u64) -> Xid {
        Xid::decree(Origin { node: 7, incarnation: 0x301, session: 9, sequence })
    }

    fn samples() -> Vec<LinkMessage> {
        let epoch = Epoch::from_raw(0x301);
        vec![
            LinkMessage::Hello {
                epoch,
                member: MemberId::new(2).unwrap(),
                node: 7,
                next_sequence: 12,
                run: 0xfeed,
            },
            LinkMessage::Batch { epoch, sequence: 1, records: Vec::new().into() },
            LinkMessage::Batch {
                epoch,
                sequence: 2,
                records: vec![
                    LinkRecord { kind: RecordKind::Decision, xid: xid(1), payload: vec![0xdc; 300] },
                    LinkRecord { kind: RecordKind::Completion, xid: xid(0), payload: Vec::new() },
                    LinkRecord { kind: RecordKind::Outcome, xid: xid(2), payload: vec![1] },
                ]
                .into(),
            },
            LinkMessage::CaughtUp { epoch, up_to: 3 },
            LinkMessage::Ack { epoch, sequence: u64::MAX },
            LinkMessage::Refuse { seen: Epoch::from_raw(0x402) },
        ]
    }

    #[test]
    fn every_message_round_trips_and_every_prefix_asks_for_more() {
        for message in samples() {
            let mut buf = Vec::new();
            message.encode(&mut buf);
            assert_eq!(LinkMessage::decode(&buf).unwrap(), Some((message.clone(), buf.len())));
            for cut in 0..buf.len() {
                assert_eq!(LinkMessage::decode(&buf[..cut]).unwrap(), None, "{message:?} cut at {cut}");
            }
            // Two frames back to back: the first one is read alone.
            let mut two = buf.clone();
            two.extend_from_slice(&buf);
            assert_eq!(LinkMessage::decode(&two).unwrap().unwrap().1, buf.len());
        }
    }

    #[test]
    fn a_hello_is_byte_exact() {
        let mut buf = Vec::new();
        LinkMessage::Hello {
            epoch: Epoch::from_raw(0x301),
            member: MemberId::new(2).unwrap(),
            node: 7,
            next_sequence: 12,
            run: 0x0123_4567_89ab_cdef,
        }
        .encode(&mut buf);
        let expected =
            "0000001f 01 01 0000000000000301 02 00000007 000000000000000c 0123456789abcdef".replace(' ', "");
        let hex: String = buf.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, expected);
    }

    #[test]
    fn lengths_and_counts_past_the_limits_are_refused_before_allocating() {
        let huge = ((LINK_FRAME_BYTES_MAX) as u32).to_be_bytes();
        let e = LinkMessage::decode(&[huge[0], huge[1], huge[2], huge[3], 1, 2]).unwrap_err();
        assert!(e.0.contains("exceeds"), "{e}");
        let mut batch = Vec::new();
        LinkMessage::Batch { epoch: Epoch::from_raw(1), sequence: 1, records: Vec::new().into() }
            .encode(&mut batch);
        let count_at = batch.len() - 2;
        batch[count_at..].copy_from_slice(&((BATCH_RECORDS_MAX + 1) as u16).to_be_bytes());
        assert!(LinkMessage::decode(&batch).unwrap_err().0.contains("records in a batch"));
        let mut record = Vec::new();
        let one = LinkRecord { kind: RecordKind::Outcome, xid: xid(1), payload: vec![1] };
        LinkMessage::Batch { epoch: Epoch::from_raw(1), sequence: 1, records: vec![one].into() }
            .encode(&mut record);
        let len_at = record.len() - 1 - 4;
        record[len_at..len_at + 4].copy_from_slice(&((PAYLOAD_BYTES_MAX + 1) as u32).to_be_bytes());
        assert!(LinkMessage::decode(&record).unwrap_err().0.contains("payload of"));
    }

    #[test]
    fn wrong_versions_types_kinds_and_trailing_bytes_are_refused_by_name() {
        let mut buf = Vec::new();
        LinkMessage::CaughtUp { epoch: Epoch::from_raw(5), up_to: 2 }.encode(&mut buf);
        let mut bad = buf.clone();
        bad[4] = 9;
        assert!(LinkMessage::decode(&bad).unwrap_err().0.contains("version 9"));
        let mut bad = buf.clone();
        bad[5] = 77;
        assert!(LinkMessage::decode(&bad).unwrap_err().0.contains("unknown type 77"));
        let mut long = buf.clone();
        long.push(0);
        long[3] += 1;
        assert!(LinkMessage::decode(&long).unwrap_err().0.contains("1 bytes after the body"));
        let mut kind = Vec::new();
        let record = LinkRecord { kind: RecordKind::Completion, xid: xid(1), payload: Vec::new() };
        LinkMessage::Batch { epoch: Epoch::from_raw(1), sequence: 1, records: vec![record].into() }
            .encode(&mut kind);
        kind[LINK_HEADER_BYTES + 18] = 0;
        assert!(LinkMessage::decode(&kind).unwrap_err().0.contains("record kind 0"));
    }

    #[test]
    fn random_bytes_never_panic_the_decoder() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut valid = Vec::new();
        for message in samples() {
            message.encode(&mut valid);
        }
        for _ in 0..20_000 {
            let mut buf = valid.clone();
            let flips = 1 + (next() % 4) as usize;
            for _ in 0..flips {
                let at = (next() % buf.len() as u64) as usize;
                buf[at] ^= (next() % 255 + 1) as u8;
            }
            let cut = (next() % buf.len() as u64) as usize;
            let _ = LinkMessage::decode(&buf[cut..]);
            let _ = LinkMessage::decode(&buf);
        }
    }

    #[test]
    fn a_refusal_tells_the_rules_of_the_newer_epoch() {
        let (epoch, message) = LinkMessage::Refuse { seen: Epoch::from_raw(0x402) }.rule_view();
        assert_eq!((epoch, message), (Epoch::from_raw(0x402), PeerMessage::Refused));
        let (epoch, message) = LinkMessage::Ack { epoch: Epoch::from_raw(0x301), sequence: 4 }.rule_view();
        assert_eq!((epoch, message), (Epoch::from_raw(0x301), PeerMessage::Ack { sequence: 4 }));
    }
}
