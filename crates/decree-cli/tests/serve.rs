//! `decree serve` as a child process: it listens on a private socket, answers a client,
//! and stops with status 0 on SIGTERM.

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn serve_listens_with_mode_0600_and_exits_0_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("d.sock");
    let config = dir.path().join("decree.toml");
    std::fs::write(
        &config,
        format!(
            "log_dir = \"{}\"\nengine = \"journal\"\nunix = \"{}\"\n\
             [[rm]]\nname = \"dummy-0\"\nkind = \"dummy\"\n[[rm]]\nname = \"dummy-1\"\nkind = \"dummy\"\n",
            dir.path().join("log").display(),
            socket.display()
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_decree"))
        .args(["serve", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts decree serve");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !socket.exists() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("decree serve exited early with {status}");
        }
        assert!(Instant::now() < deadline, "no socket after 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "socket mode {mode:o}");
    // A client can talk to it: bench cycles through it (their decisions name dummy-0 and
    // dummy-1, which the configuration lists).
    let work = tempfile::tempdir_in(".").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_decree"))
        .args(["bench", "--mode", "unix", "--threads", "1", "--cycles", "3", "--t1", "0", "--t2", "0"])
        .arg("--connect")
        .arg(format!("unix:{}", socket.display()))
        .current_dir(work.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // SAFETY: kill with a pid of our own child.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) }, 0);
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
    }
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(!socket.exists(), "the socket is removed at shutdown");
}
