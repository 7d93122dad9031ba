//! The messages of the protocol and their bodies.
//!
//! Bodies reuse decree-core's binary forms: a `Decide` body is exactly the decision record
//! the log stores ([`Decision::encode`]), and `Complete`/`Outcome` carry an Xid in its
//! binary form ([`Xid::encode`]). A body must be consumed exactly: trailing bytes are an
//! error, so that two implementations cannot silently disagree on a message.

use crate::ProtoError;
use decree_core::{Decision, Outcome, Xid};

/// The type byte of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MessageType {
    /// Client → server: first message on a connection.
    Hello = 0x01,
    /// Server → client: the session is open.
    HelloOk = 0x02,
    /// Client → server: store this decision durably.
    Decide = 0x03,
    /// Server → client: the decision is durable.
    DecideOk = 0x04,
    /// Client → server: every branch of this Xid is finished (no reply on success).
    Complete = 0x05,
    /// Client → server: what became of this Xid?
    Outcome = 0x06,
    /// Server → client: the answer to `Outcome`.
    OutcomeIs = 0x07,
    /// Either way: are you there?
    Ping = 0x08,
    /// The answer to `Ping`.
    Pong = 0x09,
    /// Server → client: the request (or the connection) failed.
    Error = 0x7f,
}

impl MessageType {
    /// The type for a type byte, `None` for bytes that name no message.
    pub fn from_byte(b: u8) -> Option<Self> {
        Some(match b {
            0x01 => MessageType::Hello,
            0x02 => MessageType::HelloOk,
            0x03 => MessageType::Decide,
            0x04 => MessageType::DecideOk,
            0x05 => MessageType::Complete,
            0x06 => MessageType::Outcome,
            0x07 => MessageType::OutcomeIs,
            0x08 => MessageType::Ping,
            0x09 => MessageType::Pong,
            0x7f => MessageType::Error,
            _ => return None,
        })
    }

    /// The name used in errors and documentation.
    pub fn name(&self) -> &'static str {
        match self {
            MessageType::Hello => "Hello",
            MessageType::HelloOk => "HelloOk",
            MessageType::Decide => "Decide",
            MessageType::DecideOk => "DecideOk",
            MessageType::Complete => "Complete",
            MessageType::Outcome => "Outcome",
            MessageType::OutcomeIs => "OutcomeIs",
            MessageType::Ping => "Ping",
            MessageType::Pong => "Pong",
            MessageType::Error => "Error",
        }
    }
}

/// What an `Error` frame says went wrong (u16 on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// 1: a frame or body did not parse; the connection is closed.
    Malformed,
    /// 2: a frame exceeded the frame maximum; the connection is closed.
    FrameTooLarge,
    /// 3: unknown message type; the connection is closed.
    UnknownType,
    /// 4: unsupported protocol version; the connection is closed.
    Version,
    /// 5: a message out of order (before `Hello`, a second `Hello`, a server message).
    Protocol,
    /// 6: the log failed; the decision is not durable and no later one will be.
    LogFailed,
    /// 7: the Xid does not belong to this connection's session.
    WrongSession,
    /// 8: the client expected another node id.
    NodeMismatch,
    /// 9: the server is shutting down.
    ShuttingDown,
    /// 10: a limit was reached (connections or requests in flight).
    Busy,
    /// Any other code, kept for forward compatibility.
    Other(u16),
}

impl ErrorCode {
    /// The code on the wire.
    pub fn to_u16(self) -> u16 {
        match self {
            ErrorCode::Malformed => 1,
            ErrorCode::FrameTooLarge => 2,
            ErrorCode::UnknownType => 3,
            ErrorCode::Version => 4,
            ErrorCode::Protocol => 5,
            ErrorCode::LogFailed => 6,
            ErrorCode::WrongSession => 7,
            ErrorCode::NodeMismatch => 8,
            ErrorCode::ShuttingDown => 9,
            ErrorCode::Busy => 10,
            ErrorCode::Other(c) => c,
        }
    }

    /// The code for a wire value.
    pub fn from_u16(c: u16) -> Self {
        match c {
            1 => ErrorCode::Malformed,
            2 => ErrorCode::FrameTooLarge,
            3 => ErrorCode::UnknownType,
            4 => ErrorCode::Version,
            5 => ErrorCode::Protocol,
            6 => ErrorCode::LogFailed,
            7 => ErrorCode::WrongSession,
            8 => ErrorCode::NodeMismatch,
            9 => ErrorCode::ShuttingDown,
            10 => ErrorCode::Busy,
            c => ErrorCode::Other(c),
        }
    }
}

/// One protocol message (the body of a frame, typed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Opens the session. `node_expected` 0 accepts any node; `client` names the client.
    Hello { node_expected: u32, client: String },
    /// The session is open: who the server is and the limits the client must respect.
    HelloOk { node: u32, incarnation: u64, session: u64, frame_bytes_max: u32, inflight_max: u32 },
    /// Store this decision durably (the commit point).
    Decide(Decision),
    /// The decision of the request with the same id is durable.
    DecideOk,
    /// Every branch of this Xid is finished; the server forgets it lazily.
    Complete(Xid),
    /// Asks what became of this Xid.
    Outcome(Xid),
    /// The answer to `Outcome`.
    OutcomeIs(Outcome),
    /// Liveness check.
    Ping,
    /// Answer to `Ping`.
    Pong,
    /// A failure; the message names the problem.
    Error { code: ErrorCode, message: String },
}

/// Longest client name in a `Hello`.
pub const CLIENT_NAME_BYTES_MAX: usize = 255;

impl Message {
    /// The type byte of this message.
    pub fn kind(&self) -> MessageType {
        match self {
            Message::Hello { .. } => MessageType::Hello,
            Message::HelloOk { .. } => MessageType::HelloOk,
            Message::Decide(_) => MessageType::Decide,
            Message::DecideOk => MessageType::DecideOk,
            Message::Complete(_) => MessageType::Complete,
            Message::Outcome(_) => MessageType::Outcome,
            Message::OutcomeIs(_) => MessageType::OutcomeIs,
            Message::Ping => MessageType::Ping,
            Message::Pong => MessageType::Pong,
            Message::Error { .. } => MessageType::Error,
        }
    }

    /// Appends the body (without the frame header) to `out`.
    pub fn encode_body(&self, out: &mut Vec<u8>) {
        match self {
            Message::Hello { node_expected, client } => {
                out.extend_from_slice(&node_expected.to_be_bytes());
                let name = truncate_utf8(client, CLIENT_NAME_BYTES_MAX);
                out.push(name.len() as u8);
                out.extend_from_slice(name.as_bytes());
            }
            Message::HelloOk { node, incarnation, session, frame_bytes_max, inflight_max } => {
                out.extend_from_slice(&node.to_be_bytes());
                out.extend_from_slice(&incarnation.to_be_bytes());
                out.extend_from_slice(&session.to_be_bytes());
                out.extend_from_slice(&frame_bytes_max.to_be_bytes());
                out.extend_from_slice(&inflight_max.to_be_bytes());
            }
            Message::Decide(decision) => out.extend_from_slice(&decision.encode()),
            Message::Complete(xid) | Message::Outcome(xid) => xid.encode(out),
            Message::OutcomeIs(outcome) => out.push(outcome_byte(*outcome)),
            Message::DecideOk | Message::Ping | Message::Pong => {}
            Message::Error { code, message } => {
                out.extend_from_slice(&code.to_u16().to_be_bytes());
                out.extend_from_slice(truncate_utf8(message, crate::FRAME_BYTES_MAX / 2).as_bytes());
            }
        }
    }

    /// Decodes the body of a frame of type `kind`.
    pub fn decode_body(kind: MessageType, body: &[u8]) -> Result<Message, ProtoError> {
        let bad = |reason: &str| ProtoError::Malformed { kind: kind.name(), reason: reason.to_string() };
        let exact = |len: usize| {
            if body.len() == len {
                Ok(())
            } else {
                Err(bad(&format!("body is {} bytes, expected {len}", body.len())))
            }
        };
        Ok(match kind {
            MessageType::Hello => {
                if body.len() < 5 {
                    return Err(bad("body shorter than 5 bytes"));
                }
                let node_expected = be_u32(&body[0..4]);
                let len = body[4] as usize;
                if body.len() != 5 + len {
                    return Err(bad("client name length does not match the body"));
                }
                let client =
                    std::str::from_utf8(&body[5..]).map_err(|_| bad("client name is not UTF-8"))?.to_string();
                Message::Hello { node_expected, client }
            }
            MessageType::HelloOk => {
                exact(28)?;
                Message::HelloOk {
                    node: be_u32(&body[0..4]),
                    incarnation: be_u64(&body[4..12]),
                    session: be_u64(&body[12..20]),
                    frame_bytes_max: be_u32(&body[20..24]),
                    inflight_max: be_u32(&body[24..28]),
                }
            }
            MessageType::Decide => Message::Decide(Decision::decode(body).map_err(|e| bad(&e.to_string()))?),
            MessageType::Complete => Message::Complete(decode_xid(body).map_err(|e| bad(&e))?),
            MessageType::Outcome => Message::Outcome(decode_xid(body).map_err(|e| bad(&e))?),
            MessageType::OutcomeIs => {
                exact(1)?;
                Message::OutcomeIs(match body[0] {
                    1 => Outcome::Committed,
                    2 => Outcome::InProgress,
                    3 => Outcome::RolledBack,
                    b => return Err(bad(&format!("unknown outcome {b}"))),
                })
            }
            MessageType::DecideOk => {
                exact(0)?;
                Message::DecideOk
            }
            MessageType::Ping => {
                exact(0)?;
                Message::Ping
            }
            MessageType::Pong => {
                exact(0)?;
                Message::Pong
            }
            MessageType::Error => {
                if body.len() < 2 {
                    return Err(bad("body shorter than the 2-byte code"));
                }
                let code = ErrorCode::from_u16(u16::from_be_bytes([body[0], body[1]]));
                let message =
                    std::str::from_utf8(&body[2..]).map_err(|_| bad("message is not UTF-8"))?.to_string();
                Message::Error { code, message }
            }
        })
    }
}

/// The wire byte of an outcome.
pub fn outcome_byte(outcome: Outcome) -> u8 {
    match outcome {
        Outcome::Committed => 1,
        Outcome::InProgress => 2,
        Outcome::RolledBack => 3,
        Outcome::Unknown => 4,
        Outcome::Heuristic => 5,
    }
}

fn decode_xid(body: &[u8]) -> Result<Xid, String> {
    let (xid, used) = Xid::decode(body).map_err(|e| e.to_string())?;
    if used != body.len() {
        return Err(format!("{} trailing bytes after the Xid", body.len() - used));
    }
    Ok(xid)
}

fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn be_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_be_bytes(a)
}

fn be_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decode_frame, encode_frame, FrameBuffer, FRAME_BYTES_MAX};
    use decree_core::{BranchRecord, Origin};
    use proptest::prelude::*;

    fn samples() -> Vec<Message> {
        let xid = Xid::decree(Origin { node: 1, incarnation: 2, session: 3, sequence: 4 });
        vec![
            Message::Hello { node_expected: 0, client: "test".into() },
            Message::HelloOk {
                node: 1,
                incarnation: 9,
                session: 3,
                frame_bytes_max: 65536,
                inflight_max: 64,
            },
            Message::Decide(Decision { xid, branches: vec![BranchRecord { rm: "pg".into(), branch: 1 }] }),
            Message::DecideOk,
            Message::Complete(xid),
            Message::Outcome(xid),
            Message::OutcomeIs(Outcome::InProgress),
            Message::Ping,
            Message::Pong,
            Message::Error { code: ErrorCode::WrongSession, message: "not yours".into() },
        ]
    }

    #[test]
    fn every_message_round_trips_through_a_frame() {
        for (i, m) in samples().into_iter().enumerate() {
            let mut out = Vec::new();
            let n = encode_frame(&mut out, i as u64 + 100, &m);
            assert_eq!(n, out.len());
            let frame = decode_frame(&out, FRAME_BYTES_MAX).unwrap().unwrap();
            assert_eq!(frame.header.request_id, i as u64 + 100);
            assert_eq!(Message::decode_body(frame.header.kind, frame.body).unwrap(), m);
            assert_eq!(decode_frame(&out[..out.len() - 1], FRAME_BYTES_MAX).unwrap_or(None), None);
        }
    }

    #[test]
    fn oversized_unknown_and_short_frames_are_named() {
        let big = [0x00, 0x01, 0x00, 0x00, 1, 8];
        assert!(matches!(decode_frame(&big, FRAME_BYTES_MAX), Err(ProtoError::TooLarge { .. })));
        let unknown = [0, 0, 0, 10, 1, 0x42, 0, 0, 0, 0, 0, 0, 0, 1];
        assert_eq!(decode_frame(&unknown, FRAME_BYTES_MAX), Err(ProtoError::UnknownType(0x42)));
        let short = [0, 0, 0, 3, 1, 8, 0];
        assert_eq!(decode_frame(&short, FRAME_BYTES_MAX), Err(ProtoError::TooShort(3)));
        let version = [0, 0, 0, 10, 2, 8];
        assert_eq!(decode_frame(&version, FRAME_BYTES_MAX), Err(ProtoError::Version(2)));
        let trailing = [0, 0, 0, 11, 1, 8, 0, 0, 0, 0, 0, 0, 0, 1, 0xff];
        assert!(matches!(
            FrameBuffer::new(FRAME_BYTES_MAX).next_message_after(&trailing),
            Err(ProtoError::Malformed { .. })
        ));
    }

    impl FrameBuffer {
        fn next_message_after(&mut self, bytes: &[u8]) -> Result<Option<(u64, Message)>, ProtoError> {
            assert_eq!(self.push(bytes), bytes.len());
            self.next_message()
        }
    }

    /// Feeds `bytes` in pieces cut at `cuts`, taking frames as they complete; returns the
    /// messages and whether an error stopped the stream.
    fn feed(bytes: &[u8], cuts: &[usize], max: usize) -> (Vec<(u64, Message)>, bool) {
        let mut fb = FrameBuffer::new(max);
        let mut out = Vec::new();
        let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
        points.push(bytes.len());
        points.sort_unstable();
        let mut at = 0;
        for p in points {
            while at < p {
                let n = fb.push(&bytes[at..p]);
                assert!(fb.capacity() <= max, "buffer grew past the frame maximum");
                at += n;
                loop {
                    match fb.next_message() {
                        Ok(Some(m)) => out.push(m),
                        Ok(None) => break,
                        Err(_) => return (out, true),
                    }
                }
                if n == 0 {
                    unreachable!("no progress: a whole frame should have been taken");
                }
            }
        }
        (out, false)
    }

    #[test]
    fn a_stream_of_frames_split_anywhere_gives_the_same_messages() {
        let mut bytes = Vec::new();
        let msgs = samples();
        for (i, m) in msgs.iter().enumerate() {
            encode_frame(&mut bytes, i as u64, m);
        }
        for step in 1..40 {
            let cuts: Vec<usize> = (0..bytes.len()).step_by(step).collect();
            let (got, failed) = feed(&bytes, &cuts, FRAME_BYTES_MAX);
            assert!(!failed);
            let want: Vec<(u64, Message)> =
                msgs.iter().cloned().enumerate().map(|(i, m)| (i as u64, m)).collect();
            assert_eq!(got, want);
        }
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_nor_grow_past_the_max(
            bytes in proptest::collection::vec(any::<u8>(), 0..2000),
            cuts in proptest::collection::vec(any::<usize>(), 0..20),
            max in 14usize..600,
        ) {
            let _ = decode_frame(&bytes, max);
            feed(&bytes, &cuts, max);
        }

        #[test]
        fn arbitrary_bodies_never_panic(kind in any::<u8>(), body in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Some(k) = MessageType::from_byte(kind) {
                let _ = Message::decode_body(k, &body);
            }
        }

        #[test]
        fn valid_frames_with_random_header_bytes_never_panic(
            prefix in proptest::collection::vec(any::<u8>(), 0..14),
            which in 0usize..10,
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
        ) {
            let mut bytes = prefix;
            encode_frame(&mut bytes, 7, &samples()[which]);
            feed(&bytes, &cuts, FRAME_BYTES_MAX);
        }
    }
}
