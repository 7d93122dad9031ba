//! The messages of the protocol and their bodies.
//!
//! Bodies reuse decree-core's binary forms: a `Decide` body is exactly the decision record
//! the log stores ([`Decision::encode`]), and `Complete`/`Outcome` carry an Xid in its
//! binary form ([`Xid::encode`]). A body must be consumed exactly: trailing bytes are an
//! error, so that two implementations cannot silently disagree on a message.
//!
//! Protocol version 2 (negotiated in `Hello`/`HelloOk`, see [`crate::choose_version`])
//! adds optional trailers to `Hello` and `HelloOk`, the `OutcomeIs` values 4 (unknown)
//! and 5 (heuristic), and the `CompleteHeuristic` message. The frame format is the same
//! for every protocol version; a decoder accepts every version's messages, and which of
//! them a session may use is the server's rule.

use crate::ProtoError;
use decree_core::{Decision, HeuristicOutcome, Outcome, Xid};

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
    /// Client → server (protocol version 2): every branch of this Xid is finished and at
    /// least one decided on its own (no reply on success).
    CompleteHeuristic = 0x0a,
    /// Client → server (protocol version 3): this session is about to commit this Xid in
    /// one phase (no reply on success).
    OnePhase = 0x0b,
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
            0x0a => MessageType::CompleteHeuristic,
            0x0b => MessageType::OnePhase,
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
            MessageType::CompleteHeuristic => "CompleteHeuristic",
            MessageType::OnePhase => "OnePhase",
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
    /// 6: the log failed: the decision's write may or may not have reached the disk (its
    /// outcome is unknown until a restart has read the log), and no later one will be.
    LogFailed,
    /// 7: the Xid does not belong to this connection's session.
    WrongSession,
    /// 8: the client expected another node id.
    NodeMismatch,
    /// 9: the server is shutting down.
    ShuttingDown,
    /// 10: a limit was reached (connections or requests in flight).
    Busy,
    /// 11: a `Decide` names a resource manager the server has no connection factory for.
    UnknownRm,
    /// 12: a `Decide`'s Xid has a non-empty branch qualifier (decisions name the global
    /// transaction).
    BranchQualifier,
    /// 13: two branches of a `Decide` share a branch number.
    DuplicateBranch,
    /// 14: a `Decide` names no branch.
    NoBranches,
    /// 15: the answer to `Outcome` on a version-1 session when the outcome is unknown.
    OutcomeUnknown,
    /// 16: the answer to `Outcome` on a version-1 session when a branch reported a
    /// heuristic outcome.
    OutcomeHeuristic,
    /// 17: the name in the client's certificate is not among those the listener allows
    /// (`tls.clients_allowed`); the connection is closed.
    NotAllowed,
    /// 18: the listener requires TLS and the client spoke plaintext (sent in plaintext,
    /// before any TLS, so that a plaintext client can read why); the connection is closed.
    TlsRequired,
    /// 19: this server is the backup member of a pair: its primary serves clients (the
    /// message names the peer when the configuration does); the connection is closed.
    NotPrimary,
    /// 20 (protocol version 3): a request carries a must-understand field the server does
    /// not know; nothing of it was acted on and the connection stays open.
    MustUnderstand,
    /// 21 (protocol version 3): a `CompleteHeuristic` that asked for the kept reply
    /// ([`crate::REPLY_WHEN_KEPT`]) was not kept for good (not this session's, refused by the
    /// outcome memory, or not durable): the client must not let its resource managers
    /// forget the branches, whose next recovery pass reports them again. The connection
    /// stays open.
    NotKept,
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
            ErrorCode::UnknownRm => 11,
            ErrorCode::BranchQualifier => 12,
            ErrorCode::DuplicateBranch => 13,
            ErrorCode::NoBranches => 14,
            ErrorCode::OutcomeUnknown => 15,
            ErrorCode::OutcomeHeuristic => 16,
            ErrorCode::NotAllowed => 17,
            ErrorCode::TlsRequired => 18,
            ErrorCode::NotPrimary => 19,
            ErrorCode::MustUnderstand => 20,
            ErrorCode::NotKept => 21,
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
            11 => ErrorCode::UnknownRm,
            12 => ErrorCode::BranchQualifier,
            13 => ErrorCode::DuplicateBranch,
            14 => ErrorCode::NoBranches,
            15 => ErrorCode::OutcomeUnknown,
            16 => ErrorCode::OutcomeHeuristic,
            17 => ErrorCode::NotAllowed,
            18 => ErrorCode::TlsRequired,
            19 => ErrorCode::NotPrimary,
            20 => ErrorCode::MustUnderstand,
            21 => ErrorCode::NotKept,
            c => ErrorCode::Other(c),
        }
    }
}

/// What the server chose in a `HelloOk` to a client that offered protocol versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Negotiated {
    /// The protocol version of the session: the highest both sides speak.
    pub version: u8,
    /// Milliseconds of silence after which the server closes the session; 0 = never. A
    /// client keeps an idle session open with `Ping`.
    pub idle_timeout_ms: u32,
}

/// One protocol message (the body of a frame, typed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Opens the session. `node_expected` 0 accepts any node; `client` names the client;
    /// `versions` are the protocol versions the client speaks (at most
    /// [`HELLO_VERSIONS_MAX`], distinct), empty for a version-1 client that sends no list.
    Hello { node_expected: u32, client: String, versions: Vec<u8> },
    /// The session is open: who the server is and the limits the client must respect.
    /// `negotiated` is present exactly when the client's `Hello` offered versions.
    HelloOk {
        node: u32,
        incarnation: u64,
        session: u64,
        frame_bytes_max: u32,
        inflight_max: u32,
        negotiated: Option<Negotiated>,
    },
    /// Store this decision durably (the commit point).
    Decide(Decision),
    /// The decision of the request with the same id is durable.
    DecideOk,
    /// Every branch of this Xid is finished; the server forgets it lazily.
    Complete(Xid),
    /// Protocol version 2: every branch of this Xid is finished and at least one decided
    /// on its own, with this combined outcome; no reply on success, like `Complete`.
    CompleteHeuristic(Xid, HeuristicOutcome),
    /// Protocol version 3: this session is about to commit this (global) Xid in one phase,
    /// so the server must not answer it rolled back after the session closes.
    OnePhase(Xid),
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

/// Most protocol versions a `Hello` may offer.
pub const HELLO_VERSIONS_MAX: usize = 16;

/// Bytes of a `HelloOk` body without the negotiation trailer.
pub(crate) const HELLO_OK_BYTES: usize = 28;

/// Bytes of the `HelloOk` trailer: version u8, idle_timeout_ms u32.
pub(crate) const NEGOTIATED_BYTES: usize = 5;

impl Message {
    /// The type byte of this message.
    pub fn kind(&self) -> MessageType {
        match self {
            Message::Hello { .. } => MessageType::Hello,
            Message::HelloOk { .. } => MessageType::HelloOk,
            Message::Decide(_) => MessageType::Decide,
            Message::DecideOk => MessageType::DecideOk,
            Message::Complete(_) => MessageType::Complete,
            Message::CompleteHeuristic(..) => MessageType::CompleteHeuristic,
            Message::OnePhase(_) => MessageType::OnePhase,
            Message::Outcome(_) => MessageType::Outcome,
            Message::OutcomeIs(_) => MessageType::OutcomeIs,
            Message::Ping => MessageType::Ping,
            Message::Pong => MessageType::Pong,
            Message::Error { .. } => MessageType::Error,
        }
    }

    /// Appends the body (without the frame header) to `out`.
    ///
    /// Like the client name, a `Hello`'s version list is cut to its first
    /// [`HELLO_VERSIONS_MAX`] entries; it is written as given otherwise (a list with
    /// duplicates makes a frame the receiver refuses). A `Decide` is never cut: it panics
    /// when the decision is past the record's limits ([`Decision::check_limits`]), which a
    /// decoded `Decide` never is and a client must check before it builds one.
    pub fn encode_body(&self, out: &mut Vec<u8>) {
        match self {
            Message::Hello { node_expected, client, versions } => {
                out.extend_from_slice(&node_expected.to_be_bytes());
                let name = truncate_utf8(client, CLIENT_NAME_BYTES_MAX);
                out.push(name.len() as u8);
                out.extend_from_slice(name.as_bytes());
                if !versions.is_empty() {
                    let versions = &versions[..versions.len().min(HELLO_VERSIONS_MAX)];
                    out.push(versions.len() as u8);
                    out.extend_from_slice(versions);
                }
            }
            Message::HelloOk { node, incarnation, session, frame_bytes_max, inflight_max, negotiated } => {
                out.extend_from_slice(&node.to_be_bytes());
                out.extend_from_slice(&incarnation.to_be_bytes());
                out.extend_from_slice(&session.to_be_bytes());
                out.extend_from_slice(&frame_bytes_max.to_be_bytes());
                out.extend_from_slice(&inflight_max.to_be_bytes());
                if let Some(n) = negotiated {
                    out.push(n.version);
                    out.extend_from_slice(&n.idle_timeout_ms.to_be_bytes());
                }
            }
            // Asserts the record's limits; a decoded `Decide` holds them (the decoder
            // refuses any other), a built one must have been checked.
            Message::Decide(decision) => decision.encode_into(out),
            Message::Complete(xid) | Message::Outcome(xid) | Message::OnePhase(xid) => xid.encode(out),
            Message::CompleteHeuristic(xid, outcome) => {
                xid.encode(out);
                out.push(heuristic_byte(*outcome));
            }
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
                if body.len() < 5 + len {
                    return Err(bad("client name length exceeds the body"));
                }
                let client = std::str::from_utf8(&body[5..5 + len])
                    .map_err(|_| bad("client name is not UTF-8"))?
                    .to_string();
                let versions = decode_versions(&body[5 + len..]).map_err(|e| bad(&e))?;
                Message::Hello { node_expected, client, versions }
            }
            MessageType::HelloOk => {
                let negotiated = match body.len() {
                    HELLO_OK_BYTES => None,
                    n if n == HELLO_OK_BYTES + NEGOTIATED_BYTES => Some(Negotiated {
                        version: body[HELLO_OK_BYTES],
                        idle_timeout_ms: be_u32(&body[HELLO_OK_BYTES + 1..]),
                    }),
                    n => {
                        return Err(bad(&format!(
                        "body is {n} bytes, expected {HELLO_OK_BYTES} or {} (with the negotiated version)",
                        HELLO_OK_BYTES + NEGOTIATED_BYTES
                    )))
                    }
                };
                Message::HelloOk {
                    node: be_u32(&body[0..4]),
                    incarnation: be_u64(&body[4..12]),
                    session: be_u64(&body[12..20]),
                    frame_bytes_max: be_u32(&body[20..24]),
                    inflight_max: be_u32(&body[24..28]),
                    negotiated,
                }
            }
            MessageType::Decide => Message::Decide(Decision::decode(body).map_err(|e| bad(&e.to_string()))?),
            MessageType::Complete => Message::Complete(decode_xid(body).map_err(|e| bad(&e))?),
            MessageType::CompleteHeuristic => {
                let Some((&last, xid)) = body.split_last() else {
                    return Err(bad("empty body"));
                };
                let xid = decode_xid(xid).map_err(|e| bad(&e))?;
                let outcome = heuristic_from_byte(last)
                    .ok_or_else(|| bad(&format!("unknown heuristic outcome {last}")))?;
                Message::CompleteHeuristic(xid, outcome)
            }
            MessageType::Outcome => Message::Outcome(decode_xid(body).map_err(|e| bad(&e))?),
            MessageType::OnePhase => Message::OnePhase(decode_xid(body).map_err(|e| bad(&e))?),
            MessageType::OutcomeIs => {
                exact(1)?;
                Message::OutcomeIs(
                    outcome_from_byte(body[0]).ok_or_else(|| bad(&format!("unknown outcome {}", body[0])))?,
                )
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

/// The wire byte of an outcome (4 and 5 exist from protocol version 2 on).
pub fn outcome_byte(outcome: Outcome) -> u8 {
    match outcome {
        Outcome::Committed => 1,
        Outcome::InProgress => 2,
        Outcome::RolledBack => 3,
        Outcome::Unknown => 4,
        Outcome::Heuristic => 5,
    }
}

/// The outcome of a wire byte, `None` for 0 and 6..=255.
pub fn outcome_from_byte(b: u8) -> Option<Outcome> {
    Some(match b {
        1 => Outcome::Committed,
        2 => Outcome::InProgress,
        3 => Outcome::RolledBack,
        4 => Outcome::Unknown,
        5 => Outcome::Heuristic,
        _ => return None,
    })
}

/// The wire byte of a heuristic outcome in `CompleteHeuristic`.
pub fn heuristic_byte(outcome: HeuristicOutcome) -> u8 {
    match outcome {
        HeuristicOutcome::Committed => 1,
        HeuristicOutcome::RolledBack => 2,
        HeuristicOutcome::Mixed => 3,
    }
}

/// The heuristic outcome of a wire byte, `None` for 0 and 4..=255.
pub fn heuristic_from_byte(b: u8) -> Option<HeuristicOutcome> {
    Some(match b {
        1 => HeuristicOutcome::Committed,
        2 => HeuristicOutcome::RolledBack,
        3 => HeuristicOutcome::Mixed,
        _ => return None,
    })
}

/// The optional version list that ends a `Hello` body: nothing, or a count (1..=16) and
/// that many distinct version bytes.
fn decode_versions(rest: &[u8]) -> Result<Vec<u8>, String> {
    let Some((&count, versions)) = rest.split_first() else {
        return Ok(Vec::new());
    };
    let count = count as usize;
    if count == 0 || count > HELLO_VERSIONS_MAX {
        return Err(format!("version count {count} is not between 1 and {HELLO_VERSIONS_MAX}"));
    }
    if versions.len() != count {
        return Err(format!("version count {count} does not match the {} bytes after it", versions.len()));
    }
    for (i, v) in versions.iter().enumerate() {
        if versions[..i].contains(v) {
            return Err(format!("version {v} is offered twice"));
        }
    }
    Ok(versions.to_vec())
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
    use crate::{decode_frame, encode_frame, FrameBuffer, FRAME_BYTES_MAX, HEADER_BYTES};
    use decree_core::{BranchRecord, Origin};
    use proptest::prelude::*;

    fn samples() -> Vec<Message> {
        let xid = Xid::decree(Origin { node: 1, incarnation: 2, session: 3, sequence: 4 });
        vec![
            Message::Hello { node_expected: 0, client: "test".into(), versions: vec![] },
            Message::Hello { node_expected: 5, client: "v2".into(), versions: vec![1, 2] },
            Message::HelloOk {
                node: 1,
                incarnation: 9,
                session: 3,
                frame_bytes_max: 65536,
                inflight_max: 64,
                negotiated: None,
            },
            Message::HelloOk {
                node: 1,
                incarnation: 9,
                session: 3,
                frame_bytes_max: 65536,
                inflight_max: 64,
                negotiated: Some(Negotiated { version: 2, idle_timeout_ms: 30_000 }),
            },
            Message::Decide(Decision { xid, branches: vec![BranchRecord { rm: "pg".into(), branch: 1 }] }),
            Message::DecideOk,
            Message::Complete(xid),
            Message::CompleteHeuristic(xid, HeuristicOutcome::Mixed),
            Message::OnePhase(xid),
            Message::Outcome(xid),
            Message::OutcomeIs(Outcome::InProgress),
            Message::OutcomeIs(Outcome::Unknown),
            Message::OutcomeIs(Outcome::Heuristic),
            Message::Ping,
            Message::Pong,
            Message::Error { code: ErrorCode::WrongSession, message: "not yours".into() },
            Message::Error { code: ErrorCode::OutcomeHeuristic, message: "heuristic".into() },
        ]
    }

    fn malformed(kind: MessageType, body: &[u8]) -> String {
        match Message::decode_body(kind, body) {
            Err(ProtoError::Malformed { reason, .. }) => reason,
            other => panic!("{} body {body:02x?} must be malformed, got {other:?}", kind.name()),
        }
    }

    #[test]
    fn hello_version_lists_are_checked() {
        let hello = |tail: &[u8]| {
            let mut b = vec![0, 0, 0, 0, 1, b'x'];
            b.extend_from_slice(tail);
            b
        };
        let ok = |tail: &[u8]| match Message::decode_body(MessageType::Hello, &hello(tail)).unwrap() {
            Message::Hello { versions, .. } => versions,
            other => panic!("{other:?}"),
        };
        assert_eq!(ok(&[]), Vec::<u8>::new());
        assert_eq!(ok(&[1, 2]), vec![2]);
        assert_eq!(ok(&[3, 2, 9, 1]), vec![2, 9, 1]);
        let sixteen: Vec<u8> = std::iter::once(16).chain(1..=16).collect();
        assert_eq!(ok(&sixteen).len(), 16);
        assert!(malformed(MessageType::Hello, &hello(&[0])).contains("count 0"));
        let seventeen: Vec<u8> = std::iter::once(17).chain(1..=17).collect();
        assert!(malformed(MessageType::Hello, &hello(&seventeen)).contains("count 17"));
        assert!(malformed(MessageType::Hello, &hello(&[2, 1, 1])).contains("twice"));
        assert!(malformed(MessageType::Hello, &hello(&[2, 1])).contains("does not match"));
        assert!(malformed(MessageType::Hello, &hello(&[1, 1, 2])).contains("does not match"));
        assert!(malformed(MessageType::Hello, &[0, 0, 0, 0, 3, b'x']).contains("exceeds"));
        // The encoder writes nothing for an empty list (version-1 bytes) and cuts long ones.
        let mut out = Vec::new();
        Message::Hello { node_expected: 0, client: "x".into(), versions: vec![] }.encode_body(&mut out);
        assert_eq!(out, hello(&[]));
        out.clear();
        Message::Hello { node_expected: 0, client: "x".into(), versions: (1..=20).collect() }
            .encode_body(&mut out);
        assert_eq!(out, hello(&sixteen));
    }

    #[test]
    fn hello_ok_is_28_bytes_or_33_with_the_negotiated_version() {
        let mut body = vec![0u8; 28];
        assert!(matches!(
            Message::decode_body(MessageType::HelloOk, &body),
            Ok(Message::HelloOk { negotiated: None, .. })
        ));
        body.extend_from_slice(&[2, 0, 0, 0x75, 0x30]);
        assert!(matches!(
            Message::decode_body(MessageType::HelloOk, &body),
            Ok(Message::HelloOk { negotiated: Some(Negotiated { version: 2, idle_timeout_ms: 30_000 }), .. })
        ));
        for len in [27, 29, 32, 34] {
            body.resize(len, 0);
            malformed(MessageType::HelloOk, &body);
        }
    }

    #[test]
    fn outcome_and_heuristic_bytes_round_trip_and_others_are_malformed() {
        for b in 0..=255u8 {
            match outcome_from_byte(b) {
                Some(o) => assert_eq!(outcome_byte(o), b),
                None => {
                    assert!(b == 0 || b >= 6, "{b}");
                    malformed(MessageType::OutcomeIs, &[b]);
                }
            }
            match heuristic_from_byte(b) {
                Some(h) => assert_eq!(heuristic_byte(h), b),
                None => assert!(b == 0 || b >= 4, "{b}"),
            }
        }
        let xid = Xid::decree(Origin { node: 1, incarnation: 2, session: 3, sequence: 4 });
        let mut body = Vec::new();
        xid.encode(&mut body);
        malformed(MessageType::CompleteHeuristic, &body); // No outcome byte.
        body.push(4);
        assert!(malformed(MessageType::CompleteHeuristic, &body).contains("heuristic outcome 4"));
        malformed(MessageType::CompleteHeuristic, &[]);
        body.pop();
        body.extend_from_slice(&[3, 3]);
        malformed(MessageType::CompleteHeuristic, &body);
    }

    #[test]
    fn error_codes_round_trip() {
        for c in 0..=40u16 {
            assert_eq!(ErrorCode::from_u16(c).to_u16(), c);
        }
        for (c, code) in [
            (11, ErrorCode::UnknownRm),
            (12, ErrorCode::BranchQualifier),
            (13, ErrorCode::DuplicateBranch),
            (14, ErrorCode::NoBranches),
            (15, ErrorCode::OutcomeUnknown),
            (16, ErrorCode::OutcomeHeuristic),
            (17, ErrorCode::NotAllowed),
            (18, ErrorCode::TlsRequired),
            (19, ErrorCode::NotPrimary),
            (20, ErrorCode::MustUnderstand),
            (21, ErrorCode::NotKept),
        ] {
            assert_eq!(ErrorCode::from_u16(c), code);
        }
        assert_eq!(ErrorCode::from_u16(22), ErrorCode::Other(22));
    }

    /// A `Decide` body of `count` branches named `name`, written by hand: the encoder
    /// refuses to write one past the limits.
    fn decide_body(count: usize, name: &[u8]) -> Vec<u8> {
        let xid = Xid::decree(Origin { node: 1, incarnation: 2, session: 3, sequence: 4 });
        let mut body = b"DCD1".to_vec();
        xid.encode(&mut body);
        body.extend_from_slice(&(count as u16).to_be_bytes());
        for branch in 0..count as u16 {
            body.extend_from_slice(&branch.to_be_bytes());
            body.push(name.len() as u8);
            body.extend_from_slice(name);
        }
        body
    }

    #[test]
    fn a_decide_past_the_record_limits_is_malformed_and_one_at_the_limits_fits_a_frame() {
        use decree_core::{BRANCHES_MAX, RM_NAME_BYTES_MAX};
        let long = [b'n'; RM_NAME_BYTES_MAX + 1];
        let why = malformed(MessageType::Decide, &decide_body(1, &long));
        assert!(why.contains("name of 65 bytes exceeds RM_NAME_BYTES_MAX = 64"), "{why}");
        let body = decide_body(BRANCHES_MAX + 1, b"a");
        assert!(HEADER_BYTES + body.len() <= FRAME_BYTES_MAX, "the wire can express it");
        let why = malformed(MessageType::Decide, &body);
        assert!(why.contains("513 branches exceed BRANCHES_MAX = 512"), "{why}");

        // At every limit (the longest Xid too): one frame, read back unchanged.
        let xid = Xid::new(7, &[1; 64], &[2; 64]).unwrap();
        let name = "n".repeat(RM_NAME_BYTES_MAX);
        let branches =
            (0..BRANCHES_MAX as u16).map(|branch| BranchRecord { rm: name.clone(), branch }).collect();
        let decide = Message::Decide(Decision { xid, branches });
        let mut out = Vec::new();
        let n = encode_frame(&mut out, 9, &decide);
        assert_eq!(n, HEADER_BYTES + decree_core::DECISION_BYTES_MAX);
        let frame = decode_frame(&out, FRAME_BYTES_MAX).unwrap().unwrap();
        assert_eq!(Message::decode_body(frame.header.kind, frame.body).unwrap(), decide);
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
            which in 0usize..18,
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
        ) {
            let mut bytes = prefix;
            let samples = samples();
            encode_frame(&mut bytes, 7, &samples[which % samples.len()]);
            feed(&bytes, &cuts, FRAME_BYTES_MAX);
        }
    }
}
