//! What the crash tests share: the test databases' DSNs and the CI rule for missing ones,
//! the seeded random source, and how `decree-bank` is started.
//!
//! Without DECREE_TEST_* the tests print "skipped" and pass, so that `cargo test` works on
//! a laptop without databases; with CI=true a missing database is a failure, so that CI
//! can never pass by skipping the crash proof.

#![allow(dead_code)]

use decree_crashtest::{BankConfig, PairKind};
use rand::{Rng, SeedableRng};
use std::process::{Child, Command, ExitStatus};
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
