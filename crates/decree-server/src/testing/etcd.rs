//! The test etcd cluster of scripts/test-etcd.sh, as tests see it: its endpoints, its
//! members, which one leads, and killing members (started again however the test ends).

use std::io::{Read, Write};
use std::process::Command;

/// What a test that needs the cluster says when it does not run.
pub const SKIPPED: &str =
    "skipped: DECREE_TEST_ETCD is not set (scripts/test-etcd.sh start; eval \"$(scripts/test-etcd.sh env)\")";

/// The cluster's endpoints (`DECREE_TEST_ETCD`), or `None` when it does not run: the caller
/// skips, saying [`SKIPPED`].
pub fn endpoints() -> Option<Vec<String>> {
    let list = std::env::var("DECREE_TEST_ETCD").ok().filter(|l| !l.is_empty())?;
    Some(list.split(',').map(str::to_string).collect())
}

/// The members' names and client ports (`DECREE_TEST_ETCD_MEMBERS`).
pub fn members() -> Vec<(String, u16)> {
    let list = std::env::var("DECREE_TEST_ETCD_MEMBERS").expect("DECREE_TEST_ETCD_MEMBERS");
    list.split_whitespace()
        .filter_map(|m| {
            m.split_once('=').and_then(|(name, port)| Some((name.to_string(), port.parse().ok()?)))
        })
        .collect()
}

/// Runs scripts/test-etcd.sh with `args` (`kill` or `restart` and member names).
pub fn script(args: &[&str]) {
    let path = std::env::var("DECREE_TEST_ETCD_SCRIPT").expect("DECREE_TEST_ETCD_SCRIPT");
    let status = Command::new("bash").arg(path).args(args).status().expect("run test-etcd.sh");
    assert!(status.success(), "test-etcd.sh {args:?}: {status}");
}

/// The name of etcd's Raft leader, asked of each member's JSON gateway; `None` while no
/// member says it leads (an election under way).
pub fn leader() -> Option<String> {
    for (name, port) in members() {
        let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else { continue };
        let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(2)));
        let request = "POST /v3/maintenance/status HTTP/1.0\r\nHost: 127.0.0.1\r\n\
                       Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
        if stream.write_all(request.as_bytes()).is_err() {
            continue;
        }
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        let Some((_, json)) = answer.split_once("\r\n\r\n") else { continue };
        let Ok(json) = serde_json::from_str::<serde_json::Value>(json) else { continue };
        if json["leader"].is_string() && json["header"]["member_id"] == json["leader"] {
            return Some(name);
        }
    }
    None
}

/// Members killed by a test, started again however the test ends (the next tests need
/// them).
pub struct Killed(Vec<String>);

impl Killed {
    /// SIGKILLs `names` (their data stays).
    pub fn kill(names: &[&str]) -> Killed {
        script(&[&["kill"], names].concat());
        Killed(names.iter().map(|n| n.to_string()).collect())
    }

    /// Starts them again on their ports, with their data.
    pub fn restart(mut self) {
        let names = std::mem::take(&mut self.0);
        script(&[vec!["restart"], names.iter().map(String::as_str).collect()].concat());
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            let path = std::env::var("DECREE_TEST_ETCD_SCRIPT").unwrap_or_default();
            let _ = Command::new("bash").arg(path).arg("restart").args(&self.0).status();
        }
    }
}
