//! The runtime of the recovery engine: executes the calls that `engine.rs` decides, with
//! one connection cache, one backoff policy and one place ([`Recorder`]) where completions,
//! presumed-abort rollbacks and heuristics are recorded. The embedded coordinator's
//! background thread, the state server's worker and `decree recover` use it; each brings
//! its own [`Liveness`] rule, its own decision lookup and its own recorder.

use super::engine::{self, Command, DecisionFact, FoundStep, Liveness, PhaseTwo};
use crate::error::HeuristicReport;
use crate::rm::{HeuristicOutcome, ResourceManager, RmError, RmFactory};
use crate::store::BranchRecord;
use crate::xid::Xid;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// Where the runtime records what it finished, so that each process keeps its own books
/// (the embedded log, the state server's outcome memory, the operator's log).
pub trait Recorder {
    /// Every branch of `xid` is finished: complete it (with what its branches decided on
    /// their own, if any did).
    fn complete(&self, xid: &Xid, heuristic: Option<HeuristicOutcome>);
    /// A prepared branch of `xid` without decision was rolled back by presumed abort
    /// (`heuristic`: the RM had decided on its own instead).
    fn rolled_back(&self, _xid: &Xid, _heuristic: Option<HeuristicOutcome>) {}
    /// A resource manager decided a branch on its own (logged by the runtime already);
    /// true once the report is kept for good (durable, and in a pair held by the backup),
    /// which is when the resource manager may be told to forget the branch. A recorder
    /// that keeps nothing says true: it has nothing to lose.
    fn heuristic(&self, _report: &HeuristicReport) -> bool {
        true
    }
    /// Branch `xid` on `rm` was committed (`commit`) or rolled back by this call (not
    /// found finished already): for metrics.
    fn branch_finished(&self, _xid: &Xid, _rm: &str, _commit: bool) {}
    /// Branch `xid` on `rm` is about to be committed, rolled back or forgotten: called
    /// before every such call, failed ones included, so that a process can count what it
    /// touched (a deposed primary must touch no branch of a newer epoch).
    fn calling(&self, _xid: &Xid, _rm: &str) {}
    /// The `tracing` span that a presumed-abort rollback of a branch of `xid` (global) logs
    /// inside, when the process knows the trace of that transaction (the state server may
    /// hold its client's context from an earlier request): its lines then carry that trace.
    fn log_scope(&self, _xid: &Xid) -> Option<tracing::Span> {
        None
    }
}

/// The retry delays after a failure: doubling from `min` up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// First delay after a failure.
    pub min: Duration,
    /// Longest delay.
    pub max: Duration,
}

impl Backoff {
    /// The state server's policy: an RM that comes back is used within 5 s.
    pub const SERVER: Backoff = Backoff { min: Duration::from_millis(50), max: Duration::from_secs(5) };

    /// The delay after `previous` (`None`: the first failure).
    pub fn next(&self, previous: Option<Duration>) -> Duration {
        assert!(self.min <= self.max, "backoff min {:?} above max {:?}", self.min, self.max);
        match previous {
            None => self.min,
            Some(d) => (d * 2).clamp(self.min, self.max),
        }
    }
}

/// Connections to the resource managers for one pass, made on first use. An RM that failed
/// once in a pass is not tried again in that pass, so that a thousand pending transactions
/// on a down RM cost one connection attempt per backoff period, not a thousand.
pub struct Connections {
    factories: Vec<Arc<dyn RmFactory>>,
    open: HashMap<String, Box<dyn ResourceManager>>,
    down: HashSet<String>,
}

impl Connections {
    /// A cache over `factories`, matched by name.
    pub fn new(factories: &[Arc<dyn RmFactory>]) -> Connections {
        Connections { factories: factories.to_vec(), open: HashMap::new(), down: HashSet::new() }
    }

    /// Whether an RM named `rm` is configured.
    pub fn knows(&self, rm: &str) -> bool {
        self.factories.iter().any(|f| f.name() == rm)
    }

    /// The names of the configured RMs.
    pub fn names(&self) -> Vec<String> {
        self.factories.iter().map(|f| f.name().to_string()).collect()
    }

    /// The connection to `rm`, made now if needed.
    pub fn get(&mut self, rm: &str) -> Result<&mut Box<dyn ResourceManager>, RmError> {
        if self.down.contains(rm) {
            return Err(RmError::Unavailable(format!("{rm:?} failed earlier in this pass")));
        }
        if !self.open.contains_key(rm) {
            let factory = self.factories.iter().find(|f| f.name() == rm).ok_or_else(|| {
                RmError::Unavailable(format!("no resource manager named {rm:?} is configured"))
            })?;
            match factory.connect() {
                Ok(conn) => {
                    self.open.insert(rm.to_string(), conn);
                }
                Err(e) => {
                    self.down.insert(rm.to_string());
                    return Err(e);
                }
            }
        }
        self.open.get_mut(rm).ok_or_else(|| RmError::Unavailable(format!("connection to {rm:?} lost")))
    }

    /// Drops the connection to `rm` after a failure; `rm` is skipped for the rest of the pass.
    pub fn drop_connection(&mut self, rm: &str) {
        self.down.insert(rm.to_string());
        if let Some(mut conn) = self.open.remove(rm) {
            let _ = conn.close();
        }
    }

    /// Gives every RM a fresh try (a failed commit does not mean that listing fails).
    pub fn forgive(&mut self) {
        self.down.clear();
    }

    /// Closes every connection (end of a pass).
    pub fn close_all(&mut self) {
        for (_, mut conn) in self.open.drain() {
            let _ = conn.close();
        }
        self.down.clear();
    }
}

impl Drop for Connections {
    fn drop(&mut self) {
        self.close_all();
    }
}

/// Runs one pass of `phase_two`; true when the transaction is finished (and recorded).
pub fn run_phase_two(phase_two: &mut PhaseTwo, conns: &mut Connections, recorder: &dyn Recorder) -> bool {
    let xid = *phase_two.xid();
    for call in phase_two.calls() {
        let Command::Call { branch, commit } = call else { unreachable!("a pass starts with calls only") };
        let bx = xid.branch(branch.branch);
        recorder.calling(&bx, &branch.rm);
        let result = match conns.get(&branch.rm) {
            Ok(conn) if commit => conn.commit(&bx, false),
            Ok(conn) => conn.rollback(&bx),
            Err(e) => Err(e),
        };
        if result.is_ok() {
            recorder.branch_finished(&bx, &branch.rm, commit);
        }
        for command in phase_two.on_answer(&branch, &result) {
            match command {
                Command::DropConnection(rm) => {
                    tracing::warn!(xid = %bx, %rm, error = ?result, "phase two failed; will retry");
                    conns.drop_connection(&rm);
                }
                Command::Heuristic(report) => {
                    tracing::error!(%report, error = ?result, "heuristic outcome");
                    let kept = recorder.heuristic(&report);
                    for forgotten in phase_two.on_heuristic_kept(&branch, kept) {
                        let Command::Forget(b) = forgotten else {
                            unreachable!("a report kept leads to Forget")
                        };
                        forget(conns, &b.rm, &xid.branch(b.branch), recorder);
                    }
                }
                other => unreachable!("an answer does not lead to {other:?}"),
            }
        }
    }
    match phase_two.end_pass() {
        Some(Command::RetryLater) => false,
        Some(Command::Complete { xid, heuristic }) => {
            recorder.complete(&xid, heuristic);
            true
        }
        None => true,
        Some(other) => unreachable!("a pass does not end with {other:?}"),
    }
}

fn forget(conns: &mut Connections, rm: &str, xid: &Xid, recorder: &dyn Recorder) {
    recorder.calling(xid, rm);
    if let Ok(conn) = conns.get(rm) {
        let _ = conn.forget(xid);
    }
}

/// What one scan of a resource manager did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanCounts {
    /// Branches rolled back by presumed abort (or found heuristically finished).
    pub rolled_back: usize,
    /// Branches left alone: another coordinator's, a live owner's, in doubt, or decided.
    pub left_alone: usize,
    /// Rollbacks that failed (the next pass tries again).
    pub failed: usize,
}

/// How a scan learns about the transactions it finds.
pub struct ScanRules<'a> {
    /// The node whose branches may be touched.
    pub node: u32,
    /// When the owner of an undecided transaction is gone.
    pub liveness: &'a dyn Liveness,
    /// The decision of a transaction (asked after liveness, see `engine::found_branch`).
    pub decision: &'a dyn Fn(&Xid) -> DecisionFact,
}

/// Lists `rm`'s prepared branches and rolls back ours that have no decision and no live
/// owner (presumed abort). An error means the list itself failed.
pub fn scan(
    rm: &str,
    conns: &mut Connections,
    rules: &ScanRules<'_>,
    recorder: &dyn Recorder,
) -> Result<ScanCounts, RmError> {
    let prepared = conns.get(rm)?.recover()?;
    let mut counts = ScanCounts::default();
    for bx in prepared {
        let step = match engine::origin_of(&bx, rules.node) {
            None => FoundStep::LeaveAlone,
            Some(origin) => {
                let gone = rules.liveness.owner_gone(&origin);
                engine::found_branch(true, gone, (rules.decision)(&bx.global()))
            }
        };
        match step {
            FoundStep::Decided | FoundStep::LeaveAlone => counts.left_alone += 1,
            FoundStep::RollBack => {
                // Its lines name the transaction's trace when the recorder knows it.
                let scope = recorder.log_scope(&bx.global());
                let _entered = scope.as_ref().map(tracing::Span::enter);
                // The same machine as any phase two: one branch, rolled back.
                let branch = BranchRecord { rm: rm.to_string(), branch: bx.branch_number().unwrap_or(0) };
                let mut rollback = PhaseTwo::new(bx.global(), false, vec![branch.clone()]);
                rollback.calls();
                recorder.calling(&bx, rm);
                let result = conns.get(rm).and_then(|conn| conn.rollback(&bx));
                let mut heuristic = None;
                for command in rollback.on_answer(&branch, &result) {
                    match command {
                        Command::DropConnection(_) => {
                            tracing::warn!(xid = %bx, %rm, error = ?result, "rollback failed; will retry");
                            conns.drop_connection(rm);
                        }
                        Command::Heuristic(report) => {
                            tracing::error!(%report, "heuristic outcome on a presumed-abort rollback");
                            let kept = recorder.heuristic(&report);
                            heuristic = Some(report.outcome);
                            if !rollback.on_heuristic_kept(&branch, kept).is_empty() {
                                forget(conns, rm, &bx, recorder);
                            }
                        }
                        other => unreachable!("an answer does not lead to {other:?}"),
                    }
                }
                match rollback.end_pass() {
                    Some(Command::RetryLater) => {
                        counts.failed += 1;
                        return Ok(counts);
                    }
                    None | Some(Command::Complete { .. }) => {
                        counts.rolled_back += 1;
                        if heuristic.is_none() {
                            tracing::info!(xid = %bx, %rm, "rolled back a prepared branch without decision");
                        }
                        recorder.rolled_back(&bx.global(), heuristic);
                    }
                    Some(other) => unreachable!("a pass does not end with {other:?}"),
                }
            }
        }
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::dummy::DummyFactory;
    use crate::xid::Origin;

    /// A recorder that knows one transaction's trace, as the state server may.
    struct Traced(Xid);

    impl Recorder for Traced {
        fn complete(&self, _xid: &Xid, _heuristic: Option<HeuristicOutcome>) {}
        fn log_scope(&self, xid: &Xid) -> Option<tracing::Span> {
            (*xid == self.0).then(|| tracing::error_span!("otel", trace_id = "abab"))
        }
    }

    #[test]
    fn a_presumed_abort_logs_inside_the_scope_of_its_known_trace() {
        let rm = DummyFactory::named("a", 16);
        let [known, unknown] =
            [1, 2].map(|sequence| Xid::decree(Origin { node: 1, incarnation: 1, session: 1, sequence }));
        for xid in [known, unknown] {
            rm.connection().prepare(&xid.branch(0)).expect("prepared");
        }
        let gone = |_: &Origin| true;
        let absent = |_: &Xid| DecisionFact::Absent;
        let rules = ScanRules { node: 1, liveness: &gone, decision: &absent };
        let mut conns = Connections::new(&[rm.arc()]);
        let (_, lines) = crate::testing::log_lines::lines_of(|| {
            let counts = scan("a", &mut conns, &rules, &Traced(known)).expect("listed");
            assert_eq!(counts.rolled_back, 2);
        });
        let rolled: Vec<&str> =
            lines.lines().filter(|l| l.contains("rolled back a prepared branch")).collect();
        assert_eq!(rolled.len(), 2, "{lines}");
        let of =
            |xid: Xid| rolled.iter().find(|l| l.contains(&xid.branch(0).to_string())).copied().unwrap_or("");
        assert!(of(known).contains("otel{trace_id=\"abab\"}"), "{lines}");
        assert!(!of(unknown).contains("otel{"), "no trace known, none named: {lines}");
    }

    #[test]
    fn backoff_doubles_within_its_bounds() {
        let b = Backoff { min: Duration::from_millis(10), max: Duration::from_millis(50) };
        assert_eq!(b.next(None), Duration::from_millis(10));
        assert_eq!(b.next(Some(Duration::from_millis(10))), Duration::from_millis(20));
        assert_eq!(b.next(Some(Duration::from_millis(40))), Duration::from_millis(50));
        assert_eq!(b.next(Some(Duration::ZERO)), Duration::from_millis(10));
    }
}
