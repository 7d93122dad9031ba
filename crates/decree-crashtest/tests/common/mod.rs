//! What the crash tests share: the test databases' DSNs and the CI rule for missing ones,
//! the seeded random source, and how `decree-bank` is started.
//!
//! Without DECREE_TEST_* the tests print "skipped" and pass, so that `cargo test` works on
//! a laptop without databases; with CI=true a missing database is a failure, so that CI
//! can never pass by skipping the crash proof.

#![allow(dead_code)]

pub mod pair_member;

use decree_crashtest::{BankConfig, PairKind};
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The bank workload's binary (built by cargo for this test crate).
pub const BANK_BIN: &str = env!("CARGO_BIN_EXE_decree-bank");

/// What every `decree-bank` command of a loop shares: the database pair, the tables'
/// prefix, the number of accounts and the node id whose branches the checks look for.
pub struct BankArgs {
    pub pair: PairKind,
    pub prefix: String,
    pub accounts: u32,
    pub node: u32,
}

impl BankArgs {
    /// `decree-bank <sub>` with the shared options.
    pub fn command(&self, sub: &str) -> Command {
        let mut c = Command::new(BANK_BIN);
        c.arg(sub).args(["--pair", self.pair.name(), "--prefix", &self.prefix]).args([
            "--accounts",
            &self.accounts.to_string(),
            "--node",
            &self.node.to_string(),
        ]);
        c
    }
}

/// The databases of one pair, or None (after printing why) when the test must skip.
pub fn bank_config(kind: PairKind, prefix: &str, accounts: u32) -> Option<BankConfig> {
    let b_var = match kind {
        PairKind::PgPg => "DECREE_TEST_PG_B",
        PairKind::PgMariaDb => "DECREE_TEST_MARIADB",
    };
    let dsn_a = test_dsn("DECREE_TEST_PG_A")?;
    let dsn_b = test_dsn(b_var)?;
    Some(BankConfig { kind, dsn_a, dsn_b, prefix: prefix.to_string(), accounts, balance_start: 1000 })
}

/// The DSN of a test database in `var`, or None (after printing why) when the test must
/// skip; with CI=true a missing one fails the test instead.
pub fn test_dsn(var: &str) -> Option<String> {
    if let Ok(dsn) = std::env::var(var) {
        return Some(dsn);
    }
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    assert!(
        !ci,
        "CI=true but {var} is not set: run scripts/test-dbs.sh start and eval \"$(scripts/test-dbs.sh env)\""
    );
    eprintln!(
        "skipped: {var} is not set: run scripts/test-dbs.sh start && eval \"$(scripts/test-dbs.sh env)\""
    );
    None
}

/// A seeded random source; the seed comes from `var` or the clock and is printed, so a
/// failing run can be repeated.
pub fn seeded_rng(var: &str) -> (u64, rand::rngs::StdRng) {
    let seed =
        std::env::var(var).ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| rand::thread_rng().gen());
    eprintln!("seed {seed} (repeat with {var}={seed})");
    (seed, rand::rngs::StdRng::seed_from_u64(seed))
}

/// A count from the environment, or `default`.
pub fn env_count(var: &str, default: u64) -> u64 {
    std::env::var(var).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// Waits until the child exits (None after `timeout`), polling every few milliseconds.
pub fn wait_exit(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Tries of a spawn that the kernel refuses because its binary is open for writing.
const SPAWN_BUSY_TRIES: u32 = 100;

/// Spawns `command`, again while the kernel answers ETXTBSY. The loops run as threads of one
/// process, each copying the binary for its members: a child that another loop forks while
/// a copy is open for writing inherits that descriptor until it execs, and for that moment
/// the copy cannot be executed (CI saw it once, 2026-11-26).
pub fn spawn_past_a_busy_binary(command: &mut Command) -> std::io::Result<std::process::Child> {
    for _ in 1..SPAWN_BUSY_TRIES {
        match command.spawn() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                std::thread::sleep(Duration::from_millis(10));
            }
            spawned => return spawned,
        }
    }
    command.spawn()
}

/// The `decree` that scripts/test.sh's workspace build linked with `features` (it builds
/// every test with decree-cli's `crash-points` and `etcd`, so that this test needs no build
/// of its own: a second build of decree-server, decree-bench and decree-cli took 1 min 45 s
/// of the CI's 30 minutes). `decree --version` names the features it was built with.
fn workspace_decree(profile_dir: &Path, features: &str) -> PathBuf {
    let bin = profile_dir.join("decree");
    let version = Command::new(&bin).arg("--version").output();
    let version = version.unwrap_or_else(|e| panic!("{} --version: {e}", bin.display()));
    let version = String::from_utf8_lossy(&version.stdout);
    let built_with = version.lines().find_map(|l| l.strip_prefix("features: ")).unwrap_or("");
    for feature in features.split(',') {
        assert!(
            built_with.split(' ').any(|f| f == feature),
            "{} was built without `{feature}` ({version:?}): scripts/test.sh builds the workspace's tests \
             with DECREE_TEST_WORKSPACE_FEATURES={features}",
            bin.display()
        );
    }
    bin
}

/// The `decree` binary of this workspace, built once per test process with the profile
/// and target directory of this test (cargo releases its lock while tests run), with the
/// `crash-points` feature (decree-server/src/crash_points.rs): the members can be told to
/// SIGKILL themselves at chosen points. That build differs from the shipped one only by
/// those points, and cargo keeps both builds apart in its cache (another `cargo build`
/// only links its own `decree` back in place); the loop runs a copy of it.
pub fn decree_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test's own path");
        // target/<profile>/deps/<test>: the binary goes to target/<profile>/decree.
        let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>/deps");
        let target_dir = profile_dir.parent().expect("target/");
        let profile = profile_dir.file_name().and_then(|p| p.to_str()).expect("a profile name");
        // The election on etcd too when the test script started etcd (its client's build
        // needs protoc, which the script installs with etcd).
        let etcd = std::env::var("DECREE_TEST_ETCD").is_ok_and(|e| !e.is_empty());
        let features = if etcd { "crash-points,etcd" } else { "crash-points" };
        if std::env::var_os("DECREE_TEST_WORKSPACE_FEATURES").is_some_and(|f| f == features) {
            return workspace_decree(profile_dir, features);
        }
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut build = Command::new(cargo);
        build
            .args(["build", "-q", "-p", "decree-cli", "--bin", "decree", "--features", features])
            .arg("--target-dir")
            .arg(target_dir);
        // What cargo sets for this test's run only: some build scripts rerun when one of
        // them changes (ring's tracks CARGO_MANIFEST_DIR), which would rebuild half the
        // workspace at every run and again at the next plain `cargo build`.
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy();
            let per_run = ["CARGO_PKG_", "CARGO_BIN_EXE_"].iter().any(|p| name.starts_with(p))
                || [
                    "CARGO_MANIFEST_DIR",
                    "CARGO_MANIFEST_PATH",
                    "CARGO_CRATE_NAME",
                    "CARGO_BIN_NAME",
                    "CARGO_PRIMARY_PACKAGE",
                    "CARGO_TARGET_TMPDIR",
                    "CARGO_RUSTC_CURRENT_DIR",
                    "OUT_DIR",
                ]
                .contains(&name.as_ref());
            if per_run {
                build.env_remove(name.as_ref());
            }
        }
        match profile {
            "debug" => {}
            "release" => {
                build.arg("--release");
            }
            other => {
                build.args(["--profile", other]);
            }
        }
        let status = build.current_dir(env!("CARGO_MANIFEST_DIR")).status().expect("run cargo build");
        assert!(status.success(), "cargo build -p decree-cli failed: {status}");
        let bin = profile_dir.join("decree");
        assert!(bin.exists(), "cargo built decree-cli but {} is missing", bin.display());
        bin
    })
}
