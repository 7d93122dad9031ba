//! Protocol version 3: answers about one-phase commits that are never "rolled back" when a
//! database may have committed, and sessions the server closes read to their end.
//!
//! The bug guarded against (issue 31, item 1): a transaction with one branch commits in its
//! database in one phase and sends nothing to the server; once its session closed, the
//! server's presumed-abort rule answered `Outcome` with "rolled back" for a transaction
//! that committed, and a user who followed the guide retried a committed transfer. The
//! client now sends `OnePhase` before it commits; the server must answer unknown (only the
//! database knows) after the session closed, committed once the session's `Complete` says
//! so, and must not lose a notice that was still unread when it closed the session itself.
//! Also here: the field trailer's must-understand rule and its refusal on older sessions.

mod common;

use common::{decision, error_code, eventually, Raw};
use decree_core::testing::DummyFactory;
use decree_core::{Outcome, Xid};
use decree_log::EngineKind;
use decree_proto::{ErrorCode, Field, Message, Negotiated};
use decree_server::ServerConfig;
use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

fn config(dir: &Path) -> ServerConfig {
    let mut c = ServerConfig::new(dir.join("log"), EngineKind::Volatile);
    c.unix = Some(dir.join("decree.sock"));
    c
}

/// The answer to `Outcome` for `xid` on a new version-3 session.
fn ask(dir: &Path, xid: &Xid) -> Outcome {
    let mut raw = Raw::connect(dir, &[1, 2, 3]);
    match raw.request(&Message::Outcome(*xid)) {
        Message::OutcomeIs(o) => o,
        other => panic!("expected OutcomeIs, got {other:?}"),
    }
}

/// The answer once the server has seen the session close (in progress before that).
fn settled(dir: &Path, xid: &Xid) -> Outcome {
    let mut answer = Outcome::InProgress;
    eventually("the server sees the session closed", || {
        answer = ask(dir, xid);
        answer != Outcome::InProgress
    });
    answer
}

fn negotiated(raw: &Raw) -> Option<Negotiated> {
    match raw.hello_ok() {
        Message::HelloOk { negotiated, .. } => *negotiated,
        other => panic!("expected HelloOk, got {other:?}"),
    }
}

/// Blocks until the server has shut its sending side down (the end of the stream).
fn wait_for_the_servers_end(raw: &mut Raw) {
    raw.stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 256];
    loop {
        match raw.stream.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => continue,
            Err(e) => panic!("waiting for the server to close the session: {e}"),
        }
    }
}

#[test]
fn a_notice_makes_a_closed_sessions_one_phase_commit_unknown_and_its_complete_committed() {
    let dir = tempfile::tempdir().unwrap();
    let a = DummyFactory::named("a", 100);
    let server = decree_server::start(config(dir.path()), vec![a.arc()]).unwrap();
    let mut raw = Raw::connect(dir.path(), &[1, 2, 3]);
    assert_eq!(negotiated(&raw).map(|n| n.version), Some(3));
    let (noticed, completed, silent) = (raw.xid(1), raw.xid(2), raw.xid(3));
    raw.send(&Message::OnePhase(noticed));
    raw.send(&Message::OnePhase(completed));
    raw.send(&Message::Complete(completed));
    assert_eq!(raw.request(&Message::Ping), Message::Pong);
    // While the session lives its one-phase commit may still be under way.
    assert_eq!(ask(dir.path(), &noticed), Outcome::InProgress);
    drop(raw); // As a killed client's kernel does: the server reads to the end.
    assert_eq!(settled(dir.path(), &noticed), Outcome::Unknown, "only the database knows");
    assert_eq!(ask(dir.path(), &completed), Outcome::Committed);
    assert_eq!(ask(dir.path(), &silent), Outcome::RolledBack, "no notice, no decision: presumed abort");
    server.shutdown().unwrap();
}

#[test]
fn a_notice_for_another_session_or_on_an_older_session_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let a = DummyFactory::named("a", 100);
    let server = decree_server::start(config(dir.path()), vec![a.arc()]).unwrap();
    let owner = Raw::connect(dir.path(), &[1, 2, 3]);
    let xid = owner.xid(1);
    let mut stranger = Raw::connect(dir.path(), &[1, 2, 3]);
    stranger.send(&Message::OnePhase(xid));
    assert_eq!(stranger.request(&Message::Ping), Message::Pong);
    drop(owner);
    assert_eq!(settled(dir.path(), &xid), Outcome::RolledBack, "a stranger's notice is ignored");
    let mut old = Raw::connect(dir.path(), &[1, 2]);
    let old_xid = old.xid(1);
    // An older session has no such message: a protocol error, answered to the notice.
    assert_eq!(error_code(&old.request(&Message::OnePhase(old_xid))), ErrorCode::Protocol);
    drop(stranger);
    server.shutdown().unwrap();
}

#[test]
fn a_session_the_server_closes_is_read_to_its_end_before_anything_is_answered_rolled_back() {
    let dir = tempfile::tempdir().unwrap();
    let a = DummyFactory::named("a", 100);
    let mut c = config(dir.path());
    c.limits.idle_timeout_ms = 200;
    c.limits.close_drain_ms = 1500;
    let server = decree_server::start(c, vec![a.arc()]).unwrap();

    // The idle bound closes the session; a notice the client writes after that (as one
    // written at the very moment of the close would be) is still read.
    let mut late = Raw::connect(dir.path(), &[1, 2, 3]);
    let (noticed, silent) = (late.xid(1), late.xid(2));
    wait_for_the_servers_end(&mut late);
    late.send(&Message::OnePhase(noticed));
    drop(late);
    assert_eq!(settled(dir.path(), &noticed), Outcome::Unknown, "the late notice was read");
    assert_eq!(ask(dir.path(), &silent), Outcome::RolledBack, "read to its end: nothing else came");

    // A client that does not close its end within close_drain_ms: whatever it may have
    // sent is unproven, so nothing of that session is answered rolled back.
    let mut stuck = Raw::connect(dir.path(), &[1, 2, 3]);
    let unread = stuck.xid(1);
    wait_for_the_servers_end(&mut stuck);
    let closed_at = Instant::now();
    let answer = settled(dir.path(), &unread);
    assert!(closed_at.elapsed() >= Duration::from_millis(1000), "settled only after the drain bound");
    assert_eq!(answer, Outcome::Unknown);
    drop(stuck);
    server.shutdown().unwrap();
}

#[test]
fn a_version_3_trailer_is_skipped_refused_when_it_must_be_understood_and_malformed_on_older_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let a = DummyFactory::named("a", 100);
    let server = decree_server::start(config(dir.path()), vec![a.arc()]).unwrap();
    let mut raw = Raw::connect(dir.path(), &[1, 2, 3]);
    let optional = vec![Field { tag: 0x0101, value: b"abc".to_vec() }];
    let must = vec![Field { tag: 0x8101, value: vec![] }];
    let (kept, refused) = (raw.xid(1), raw.xid(2));
    assert_eq!(
        raw.request_with_fields(&Message::Decide(decision(kept, &["a"])), &optional),
        Message::DecideOk
    );
    let reply = raw.request_with_fields(&Message::Decide(decision(refused, &["a"])), &must);
    // The text of the documented vector error_must_understand.
    let expected = Message::Error {
        code: ErrorCode::MustUnderstand,
        message: "unknown must-understand field 0x8101 in Decide".into(),
    };
    assert_eq!(reply, expected);
    assert_eq!(raw.request(&Message::Ping), Message::Pong, "the connection stays open");
    assert_eq!(ask(dir.path(), &kept), Outcome::Committed);
    assert_eq!(ask(dir.path(), &refused), Outcome::InProgress, "nothing of it was written");

    let mut old = Raw::connect(dir.path(), &[1, 2]);
    let reply = old.request_with_fields(&Message::Ping, &optional);
    assert_eq!(error_code(&reply), ErrorCode::Malformed);
    let mut rest = Vec::new();
    old.stream.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "a version-2 session is closed after the malformed frame");
    server.shutdown().unwrap();
}

/// The kept reply (issue 32): `CompleteHeuristic` with field `REPLY_WHEN_KEPT` is answered
/// `OutcomeIs` heuristic once the outcome is kept, `NotKept` for an Xid the session does not
/// own (the connection stays open), and the field is refused on any other message; a
/// plain `CompleteHeuristic` still gets no reply.
#[test]
fn a_heuristic_completion_that_asks_for_the_kept_reply_is_answered_once_kept() {
    use decree_core::HeuristicOutcome;
    let dir = tempfile::tempdir().unwrap();
    let a = DummyFactory::named("a", 100);
    let server = decree_server::start(config(dir.path()), vec![a.arc()]).unwrap();
    let kept_field = vec![Field { tag: decree_proto::REPLY_WHEN_KEPT, value: vec![] }];
    let mut raw = Raw::connect(dir.path(), &[1, 2, 3]);
    let (rolled_back, decided, plain) = (raw.xid(1), raw.xid(2), raw.xid(3));
    let rolled_back_heuristic = Message::CompleteHeuristic(rolled_back, HeuristicOutcome::Committed);
    assert_eq!(
        raw.request_with_fields(&rolled_back_heuristic, &kept_field),
        Message::OutcomeIs(Outcome::Heuristic)
    );
    assert_eq!(ask(dir.path(), &rolled_back), Outcome::Heuristic);
    assert_eq!(raw.request(&Message::Decide(decision(decided, &["a"]))), Message::DecideOk);
    let decided_heuristic = Message::CompleteHeuristic(decided, HeuristicOutcome::Mixed);
    assert_eq!(
        raw.request_with_fields(&decided_heuristic, &kept_field),
        Message::OutcomeIs(Outcome::Heuristic)
    );
    assert_eq!(ask(dir.path(), &decided), Outcome::Heuristic);

    let mut other = Raw::connect(dir.path(), &[1, 2, 3]);
    let foreign = Message::CompleteHeuristic(plain, HeuristicOutcome::RolledBack);
    assert_eq!(error_code(&other.request_with_fields(&foreign, &kept_field)), ErrorCode::NotKept);
    assert_eq!(other.request(&Message::Ping), Message::Pong, "the connection stays open");
    let complete = other.request_with_fields(&Message::Complete(plain), &kept_field);
    assert_eq!(error_code(&complete), ErrorCode::MustUnderstand, "the field is for CompleteHeuristic only");
    // Without the field: no reply, as before (the next reply is the ping's).
    raw.send(&Message::CompleteHeuristic(plain, HeuristicOutcome::RolledBack));
    assert_eq!(raw.request(&Message::Ping), Message::Pong);
    assert_eq!(ask(dir.path(), &plain), Outcome::Heuristic);
    server.shutdown().unwrap();
}
