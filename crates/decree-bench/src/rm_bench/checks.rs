//! The checks of the benchmark: a spec is rejected before any database is touched
//! (`check`), and after every run the balances must add up (`check_totals`) and no branch
//! of the benchmark's coordinator node may be left prepared (`check_nothing_prepared`).
//! Any failure is an error, never a silent pass. Not for the checks a run makes while it
//! goes (one row per update, the two-phase path, the decisions in the log): those stay in
//! the loops that see them (`threads.rs`, `two_phase.rs`).

use super::database::{db_error, Database};
use super::{RmBenchSpec, RmMode, ACCOUNTS_MAX, ROUNDS_MAX, TABLE_BYTES_MAX};
use crate::tx::{Stop, THREADS_MAX};
use crate::BenchError;

/// Prepared branches listed in full in the leftover error; the rest are counted.
const LEFTOVER_LISTED_MAX: usize = 10;

/// Rejects a spec that cannot run, before touching any database.
pub fn check(spec: &RmBenchSpec) -> Result<(), BenchError> {
    let table_ok = !spec.table.is_empty()
        && spec.table.len() <= TABLE_BYTES_MAX
        && spec.table.starts_with(|c: char| c.is_ascii_lowercase())
        && spec.table.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !table_ok {
        return Err(BenchError::Option(format!(
            "table {:?}: expected 1 to {TABLE_BYTES_MAX} of a-z, 0-9, _ starting with a letter",
            spec.table
        )));
    }
    if spec.accounts == 0 || spec.accounts > ACCOUNTS_MAX {
        return Err(BenchError::Option(format!("accounts {}: expected 1 to {ACCOUNTS_MAX}", spec.accounts)));
    }
    if spec.threads.is_empty() {
        return Err(BenchError::Option("--threads: expected at least one thread count".into()));
    }
    if let Some(t) = spec.threads.iter().find(|&&t| t == 0 || t > THREADS_MAX) {
        return Err(BenchError::Option(format!("--threads {t}: expected 1 to {THREADS_MAX}")));
    }
    if spec.rounds == 0 || spec.rounds > ROUNDS_MAX {
        return Err(BenchError::Option(format!("--rounds {}: expected 1 to {ROUNDS_MAX}", spec.rounds)));
    }
    if spec.dsn_a.trim().is_empty() || spec.dsn_b.trim().is_empty() {
        return Err(BenchError::Option("--dsn: both DSNs must be non-empty".into()));
    }
    match spec.stop {
        Stop::Cycles(0) => Err(BenchError::Option("--cycles 0: expected at least 1".into())),
        Stop::Duration(d) if d.is_zero() => Err(BenchError::Option("--duration must be positive".into())),
        _ => Ok(()),
    }
}

/// The total over both databases must not move, and B must have gained one per transfer.
pub(super) fn check_totals(
    mode: RmMode,
    threads: usize,
    before: (i64, i64),
    after: (i64, i64),
    transfers: u64,
) -> Result<(), BenchError> {
    let gained = after.1 - before.1;
    if before.0 + before.1 != after.0 + after.1 || gained != transfers as i64 {
        return Err(db_error(
            format!("checking balances after the {} run at {threads} threads", mode.name()),
            format!(
                "totals (A, B) went from {before:?} to {after:?} over {transfers} transfers: atomicity \
                 violated, or another process uses the same table"
            ),
        ));
    }
    Ok(())
}

/// No branch of this benchmark's coordinator node may stay prepared in either database
/// (listed once even when both sides see the same server's list).
pub(super) fn check_nothing_prepared(
    dbs: [&dyn Database; 2],
    node: u32,
    mode: RmMode,
    threads: usize,
) -> Result<(), BenchError> {
    let mut left = dbs[0].prepared_of_node(node)?;
    left.extend(dbs[1].prepared_of_node(node)?);
    left.sort_unstable();
    left.dedup();
    if left.is_empty() {
        return Ok(());
    }
    let listed: Vec<&str> = left.iter().take(LEFTOVER_LISTED_MAX).map(String::as_str).collect();
    Err(db_error(
        format!("checking for prepared branches after the {} run at {threads} threads", mode.name()),
        format!("{} branch(es) of node {node:#x} left prepared: {}", left.len(), listed.join(", ")),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rm_bench::{node_id, DbKind, ACCOUNTS_DEFAULT, TABLE_DEFAULT};
    use decree_core::BranchCalls;
    use decree_log::EngineKind;
    use std::path::PathBuf;
    use std::time::Duration;

    fn spec() -> RmBenchSpec {
        RmBenchSpec {
            kind: DbKind::Postgres,
            dsn_a: "host=x".into(),
            dsn_b: "host=y".into(),
            table: TABLE_DEFAULT.into(),
            accounts: ACCOUNTS_DEFAULT,
            threads: vec![1, 4, 16],
            stop: Stop::Duration(Duration::from_secs(3)),
            engine: EngineKind::Journal,
            rpo_ms: 0,
            dir: PathBuf::from("."),
            seed: 1,
            node: node_id(),
            branch_calls: BranchCalls::Auto,
            rounds: 1,
            connect: None,
        }
    }

    #[test]
    fn bad_specs_are_option_errors() {
        assert!(check(&spec()).is_ok());
        let bad = [
            RmBenchSpec { table: "x; DROP TABLE y".into(), ..spec() },
            RmBenchSpec { table: "1abc".into(), ..spec() },
            RmBenchSpec { accounts: 0, ..spec() },
            RmBenchSpec { threads: vec![], ..spec() },
            RmBenchSpec { threads: vec![0], ..spec() },
            RmBenchSpec { stop: Stop::Cycles(0), ..spec() },
            RmBenchSpec { dsn_b: " ".into(), ..spec() },
            RmBenchSpec { rounds: 0, ..spec() },
            RmBenchSpec { rounds: ROUNDS_MAX + 1, ..spec() },
            RmBenchSpec { kind: DbKind::MariaDb, table: "a-b".into(), ..spec() },
        ];
        for s in bad {
            assert!(matches!(check(&s), Err(BenchError::Option(_))), "{s:?} accepted");
        }
    }

    #[test]
    fn totals_must_balance() {
        assert!(check_totals(RmMode::TwoPhase, 1, (100, 50), (90, 60), 10).is_ok());
        assert!(check_totals(RmMode::TwoPhase, 1, (100, 50), (90, 59), 10).is_err(), "lost a credit");
        assert!(check_totals(RmMode::Independent, 1, (100, 50), (91, 59), 10).is_err(), "miscounted");
    }
}
