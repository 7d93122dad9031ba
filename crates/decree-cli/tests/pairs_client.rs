//! The Rust client over several pairs (issue 34), against real `decree serve` processes:
//! two operator-promoted pairs with distinct node ids, and single servers for the hostile
//! cases.
//!
//! The bugs this guards against: sessions that all land on one pair, a transaction whose
//! Xid names one pair while its decision went to another, an outcome asked of a pair that
//! did not mint the Xid (it would answer "unknown", or another transaction's fate), a dead
//! pair that stops the live one, and errors that do not say which pair failed.

mod common;

use common::{free_port, Reaped};
use decree_client::{Pairs, PairsCoordinator};
use decree_core::testing::DummyFactory;
use decree_core::{
    BranchRecord, Decision, DecisionStore, Origin, Outcome, ResourceManager, RmFactory, Session, StoreError,
    TmConfig, TmError, Xid,
};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One `decree serve` process's files.
struct Server {
    config: PathBuf,
    socket: PathBuf,
}

impl Server {
    fn endpoint(&self) -> String {
        format!("unix:{}", self.socket.display())
    }
}

const RMS: &str =
    "[[rm]]\nname = \"dummy-0\"\nkind = \"dummy\"\n[[rm]]\nname = \"dummy-1\"\nkind = \"dummy\"\n";

/// A single server (no pair) with node id `node`.
fn single(dir: &Path, name: &str, node: u32) -> Server {
    let socket = dir.join(format!("{name}.sock"));
    let config = dir.join(format!("{name}.toml"));
    let text = format!(
        "node = {node}\nlog_dir = \"{}\"\nengine = \"journal\"\nunix = \"{}\"\n{RMS}",
        dir.join(name).display(),
        socket.display()
    );
    std::fs::write(&config, text).unwrap();
    Server { config, socket }
}

/// The two members of a pair with node id `node`, named `<name>1` and `<name>2`, linked on
/// free ports and proving a secret of their own.
fn pair(dir: &Path, name: &str, node: u32) -> (Server, Server) {
    let dir = dir.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let secret = decree_server::testing::pair_secret(&dir).unwrap();
    let links = [free_port(), free_port()];
    let mut members = Vec::new();
    for member in 1..=2usize {
        let (own, peer) = (format!("{name}{member}"), format!("{name}{}", 3 - member));
        let socket = dir.join(format!("{own}.sock"));
        let config = dir.join(format!("{own}.toml"));
        let text = format!(
            "node = {node}\nlog_dir = \"{}\"\nengine = \"journal\"\nunix = \"{}\"\n\
             [pair]\nmember = {member}\nlink = \"127.0.0.1:{}\"\npeer_link = \"127.0.0.1:{}\"\n\
             peer_clients = \"unix:{}\"\nsecret_file = \"{}\"\n{RMS}",
            dir.join(&own).display(),
            socket.display(),
            links[member - 1],
            links[2 - member],
            dir.join(format!("{peer}.sock")).display(),
            secret.display()
        );
        std::fs::write(&config, text).unwrap();
        members.push(Server { config, socket });
    }
    let second = members.pop().unwrap();
    (members.pop().unwrap(), second)
}

fn serve(s: &Server) -> Reaped {
    let _ = std::fs::remove_file(&s.socket);
    let log =
        std::fs::OpenOptions::new().create(true).append(true).open(s.config.with_extension("log")).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_decree"))
        .args(["serve", "-v", "--config"])
        .arg(&s.config)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("starts decree serve");
    eventually("the server listens", || s.socket.exists());
    Reaped(child)
}

/// Runs `decree <args> --config <s>`; returns (success, stdout + stderr).
fn decree(args: &[&str], s: &Server) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_decree"))
        .args(args)
        .arg("--config")
        .arg(&s.config)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

fn status(s: &Server) -> serde_json::Value {
    let (ok, text) = decree(&["status", "--format", "json"], s);
    assert!(ok, "{text}");
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Promotes `primary` (forced: a new pair) and waits until its backup holds everything.
fn promote(primary: &Server, backup: &Server) {
    let (ok, text) = decree(&["promote", "--force"], primary);
    assert!(ok, "{text}");
    eventually("the backup caught up", || status(backup)["caught_up"] == true);
    eventually("the primary is strict", || status(primary)["strict"] == true);
}

fn factories() -> Vec<Arc<dyn RmFactory>> {
    vec![DummyFactory::named("dummy-0", 0).arc(), DummyFactory::named("dummy-1", 0).arc()]
}

fn open(coordinator: &PairsCoordinator, factories: &[Arc<dyn RmFactory>]) -> Session {
    let rms: Vec<Box<dyn ResourceManager>> = factories.iter().map(|f| f.connect().unwrap()).collect();
    coordinator.open_session(rms).unwrap_or_else(|e| panic!("no session: {e}"))
}

/// One two-phase transaction (both dummy branches) on `session`; returns its Xid.
fn transfer(session: &mut Session) -> Xid {
    let mut tx = session.begin().unwrap();
    tx.enlist_all().unwrap();
    let report = tx.commit().unwrap_or_else(|e| panic!("commit: {e}"));
    assert_eq!(report.phase_two_pending, 0);
    report.xid
}

fn node_of(xid: &Xid) -> u32 {
    xid.origin().unwrap().node
}

#[test]
fn sessions_spread_over_two_pairs_and_a_dead_pair_leaves_the_other_serving() {
    let dir = tempfile::tempdir().unwrap();
    let (a1, a2) = pair(dir.path(), "a", 21);
    let (b1, b2) = pair(dir.path(), "b", 22);
    let mut server_a1 = serve(&a1);
    let (_a2, _b1, _b2) = (serve(&a2), serve(&b1), serve(&b2));
    promote(&a1, &a2);
    promote(&b1, &b2);

    // A pair listed by its backup alone does not serve (the client never connects to an
    // address it was not given); sessions go to the other pair, and the error carries the
    // backup's refusal, which names the primary to add to the list.
    let backup_only = Pairs::connect(&format!("{};{}", a2.endpoint(), b1.endpoint())).unwrap();
    assert_eq!(backup_only.nodes(), vec![None, Some(22)]);
    for _ in 0..3 {
        let (store, session) = backup_only.open_session().unwrap();
        assert_eq!((store.pair(), store.node()), (1, 22));
        store.close_session(session);
    }
    let why = backup_only.store(0).err().expect("a backup serves no client").to_string();
    assert!(why.contains("not the primary") && why.contains("a1.sock"), "{why}");
    drop(backup_only);

    // Each pair listed backup first: the backup's NotPrimary sends the client on to the
    // primary, in each pair.
    let spec = format!("{},{};{},{}", a2.endpoint(), a1.endpoint(), b2.endpoint(), b1.endpoint());
    let pairs = Pairs::connect(&spec).unwrap();
    assert_eq!(pairs.nodes(), vec![Some(21), Some(22)]);
    assert_eq!(pairs.store(0).unwrap().remote().endpoint().to_string(), a1.endpoint());
    assert_eq!(pairs.store(1).unwrap().remote().endpoint().to_string(), b1.endpoint());
    let factories = factories();
    let coordinator = PairsCoordinator::new(pairs, TmConfig::default(), factories.clone()).unwrap();

    // Four sessions, round robin: two on each pair; each transaction lives on one pair.
    let mut sessions: Vec<Session> = (0..4).map(|_| open(&coordinator, &factories)).collect();
    let xids: Vec<Xid> = sessions.iter_mut().map(transfer).collect();
    let nodes: Vec<u32> = xids.iter().map(node_of).collect();
    assert_eq!(nodes.iter().filter(|&&n| n == 21).count(), 2, "{nodes:?}");
    assert_eq!(nodes.iter().filter(|&&n| n == 22).count(), 2, "{nodes:?}");
    for xid in &xids {
        assert_eq!(coordinator.outcome(xid).unwrap(), Outcome::Committed, "{xid}");
        let pair = coordinator.pairs().pair_of(xid).unwrap();
        assert_eq!(pair, if node_of(xid) == 21 { 0 } else { 1 });
    }
    // A session the coordinator refuses (a connection whose resource manager has no
    // factory) is refused whole, and the next one opens as before.
    let unknown: Vec<Box<dyn ResourceManager>> = vec![DummyFactory::named("dummy-9", 0).connect().unwrap()];
    match coordinator.open_session(unknown) {
        Err(TmError::Config(why)) => assert!(why.contains("dummy-9"), "{why}"),
        Err(e) => panic!("expected a configuration error, got {e}"),
        Ok(_) => panic!("a connection without a factory must be refused"),
    }
    drop(open(&coordinator, &factories));

    // An Xid of a node no pair has: refused by name, never asked of a pair.
    let stranger = Xid::decree(Origin { node: 99, incarnation: 257, session: 1, sequence: 1 });
    match coordinator.outcome(&stranger) {
        Err(StoreError::Malformed(why)) => {
            assert!(why.contains("no pair has node id 99"), "{why}");
            assert!(why.contains("pair 1 has node 21") && why.contains("pair 2 has node 22"), "{why}");
        }
        other => panic!("an Xid of no pair must be refused, got {other:?}"),
    }

    // A workload on one of pair b's sessions runs across what follows; any failed commit
    // of it fails the test.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let mut busy = sessions.remove(sessions.iter().position(|s| s.tm().store().node() == 22).unwrap());
    let worker = {
        let (stop, done) = (stop.clone(), done.clone());
        std::thread::spawn(move || {
            let mut xids = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                xids.push(transfer(&mut busy));
                done.fetch_add(1, Ordering::Relaxed);
            }
            xids
        })
    };
    eventually("the workload on pair b runs", || done.load(Ordering::Relaxed) >= 3);

    // Pair a's primary dies; its backup is not promoted yet: pair a serves nobody.
    server_a1.0.kill().unwrap();
    server_a1.0.wait().unwrap();
    let at_kill = done.load(Ordering::Relaxed);
    let (a_xids, b_xids): (Vec<Xid>, Vec<Xid>) = xids.iter().partition(|x| node_of(x) == 21);
    // Pair b's sessions go on unaffected.
    for session in sessions.iter_mut().filter(|s| s.tm().store().node() == 22) {
        let xid = transfer(session);
        assert_eq!(node_of(&xid), 22);
        assert_eq!(coordinator.outcome(&xid).unwrap(), Outcome::Committed);
    }
    // New sessions all go to the live pair.
    for _ in 0..4 {
        let mut session = open(&coordinator, &factories);
        assert_eq!(node_of(&transfer(&mut session)), 22);
    }
    for xid in &b_xids {
        assert_eq!(coordinator.outcome(xid).unwrap(), Outcome::Committed, "{xid}");
    }
    eventually("the workload on pair b went on after the kill", || {
        done.load(Ordering::Relaxed) >= at_kill + 5
    });
    stop.store(true, Ordering::Relaxed);
    let busy_xids = worker.join().expect("every transaction of pair b's workload committed");
    for xid in &busy_xids {
        assert_eq!(node_of(xid), 22);
        assert_eq!(coordinator.outcome(xid).unwrap(), Outcome::Committed, "{xid}");
    }
    // Pair a's Xids are asked of pair a only: it is down, and the error says which pair.
    match coordinator.outcome(&a_xids[0]) {
        Err(StoreError::Unreachable(why)) => {
            assert!(why.contains("pair 1 (") && why.contains("a1.sock"), "{why}")
        }
        other => panic!("pair a is down, got {other:?}"),
    }

    // The operator promotes pair a's backup: pair a serves again, in a new epoch; its old
    // Xids are answered by it (the backup held their decisions), and new sessions reach it.
    let (ok, text) = decree(&["promote"], &a2);
    assert!(ok, "{text}");
    for xid in &a_xids {
        assert_eq!(coordinator.outcome(xid).unwrap(), Outcome::Committed, "{xid}");
    }
    let mut on_a = None;
    eventually("a new session lands on pair a again", || {
        let mut session = open(&coordinator, &factories);
        let xid = transfer(&mut session);
        if node_of(&xid) == 21 {
            on_a = Some(xid);
        }
        on_a.is_some()
    });
    let on_a = on_a.unwrap();
    assert_eq!(on_a.origin().unwrap().incarnation, (2 << 8) | 2, "pair a's new epoch");
    assert_eq!(coordinator.outcome(&on_a).unwrap(), Outcome::Committed);
    assert_eq!(coordinator.pairs().store(0).unwrap().remote().endpoint().to_string(), a2.endpoint());
}

/// A decision straight through a pair's store (no coordinator): the store mints nothing,
/// the caller builds the Xid from the store's node and incarnation.
fn decide_raw(pairs: &Pairs) -> Xid {
    let (store, session) = pairs.open_session().unwrap();
    let origin = Origin { node: store.node(), incarnation: store.incarnation(), session, sequence: 1 };
    let branches = vec![
        BranchRecord { rm: "dummy-0".into(), branch: 0 },
        BranchRecord { rm: "dummy-1".into(), branch: 1 },
    ];
    let decision = Decision { xid: Xid::decree(origin), branches };
    store.decide(&decision).unwrap();
    store.close_session(session);
    decision.xid
}

#[test]
fn hostile_pair_lists_are_refused_and_a_pair_that_is_all_down_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let (one, two) = (single(dir.path(), "one", 31), single(dir.path(), "two", 32));
    let mut server_one = serve(&one);
    let mut server_two = serve(&two);
    let nowhere = |name: &str| format!("unix:{}", dir.path().join(format!("{name}.sock")).display());

    // Lists that name no pair, an empty pair, or a member twice.
    for (spec, why) in [
        ("".to_string(), "names no member"),
        (format!("{};", one.endpoint()), "pair 2"),
        (format!("{},{}", one.endpoint(), one.endpoint()), "twice in pair 1"),
        (format!("{};{}", one.endpoint(), one.endpoint()), "in pair 1 and in pair 2"),
    ] {
        match Pairs::connect(&spec) {
            Err(StoreError::Unreachable(e)) => assert!(e.contains(why), "{spec:?}: {e}"),
            Err(e) => panic!("{spec:?}: wrong error {e}"),
            Ok(_) => panic!("{spec:?} must be refused"),
        }
    }
    assert!(Pairs::connect_with(Vec::new(), Default::default()).is_err());

    // Every pair down: the error names each pair and its members.
    let dead = format!("{},{};{}", nowhere("x1"), nowhere("x2"), nowhere("y1"));
    let why = Pairs::connect(&dead).err().expect("nothing serves").to_string();
    assert!(why.contains("no pair serves"), "{why}");
    assert!(why.contains("pair 1 (") && why.contains("x1.sock,unix:") && why.contains("x2.sock"), "{why}");
    assert!(why.contains("pair 2 (") && why.contains("y1.sock"), "{why}");

    // Two servers with one node id cannot both be pairs of one client.
    let twin = single(dir.path(), "twin", 31);
    let server_twin = serve(&twin);
    let pairs = Pairs::connect(&format!("{};{}", one.endpoint(), twin.endpoint())).unwrap();
    assert_eq!(pairs.nodes(), vec![Some(31), None]);
    let refused = pairs.store(1).err().expect("a second pair with node 31").to_string();
    assert!(
        refused.contains("has node id 31, as pair 1") && refused.contains("its own node id"),
        "{refused}"
    );
    drop((pairs, server_twin));

    // A pair whose members are all down sits beside two that serve: sessions go to the live
    // ones only, and each Xid's outcome comes from the pair that minted it.
    let spec = format!("{};{},{};{}", one.endpoint(), nowhere("z1"), nowhere("z2"), two.endpoint());
    let pairs = Pairs::connect(&spec).unwrap();
    assert_eq!(pairs.nodes(), vec![Some(31), None, Some(32)]);
    let xids: Vec<Xid> = (0..6).map(|_| decide_raw(&pairs)).collect();
    let nodes: Vec<u32> = xids.iter().map(node_of).collect();
    assert!(nodes.contains(&31) && nodes.contains(&32), "both live pairs take sessions: {nodes:?}");
    for xid in &xids {
        assert_eq!(pairs.outcome(xid).unwrap(), Outcome::Committed, "{xid}");
    }
    // An unknown node id while a pair's node id is not known (it never answered): the Xid
    // may be that pair's, so the answer is "cannot reach", naming it, not "no such pair".
    let stranger = Xid::decree(Origin { node: 99, incarnation: 1, session: 1, sequence: 1 });
    match pairs.outcome(&stranger) {
        Err(StoreError::Unreachable(why)) => {
            assert!(why.contains("no pair has node id 99") && why.contains("not reached yet"), "{why}");
            assert!(why.contains("pair 2"), "{why}");
        }
        other => panic!("expected Unreachable, got {other:?}"),
    }

    // Both live servers die: opening a session names every pair and why.
    server_one.0.kill().unwrap();
    server_one.0.wait().unwrap();
    server_two.0.kill().unwrap();
    server_two.0.wait().unwrap();
    let why = pairs.open_session().err().expect("nothing serves").to_string();
    assert!(why.contains("no pair serves"), "{why}");
    for name in ["one.sock", "z1.sock", "two.sock"] {
        assert!(why.contains(name), "{name} missing: {why}");
    }
    // Outcomes of the dead pairs' Xids: unreachable, naming the pair; never another answer.
    match pairs.outcome(&xids[0]) {
        Err(StoreError::Unreachable(why)) => {
            assert!(why.contains("pair 1 (") || why.contains("pair 3 ("), "{why}")
        }
        other => panic!("expected Unreachable, got {other:?}"),
    }
}
