//! Issue 36: the log's decision record keeps the client's trace context, so that recovery
//! after a restart or a failover can link its spans to the client's. A real server (in
//! this process, the journal on disk, real sockets and the real client) decides
//! transactions whose `Decide` carried a sampled context, an unsampled one and none; once
//! it stopped, its log is read back:
//!
//! - spans on: the sampled one's record is `DCD2`, exactly the decision followed by the
//!   context; the others are `DCD1`, byte for byte what the server always wrote;
//! - spans off: every record is `DCD1`, whatever the `Decide` carried (tracing off writes
//!   the same bytes as before and reads nothing of the context);
//! - a log holding a record that is not a decision this server can read (a newer form)
//!   stops the server's start with an error naming it, rather than leaving that
//!   transaction's branches to presumed abort.
//!
//! The bugs it guards against: a context lost on its way to the disk (no link after a
//! restart), a record that changes when tracing is off, an unreadable record skipped.

mod common;

use common::{decision, xid_of};
use decree_client::RemoteDecisions;
use decree_core::testing::dummy::{Call, FaultAction, FaultRule};
use decree_core::testing::DummyFactory;
use decree_core::{DecisionStore, RecoveredDecisions, TraceContext, Xid};
use decree_log::EngineKind;
use decree_server::ServerConfig;
use std::collections::HashMap;
use std::path::Path;

fn config(dir: &Path, spans: bool) -> ServerConfig {
    let mut c = ServerConfig::new(dir.join("log"), EngineKind::Journal);
    c.unix = Some(dir.join("decree.sock"));
    // Nothing listens there: the exports fail, the spans and the records do not depend on them.
    c.tracing = spans.then(|| decree_otel::TracingConfig::to("http://127.0.0.1:9"));
    c
}

fn context(flags: u8) -> TraceContext {
    TraceContext { trace_id: [0x3c; 16], span_id: [0x7e; 8], flags }
}

/// Each decided Xid with the trace context its `Decide` carried.
type Sent = Vec<(Xid, Option<TraceContext>)>;

/// The log's live records by the Xid of their decision.
type Records = HashMap<Xid, Vec<u8>>;

/// Decides three transactions on a server with spans on or off, whose resource manager
/// fails every commit (so that the decisions stay live in the log): the client's context
/// sampled, unsampled, absent. Stops the server; returns the three Xids with the context
/// each `Decide` carried, and the log's live records by Xid.
fn decide_and_read_back(dir: &Path, spans: bool) -> (Sent, Records) {
    let down = DummyFactory::named("a", 0);
    down.set_rules(vec![FaultRule::sometimes(Call::Commit, FaultAction::Fail, 1.0)]);
    let server = decree_server::start(config(dir, spans), vec![down.arc()]).expect("server starts");
    let store = RemoteDecisions::connect(&format!("unix:{}", server.unix_path().unwrap().display())).unwrap();
    let session = store.open_session().unwrap();
    let sent: Vec<(Xid, Option<TraceContext>)> = [Some(context(1)), Some(context(0)), None]
        .into_iter()
        .enumerate()
        .map(|(i, trace)| (xid_of(&store, session, i as u64), trace))
        .collect();
    for (xid, trace) in &sent {
        store.decide_traced(&decision(*xid, &["a"]), trace.as_ref()).expect("acknowledged");
    }
    drop(store);
    server.shutdown().unwrap();
    let log = decree_log::open(&config(dir, spans).log_config().unwrap()).unwrap();
    let records = log.take_recovered();
    let mut by_xid = HashMap::new();
    for record in records {
        let (d, _) = decree_core::Decision::decode_logged(&record.payload).expect("a decision record");
        assert!(by_xid.insert(d.xid, record.payload).is_none(), "one record per decision");
    }
    (sent, by_xid)
}

#[test]
fn with_spans_on_only_a_sampled_context_is_written_with_its_decision() {
    let dir = tempfile::tempdir().unwrap();
    let (sent, records) = decide_and_read_back(dir.path(), true);
    assert_eq!(records.len(), 3, "every decision is still live");
    let [(sampled, Some(context)), (unsampled, _), (untraced, None)] = sent[..] else { unreachable!() };
    let expected = decision(sampled, &["a"]).encode_logged(Some(&context));
    assert_eq!(&expected[..4], b"DCD2");
    assert_eq!(records[&sampled], expected, "the decision, then the client's context");
    for xid in [unsampled, untraced] {
        assert_eq!(records[&xid], decision(xid, &["a"]).encode(), "DCD1, as ever");
    }
    let payloads =
        records.into_iter().map(|(xid, payload)| decree_log::LiveRecord { txn: xid_key(&xid), payload });
    let recovered = RecoveredDecisions::from_records(payloads.collect());
    assert_eq!(recovered.traces, HashMap::from([(sampled, context)]), "what a restart links to");
}

#[test]
fn with_spans_off_every_record_is_the_untraced_form() {
    let dir = tempfile::tempdir().unwrap();
    let (sent, records) = decide_and_read_back(dir.path(), false);
    assert_eq!(records.len(), 3, "every decision is still live");
    for (xid, _) in sent {
        assert_eq!(records[&xid], decision(xid, &["a"]).encode(), "the very bytes of DCD1");
    }
}

#[test]
fn a_record_this_server_cannot_read_stops_its_start() {
    let dir = tempfile::tempdir().unwrap();
    let log_config = config(dir.path(), false).log_config().unwrap();
    let log = decree_log::open(&log_config).unwrap();
    // A decision record of a form this server does not know (as an older server sees DCD2).
    log.append(0x2a, b"DCD9 from a newer server").unwrap();
    log.sync().unwrap();
    drop(log);
    let down = DummyFactory::named("a", 0);
    let Err(e) = decree_server::start(config(dir.path(), false), vec![down.arc()]) else {
        panic!("a server started over a record it cannot read")
    };
    let text = e.to_string();
    assert!(text.contains("log key 0x2a") && text.contains("missing DCD1 or DCD2 magic"), "{text}");
    assert!(text.contains("rather than presume abort"), "{text}");
}

/// A log key for a record read back (only its uniqueness matters to the decoding).
fn xid_key(xid: &Xid) -> u64 {
    xid.origin().expect("a decree Xid").sequence + 1
}
