//! Runs the `decree` binary as a user would, with tiny parameters, and reads its output.

use std::process::Command;

fn decree(args: &[&str], cwd: &std::path::Path) -> (bool, String, String) {
    let out =
        Command::new(env!("CARGO_BIN_EXE_decree")).args(args).current_dir(cwd).output().expect("runs decree");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn bench_log_json_lines() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let args =
        ["bench-log", "--engine", "volatile", "--threads", "1,2", "--duration", "0.1", "--format", "json"];
    let (ok, stdout, stderr) = decree(&[&args[..], &["--reference-mib", "1"]].concat(), dir.path());
    assert!(ok, "{stderr}");
    let lines: Vec<serde_json::Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let engines: Vec<&str> = lines.iter().filter_map(|v| v["engine"].as_str()).collect();
    assert_eq!(engines, ["raw-fdatasync", "volatile", "volatile"]);
    assert_eq!(lines[2]["threads"].as_u64(), Some(2));
    // The temporary work directory was made in the current directory and removed.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "work directory left behind");
}

#[test]
fn bench_table_and_charts() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let args = [
        "bench",
        "--engine",
        "volatile",
        "--threads",
        "1,2",
        "--cycles",
        "10",
        "--t1",
        "0",
        "--t2",
        "0",
        "--chart",
        "c.svg",
    ];
    let (ok, stdout, stderr) = decree(&args, dir.path());
    assert!(ok, "{stderr}");
    assert!(stdout.starts_with("decree bench: mode=embedded rms=2 workload=extreme t1=0 t2=0"), "{stdout}");
    assert_eq!(
        stdout.lines().filter(|l| l.split_whitespace().next() == Some("total")).count(),
        2,
        "{stdout}"
    );
    assert!(stdout.contains("summary: throughput"), "{stdout}");
    assert!(dir.path().join("c.svg").metadata().unwrap().len() > 0);
    assert!(dir.path().join("c-percentiles.svg").metadata().unwrap().len() > 0);
}

#[test]
fn unavailable_mode_and_bad_options_fail_clearly() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let (ok, _, stderr) = decree(&["bench", "--mode", "tcp"], dir.path());
    assert!(!ok);
    assert!(stderr.contains("mode tcp is not available yet"), "{stderr}");
    let (ok, _, stderr) = decree(&["bench", "--t1", "1000"], dir.path());
    assert!(!ok);
    assert!(stderr.contains("needs a unit"), "{stderr}");
}
