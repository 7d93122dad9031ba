//! The Grafana dashboard (`ops/grafana/decree.json`) and the Prometheus alert rules
//! (`ops/prometheus/alerts.yml`) against what a real server exports: every `decree_*`
//! metric name they use must be one that a pair of real `decree serve` processes (a
//! primary, which also shows every single server's metric, and a backup) serves on their
//! endpoints. The bug it guards against: a metric renamed or removed in the server while a
//! dashboard panel or an alert still asks for the old name, which Prometheus answers with
//! an empty result: a panel that stays flat and an alert that never fires.
//!
//! It also runs the alert rules' own tests, `promtool test rules` on recorded series
//! (Debian's `prometheus` package; skipped with a note when promtool is missing, failed
//! under `CI=true`).

mod common;

use common::{free_port, Reaped};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a member may take to answer (a failure bound, not a performance target).
const WAIT_MAX: Duration = Duration::from_secs(30);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `decree_*` name in `text`, without the histogram suffixes Prometheus adds.
fn names_in(text: &str) -> BTreeSet<String> {
    let bytes = text.as_bytes();
    let mut names = BTreeSet::new();
    let mut at = 0;
    while let Some(found) = text[at..].find("decree_") {
        let start = at + found;
        let boundary = start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let mut end = start;
        while end < bytes.len()
            && (bytes[end].is_ascii_lowercase() || bytes[end].is_ascii_digit() || bytes[end] == b'_')
        {
            end += 1;
        }
        if boundary {
            names.insert(text[start..end].to_string());
        }
        at = end;
    }
    names
}

/// Starts member `name` of a pair (node 5) with its metrics on `metrics`.
fn member(dir: &Path, name: &str, id: u8, ports: (u16, u16, u16), peer: &str) -> (Reaped, PathBuf) {
    let (link, peer_link, metrics) = ports;
    let socket = dir.join(format!("{name}.sock"));
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(
        &config,
        format!(
            "node = 5\nlog_dir = \"{}\"\nengine = \"journal\"\nunix = \"{}\"\nmetrics = \"127.0.0.1:{metrics}\"\n\
             [pair]\nmember = {id}\nlink = \"127.0.0.1:{link}\"\npeer_link = \"127.0.0.1:{peer_link}\"\n\
             peer_clients = \"unix:{}\"\nsecret_file = \"{}\"\n[[rm]]\nname = \"dummy-0\"\nkind = \"dummy\"\n",
            dir.join(name).display(),
            socket.display(),
            dir.join(format!("{peer}.sock")).display(),
            decree_server::testing::pair_secret(dir).unwrap().display()
        ),
    )
    .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_decree"))
        .args(["serve", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starts decree serve");
    let deadline = Instant::now() + WAIT_MAX;
    while !socket.exists() {
        assert!(Instant::now() < deadline, "no socket");
        std::thread::sleep(Duration::from_millis(20));
    }
    (Reaped(child), config)
}

/// The text of `GET /metrics` on `port`.
fn scrape(port: u16) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text
}

/// The metric names a primary and its backup export once the pair is in sync.
fn exported() -> BTreeSet<String> {
    let dir = tempfile::tempdir().unwrap();
    let (link_a, link_b, metrics_a, metrics_b) = (free_port(), free_port(), free_port(), free_port());
    let (_a, config_a) = member(dir.path(), "a", 1, (link_a, link_b, metrics_a), "b");
    let (_b, _) = member(dir.path(), "b", 2, (link_b, link_a, metrics_b), "a");
    let out = Command::new(env!("CARGO_BIN_EXE_decree"))
        .args(["promote", "--force", "--config"])
        .arg(&config_a)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let deadline = Instant::now() + WAIT_MAX;
    loop {
        let (primary, backup) = (scrape(metrics_a), scrape(metrics_b));
        if primary.contains("decree_pair_strict 1") && backup.contains("decree_pair_caught_up 1") {
            return names_in(&primary).union(&names_in(&backup)).cloned().collect();
        }
        assert!(Instant::now() < deadline, "the pair did not get in sync:\n{primary}\n{backup}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn every_metric_the_dashboard_and_the_alerts_use_is_exported_by_a_real_server() {
    let exported = exported();
    assert!(
        exported.contains("decree_commits_total") && exported.contains("decree_pair_role"),
        "{exported:?}"
    );
    for file in ["ops/grafana/decree.json", "ops/prometheus/alerts.yml", "ops/prometheus/alerts.test.yml"] {
        let text = std::fs::read_to_string(repo().join(file)).unwrap();
        let used = names_in(&text);
        assert!(used.len() >= 4, "{file} uses only {used:?}: the name extraction is broken");
        let missing: Vec<&String> = used
            .iter()
            .filter(|n| {
                let base = ["_bucket", "_sum", "_count"].iter().find_map(|s| n.strip_suffix(s)).unwrap_or(n);
                !exported.contains(n.as_str()) && !exported.contains(base)
            })
            .collect();
        assert!(
            missing.is_empty(),
            "{file} uses metrics no server exports: {missing:?}\nexported: {exported:?}"
        );
    }
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo().join("ops/grafana/decree.json")).unwrap())
            .unwrap();
    assert!(dashboard["panels"].as_array().unwrap().len() > 10);
}

#[test]
fn the_names_of_a_text_are_found_whole() {
    let names = names_in("rate(decree_commits_total{a=\"b\"}[1m]) / xdecree_no decree_decide_seconds_bucket");
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["decree_commits_total", "decree_decide_seconds_bucket"]
    );
}

#[test]
fn the_alert_rules_pass_their_promtool_tests() {
    let Ok(out) = Command::new("promtool")
        .args(["test", "rules", "alerts.test.yml"])
        .current_dir(repo().join("ops/prometheus"))
        .output()
    else {
        let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
        assert!(!ci, "CI=true but promtool is missing: apt-get install prometheus");
        eprintln!("skipped: promtool is missing (apt-get install prometheus)");
        return;
    };
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool test rules failed:\n{text}");
}
