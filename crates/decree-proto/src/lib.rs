//! The binary wire protocol between decree clients and the state server.
//!
//! This crate only turns messages into bytes and bytes into messages; it does no IO, so
//! the server (tokio), the blocking client and clients in other languages can share it
//! and its test vectors (`docs/vectors/messages.json`, described byte by byte in
//! `docs/protocol.md`). Every frame is:
//!
//! ```text
//! offset size field       (all integers big-endian)
//! 0      4    length      bytes after this field: 10 + body length
//! 4      1    version     FRAME_VERSION (1, for every protocol version)
//! 5      1    type        MessageType
//! 6      8    request id  chosen by the client, echoed in the response
//! 14     n    body
//! ```
//!
//! Invariants: a decoder never allocates more than the frame maximum it was given and
//! never panics, whatever the input; a frame longer than the maximum, with an unknown
//! version or type, or with a body that does not parse, is an error that names the
//! problem (the server answers it with an `Error` frame and closes that connection).
//!
//! The frame's version byte is the version of the framing and stays 1. The *protocol*
//! version (what a session may say: [`PROTOCOL_VERSIONS`]) is negotiated in the hello: a
//! client lists the versions it speaks, the server answers with the highest both speak
//! ([`choose_version`]); a client that lists none speaks version 1.

pub mod frame;
pub mod message;
pub mod trailer;

use decree_core::Outcome;

pub use frame::{
    decode_frame, encode_decide_frame, encode_frame, encode_frame_with_fields, FrameBuffer, FrameHeader,
    RawFrame,
};
pub use message::{
    heuristic_byte, heuristic_from_byte, outcome_byte, outcome_from_byte, ErrorCode, Message, MessageType,
    Negotiated, HELLO_VERSIONS_MAX,
};
pub use trailer::{
    append_trace_context, asks_reply_when_kept, carries_trace_context, trace_context, Field, MUST_UNDERSTAND,
    REPLY_WHEN_KEPT, TRACE_CONTEXT, TRACE_CONTEXT_BYTES,
};

/// The version byte of every frame: the version of the framing, the same for every
/// protocol version.
pub const FRAME_VERSION: u8 = 1;

/// The protocol versions this implementation speaks, in increasing order.
pub const PROTOCOL_VERSIONS: &[u8] = &[1, 2, 3];

/// The first protocol version with the field trailer and `OnePhase`.
pub const PROTOCOL_VERSION_TRAILER: u8 = 3;

/// The protocol version of a session whose client sent no version list.
pub const PROTOCOL_VERSION_DEFAULT: u8 = 1;

/// The version a server chooses for a client that offered `offered`: the highest of
/// [`PROTOCOL_VERSIONS`] that `offered` contains, `None` when there is none (the server
/// then answers `Error` 4 and closes). An empty offer gives `None` too: a client that
/// sends no list is not negotiating and speaks [`PROTOCOL_VERSION_DEFAULT`].
pub fn choose_version(offered: &[u8]) -> Option<u8> {
    PROTOCOL_VERSIONS.iter().rev().copied().find(|v| offered.contains(v))
}

/// The text of error 15, the version-1 answer to `Outcome` when the outcome is unknown.
pub const OUTCOME_UNKNOWN_MESSAGE: &str =
    "the outcome of this transaction is unknown: the server can prove neither commit nor rollback";

/// The text of error 16, the version-1 answer to `Outcome` after a heuristic outcome.
pub const OUTCOME_HEURISTIC_MESSAGE: &str =
    "a branch of this transaction decided on its own (heuristic outcome): check its resource managers";

/// The reply to `Outcome` on a session of protocol `version`.
///
/// From version 2 on every outcome is an `OutcomeIs`. Version 1 has no value for unknown
/// and heuristic, and its clients treat an unknown error code as fatal for the request, so
/// those two become errors 15 and 16: an old client never reads them as committed, in
/// progress or rolled back.
pub fn outcome_reply(outcome: Outcome, version: u8) -> Message {
    if version >= 2 {
        return Message::OutcomeIs(outcome);
    }
    match outcome {
        Outcome::Unknown => {
            Message::Error { code: ErrorCode::OutcomeUnknown, message: OUTCOME_UNKNOWN_MESSAGE.to_string() }
        }
        Outcome::Heuristic => Message::Error {
            code: ErrorCode::OutcomeHeuristic,
            message: OUTCOME_HEURISTIC_MESSAGE.to_string(),
        },
        Outcome::Committed | Outcome::InProgress | Outcome::RolledBack => Message::OutcomeIs(outcome),
    }
}

/// Bytes of the frame header: length (4), version (1), type (1), request id (8).
pub const HEADER_BYTES: usize = 14;

/// The default and largest frame accepted, header included (64 KiB).
pub const FRAME_BYTES_MAX: usize = 64 << 10;

// A `Decide` at every limit of the decision record fits in one frame of the default size,
// so that the limits, not the frame, decide what a client may send.
const _: () = assert!(HEADER_BYTES + decree_core::DECISION_BYTES_MAX <= FRAME_BYTES_MAX);
// The length field counts the bytes after itself in a u32.
const _: () = assert!(FRAME_BYTES_MAX - 4 <= u32::MAX as usize);

/// Why bytes are not a valid frame or message; each names the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// The length field announces a frame longer than the limit.
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { len: usize, max: usize },
    /// The length field is shorter than the fixed header.
    #[error("frame length {0} is shorter than the 10 bytes of version, type and request id")]
    TooShort(usize),
    /// The frame's version byte is not [`FRAME_VERSION`].
    #[error("unsupported frame version {0} (frames carry version 1 for every protocol version)")]
    Version(u8),
    /// The type byte names no message.
    #[error("unknown message type 0x{0:02x}")]
    UnknownType(u8),
    /// The body of a known message type does not parse.
    #[error("malformed {kind} body: {reason}")]
    Malformed { kind: &'static str, reason: String },
}

impl ProtoError {
    /// The error code the server sends back for this problem.
    pub fn code(&self) -> ErrorCode {
        match self {
            ProtoError::TooLarge { .. } => ErrorCode::FrameTooLarge,
            ProtoError::TooShort(_) | ProtoError::Malformed { .. } => ErrorCode::Malformed,
            ProtoError::Version(_) => ErrorCode::Version,
            ProtoError::UnknownType(_) => ErrorCode::UnknownType,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_highest_common_version_is_chosen() {
        assert_eq!(choose_version(&[1, 2]), Some(2));
        assert_eq!(choose_version(&[2, 1]), Some(2));
        assert_eq!(choose_version(&[1]), Some(1));
        assert_eq!(choose_version(&[2]), Some(2));
        assert_eq!(choose_version(&[9, 3, 2, 1]), Some(3));
        assert_eq!(choose_version(&[9, 4, 2, 1]), Some(2));
        assert_eq!(choose_version(&[7, 1]), Some(1));
        assert_eq!(choose_version(&[3, 4, 200]), Some(3));
        assert_eq!(choose_version(&[4, 200]), None);
        assert_eq!(choose_version(&[0]), None);
        assert_eq!(choose_version(&[]), None);
        assert!(PROTOCOL_VERSIONS.windows(2).all(|w| w[0] < w[1]));
        assert!(PROTOCOL_VERSIONS.contains(&PROTOCOL_VERSION_DEFAULT));
    }

    #[test]
    fn version_1_sessions_never_see_unknown_or_heuristic_as_an_outcome() {
        let all = [
            Outcome::Committed,
            Outcome::InProgress,
            Outcome::RolledBack,
            Outcome::Unknown,
            Outcome::Heuristic,
        ];
        for o in all {
            assert_eq!(outcome_reply(o, 2), Message::OutcomeIs(o));
            assert_eq!(outcome_reply(o, 3), Message::OutcomeIs(o));
        }
        for o in [Outcome::Committed, Outcome::InProgress, Outcome::RolledBack] {
            assert_eq!(outcome_reply(o, 1), Message::OutcomeIs(o));
        }
        match outcome_reply(Outcome::Unknown, 1) {
            Message::Error { code: ErrorCode::OutcomeUnknown, message } => {
                assert!(message.contains("unknown"))
            }
            other => panic!("{other:?}"),
        }
        match outcome_reply(Outcome::Heuristic, 1) {
            Message::Error { code: ErrorCode::OutcomeHeuristic, message } => {
                assert!(message.contains("heuristic"))
            }
            other => panic!("{other:?}"),
        }
        // Version 1 bytes: an OutcomeIs to a version-1 session is always 1, 2 or 3.
        for o in all {
            if let Message::OutcomeIs(o) = outcome_reply(o, 1) {
                assert!((1..=3).contains(&outcome_byte(o)));
            }
        }
    }
}
