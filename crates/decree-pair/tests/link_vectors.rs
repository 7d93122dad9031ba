//! Checks the replication link's vectors (`docs/vectors/link.json`, shown in
//! docs/replication.md): encoding the fields gives exactly the stored bytes, decoding the
//! bytes gives exactly those fields, and every invalid vector is refused with the named
//! error. The file was written by an independent encoder (a short Python script following
//! the document, not this crate), so a change of the wire format breaks this test instead
//! of silently moving the vectors.

use decree_core::{Origin, Xid};
use decree_pair::wire::{LinkMessage, LinkRecord, RecordKind};
use decree_pair::{Epoch, MemberId};
use serde_json::Value;

fn vectors() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/vectors/link.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("vector file")).expect("vector JSON")
}

fn num(v: &Value, field: &str) -> u64 {
    v[field].as_u64().unwrap_or_else(|| panic!("field {field} missing in {v}"))
}

fn xid(v: &Value) -> Xid {
    Xid::decree(Origin {
        node: num(v, "node") as u32,
        incarnation: num(v, "incarnation"),
        session: num(v, "session"),
        sequence: num(v, "sequence"),
    })
}

fn record(v: &Value) -> LinkRecord {
    let kind = match v["kind"].as_str().unwrap() {
        "decision" => RecordKind::Decision,
        "completion" => RecordKind::Completion,
        "outcome" => RecordKind::Outcome,
        other => panic!("record kind {other}"),
    };
    LinkRecord { kind, xid: xid(&v["xid"]), payload: hex::decode(v["payload"].as_str().unwrap()).unwrap() }
}

/// The message a vector's `type` and `fields` describe.
fn message(kind: &str, f: &Value) -> LinkMessage {
    let epoch = || Epoch::from_raw(num(f, "epoch"));
    match kind {
        "Hello" => LinkMessage::Hello {
            epoch: epoch(),
            member: MemberId::new(num(f, "member") as u8).unwrap(),
            node: num(f, "node") as u32,
            next_sequence: num(f, "next_sequence"),
            run: num(f, "run"),
        },
        "Batch" => LinkMessage::Batch {
            epoch: epoch(),
            sequence: num(f, "sequence"),
            records: f["records"].as_array().unwrap().iter().map(record).collect(),
        },
        "CaughtUp" => LinkMessage::CaughtUp { epoch: epoch(), up_to: num(f, "up_to") },
        "Ack" => LinkMessage::Ack { epoch: epoch(), sequence: num(f, "sequence") },
        "Refuse" => LinkMessage::Refuse { seen: Epoch::from_raw(num(f, "seen")) },
        other => panic!("message type {other}"),
    }
}

#[test]
fn every_vector_encodes_to_its_bytes_and_decodes_to_its_fields() {
    let doc = vectors();
    assert_eq!(num(&doc, "link_version"), u64::from(decree_pair::wire::LINK_VERSION));
    assert_eq!(num(&doc, "frame_bytes_max") as usize, decree_pair::wire::LINK_FRAME_BYTES_MAX);
    assert_eq!(num(&doc, "batch_records_max") as usize, decree_pair::wire::BATCH_RECORDS_MAX);
    assert_eq!(num(&doc, "payload_bytes_max") as usize, decree_pair::wire::PAYLOAD_BYTES_MAX);
    let mut kinds = std::collections::HashSet::new();
    for v in doc["messages"].as_array().unwrap() {
        let name = v["name"].as_str().unwrap();
        let kind = v["type"].as_str().unwrap();
        kinds.insert(kind.to_string());
        let expected = message(kind, &v["fields"]);
        let bytes = hex::decode(v["hex"].as_str().unwrap()).unwrap();
        let mut encoded = Vec::new();
        expected.encode(&mut encoded);
        assert_eq!(hex::encode(&encoded), v["hex"].as_str().unwrap(), "{name}: encoding");
        assert_eq!(LinkMessage::decode(&bytes).unwrap(), Some((expected, bytes.len())), "{name}: decoding");
    }
    assert_eq!(kinds.len(), 5, "every link message type has a vector");
}

#[test]
fn every_invalid_vector_is_refused_with_its_named_error() {
    for v in vectors()["invalid"].as_array().unwrap() {
        let bytes = hex::decode(v["hex"].as_str().unwrap()).unwrap();
        let error = LinkMessage::decode(&bytes).expect_err(v["name"].as_str().unwrap());
        let named = v["error"].as_str().unwrap();
        assert!(error.to_string().contains(named), "{}: {error} does not name {named:?}", v["name"]);
    }
}

#[test]
fn the_decision_inside_the_batch_vector_is_a_decision_record_of_its_xid() {
    let doc = vectors();
    let batch = doc["messages"].as_array().unwrap().iter().find(|v| v["name"] == "batch").unwrap();
    let record = record(&batch["fields"]["records"][0]);
    let decision = decree_core::Decision::decode(&record.payload).unwrap();
    assert_eq!(decision.xid, record.xid);
    let names: Vec<&str> = decision.branches.iter().map(|b| b.rm.as_str()).collect();
    assert_eq!(names, ["pg-a", "pg-b"]);
}
