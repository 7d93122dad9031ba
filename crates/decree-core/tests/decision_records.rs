//! Checks the decision-record vectors (`docs/vectors/decision_records.json`, described in
//! docs/protocol.md): each record's fields encode to exactly its bytes in the log's form
//! (`DCD1` without a trace context, `DCD2` with one) and its bytes decode to exactly those
//! fields; every invalid vector is refused with the named error; the wire refuses the
//! log-only form. The file was written by an independent encoder (a short Python script
//! of `struct.pack` calls following the document, not this crate), so a change of the
//! record's format breaks this test instead of silently moving the vectors.

use decree_core::{BranchRecord, Decision, Origin, TraceContext, Xid, TRACE_CONTEXT_BYTES};
use serde_json::Value;

fn vectors() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/vectors/decision_records.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("vector file")).expect("vector JSON")
}

fn num(v: &Value, field: &str) -> u64 {
    v[field].as_u64().unwrap_or_else(|| panic!("field {field} missing in {v}"))
}

fn bytes(v: &Value, field: &str) -> Vec<u8> {
    hex::decode(v[field].as_str().unwrap_or_else(|| panic!("field {field} missing in {v}"))).unwrap()
}

/// The decision and trace context a vector's fields describe.
fn fields(v: &Value) -> (Decision, Option<TraceContext>) {
    let x = &v["xid"];
    let origin = Origin {
        node: num(x, "node") as u32,
        incarnation: num(x, "incarnation"),
        session: num(x, "session"),
        sequence: num(x, "sequence"),
    };
    let branches = v["branches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| BranchRecord { rm: b["rm"].as_str().unwrap().into(), branch: num(b, "branch") as u16 })
        .collect();
    let trace = (!v["trace"].is_null()).then(|| {
        let t = &v["trace"];
        TraceContext {
            trace_id: bytes(t, "trace_id").try_into().unwrap(),
            span_id: bytes(t, "span_id").try_into().unwrap(),
            flags: num(t, "flags") as u8,
        }
    });
    (Decision { xid: Xid::decree(origin), branches }, trace)
}

#[test]
fn every_record_encodes_to_its_bytes_and_decodes_to_its_fields() {
    let doc = vectors();
    assert_eq!(num(&doc, "trace_context_bytes") as usize, TRACE_CONTEXT_BYTES);
    let records = doc["records"].as_array().unwrap();
    assert_eq!(records.len(), 2, "both forms have a vector");
    for v in records {
        let name = v["name"].as_str().unwrap();
        let (decision, trace) = fields(v);
        let expected = bytes(v, "hex");
        assert_eq!(decision.encode_logged(trace.as_ref()), expected, "{name}: encoding");
        assert_eq!(
            Decision::decode_logged(&expected).unwrap(),
            (decision.clone(), trace),
            "{name}: decoding"
        );
        if trace.is_none() {
            assert_eq!(Decision::decode(&expected).unwrap(), decision, "{name}: the wire's form too");
        }
    }
}

#[test]
fn every_invalid_record_is_refused_with_its_named_error() {
    let doc = vectors();
    let refused = |list: &str, decode: &dyn Fn(&[u8]) -> Result<(), String>| {
        for v in doc[list].as_array().unwrap() {
            let error = decode(&bytes(v, "hex")).expect_err(v["name"].as_str().unwrap());
            let named = v["error"].as_str().unwrap();
            assert!(error.contains(named), "{}: {error} does not name {named:?}", v["name"]);
        }
    };
    refused("invalid", &|b| Decision::decode_logged(b).map(|_| ()).map_err(|e| e.to_string()));
    refused("wire_refuses", &|b| Decision::decode(b).map(|_| ()).map_err(|e| e.to_string()));
}
