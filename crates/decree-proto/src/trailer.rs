//! The field trailer of protocol version 3: how a version adds optional data to a message
//! whose body layout stays fixed.
//!
//! A trailer follows the body of the messages whose body is self-delimiting (see
//! [`carries_trailer`]) and runs to the end of the frame: fields of `tag u16 | length u16 |
//! value`, each tag at most once. A tag with [`MUST_UNDERSTAND`] set may not be skipped: a
//! receiver that does not know it refuses the message (the server with error 20
//! `MustUnderstand`, before acting on anything). The first field defined is the optional
//! trace context ([`TRACE_CONTEXT`], issue 36); the mechanism exists so that later fields
//! (queues, calls across services) come without moving any byte of an older body. Sessions of versions 1 and 2 have no trailer:
//! bytes after the body stay malformed there, which is for the session to check.

use crate::message::{Message, MessageType};
use crate::ProtoError;
use decree_core::{TraceContext, Xid};

/// The bit of a field's tag that says a receiver must understand the field to act on the
/// message.
pub const MUST_UNDERSTAND: u16 = 0x8000;

/// Bytes of a field's tag and length.
const FIELD_HEADER_BYTES: usize = 4;

/// The trace-context field (optional, so old servers skip it): the W3C Trace Context of
/// the client's span that the receiver's spans are children of. Value: trace id (16
/// bytes), parent span id (8 bytes), trace flags (1 byte, bit 0 = sampled), as in a
/// `traceparent` header of version 00. A client sends it on `Decide`, `Complete`,
/// `CompleteHeuristic`, `OnePhase` and `Outcome`.
pub const TRACE_CONTEXT: u16 = 0x0001;

/// Bytes of the trace-context field's value; a receiver reads these first bytes and
/// ignores any more (room for a later `tracestate`), and ignores a shorter value.
pub const TRACE_CONTEXT_BYTES: usize = 25;

/// Whether a client may send the trace-context field on messages of `kind`.
pub fn carries_trace_context(kind: MessageType) -> bool {
    matches!(
        kind,
        MessageType::Decide
            | MessageType::Complete
            | MessageType::CompleteHeuristic
            | MessageType::OnePhase
            | MessageType::Outcome
    )
}

/// The trace-context field's value.
pub fn trace_context_value(context: &TraceContext) -> [u8; TRACE_CONTEXT_BYTES] {
    let mut value = [0u8; TRACE_CONTEXT_BYTES];
    value[..16].copy_from_slice(&context.trace_id);
    value[16..24].copy_from_slice(&context.span_id);
    value[24] = context.flags;
    value
}

/// The trace context a trailer carries, if any: `None` without the field, with a value
/// too short, or with an all-zero trace or span id (invalid in W3C Trace Context).
pub fn trace_context(fields: &[Field]) -> Option<TraceContext> {
    let value = &fields.iter().find(|f| f.tag == TRACE_CONTEXT)?.value;
    if value.len() < TRACE_CONTEXT_BYTES {
        return None;
    }
    let mut context = TraceContext { trace_id: [0; 16], span_id: [0; 8], flags: value[24] };
    context.trace_id.copy_from_slice(&value[..16]);
    context.span_id.copy_from_slice(&value[16..24]);
    let valid = context.trace_id != [0; 16] && context.span_id != [0; 8];
    valid.then_some(context)
}

/// Appends the trace-context field to the frame that starts at `frame_start` in `out` (the
/// last frame written there) and fixes its length, without allocating: the client's way
/// to add it to a frame it has just encoded.
pub fn append_trace_context(out: &mut Vec<u8>, frame_start: usize, context: &TraceContext) {
    let kind = MessageType::from_byte(out[frame_start + 5]).expect("a frame this crate encoded");
    assert!(carries_trace_context(kind), "{} carries no trace context", kind.name());
    out.extend_from_slice(&TRACE_CONTEXT.to_be_bytes());
    out.extend_from_slice(&(TRACE_CONTEXT_BYTES as u16).to_be_bytes());
    out.extend_from_slice(&trace_context_value(context));
    let length = (out.len() - frame_start - 4) as u32;
    out[frame_start..frame_start + 4].copy_from_slice(&length.to_be_bytes());
}

/// The kept-reply field (must understand, empty value), on `CompleteHeuristic` only: the
/// client asks to be answered `OutcomeIs` heuristic once the server keeps the outcome for
/// good (durable, and in a pair held by the backup), or `Error` 21 `NotKept`. Only then may
/// the client's resource managers forget the heuristic branches: a `CompleteHeuristic`
/// without a reply may still be in flight when the client dies (issue 32). Must understand,
/// so that a server that does not know it refuses the request instead of never answering.
pub const REPLY_WHEN_KEPT: u16 = MUST_UNDERSTAND | 0x0002;

/// Whether a message of `kind` with `fields` asks for the kept reply.
pub fn asks_reply_when_kept(kind: MessageType, fields: &[Field]) -> bool {
    kind == MessageType::CompleteHeuristic && fields.iter().any(|f| f.tag == REPLY_WHEN_KEPT)
}

/// One typed field of a trailer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// What the field is; bit 15 is [`MUST_UNDERSTAND`].
    pub tag: u16,
    /// The field's bytes, at most `u16::MAX`.
    pub value: Vec<u8>,
}

impl Field {
    /// Whether a receiver that does not know this field must refuse the message.
    pub fn must_understand(&self) -> bool {
        self.tag & MUST_UNDERSTAND != 0
    }
}

/// Whether messages of `kind` may carry a trailer on a version-3 session: those whose body
/// is self-delimiting. `Hello` is read before a version is agreed, and an `Error`'s message
/// runs to the end of its body.
pub fn carries_trailer(kind: MessageType) -> bool {
    !matches!(kind, MessageType::Hello | MessageType::Error)
}

/// Appends `fields` to a body.
///
/// Panics on a value longer than `u16::MAX` or a tag given twice: the caller builds the
/// trailer, and a receiver would refuse either.
pub fn encode_fields(out: &mut Vec<u8>, fields: &[Field]) {
    for (i, f) in fields.iter().enumerate() {
        assert!(!fields[..i].iter().any(|g| g.tag == f.tag), "field tag 0x{:04x} given twice", f.tag);
        let len = u16::try_from(f.value.len()).expect("a field value holds at most 65535 bytes");
        out.extend_from_slice(&f.tag.to_be_bytes());
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&f.value);
    }
}

/// Reads a trailer: every byte must belong to a field, and each tag appears once.
pub fn decode_fields(kind: MessageType, mut rest: &[u8]) -> Result<Vec<Field>, ProtoError> {
    let bad = |reason: String| ProtoError::Malformed { kind: kind.name(), reason };
    let mut fields: Vec<Field> = Vec::new();
    while !rest.is_empty() {
        if rest.len() < FIELD_HEADER_BYTES {
            return Err(bad(format!("{} bytes after the body are too few for a field", rest.len())));
        }
        let tag = u16::from_be_bytes([rest[0], rest[1]]);
        let len = u16::from_be_bytes([rest[2], rest[3]]) as usize;
        rest = &rest[FIELD_HEADER_BYTES..];
        if rest.len() < len {
            return Err(bad(format!(
                "field 0x{tag:04x} of {len} bytes runs past the frame ({} left)",
                rest.len()
            )));
        }
        if fields.iter().any(|f| f.tag == tag) {
            return Err(bad(format!("field 0x{tag:04x} is given twice")));
        }
        fields.push(Field { tag, value: rest[..len].to_vec() });
        rest = &rest[len..];
    }
    Ok(fields)
}

/// Decodes a body that may end with a trailer: the message and its fields (none for a
/// message that cannot carry any, whose body must then be consumed exactly).
pub fn decode_body_and_fields(kind: MessageType, body: &[u8]) -> Result<(Message, Vec<Field>), ProtoError> {
    if !carries_trailer(kind) {
        return Ok((Message::decode_body(kind, body)?, Vec::new()));
    }
    let fixed = fixed_body_bytes(kind, body)?.min(body.len());
    let message = Message::decode_body(kind, &body[..fixed])?;
    Ok((message, decode_fields(kind, &body[fixed..])?))
}

/// Bytes of the fixed body at the start of `body`: what a version-2 decoder would consume.
/// A body too short for its layout gives its own length, and the strict decoder then says
/// what is missing.
fn fixed_body_bytes(kind: MessageType, body: &[u8]) -> Result<usize, ProtoError> {
    let xid_bytes = |at: usize| -> usize {
        match body.get(at..).map(Xid::decode) {
            Some(Ok((_, used))) => at + used,
            _ => body.len(),
        }
    };
    Ok(match kind {
        MessageType::DecideOk | MessageType::Ping | MessageType::Pong => 0,
        MessageType::OutcomeIs => 1,
        MessageType::HelloOk => {
            // 28 bytes, then the negotiation trailer (5 bytes) that any version-3 HelloOk has.
            if body.len() > crate::message::HELLO_OK_BYTES {
                crate::message::HELLO_OK_BYTES + crate::message::NEGOTIATED_BYTES
            } else {
                body.len()
            }
        }
        MessageType::Complete | MessageType::Outcome | MessageType::OnePhase => xid_bytes(0),
        MessageType::CompleteHeuristic => (xid_bytes(0) + 1).min(body.len()),
        MessageType::Decide => decision_bytes(body),
        MessageType::Hello | MessageType::Error => body.len(),
    })
}

/// Bytes of the decision record at the start of `body`, walking only its lengths (the
/// strict decoder checks the rest); the whole body when it is too short to tell.
fn decision_bytes(body: &[u8]) -> usize {
    let walk = || -> Option<usize> {
        let g = *body.get(8)? as usize;
        let b = *body.get(9)? as usize;
        let mut at = 4 + 6 + g + b;
        let count = u16::from_be_bytes([*body.get(at)?, *body.get(at + 1)?]) as usize;
        at += 2;
        for _ in 0..count {
            let len = *body.get(at + 2)? as usize;
            at += 3 + len;
        }
        (at <= body.len()).then_some(at)
    };
    walk().unwrap_or(body.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decode_frame, encode_frame, FRAME_BYTES_MAX};
    use decree_core::{BranchRecord, Decision, Origin};

    fn xid() -> Xid {
        Xid::decree(Origin { node: 1, incarnation: 7, session: 42, sequence: 1 })
    }

    fn body_of(message: &Message) -> Vec<u8> {
        let mut body = Vec::new();
        message.encode_body(&mut body);
        body
    }

    fn trailer() -> Vec<Field> {
        vec![Field { tag: 0x0101, value: b"abc".to_vec() }, Field { tag: 0x8102, value: vec![] }]
    }

    #[test]
    fn every_message_that_carries_a_trailer_gives_back_its_body_and_its_fields() {
        let decision = Decision { xid: xid(), branches: vec![BranchRecord { rm: "pg-a".into(), branch: 0 }] };
        let messages = [
            Message::Decide(decision),
            Message::DecideOk,
            Message::Complete(xid()),
            Message::CompleteHeuristic(xid(), decree_core::HeuristicOutcome::Mixed),
            Message::Outcome(xid()),
            Message::OnePhase(xid()),
            Message::OutcomeIs(decree_core::Outcome::Unknown),
            Message::Ping,
            Message::Pong,
            Message::HelloOk {
                node: 1,
                incarnation: 7,
                session: 42,
                frame_bytes_max: 65536,
                inflight_max: 64,
                negotiated: Some(crate::Negotiated { version: 3, idle_timeout_ms: 0 }),
            },
        ];
        for m in messages {
            let mut body = body_of(&m);
            assert_eq!(decode_body_and_fields(m.kind(), &body).unwrap(), (m.clone(), vec![]));
            encode_fields(&mut body, &trailer());
            assert_eq!(decode_body_and_fields(m.kind(), &body).unwrap(), (m.clone(), trailer()), "{m:?}");
            // The strict decoder of versions 1 and 2 still refuses the same bytes.
            assert!(Message::decode_body(m.kind(), &body).is_err(), "{m:?}");
        }
    }

    #[test]
    fn overrunning_fields_twice_given_tags_and_loose_bytes_are_malformed() {
        let mut body = body_of(&Message::Outcome(xid()));
        let fixed = body.len();
        body.extend_from_slice(&[0x01, 0x01, 0x00, 0x04, b'a']);
        let why = decode_body_and_fields(MessageType::Outcome, &body).unwrap_err().to_string();
        assert!(why.contains("runs past the frame"), "{why}");
        body.truncate(fixed);
        body.extend_from_slice(&[0x01, 0x01, 0x00, 0x00, 0x01, 0x01, 0x00, 0x00]);
        let why = decode_body_and_fields(MessageType::Outcome, &body).unwrap_err().to_string();
        assert!(why.contains("given twice"), "{why}");
        body.truncate(fixed);
        body.extend_from_slice(&[0x01, 0x01, 0x00]);
        let why = decode_body_and_fields(MessageType::Outcome, &body).unwrap_err().to_string();
        assert!(why.contains("too few for a field"), "{why}");
    }

    #[test]
    fn hello_and_error_never_carry_one_and_short_bodies_stay_malformed() {
        let hello = Message::Hello { node_expected: 0, client: "c".into(), versions: vec![1, 2, 3] };
        let mut body = body_of(&hello);
        body.extend_from_slice(&[0x01, 0x01, 0x00, 0x00]);
        assert!(decode_body_and_fields(MessageType::Hello, &body).is_err());
        let error = Message::Error { code: crate::ErrorCode::Malformed, message: "x".into() };
        let body = body_of(&error);
        assert_eq!(decode_body_and_fields(MessageType::Error, &body).unwrap(), (error, vec![]));
        for len in 0..20 {
            let short = &body_of(&Message::Complete(xid()))[..len];
            assert!(decode_body_and_fields(MessageType::Complete, short).is_err(), "{len}");
        }
        let decide = body_of(&Message::Decide(Decision {
            xid: xid(),
            branches: vec![BranchRecord { rm: "pg-a".into(), branch: 0 }],
        }));
        for len in 0..decide.len() {
            assert!(decode_body_and_fields(MessageType::Decide, &decide[..len]).is_err(), "{len}");
        }
    }

    #[test]
    fn a_frame_with_a_trailer_round_trips() {
        let mut out = Vec::new();
        crate::encode_frame_with_fields(&mut out, 9, &Message::OnePhase(xid()), &trailer());
        let frame = decode_frame(&out, FRAME_BYTES_MAX).unwrap().unwrap();
        let (m, f) = decode_body_and_fields(frame.header.kind, frame.body).unwrap();
        assert_eq!((m, f), (Message::OnePhase(xid()), trailer()));
        let mut plain = Vec::new();
        encode_frame(&mut plain, 9, &Message::OnePhase(xid()));
        assert_eq!(out.len(), plain.len() + 4 + 3 + 4, "the body is unchanged, the fields follow it");
    }

    #[test]
    fn the_trace_context_field_is_appended_to_a_frame_and_read_back() {
        let context = TraceContext { trace_id: [0xab; 16], span_id: [0xcd; 8], flags: 1 };
        let mut out = vec![9, 9];
        let start = out.len();
        crate::encode_frame(&mut out, 5, &Message::Complete(xid()));
        append_trace_context(&mut out, start, &context);
        let frame = decode_frame(&out[start..], FRAME_BYTES_MAX).unwrap().unwrap();
        assert_eq!(frame.header.frame_bytes, out.len() - start);
        let (m, fields) = decode_body_and_fields(frame.header.kind, frame.body).unwrap();
        assert_eq!(m, Message::Complete(xid()));
        assert_eq!(trace_context(&fields), Some(context));
        assert!(!fields[0].must_understand(), "old servers skip it");
        // Too short, or all-zero ids: ignored, never an error.
        let short = [Field { tag: TRACE_CONTEXT, value: vec![1; 24] }];
        assert_eq!(trace_context(&short), None);
        let zero = [Field { tag: TRACE_CONTEXT, value: vec![0; 25] }];
        assert_eq!(trace_context(&zero), None);
        let longer =
            [Field { tag: TRACE_CONTEXT, value: [&trace_context_value(&context)[..], &[7, 7]].concat() }];
        assert_eq!(trace_context(&longer), Some(context));
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bodies_never_panic(kind in proptest::prelude::any::<u8>(), body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            if let Some(k) = MessageType::from_byte(kind) {
                let _ = decode_body_and_fields(k, &body);
            }
        }
    }
}
