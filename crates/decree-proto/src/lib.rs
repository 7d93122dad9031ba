//! The binary wire protocol between decree clients and the state server.
//!
//! This crate only turns messages into bytes and bytes into messages; it does no IO, so
//! the server (tokio), the blocking client and clients in other languages can share it
//! and its test vectors (`tests/vectors/messages.json`, described byte by byte in
//! `docs/protocol.md`). Every frame is:
//!
//! ```text
//! offset size field       (all integers big-endian)
//! 0      4    length      bytes after this field: 10 + body length
//! 4      1    version     PROTOCOL_VERSION (1)
//! 5      1    type        MessageType
//! 6      8    request id  chosen by the client, echoed in the response
//! 14     n    body
//! ```
//!
//! Invariants: a decoder never allocates more than the frame maximum it was given and
//! never panics, whatever the input; a frame longer than the maximum, with an unknown
//! version or type, or with a body that does not parse, is an error that names the
//! problem (the server answers it with an `Error` frame and closes that connection).

pub mod frame;
pub mod message;

pub use frame::{decode_frame, encode_decide_frame, encode_frame, FrameBuffer, FrameHeader, RawFrame};
pub use message::{ErrorCode, Message, MessageType};

/// The protocol version carried by every frame.
pub const PROTOCOL_VERSION: u8 = 1;

/// Bytes of the frame header: length (4), version (1), type (1), request id (8).
pub const HEADER_BYTES: usize = 14;

/// The default and largest frame accepted, header included (64 KiB).
pub const FRAME_BYTES_MAX: usize = 64 << 10;

/// Why bytes are not a valid frame or message; each names the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// The length field announces a frame longer than the limit.
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { len: usize, max: usize },
    /// The length field is shorter than the fixed header.
    #[error("frame length {0} is shorter than the 10 bytes of version, type and request id")]
    TooShort(usize),
    /// The version byte is not one this implementation speaks.
    #[error("unsupported protocol version {0} (this side speaks version 1)")]
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
