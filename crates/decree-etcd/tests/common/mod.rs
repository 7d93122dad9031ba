//! What the etcd tests share: the cluster's address, fresh key prefixes, the member script.
#![allow(dead_code)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use decree_etcd::{Etcd, EtcdConfig};

/// The test cluster's endpoints, or `None` (with a message saying how to start it) when
/// DECREE_TEST_ETCD is unset; in CI an unset cluster is a failure, not a skip.
pub fn endpoints() -> Option<Vec<String>> {
    match std::env::var("DECREE_TEST_ETCD") {
        Ok(v) if !v.is_empty() => Some(v.split(',').map(str::to_string).collect()),
        _ => {
            let hint = "DECREE_TEST_ETCD is not set: run scripts/test-etcd.sh start && eval \"$(scripts/test-etcd.sh env)\"";
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{hint}");
            }
            eprintln!("skipped: {hint}");
            None
        }
    }
}

/// A client of the test cluster with a short request timeout, or `None` when there is none.
pub async fn connect() -> Option<Etcd> {
    let mut config = EtcdConfig::new(endpoints()?);
    config.request_timeout = Duration::from_secs(3);
    Some(Etcd::connect(&config).await.expect("connect to the test etcd cluster"))
}

/// A key prefix no other test or run uses.
pub fn prefix(test: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("/decree-test/{test}/{}-{nanos}/", std::process::id())
}

/// The script that runs the test cluster (`env` names it; else this source tree's).
pub fn script() -> String {
    std::env::var("DECREE_TEST_ETCD_SCRIPT")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/test-etcd.sh").to_string())
}

/// Runs `scripts/test-etcd.sh` (kill or restart members), failing the test if it fails.
pub fn members(args: &[&str]) {
    let script = script();
    let status = std::process::Command::new(&script).args(args).status().expect("run scripts/test-etcd.sh");
    assert!(status.success(), "{script} {} failed: {status}", args.join(" "));
}
