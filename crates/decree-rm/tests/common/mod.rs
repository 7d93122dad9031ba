//! Shared helpers of the integration tests: the DSNs of the throwaway databases that
//! scripts/test-dbs.sh starts, unique Xids and unique table names.
//!
//! The tests need real servers. Without the DECREE_TEST_* variables a test prints
//! "skipped: ..." and returns, so that `cargo test --workspace` stays usable on a machine
//! without databases; with CI=true it fails instead, so that CI cannot pass without them.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use decree_core::{Origin, Xid};

/// The DSN in `var`, or `None` (after printing why) when the test must be skipped.
pub fn dsn(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(value) if !value.is_empty() => Some(value),
        _ => {
            let hint = format!(
                "{var} is not set: run `scripts/test-dbs.sh start && eval \"$(scripts/test-dbs.sh env)\"` \
                 before the tests"
            );
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{hint}");
            }
            eprintln!("skipped: {hint}");
            None
        }
    }
}

/// Returns from the test (skipping it) when `$var` is not set; see [`dsn`].
#[macro_export]
macro_rules! require_dsn {
    ($var:expr) => {
        match common::dsn($var) {
            Some(value) => value,
            None => return,
        }
    };
}

static SEQUENCE: AtomicU64 = AtomicU64::new(1);

/// A token unique to this process run, for table names and Xids.
pub fn run_token() -> u64 {
    static TOKEN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TOKEN.get_or_init(|| {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
        (nanos ^ ((std::process::id() as u64) << 32)) & 0x0fff_ffff_ffff
    })
}

/// A decree branch Xid never used before (the run token is its incarnation).
pub fn fresh_xid() -> Xid {
    let origin = Origin {
        node: 77,
        incarnation: run_token(),
        session: std::process::id() as u64,
        sequence: SEQUENCE.fetch_add(1, Ordering::Relaxed),
    };
    Xid::decree(origin).branch(1)
}

/// A table name unique to this run and test.
pub fn table(test: &str) -> String {
    format!("rm_{test}_{:x}", run_token())
}
