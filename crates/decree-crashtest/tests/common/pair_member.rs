//! What the tests of pairs of real `decree serve` processes share (pair_etcd.rs and
//! pair_etcd_secure.rs): a member's files, starting and reading it, waiting for a strict
//! pair, deciding through it and checking outcomes.

use decree_client::RemoteDecisions;
use decree_core::{BranchRecord, Decision, DecisionStore, Origin, Outcome, Xid};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child killed and reaped when the test ends, so that a failed assertion leaves no
/// process running.
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub use decree_server::testing::ports::free_port;

/// A new pair name (etcd's data outlives one test run).
pub fn pair_name(test: &str) -> String {
    format!("{test}-{}-{}", std::process::id(), free_port())
}

/// One member's files: its configuration, client socket and stderr log.
#[derive(Clone)]
pub struct Member {
    pub name: &'static str,
    pub config: PathBuf,
    pub socket: PathBuf,
    pub log: PathBuf,
}

/// Starts `decree serve` for `m` and waits for its client socket; fails, with its log, if
/// it exits or binds nothing within 20 s.
pub fn serve(m: &Member) -> Reaped {
    let _ = std::fs::remove_file(&m.socket);
    let log = std::fs::OpenOptions::new().create(true).append(true).open(&m.log).unwrap();
    let mut child = Command::new(super::decree_bin())
        .args(["serve", "-v", "--config"])
        .arg(&m.config)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("starts decree serve");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !m.socket.exists() {
        if let Ok(Some(exit)) = child.try_wait() {
            panic!("decree serve ({}) exited: {exit}\n{}", m.name, tail(m));
        }
        assert!(Instant::now() < deadline, "no socket after 20 s:\n{}", tail(m));
        std::thread::sleep(Duration::from_millis(20));
    }
    Reaped(child)
}

/// The last 30 lines of the member's log, named, repeated messages counted.
pub fn tail(m: &Member) -> String {
    let text = std::fs::read_to_string(&m.log).unwrap_or_default();
    // A run of one message (its timestamp aside) shows once with its count: a primary
    // retrying its link every 100 ms would otherwise fill the tail and hide the rest.
    let mut runs: Vec<(&str, &str, usize)> = Vec::new();
    for line in text.lines() {
        let message = line.split_once(' ').map_or(line, |(_, rest)| rest);
        match runs.last_mut() {
            Some((last, _, count)) if *last == message => *count += 1,
            _ => runs.push((message, line, 1)),
        }
    }
    let shown: Vec<String> = runs[runs.len().saturating_sub(30)..]
        .iter()
        .map(|&(_, line, count)| match count {
            1 => line.to_string(),
            _ => format!("{line} (and {} more times)", count - 1),
        })
        .collect();
    format!("[{}]\n{}", m.name, shown.join("\n"))
}

/// The member's status, `None` while it cannot answer.
pub fn status(m: &Member) -> Option<serde_json::Value> {
    let out = Command::new(super::decree_bin())
        .args(["status", "--format", "json", "--config"])
        .arg(&m.config)
        .output()
        .unwrap();
    out.status.success().then(|| serde_json::from_slice(&out.stdout).ok()).flatten()
}

/// Polls `cond` until it holds (how long that took), failing after 30 s with the logs of
/// `members`.
pub fn eventually(what: &str, members: &[&Member], mut cond: impl FnMut() -> bool) -> Duration {
    let (started, deadline) = (Instant::now(), Instant::now() + Duration::from_secs(30));
    while !cond() {
        let logs: Vec<String> = members.iter().map(|m| tail(m)).collect();
        assert!(
            Instant::now() < deadline,
            "timed out waiting until {what}; logs:\n{}",
            logs.join("\n----\n")
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    started.elapsed()
}

/// Whether `primary` leads strictly with `backup` caught up (each says so).
pub fn strict_pair(primary: &Member, backup: &Member) -> bool {
    let (Some(p), Some(b)) = (status(primary), status(backup)) else { return false };
    p["role"] == "primary" && p["strict"] == true && b["role"] == "backup" && b["caught_up"] == true
}

/// Waits until one of the two leads strictly with the other caught up; (primary, backup).
pub fn wait_strict<'a>(a: &'a Member, b: &'a Member) -> (&'a Member, &'a Member) {
    let mut found = None;
    eventually("one member leads strictly, the other caught up", &[a, b], || {
        found = [(a, b), (b, a)].into_iter().find(|(p, q)| strict_pair(p, q));
        found.is_some()
    });
    found.expect("found")
}

/// The member's epoch (raw), 0 while it cannot answer.
pub fn epoch(m: &Member) -> u64 {
    status(m).and_then(|s| s["epoch_raw"].as_u64()).unwrap_or(0)
}

/// A client of `m` alone.
pub fn connect(m: &Member) -> RemoteDecisions {
    RemoteDecisions::connect(&format!("unix:{}", m.socket.display())).expect("connect to the primary")
}

/// Decision `sequence` of `session` on the dummy resource managers the members configure.
pub fn decision(store: &RemoteDecisions, session: u64, sequence: u64) -> Decision {
    let xid = Xid::decree(Origin { node: store.node(), incarnation: store.incarnation(), session, sequence });
    let branches = vec![
        BranchRecord { rm: "dummy-0".into(), branch: 0 },
        BranchRecord { rm: "dummy-1".into(), branch: 1 },
    ];
    Decision { xid, branches }
}

/// Decides `count` transactions through `primary`; returns their Xids, all acknowledged.
pub fn decide(primary: &Member, count: u64) -> Vec<Xid> {
    let mut acknowledged = Vec::new();
    try_decide(primary, count, &mut acknowledged).unwrap_or_else(|e| panic!("{e}"));
    acknowledged
}

/// [`decide`], adding each acknowledged Xid to `acknowledged`, until the first error.
pub fn try_decide(primary: &Member, count: u64, acknowledged: &mut Vec<Xid>) -> Result<(), String> {
    let endpoint = format!("unix:{}", primary.socket.display());
    let store = RemoteDecisions::connect(&endpoint).map_err(|e| e.to_string())?;
    let session = store.open_session().map_err(|e| e.to_string())?;
    for sequence in 1..=count {
        let d = decision(&store, session, sequence);
        store.decide(&d).map_err(|e| format!("decision {sequence} not acknowledged: {e}"))?;
        acknowledged.push(d.xid);
    }
    Ok(())
}

/// Every Xid is answered committed by `m`.
pub fn all_committed(m: &Member, xids: &[Xid]) {
    let store = connect(m);
    for xid in xids {
        assert_eq!(store.outcome(xid).unwrap(), Outcome::Committed, "{xid} on {}", m.name);
    }
}
