//! Checks the protocol test vectors (`docs/vectors/messages.json`, also shown in
//! docs/protocol.md): encoding the decoded fields gives exactly the stored bytes, decoding
//! the bytes gives exactly those fields, and every invalid vector is refused with the
//! named error. The vectors were produced by an independent encoder (not this crate), so
//! a change of the wire format breaks this test instead of silently moving the vectors.
//!
//! Vectors with `"since": 2` exist only from protocol version 2 on, those with `"since": 3`
//! (the field trailer, `OnePhase`, error 20) from version 3 on; the others are version 1
//! and must stay byte for byte what they are.

use decree_core::{BranchRecord, Decision, HeuristicOutcome, Outcome, Xid};
use decree_proto::trailer::decode_body_and_fields;
use decree_proto::{
    decode_frame, encode_frame, encode_frame_with_fields, ErrorCode, Field, FrameBuffer, Message, Negotiated,
    ProtoError, FRAME_BYTES_MAX,
};
use serde_json::Value;

fn vectors() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/vectors/messages.json");
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
            versions: match &f["versions"] {
                Value::Null => Vec::new(),
                list => list.as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u8).collect(),
            },
        },
        "HelloOk" => Message::HelloOk {
            node: num(f, "node") as u32,
            incarnation: num(f, "incarnation"),
            session: num(f, "session"),
            frame_bytes_max: num(f, "frame_bytes_max") as u32,
            inflight_max: num(f, "inflight_max") as u32,
            negotiated: match &f["negotiated"] {
                Value::Null => None,
                n => Some(Negotiated {
                    version: num(n, "version") as u8,
                    idle_timeout_ms: num(n, "idle_timeout_ms") as u32,
                }),
            },
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
        "CompleteHeuristic" => Message::CompleteHeuristic(
            xid(&f["xid"]),
            match f["heuristic"].as_str().unwrap() {
                "committed" => HeuristicOutcome::Committed,
                "rolled_back" => HeuristicOutcome::RolledBack,
                "mixed" => HeuristicOutcome::Mixed,
                other => panic!("unknown heuristic outcome {other}"),
            },
        ),
        "Outcome" => Message::Outcome(xid(&f["xid"])),
        "OnePhase" => Message::OnePhase(xid(&f["xid"])),
        "OutcomeIs" => Message::OutcomeIs(match f["outcome"].as_str().unwrap() {
            "committed" => Outcome::Committed,
            "in_progress" => Outcome::InProgress,
            "rolled_back" => Outcome::RolledBack,
            "unknown" => Outcome::Unknown,
            "heuristic" => Outcome::Heuristic,
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

/// A vector's field trailer (version 3), empty when it has none.
fn trailer(f: &Value) -> Vec<Field> {
    let Some(list) = f["trailer"].as_array() else { return Vec::new() };
    list.iter()
        .map(|t| Field {
            tag: num(t, "tag") as u16,
            value: hex::decode(t["value"].as_str().unwrap()).unwrap(),
        })
        .collect()
}

#[test]
fn every_vector_encodes_and_decodes_exactly() {
    let v = vectors();
    assert_eq!(v["frame_version"].as_u64(), Some(decree_proto::FRAME_VERSION as u64));
    let versions: Vec<u8> =
        v["protocol_versions"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u8).collect();
    assert_eq!(versions, decree_proto::PROTOCOL_VERSIONS);
    assert_eq!(v["frame_bytes_max"].as_u64(), Some(FRAME_BYTES_MAX as u64));
    let messages = v["messages"].as_array().unwrap();
    let mut kinds: Vec<&str> = messages.iter().map(|m| m["type"].as_str().unwrap()).collect();
    kinds.sort_unstable();
    kinds.dedup();
    assert_eq!(kinds.len(), 12, "every message type has a vector");
    let mut stream = Vec::new();
    let mut expected = Vec::new();
    for vector in messages {
        let name = vector["name"].as_str().unwrap();
        let bytes = hex::decode(vector["hex"].as_str().unwrap()).unwrap();
        let id = num(vector, "request_id");
        let m = message(vector["type"].as_str().unwrap(), &vector["fields"]);
        let fields = trailer(&vector["fields"]);
        assert!(fields.is_empty() || vector["since"].as_u64() >= Some(3), "{name}: a trailer is version 3");
        assert_eq!(m.kind().name(), vector["type"].as_str().unwrap(), "{name}");
        let mut encoded = Vec::new();
        encode_frame_with_fields(&mut encoded, id, &m, &fields);
        assert_eq!(hex::encode(&encoded), hex::encode(&bytes), "encoding of vector {name}");
        let frame = decode_frame(&bytes, FRAME_BYTES_MAX).unwrap().expect("whole frame");
        assert_eq!(frame.header.request_id, id, "{name}");
        assert_eq!(frame.header.frame_bytes, bytes.len(), "{name}");
        assert_eq!(
            decode_body_and_fields(frame.header.kind, frame.body).unwrap(),
            (m.clone(), fields.clone()),
            "decoding of vector {name}"
        );
        // A decoder of versions 1 and 2 reads every vector without a trailer, and refuses
        // one with a trailer as trailing bytes.
        let strict = Message::decode_body(frame.header.kind, frame.body);
        match fields.is_empty() {
            true => assert_eq!(strict.unwrap(), m, "strict decoding of vector {name}"),
            false => assert!(matches!(strict, Err(ProtoError::Malformed { .. })), "{name}: {strict:?}"),
        }
        stream.extend_from_slice(&bytes);
        expected.push((id, m, fields));
    }
    // All vectors back to back, as on a connection.
    let mut buffer = FrameBuffer::new(FRAME_BYTES_MAX);
    let mut got = Vec::new();
    let mut at = 0;
    while at < stream.len() {
        at += buffer.push(&stream[at..]);
        while let Some(m) = buffer.next_message_with_fields().unwrap() {
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
        let mut with_fields = FrameBuffer::new(FRAME_BYTES_MAX);
        assert_eq!(with_fields.push(&bytes), bytes.len());
        // Refused alike by a version-3 decoder, which reads trailers.
        let err3 = with_fields.next_message_with_fields().expect_err(name);
        let err = buffer.next_message().expect_err(name);
        assert_eq!(
            std::mem::discriminant(&err),
            std::mem::discriminant(&err3),
            "vector {name}: {err} / {err3}"
        );
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

fn vector(name: &str) -> Value {
    let v = vectors();
    let found = v["messages"].as_array().unwrap().iter().find(|m| m["name"] == name).cloned();
    found.unwrap_or_else(|| panic!("no vector {name}"))
}

fn frame_hex(request_id: u64, m: &Message) -> String {
    let mut out = Vec::new();
    encode_frame(&mut out, request_id, m);
    hex::encode(out)
}

#[test]
fn the_version_1_answers_to_unknown_and_heuristic_are_errors_15_and_16() {
    let unknown = vector("error_outcome_unknown");
    let reply = decree_proto::outcome_reply(Outcome::Unknown, 1);
    assert_eq!(frame_hex(num(&unknown, "request_id"), &reply), unknown["hex"].as_str().unwrap());
    let reply = decree_proto::outcome_reply(Outcome::Heuristic, 1);
    assert!(matches!(reply, Message::Error { code: ErrorCode::OutcomeHeuristic, .. }), "{reply:?}");
    for (o, name) in [(Outcome::Unknown, "outcome_is_unknown"), (Outcome::Heuristic, "outcome_is_heuristic")]
    {
        let v = vector(name);
        let reply = decree_proto::outcome_reply(o, 2);
        assert_eq!(frame_hex(num(&v, "request_id"), &reply), v["hex"].as_str().unwrap());
    }
}

#[test]
fn a_version_2_hello_is_a_version_1_hello_plus_its_list() {
    let (v1, v2) = (vector("hello"), vector("hello_v2"));
    let (h1, h2) = (v1["hex"].as_str().unwrap(), v2["hex"].as_str().unwrap());
    assert_eq!(&h2[8..h1.len()], &h1[8..], "same header and body up to the list");
    assert_eq!(&h2[h1.len()..], "020102");
    let (v1, v2) = (vector("hello_ok"), vector("hello_ok_v2"));
    let (h1, h2) = (v1["hex"].as_str().unwrap(), v2["hex"].as_str().unwrap());
    assert_eq!(&h2[8..h1.len()], &h1[8..], "same header and body up to the trailer");
    assert_eq!(&h2[h1.len()..], "0200000000");
    assert_eq!(decree_proto::choose_version(&[1, 2]), Some(2));
}

/// The trace-context field (issue 36): every vector that names a `trace_context` carries
/// it as its trailer's tag 0x0001, it reads back as those ids and flags, and the client's
/// way of adding it to a frame it just encoded (`append_trace_context`) gives exactly the
/// vector's bytes.
#[test]
fn the_trace_context_vectors_read_back_and_the_client_writes_them_byte_for_byte() {
    let v = vectors();
    let mut seen = Vec::new();
    for vector in v["messages"].as_array().unwrap() {
        let Some(tc) = vector["fields"].get("trace_context") else { continue };
        let name = vector["name"].as_str().unwrap();
        let array = |key: &str| hex::decode(tc[key].as_str().unwrap()).unwrap();
        let expected = decree_core::TraceContext {
            trace_id: array("trace_id").try_into().unwrap(),
            span_id: array("span_id").try_into().unwrap(),
            flags: num(tc, "flags") as u8,
        };
        let bytes = hex::decode(vector["hex"].as_str().unwrap()).unwrap();
        let frame = decode_frame(&bytes, FRAME_BYTES_MAX).unwrap().unwrap();
        let (m, fields) = decode_body_and_fields(frame.header.kind, frame.body).unwrap();
        assert_eq!(decree_proto::trace_context(&fields), Some(expected), "{name}");
        assert!(
            fields.iter().all(|f| f.tag == decree_proto::TRACE_CONTEXT && !f.must_understand()),
            "{name}"
        );
        assert!(decree_proto::carries_trace_context(m.kind()), "{name}");
        let mut out = Vec::new();
        encode_frame(&mut out, num(vector, "request_id"), &m);
        decree_proto::append_trace_context(&mut out, 0, &expected);
        assert_eq!(hex::encode(&out), vector["hex"].as_str().unwrap(), "{name}");
        seen.push(m.kind().name());
    }
    seen.sort_unstable();
    assert_eq!(
        seen,
        ["Complete", "Decide", "OnePhase", "Outcome"],
        "a trace-context vector per message kind"
    );
}
