//! Frames: the length-prefixed envelope around every message, and a bounded buffer that
//! cuts a byte stream into frames.
//!
//! The length field is checked before anything is allocated for the frame, so a peer that
//! announces a 4 GiB frame costs nothing but an error. [`FrameBuffer`] grows from 4 KiB up
//! to the frame maximum only when a frame that large is announced, which keeps the memory
//! of a thousand idle connections small.

use crate::message::{Message, MessageType};
use crate::{ProtoError, FRAME_VERSION, HEADER_BYTES};

/// The fixed part of a frame, as read from the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Total bytes of the frame, the 4-byte length field included.
    pub frame_bytes: usize,
    /// The message type byte.
    pub kind: MessageType,
    /// The request id the response must echo.
    pub request_id: u64,
}

/// A whole frame borrowing its body from the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawFrame<'a> {
    /// The header fields.
    pub header: FrameHeader,
    /// The body bytes (after the 14-byte header).
    pub body: &'a [u8],
}

/// Bytes of the initial buffer of a [`FrameBuffer`]; it grows only for larger frames.
const BUFFER_BYTES_INITIAL: usize = 4096;

/// Decodes the frame at the start of `buf`.
///
/// Returns `Ok(None)` while more bytes are needed, and an error as soon as the bytes seen
/// so far cannot start a valid frame no longer than `frame_bytes_max` (header included).
pub fn decode_frame(buf: &[u8], frame_bytes_max: usize) -> Result<Option<RawFrame<'_>>, ProtoError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let length = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    let frame_bytes = length.saturating_add(4);
    if frame_bytes > frame_bytes_max {
        return Err(ProtoError::TooLarge { len: frame_bytes, max: frame_bytes_max });
    }
    if length < HEADER_BYTES - 4 {
        return Err(ProtoError::TooShort(length));
    }
    if buf.len() < 6 {
        return Ok(None);
    }
    if buf[4] != FRAME_VERSION {
        return Err(ProtoError::Version(buf[4]));
    }
    let kind = MessageType::from_byte(buf[5]).ok_or(ProtoError::UnknownType(buf[5]))?;
    if buf.len() < frame_bytes {
        return Ok(None);
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&buf[6..14]);
    let header = FrameHeader { frame_bytes, kind, request_id: u64::from_be_bytes(id) };
    Ok(Some(RawFrame { header, body: &buf[HEADER_BYTES..frame_bytes] }))
}

/// Appends the frame of `message` with `request_id` to `out`; returns the frame's length.
pub fn encode_frame(out: &mut Vec<u8>, request_id: u64, message: &Message) -> usize {
    encode_frame_with_fields(out, request_id, message, &[])
}

/// Appends the frame of `message` followed by a version-3 field trailer (for sessions of
/// version 3 and later only, and for messages that carry one: see
/// [`crate::trailer::carries_trailer`]); returns the frame's length.
pub fn encode_frame_with_fields(
    out: &mut Vec<u8>,
    request_id: u64,
    message: &Message,
    fields: &[crate::trailer::Field],
) -> usize {
    assert!(fields.is_empty() || crate::trailer::carries_trailer(message.kind()));
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    out.push(FRAME_VERSION);
    out.push(message.kind() as u8);
    out.extend_from_slice(&request_id.to_be_bytes());
    message.encode_body(out);
    crate::trailer::encode_fields(out, fields);
    let frame_bytes = out.len() - start;
    let length = (frame_bytes - 4) as u32;
    out[start..start + 4].copy_from_slice(&length.to_be_bytes());
    frame_bytes
}

/// Appends a `Decide` frame for `decision` without copying the decision into a
/// [`Message`] (the client's hot path). Panics, like [`decree_core::Decision::encode`],
/// for a decision past the record's limits: check it with `check_limits` first.
pub fn encode_decide_frame(out: &mut Vec<u8>, request_id: u64, decision: &decree_core::Decision) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    out.push(FRAME_VERSION);
    out.push(MessageType::Decide as u8);
    out.extend_from_slice(&request_id.to_be_bytes());
    decision.encode_into(out);
    let frame_bytes = out.len() - start;
    out[start..start + 4].copy_from_slice(&((frame_bytes - 4) as u32).to_be_bytes());
    frame_bytes
}

/// A receive buffer that cuts a byte stream into messages, never holding more than
/// `frame_bytes_max` bytes.
#[derive(Debug)]
pub struct FrameBuffer {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    frame_bytes_max: usize,
}

impl FrameBuffer {
    /// An empty buffer for frames of at most `frame_bytes_max` bytes (at least the header).
    pub fn new(frame_bytes_max: usize) -> Self {
        let frame_bytes_max = frame_bytes_max.max(HEADER_BYTES);
        FrameBuffer {
            buf: vec![0; BUFFER_BYTES_INITIAL.min(frame_bytes_max)],
            start: 0,
            end: 0,
            frame_bytes_max,
        }
    }

    /// Bytes currently allocated (never more than the frame maximum).
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// Bytes received and not yet taken as frames.
    pub fn pending(&self) -> usize {
        self.end - self.start
    }

    /// The bytes received and not yet taken as frames (for an error message that shows
    /// what a peer sent).
    pub fn pending_bytes(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Free space to read into; call [`FrameBuffer::commit`] with the bytes read.
    ///
    /// Empty only when the buffer holds a whole frame that must be taken first.
    pub fn read_space(&mut self) -> &mut [u8] {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        if self.end == self.buf.len() {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            if self.end == self.buf.len() && self.buf.len() < self.frame_bytes_max {
                let wanted = (self.buf.len() * 2).max(self.announced_bytes()).min(self.frame_bytes_max);
                self.buf.resize(wanted, 0);
            }
        }
        assert!(self.buf.len() <= self.frame_bytes_max);
        &mut self.buf[self.end..]
    }

    /// Records that `n` bytes were written into the space given by `read_space`.
    pub fn commit(&mut self, n: usize) {
        assert!(self.end + n <= self.buf.len(), "commit past the read space");
        self.end += n;
    }

    /// Copies as much of `bytes` as fits; returns how many were taken.
    pub fn push(&mut self, bytes: &[u8]) -> usize {
        let space = self.read_space();
        let n = space.len().min(bytes.len());
        space[..n].copy_from_slice(&bytes[..n]);
        self.commit(n);
        n
    }

    /// Takes the next whole frame: `Ok(None)` when more bytes are needed.
    pub fn next_message(&mut self) -> Result<Option<(u64, Message)>, ProtoError> {
        let data = &self.buf[self.start..self.end];
        let Some(frame) = decode_frame(data, self.frame_bytes_max)? else {
            return Ok(None);
        };
        let message = Message::decode_body(frame.header.kind, frame.body)?;
        let id = frame.header.request_id;
        self.start += frame.header.frame_bytes;
        Ok(Some((id, message)))
    }

    /// Takes the next whole frame with its version-3 field trailer (empty when there is
    /// none): the caller refuses a trailer on a session of an earlier version.
    pub fn next_message_with_fields(
        &mut self,
    ) -> Result<Option<(u64, Message, Vec<crate::trailer::Field>)>, ProtoError> {
        let data = &self.buf[self.start..self.end];
        let Some(frame) = decode_frame(data, self.frame_bytes_max)? else {
            return Ok(None);
        };
        let (message, fields) = crate::trailer::decode_body_and_fields(frame.header.kind, frame.body)?;
        let id = frame.header.request_id;
        self.start += frame.header.frame_bytes;
        Ok(Some((id, message, fields)))
    }

    /// The frame length announced by the pending bytes, once the length field is in.
    fn announced_bytes(&self) -> usize {
        let data = &self.buf[self.start..self.end];
        if data.len() < 4 {
            return 0;
        }
        (u32::from_be_bytes([data[0], data[1], data[2], data[3]]) as usize).saturating_add(4)
    }
}
