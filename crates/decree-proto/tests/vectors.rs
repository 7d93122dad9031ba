//! Checks the protocol test vectors (`tests/vectors/messages.json`, also shown in
//! docs/protocol.md): encoding the decoded fields gives exactly the stored bytes, decoding
//! the bytes gives exactly those fields, and every invalid vector is refused with the
//! named error. The vectors were produced by an independent encoder (not this crate), so
//! a change of the wire format breaks this test instead of silently moving the vectors.

use decree_core::{BranchRecord, Decision, Outcome, Xid};
use decree_proto::{
    decode_frame, encode_frame, ErrorCode, FrameBuffer, Message, ProtoError, FRAME_BYTES_MAX,
};
use serde_json::Value;

fn vectors() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors/messages.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("vector file")).expect("vector JSON")
}

fn xid(v: &Value) -> Xid {
    let gtrid = hex::decode(v["gtrid"].as_str().unwrap()).unwrap();
    let bqual = hex::decode(v["bqual"].as_str().unwrap()).unwrap();
    Xid::new(v["format_id"].as_i64().unwrap() as i32, &gtrid, &bqual).unwrap()
}

fn num(v: &Value, field: &str) -> u64 {
    v[field].as_u64().unwrap_or_else(|| panic!("field {field} missing in {v}"))
}

/// The message a vector's `type` and `fields` describe.
fn message(kind: &str, f: &Value) -> Message {
    match kind {
        "Hello" => Message::Hello {
            node_expected: num(f, "node_expected") as u32,
            client: f["client"].as_str().unwrap().into(),
        },
        "HelloOk" => Message::HelloOk {
            node: num(f, "node") as u32,
            incarnation: num(f, "incarnation"),
            session: num(f, "session"),
            frame_bytes_max: num(f, "frame_bytes_max") as u32,
            inflight_max: num(f, "inflight_max") as u32,
        },
        "Decide" => Message::Decide(Decision {
            xid: xid(&f["xid"]),
            branches: f["branches"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| BranchRecord {
                    rm: b["rm"].as_str().unwrap().into(),
                    branch: num(b, "branch") as u16,
                })
                .collect(),
        }),
        "DecideOk" => Message::DecideOk,
        "Complete" => Message::Complete(xid(&f["xid"])),
        "Outcome" => Message::Outcome(xid(&f["xid"])),
        "OutcomeIs" => Message::OutcomeIs(match f["outcome"].as_str().unwrap() {
            "committed" => Outcome::Committed,
            "in_progress" => Outcome::InProgress,
            "rolled_back" => Outcome::RolledBack,
            other => panic!("unknown outcome {other}"),
        }),
        "Ping" => Message::Ping,
        "Pong" => Message::Pong,
        "Error" => Message::Error {
            code: ErrorCode::from_u16(num(f, "code") as u16),
            message: f["message"].as_str().unwrap().into(),
        },
        other => panic!("unknown message type {other} in the vectors"),
    }
}

#[test]
fn every_vector_encodes_and_decodes_exactly() {
    let v = vectors();
    assert_eq!(v["protocol_version"].as_u64(), Some(decree_proto::PROTOCOL_VERSION as u64));
    assert_eq!(v["frame_bytes_max"].as_u64(), Some(FRAME_BYTES_MAX as u64));
    let messages = v["messages"].as_array().unwrap();
    assert!(messages.len() >= 10, "every message type has a vector");
    let mut stream = Vec::new();
    let mut expected = Vec::new();
    for vector in messages {
        let name = vector["name"].as_str().unwrap();
        let bytes = hex::decode(vector["hex"].as_str().unwrap()).unwrap();
        let id = num(vector, "request_id");
        let m = message(vector["type"].as_str().unwrap(), &vector["fields"]);
        assert_eq!(m.kind().name(), vector["type"].as_str().unwrap(), "{name}");
        let mut encoded = Vec::new();
        encode_frame(&mut encoded, id, &m);
        assert_eq!(hex::encode(&encoded), hex::encode(&bytes), "encoding of vector {name}");
        let frame = decode_frame(&bytes, FRAME_BYTES_MAX).unwrap().expect("whole frame");
        assert_eq!(frame.header.request_id, id, "{name}");
        assert_eq!(frame.header.frame_bytes, bytes.len(), "{name}");
        assert_eq!(
            Message::decode_body(frame.header.kind, frame.body).unwrap(),
            m,
            "decoding of vector {name}"
        );
        stream.extend_from_slice(&bytes);
        expected.push((id, m));
    }
    // All vectors back to back, as on a connection.
    let mut buffer = FrameBuffer::new(FRAME_BYTES_MAX);
    let mut got = Vec::new();
    let mut at = 0;
    while at < stream.len() {
        at += buffer.push(&stream[at..]);
        while let Some(m) = buffer.next_message().unwrap() {
            got.push(m);
        }
    }
    assert_eq!(got, expected);
}

#[test]
fn every_invalid_vector_is_refused_with_its_named_error() {
    let v = vectors();
    for vector in v["invalid"].as_array().unwrap() {
        let name = vector["name"].as_str().unwrap();
        let bytes = hex::decode(vector["hex"].as_str().unwrap()).unwrap();
        let mut buffer = FrameBuffer::new(FRAME_BYTES_MAX);
        assert_eq!(buffer.push(&bytes), bytes.len());
        let err = buffer.next_message().expect_err(name);
        let kind = match err {
            ProtoError::TooLarge { .. } => "TooLarge",
            ProtoError::TooShort(_) => "TooShort",
            ProtoError::Version(_) => "Version",
            ProtoError::UnknownType(_) => "UnknownType",
            ProtoError::Malformed { .. } => "Malformed",
        };
        assert_eq!(kind, vector["error"].as_str().unwrap(), "vector {name}: {err}");
    }
}

#[test]
fn the_protocol_document_shows_every_vector() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/protocol.md");
    let doc = std::fs::read_to_string(path).expect("docs/protocol.md");
    let v = vectors();
    for vector in v["messages"].as_array().unwrap().iter().chain(v["invalid"].as_array().unwrap()) {
        let hex = vector["hex"].as_str().unwrap();
        assert!(doc.contains(hex), "docs/protocol.md lacks vector {} ({hex})", vector["name"]);
    }
}
