//! `decree recover`: inspect in-doubt transactions and resolve them by hand.
//!
//! An [`Inspector`] opens the log directory of a stopped coordinator (a `decree serve` or
//! an embedded application) *without* running automatic recovery: it only reads the
//! decisions that are not complete ([`decree_log::Log::take_recovered`]) and asks every
//! configured resource manager for its prepared branches. [`Inspector::list`] joins both:
//! decided transactions whose phase two is unfinished, and this node's prepared branches
//! that have no decision (presumed abort). [`Inspector::commit`] and
//! [`Inspector::rollback`] resolve one transaction.
//!
//! Invariants:
//! - The log lock is held for the inspector's whole life, so no coordinator decides or
//!   recovers at the same time; a locked directory is refused with [`AdminError::LogInUse`].
//! - Only branches whose Xid carries decree's format id and this configuration's node id
//!   are listed or touched; other transaction managers' branches are never touched.
//! - A choice that contradicts the log (commit without a decision, rollback of a decided
//!   transaction) is refused unless forced; a forced choice is first appended, fsync'd, to
//!   [`HEURISTICS_FILE`] in the log directory, and the log is then made to agree with it
//!   *before* any branch is touched (a forced commit appends a decision record; a forced
//!   rollback completes the decision), so that a crash halfway is finished by automatic
//!   recovery in the direction the operator chose.
//! - Heuristic records are not written into the decision log itself: every coordinator
//!   decodes each recovered record as a [`Decision`] and an embedded one refuses to start
//!   on a payload it cannot decode. `heuristics.log` is a text audit trail, one line per
//!   forced choice, that no engine reads (engines ignore files they did not name).
//!
//! Ages: the resource-manager interface does not say when a branch was prepared. For
//! `[[rm]]` entries of kind postgres the inspector asks `pg_prepared_xacts.prepared` over
//! a separate connection to the DSN; for other kinds the age is shown as unknown, with the
//! origin (incarnation, session) of the Xid instead.

use crate::config::ServerConfig;
use crate::rules::Remembered;
use decree_core::protocol::{self, PhaseTwoStep};
use decree_core::recovery::Connections;
use decree_core::{
    BranchRecord, Decision, HeuristicOutcome, KeyAllocator, Origin, RecoveredDecisions, RmError, RmFactory,
    TraceContext, Xid,
};
use decree_log::outcomes::OutcomeMemory;
use decree_log::{Log, LogError};
use decree_pair::election::{hand_resolution, HandResolution, PairView};
use decree_pair::{Epoch, PairState};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// The audit file of forced (heuristic) choices, in the log directory.
pub const HEURISTICS_FILE: &str = "heuristics.log";

/// Most prepared branches read from one resource manager in one scan; more is refused
/// (PostgreSQL's own limit is `max_prepared_transactions`, typically at most a few hundred).
pub const PREPARED_PER_RM_MAX: usize = 1 << 20;

/// What the state column says of a decided transaction.
pub const STATE_DECIDED: &str = "decided: commit";

/// What the state column says of prepared branches without a decision.
pub const STATE_UNDECIDED: &str = "no decision (presumed abort once its owner is gone)";

/// Why an inspection or a resolution failed; each names the Xid, RM or file concerned.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AdminError {
    /// A coordinator holds the log directory's lock.
    #[error(
        "the log at {dir} is in use by a running decree process (decree serve or an application); \
         stop it first"
    )]
    LogInUse {
        /// The log directory.
        dir: PathBuf,
    },
    /// The log could not be opened, appended to or synced.
    #[error("decision log at {dir}: {source}")]
    Log {
        /// The log directory.
        dir: PathBuf,
        /// What the log said.
        source: LogError,
    },
    /// The configuration cannot be used (engine, `[[rm]]` entries).
    #[error("configuration: {0}")]
    Config(String),
    /// The Xid is not one this node may resolve.
    #[error("{xid}: {reason}")]
    BadXid {
        /// The Xid given (gid form).
        xid: String,
        /// Why it is refused.
        reason: String,
    },
    /// The choice contradicts the log and `force` was not given.
    #[error("{0}")]
    Refused(String),
    /// Neither the log nor any reachable resource manager knows the Xid.
    #[error(
        "{xid} is not in doubt: no decision is logged in {dir} and no reachable resource manager holds a \
         prepared branch of it{unreachable}"
    )]
    NotFound {
        /// The global Xid (gid form).
        xid: String,
        /// The log directory.
        dir: PathBuf,
        /// ", but X and Y could not be asked" when some RMs were unreachable.
        unreachable: String,
    },
    /// Writing the heuristics audit file failed (nothing was touched).
    #[error("heuristics file {path}: {message}")]
    Heuristics {
        /// The file.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// Some branches could not be resolved; the report says which and what remains.
    #[error("{xid} is only partly resolved: {}", failures.join("; "))]
    Incomplete {
        /// The global Xid (gid form).
        xid: String,
        /// One message per branch or RM that failed, naming it.
        failures: Vec<String>,
    },
}

/// Where one branch of an in-doubt transaction stands in its resource manager.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BranchState {
    /// The RM holds the branch prepared: it waits for commit or rollback.
    Prepared,
    /// The RM no longer holds it (a decided branch absent from the RM is committed).
    Done,
    /// The RM could not be asked.
    Unreachable(String),
    /// The decision names an RM that this configuration does not know.
    NotConfigured,
}

impl BranchState {
    /// The short word of the table and of the JSON `state` field.
    pub fn word(&self) -> &'static str {
        match self {
            BranchState::Prepared => "prepared",
            BranchState::Done => "done",
            BranchState::Unreachable(_) => "unreachable",
            BranchState::NotConfigured => "not configured",
        }
    }
}

impl std::fmt::Display for BranchState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BranchState::Unreachable(e) => write!(f, "unreachable: {e}"),
            other => f.write_str(other.word()),
        }
    }
}

/// One branch of an in-doubt transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BranchStatus {
    /// The resource manager's configured name.
    pub rm: String,
    /// The branch's own Xid (with its bqual), as the RM knows it.
    pub xid: Xid,
    /// Where it stands.
    pub state: BranchState,
}

/// One in-doubt transaction: decided but unfinished, or prepared without a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InDoubt {
    /// The global Xid (empty bqual).
    pub xid: Xid,
    /// Whether a commit decision is logged.
    pub decided: bool,
    /// Node, incarnation, session and sequence of a decree Xid.
    pub origin: Option<Origin>,
    /// Seconds since the oldest branch was prepared, when an RM says (PostgreSQL).
    pub age_s: Option<u64>,
    /// The client's trace context its decision record kept (a `Decide` with a sampled
    /// one, tracing on): where an operator finds the transaction's trace.
    pub trace: Option<TraceContext>,
    /// Its branches with their state per RM.
    pub branches: Vec<BranchStatus>,
}

impl InDoubt {
    /// The state column: [`STATE_DECIDED`] or [`STATE_UNDECIDED`].
    pub fn state(&self) -> &'static str {
        if self.decided {
            STATE_DECIDED
        } else {
            STATE_UNDECIDED
        }
    }

    /// The pair's epoch this transaction belongs to, read from its Xid: in a pair the
    /// incarnation in a primary's Xids is its epoch. Meaningful on a pair member's log only.
    pub fn epoch(&self) -> Option<Epoch> {
        self.origin.map(|o| Epoch::from_raw(o.incarnation))
    }

    /// The age column: a duration, or "age unknown" with the origin to judge by.
    pub fn age_text(&self) -> String {
        match (self.age_s, self.origin) {
            (Some(s), _) => format_duration(s),
            (None, Some(o)) => format!("age unknown (incarnation {}, session {})", o.incarnation, o.session),
            (None, None) => "age unknown".to_string(),
        }
    }
}

/// Whether a configured RM answered the last scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RmStatus {
    /// The RM's configured name.
    pub name: String,
    /// `None` when reachable, else the error.
    pub unreachable: Option<String>,
}

/// What [`Inspector::list`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    /// The log directory inspected.
    pub log_dir: PathBuf,
    /// The node id whose branches were looked for.
    pub node: u32,
    /// In-doubt transactions, decided ones first, then by origin.
    pub in_doubt: Vec<InDoubt>,
    /// Every configured RM and whether it answered.
    pub rms: Vec<RmStatus>,
    /// Records of the log that are not decisions, and similar oddities.
    pub warnings: Vec<String>,
    /// The pair state of this log directory, when it belongs to a member of a pair.
    pub pair: Option<PairState>,
}

impl Listing {
    /// The human table: one line per transaction with its Xid (gid form), state, age,
    /// origin and branches with their state per RM; RM reachability above, warnings below.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "log {} (node {})", self.log_dir.display(), self.node);
        if let Some(pair) = &self.pair {
            let _ = writeln!(out, "{}", pair_line(pair));
        }
        for rm in &self.rms {
            match &rm.unreachable {
                None => {
                    let _ = writeln!(out, "rm {}: reachable", rm.name);
                }
                Some(e) => {
                    let _ = writeln!(out, "rm {}: unreachable: {e}", rm.name);
                }
            }
        }
        if self.in_doubt.is_empty() {
            out.push_str("no in-doubt transactions\n");
        } else {
            self.write_rows(&mut out);
        }
        for w in &self.warnings {
            let _ = writeln!(out, "warning: {w}");
        }
        out
    }

    /// The table's rows, aligned under their header; on a pair member's log an EPOCH column
    /// shows the pair's epoch each transaction was decided or prepared in.
    fn write_rows(&self, out: &mut String) {
        let pair = self.pair.is_some();
        let mut header = vec!["XID", "STATE"];
        if pair {
            header.push("EPOCH");
        }
        header.extend(["AGE", "ORIGIN (incarnation/session/sequence)", "BRANCHES"]);
        let rows: Vec<Vec<String>> = self
            .in_doubt
            .iter()
            .map(|t| {
                let origin = t.origin.map_or_else(
                    || "-".to_string(),
                    |o| format!("{}/{}/{}", o.incarnation, o.session, o.sequence),
                );
                let age = t.age_s.map_or_else(|| "unknown".to_string(), format_duration);
                let branches: Vec<String> = t
                    .branches
                    .iter()
                    .map(|b| {
                        let n = b.xid.branch_number().map_or_else(|| "?".to_string(), |n| n.to_string());
                        format!("{}#{n}: {}", b.rm, b.state)
                    })
                    .collect();
                let mut row = vec![t.xid.to_gid(), t.state().to_string()];
                if pair {
                    row.push(t.epoch().map_or_else(|| "-".to_string(), |e| e.to_string()));
                }
                row.extend([age, origin, branches.join(", ")]);
                row
            })
            .collect();
        let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.len());
            }
        }
        let mut line = |cells: &[&str]| {
            let mut text = String::new();
            for (i, cell) in cells.iter().enumerate() {
                if i + 1 == cells.len() {
                    text.push_str(cell);
                } else {
                    let _ = write!(text, "{cell:<width$}  ", width = widths[i]);
                }
            }
            let _ = writeln!(out, "{}", text.trim_end());
        };
        line(&header);
        for row in &rows {
            line(&row.iter().map(String::as_str).collect::<Vec<_>>());
        }
    }

    /// The same listing as a JSON document (`--format json`).
    pub fn to_json(&self) -> String {
        let in_doubt: Vec<serde_json::Value> = self
            .in_doubt
            .iter()
            .map(|t| {
                serde_json::json!({
                    "xid": t.xid.to_gid(),
                    "decided": t.decided,
                    "state": t.state(),
                    "age_seconds": t.age_s,
                    // The client's span its decision record names (lowercase hex), if any.
                    "trace_id": t.trace.map(|c| c.trace_id_hex()),
                    "span_id": t.trace.map(|c| c.span_id_hex()),
                    // On a pair member's log, the pair's epoch (the Xid's incarnation).
                    "epoch": self.pair.and(t.epoch()).map(|e| e.to_string()),
                    "origin": t.origin.map(|o| serde_json::json!({
                        "node": o.node,
                        "incarnation": o.incarnation,
                        "session": o.session,
                        "sequence": o.sequence,
                    })),
                    "branches": t.branches.iter().map(|b| serde_json::json!({
                        "rm": b.rm,
                        "xid": b.xid.to_gid(),
                        "branch": b.xid.branch_number(),
                        "state": b.state.word(),
                        "error": match &b.state {
                            BranchState::Unreachable(e) => Some(e.as_str()),
                            _ => None,
                        },
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let rms: Vec<serde_json::Value> = self
            .rms
            .iter()
            .map(|r| {
                serde_json::json!({
                    "name": r.name,
                    "reachable": r.unreachable.is_none(),
                    "error": r.unreachable,
                })
            })
            .collect();
        let doc = serde_json::json!({
            "log_dir": self.log_dir.display().to_string(),
            "node": self.node,
            "rms": rms,
            "in_doubt": in_doubt,
            "warnings": self.warnings,
            "pair": self.pair.map(|p| serde_json::json!({
                "member": p.member.get(),
                "epoch_seen": p.seen.raw(),
                "forced_promotion_epoch": p.forced.map(|e| e.raw()),
            })),
        });
        serde_json::to_string_pretty(&doc).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }
}

/// What happened to one branch during a resolution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BranchOutcome {
    /// This call committed it.
    Committed,
    /// This call rolled it back.
    RolledBack,
    /// The RM no longer knew it (finished earlier).
    AlreadyDone,
    /// The RM had decided on its own or did the opposite; the text says what.
    Heuristic(String),
}

/// The report of a successful [`Inspector::commit`] or [`Inspector::rollback`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    /// The global Xid.
    pub xid: Xid,
    /// "commit" or "rollback".
    pub action: &'static str,
    /// Each branch handled, with its RM name.
    pub branches: Vec<(String, Xid, BranchOutcome)>,
    /// The heuristics file written to, when the choice was forced against the log.
    pub heuristic: Option<PathBuf>,
    /// Whether a decision was completed in the log.
    pub log_completed: bool,
}

impl std::fmt::Display for Resolution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{}: {}", self.xid, self.action)?;
        for (rm, xid, outcome) in &self.branches {
            writeln!(f, "  {rm} {xid}: {outcome:?}")?;
        }
        if let Some(path) = &self.heuristic {
            writeln!(f, "  recorded as a heuristic decision in {}", path.display())?;
        }
        if self.log_completed {
            writeln!(f, "  decision completed in the log")?;
        }
        Ok(())
    }
}

/// One configured resource manager and its connection, made on first use.
struct RmSlot {
    name: String,
    /// Whether a connection factory exists for it (else its kind is unsupported).
    connectable: bool,
    /// The DSN when the `[[rm]]` kind is postgres (for the age query).
    pg_dsn: Option<String>,
}

/// This node's prepared branches in each RM, or why the RM could not be asked.
type Scan = Vec<(String, Result<Vec<Xid>, String>)>;

/// An open log directory plus connections to its resource managers, for `decree recover`.
pub struct Inspector {
    log: Box<dyn Log>,
    log_dir: PathBuf,
    node: u32,
    decisions: HashMap<Xid, Decision>,
    /// The client's trace context each traced decision record kept.
    traces: HashMap<Xid, TraceContext>,
    /// The log keys of each decision's records (completing it completes them all).
    keys: HashMap<Xid, Vec<u64>>,
    key_allocator: KeyAllocator,
    /// The server's memory of finished outcomes: an operator's resolution is remembered
    /// there, so that a client asking later gets the true answer.
    outcomes: OutcomeMemory,
    warnings: Vec<String>,
    rms: Vec<RmSlot>,
    /// The recovery runtime's connection cache (one connection per RM, kept between
    /// commands; an RM that failed is tried again by the next command).
    connections: Connections,
    /// The pair state when the log belongs to a pair member.
    pair: Option<PairState>,
    /// `--pair-override`: act on a pair member's log anyway (recorded).
    pair_override: bool,
    /// What etcd said of this member's pair, with `[pair.etcd]` (or why it could not tell).
    etcd: Option<Result<HandResolution, String>>,
}

impl Inspector {
    /// Opens `config`'s log without recovery and connects every RM (an unreachable one is
    /// reported by [`Inspector::list`], not here); `factories` are matched by name.
    pub fn open(config: &ServerConfig, factories: Vec<Arc<dyn RmFactory>>) -> Result<Inspector, AdminError> {
        let log_config = config.log_config().map_err(|e| AdminError::Config(e.0))?;
        let dir = config.log_dir.clone();
        let log = decree_log::open(&log_config).map_err(|e| match e {
            LogError::Locked { .. } => AdminError::LogInUse { dir: dir.clone() },
            other => AdminError::Log { dir: dir.clone(), source: other },
        })?;
        let recovered = RecoveredDecisions::from_records(log.take_recovered());
        let key_allocator = KeyAllocator::new(recovered.all_keys());
        // What the log's open cut or deleted (a torn tail) comes first.
        let mut warnings: Vec<String> = log.open_warnings();
        warnings.extend(recovered.undecodable.iter().map(|(key, e)| {
            format!("record under log key {key:#x} in {} is not a decision ({e}); ignored", dir.display())
        }));
        let (decisions, keys, traces) = (recovered.decisions, recovered.keys, recovered.traces);
        // Flushed at once: an operator's resolution is synced before the log is changed.
        let capacity = config.limits.outcomes_remembered_max;
        let outcomes = crate::open_outcomes(&log_config, None, capacity, std::time::Duration::ZERO)
            .map_err(|source| AdminError::Log { dir: dir.clone(), source })?;
        warnings.extend(outcomes.open_warnings().iter().cloned());
        let mut rms: Vec<RmSlot> = Vec::new();
        for rm in &config.rm {
            let pg_dsn = matches!(rm.kind.to_ascii_lowercase().as_str(), "postgres" | "postgresql" | "pg")
                .then(|| rm.dsn.clone());
            let connectable = factories.iter().any(|f| f.name() == rm.name);
            rms.push(RmSlot { name: rm.name.clone(), connectable, pg_dsn });
        }
        for factory in &factories {
            if !rms.iter().any(|r| r.name == factory.name()) {
                let name = factory.name().to_string();
                rms.push(RmSlot { name, connectable: true, pg_dsn: None });
            }
        }
        let connections = Connections::new(&factories);
        let pair = decree_pair::state_file::load(&decree_log::io::StdStorage, &dir)
            .map_err(|source| AdminError::Log { dir: dir.clone(), source })?;
        // Connections are made by the first scan, so that an unreachable RM costs one
        // connect timeout and is reported by `list` rather than failing here.
        Ok(Inspector {
            log,
            log_dir: dir,
            node: config.node,
            decisions,
            traces,
            keys,
            key_allocator,
            outcomes,
            warnings,
            rms,
            connections,
            pair,
            pair_override: false,
            etcd: None,
        })
    }

    /// The heuristics audit file of this log directory.
    pub fn heuristics_path(&self) -> PathBuf {
        self.log_dir.join(HEURISTICS_FILE)
    }

    /// The log's incarnation of this open (each open bumps it, as a coordinator's does).
    pub fn incarnation(&self) -> u64 {
        self.log.incarnation()
    }

    /// Decided-but-unfinished transactions and this node's prepared branches without a
    /// decision, with the state of each branch per RM.
    pub fn list(&mut self) -> Listing {
        let scan = self.scan();
        let ages = self.pg_ages(&scan);
        let mut in_doubt: HashMap<Xid, InDoubt> = HashMap::new();
        for decision in self.decisions.values() {
            let mut branches = Vec::new();
            for b in &decision.branches {
                let xid = decision.xid.branch(b.branch);
                let state = match scan.iter().find(|(name, _)| *name == b.rm) {
                    None => BranchState::NotConfigured,
                    Some((_, Err(e))) => BranchState::Unreachable(e.clone()),
                    Some((_, Ok(prepared))) if prepared.contains(&xid) => BranchState::Prepared,
                    Some((_, Ok(_))) => BranchState::Done,
                };
                branches.push(BranchStatus { rm: b.rm.clone(), xid, state });
            }
            let entry = InDoubt {
                xid: decision.xid,
                decided: true,
                origin: decision.xid.origin(),
                age_s: None,
                trace: self.traces.get(&decision.xid).copied(),
                branches,
            };
            in_doubt.insert(decision.xid, entry);
        }
        for (rm, result) in &scan {
            let Ok(prepared) = result else { continue };
            for xid in prepared {
                let global = xid.global();
                let entry = in_doubt.entry(global).or_insert_with(|| InDoubt {
                    xid: global,
                    decided: false,
                    origin: global.origin(),
                    age_s: None,
                    trace: None,
                    branches: Vec::new(),
                });
                if !entry.branches.iter().any(|b| b.rm == *rm && b.xid == *xid) {
                    entry.branches.push(BranchStatus {
                        rm: rm.clone(),
                        xid: *xid,
                        state: BranchState::Prepared,
                    });
                }
            }
        }
        let mut in_doubt: Vec<InDoubt> = in_doubt.into_values().collect();
        for t in &mut in_doubt {
            t.age_s = t.branches.iter().filter_map(|b| ages.get(&b.xid.to_gid()).copied()).max();
        }
        in_doubt.sort_by_key(|t| {
            let o = t.origin.map(|o| (o.node, o.incarnation, o.session, o.sequence));
            (!t.decided, o, t.xid.to_gid())
        });
        let rms = scan
            .iter()
            .map(|(name, r)| RmStatus { name: name.clone(), unreachable: r.as_ref().err().cloned() })
            .collect();
        Listing {
            log_dir: self.log_dir.clone(),
            node: self.node,
            in_doubt,
            rms,
            warnings: self.warnings.iter().cloned().chain(self.etcd_line()).collect(),
            pair: self.pair,
        }
    }

    /// Reads what etcd says of pair `pair` (its view in `cluster`, `decree status --etcd`'s
    /// JSON, or why etcd could not be read): `list` shows it, and `commit` and `rollback`
    /// on a member's log then need no `--pair-override` when nobody else can act
    /// ([`HandResolution::Alone`]), and name the leader when one does.
    pub fn consult_etcd(&mut self, cluster: Result<serde_json::Value, String>, pair: &str) {
        let Some(state) = &self.pair else { return };
        let verdict = cluster.and_then(|c| {
            let views: Vec<PairView> = serde_json::from_value(c["pairs"].clone())
                .map_err(|e| format!("etcd's view does not parse: {e}"))?;
            let view = views.into_iter().find(|v| v.pair == pair).unwrap_or_default();
            Ok(hand_resolution(&view, state.member.get(), state.seen.raw()))
        });
        self.etcd = Some(verdict);
    }

    /// The line `list` shows of what etcd said, if it was asked.
    fn etcd_line(&self) -> Option<String> {
        Some(match self.etcd.as_ref()? {
            Ok(HandResolution::Led { member, epoch }) => format!(
                "etcd: member {member} leads epoch {}: its recovery acts on these transactions; resolve them through it",
                Epoch::from_raw(*epoch)
            ),
            Ok(HandResolution::Alone) => {
                "etcd: nobody leads and this member holds the pair's latest epoch: it may resolve by hand".into()
            }
            Ok(HandResolution::Unproven(why)) => format!("etcd: {why}"),
            Err(why) => format!("etcd cannot be read: {why}"),
        })
    }

    /// Lets `commit` and `rollback` act on a pair member's log (`--pair-override`): the
    /// other member may lead and decide otherwise, so each use is recorded.
    pub fn allow_on_pair_member(&mut self) {
        self.pair_override = true;
    }

    /// Refuses an action on a pair member's log unless overridden, recording an override
    /// in the heuristics file before anything is touched.
    fn check_pair(&self, action: &str, xid: &Xid) -> Result<(), AdminError> {
        let Some(pair) = &self.pair else { return Ok(()) };
        let alone = matches!(self.etcd, Some(Ok(HandResolution::Alone)));
        if !self.pair_override && !alone {
            let etcd = self.etcd_line().map_or_else(String::new, |line| format!(" ({line})"));
            return Err(AdminError::Refused(format!(
                "{} belongs to member {} of a pair (highest epoch seen {}): the other member may lead and \
                 act on {xid} itself, with decisions this log has not seen; resolve it through the pair's \
                 primary, or stop both members and use --pair-override (recorded in the heuristics file){etcd}",
                self.log_dir.display(),
                pair.member.get(),
                pair.seen
            )));
        }
        let path = self.heuristics_path();
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let user =
            std::env::var("USER").or_else(|_| std::env::var("LOGNAME")).unwrap_or_else(|_| "unknown".into());
        let line = format!(
            "{} {} {action} {xid} member={} epoch_seen={} user={user} pid={}\n",
            format_utc(now),
            if self.pair_override { "pair-override" } else { "etcd-alone" },
            pair.member.get(),
            pair.seen,
            std::process::id()
        );
        append_synced(&path, line.as_bytes())
            .map_err(|e| AdminError::Heuristics { path: path.clone(), message: e.to_string() })?;
        tracing::warn!(%xid, action, "acting on a pair member's log; recorded in {}", path.display());
        Ok(())
    }

    /// Commits every prepared branch of `xid` and completes its decision. Without a
    /// logged decision this contradicts presumed abort: refused unless `force`, which
    /// records a heuristic and logs a decision first.
    pub fn commit(&mut self, xid: &Xid, force: bool) -> Result<Resolution, AdminError> {
        let global = self.check_xid(xid)?;
        self.check_pair("commit", &global)?;
        let scan = self.scan();
        let decision = self.decisions.get(&global).cloned();
        let prepared = prepared_of(&scan, &global);
        let mut heuristic = None;
        let decision = match decision {
            Some(d) => d,
            None => {
                if prepared.is_empty() {
                    return Err(self.not_found(global, &scan));
                }
                if !force {
                    return Err(AdminError::Refused(format!(
                        "no commit decision is logged for {global}: presumed abort says roll back; use \
                         --force to commit anyway (recorded as a heuristic decision)"
                    )));
                }
                let branches = prepared
                    .iter()
                    .map(|(rm, x)| BranchRecord { rm: rm.clone(), branch: x.branch_number().unwrap_or(0) })
                    .collect();
                let decision = Decision { xid: global, branches };
                heuristic =
                    Some(self.record_heuristic("commit", &global, "none (presumed abort)", &prepared)?);
                // The log now agrees with the operator: a crash from here on commits.
                self.append_decision(&decision)?;
                decision
            }
        };
        // Branches named by the decision plus any other prepared branch of the same Xid.
        let mut targets: Vec<(String, Xid)> =
            decision.branches.iter().map(|b| (b.rm.clone(), global.branch(b.branch))).collect();
        for p in &prepared {
            if !targets.contains(p) {
                targets.push(p.clone());
            }
        }
        let mut branches = Vec::new();
        let mut failures = Vec::new();
        for (rm, branch_xid) in targets {
            match self.on_branch(&rm, &branch_xid, true) {
                Ok(outcome) => branches.push((rm, branch_xid, outcome)),
                Err(e) => failures.push(e),
            }
        }
        if !failures.is_empty() {
            failures.push(format!("the decision stays in {} for a later retry", self.log_dir.display()));
            return Err(AdminError::Incomplete { xid: global.to_gid(), failures });
        }
        let outcome = match heuristic {
            Some(_) => Remembered::Heuristic(HeuristicOutcome::Committed),
            None => Remembered::Committed,
        };
        self.complete(&global, outcome)?;
        Ok(Resolution { xid: global, action: "commit", branches, heuristic, log_completed: true })
    }

    /// Rolls back every prepared branch of `xid`. With a logged commit decision this may
    /// leave the transaction half-committed: refused unless `force`, which records a
    /// heuristic and completes the decision first.
    pub fn rollback(&mut self, xid: &Xid, force: bool) -> Result<Resolution, AdminError> {
        let global = self.check_xid(xid)?;
        self.check_pair("rollback", &global)?;
        let scan = self.scan();
        let prepared = prepared_of(&scan, &global);
        let mut heuristic = None;
        let mut log_completed = false;
        if self.decisions.contains_key(&global) {
            if !force {
                return Err(AdminError::Refused(format!(
                    "a commit decision is logged for {global}; rolling back would leave the transaction \
                     half-committed if any branch already committed; use --force to override (recorded as \
                     a heuristic decision)"
                )));
            }
            heuristic = Some(self.record_heuristic("rollback", &global, "commit", &prepared)?);
            // The log now agrees with the operator: without the decision, a crash from
            // here on is finished by presumed abort.
            self.complete(&global, Remembered::Heuristic(HeuristicOutcome::RolledBack))?;
            log_completed = true;
        } else if prepared.is_empty() {
            return Err(self.not_found(global, &scan));
        }
        let mut branches = Vec::new();
        let mut failures = Vec::new();
        for (rm, branch_xid) in prepared {
            match self.on_branch(&rm, &branch_xid, false) {
                Ok(outcome) => branches.push((rm, branch_xid, outcome)),
                Err(e) => failures.push(e),
            }
        }
        let unreachable: Vec<String> = scan
            .iter()
            .filter_map(|(name, r)| r.as_ref().err().map(|e| format!("{name} could not be asked: {e}")))
            .collect();
        failures.extend(unreachable);
        if !failures.is_empty() {
            failures.push("no decision is logged: run rollback again, or let recovery presume abort".into());
            return Err(AdminError::Incomplete { xid: global.to_gid(), failures });
        }
        if heuristic.is_none() {
            self.remember(&global, Remembered::RolledBack)?;
        }
        Ok(Resolution { xid: global, action: "rollback", branches, heuristic, log_completed })
    }

    /// The global Xid of `xid`, refused when it is not this node's decree Xid.
    fn check_xid(&self, xid: &Xid) -> Result<Xid, AdminError> {
        let global = xid.global();
        if self.decisions.contains_key(&global) {
            return Ok(global);
        }
        match global.origin() {
            None => Err(AdminError::BadXid {
                xid: global.to_gid(),
                reason: "not a decree Xid (foreign transaction managers' branches are never touched)".into(),
            }),
            Some(o) if o.node != self.node => Err(AdminError::BadXid {
                xid: global.to_gid(),
                reason: format!(
                    "belongs to node {}, this configuration is node {}; use that node's configuration",
                    o.node, self.node
                ),
            }),
            Some(_) => Ok(global),
        }
    }

    fn not_found(&self, xid: Xid, scan: &Scan) -> AdminError {
        let names: Vec<&str> =
            scan.iter().filter(|(_, r)| r.is_err()).map(|(name, _)| name.as_str()).collect();
        let unreachable = if names.is_empty() {
            String::new()
        } else {
            format!(", but {} could not be asked", names.join(", "))
        };
        AdminError::NotFound { xid: xid.to_gid(), dir: self.log_dir.clone(), unreachable }
    }

    /// This node's prepared decree branches in every RM.
    fn scan(&mut self) -> Scan {
        let node = self.node;
        self.connections.forgive();
        let mut scan = Vec::with_capacity(self.rms.len());
        for slot in &self.rms {
            let result = slot.recover(&mut self.connections).map(|xids| {
                xids.into_iter().filter(|x| x.origin().is_some_and(|o| o.node == node)).collect()
            });
            scan.push((slot.name.clone(), result));
        }
        scan
    }

    /// Seconds since prepare of decree branches, by gid, from every PostgreSQL RM that
    /// answers; an RM that does not is simply left out (ages then show as unknown).
    fn pg_ages(&self, scan: &Scan) -> HashMap<String, u64> {
        let mut ages = HashMap::new();
        for slot in &self.rms {
            let Some(dsn) = &slot.pg_dsn else { continue };
            let has_branches =
                scan.iter().any(|(name, r)| *name == slot.name && r.as_ref().is_ok_and(|x| !x.is_empty()));
            if !has_branches {
                continue; // Unreachable, or nothing to date: spare a connection attempt.
            }
            match pg_prepared_ages(&slot.name, dsn) {
                Ok(found) => ages.extend(found),
                Err(e) => tracing::debug!(rm = %slot.name, error = %e, "no prepare times"),
            }
        }
        ages
    }

    /// Commits (`commit`) or rolls back one branch; the error names the RM and Xid. What
    /// an answer means is the recovery engine's one reading (`protocol::phase_two_step`).
    fn on_branch(&mut self, rm: &str, xid: &Xid, commit: bool) -> Result<BranchOutcome, String> {
        let verb = if commit { "commit" } else { "rollback" };
        if !self.rms.iter().any(|s| s.name == rm) {
            return Err(format!("{verb} of {xid} on {rm}: that resource manager is not configured"));
        }
        self.connections.forgive();
        let connection = self.connections.get(rm).map_err(|e| format!("{verb} of {xid} on {rm}: {e}"))?;
        let result = if commit { connection.commit(xid, false) } else { connection.rollback(xid) };
        match protocol::phase_two_step(&result, commit) {
            PhaseTwoStep::Done => Ok(match result {
                Err(RmError::UnknownXid(_)) => BranchOutcome::AlreadyDone,
                _ if commit => BranchOutcome::Committed,
                _ => BranchOutcome::RolledBack,
            }),
            PhaseTwoStep::Heuristic(outcome) => {
                if let Ok(connection) = self.connections.get(rm) {
                    let _ = connection.forget(xid);
                }
                tracing::error!(%xid, rm, ?outcome, error = ?result, "heuristic outcome reported by the resource manager");
                let why = match result {
                    Err(RmError::RolledBack(why)) => format!("{rm} rolled the branch back: {why}"),
                    _ => format!("{rm} reports a heuristic outcome: {outcome:?}"),
                };
                Ok(BranchOutcome::Heuristic(why))
            }
            PhaseTwoStep::Retry => {
                self.connections.drop_connection(rm);
                let e = result.err().map(|e| e.to_string()).unwrap_or_default();
                Err(format!("{verb} of {xid} on {rm}: {e}"))
            }
        }
    }

    /// Appends a decision durably (the forced-commit path).
    fn append_decision(&mut self, decision: &Decision) -> Result<(), AdminError> {
        // The branches come from the resource managers' listings: refuse, never cut.
        decision.check_limits().map_err(|e| {
            AdminError::Refused(format!("cannot record a decision for {}: {e}", decision.xid))
        })?;
        let dir = self.log_dir.clone();
        let log_error = |source| AdminError::Log { dir: dir.clone(), source };
        let key = self.key_allocator.next();
        self.log.append(key, &decision.encode()).map_err(log_error)?;
        self.log.sync().map_err(log_error)?;
        self.keys.entry(decision.xid).or_default().push(key);
        self.decisions.insert(decision.xid, decision.clone());
        Ok(())
    }

    /// Remembers `outcome` for `xid` durably in the outcome memory.
    fn remember(&mut self, xid: &Xid, outcome: Remembered) -> Result<(), AdminError> {
        let mut id = Vec::with_capacity(40);
        xid.global().encode(&mut id);
        let log_error = |source| AdminError::Log { dir: self.log_dir.clone(), source };
        self.outcomes.remember(&id, outcome.to_byte(), Box::new(|_| {})).map_err(log_error)?;
        self.outcomes.sync().map_err(log_error)
    }

    /// Remembers `outcome` for `xid`, then completes its decision in the log and syncs:
    /// the outcome is durable before the decision can go.
    fn complete(&mut self, xid: &Xid, outcome: Remembered) -> Result<(), AdminError> {
        let dir = self.log_dir.clone();
        let log_error = |source| AdminError::Log { dir: dir.clone(), source };
        if self.decisions.contains_key(xid) {
            self.remember(xid, outcome)?;
            for key in self.keys.remove(xid).unwrap_or_default() {
                self.log.complete(key).map_err(log_error)?;
            }
            self.log.sync().map_err(log_error)?;
            self.decisions.remove(xid);
        }
        Ok(())
    }

    /// Appends one line to the heuristics file and fsyncs it (and the directory when the
    /// file is new) before anything is touched.
    fn record_heuristic(
        &self,
        action: &str,
        xid: &Xid,
        logged: &str,
        prepared: &[(String, Xid)],
    ) -> Result<PathBuf, AdminError> {
        let path = self.heuristics_path();
        let line = heuristic_line(action, xid, logged, prepared);
        append_synced(&path, line.as_bytes())
            .map_err(|e| AdminError::Heuristics { path: path.clone(), message: e.to_string() })?;
        tracing::warn!(%xid, action, "heuristic decision recorded in {}", path.display());
        Ok(path)
    }
}

impl RmSlot {
    /// The RM's prepared decree branches, through the runtime's connection cache (a
    /// failure drops the connection, so the next command tries a new one).
    fn recover(&self, connections: &mut Connections) -> Result<Vec<Xid>, String> {
        if !self.connectable {
            return Err(format!(
                "no connection factory for resource manager {} (unsupported kind?)",
                self.name
            ));
        }
        let result = connections.get(&self.name).and_then(|c| c.recover()).map_err(|e| e.to_string());
        match result {
            Ok(xids) if xids.len() > PREPARED_PER_RM_MAX => Err(format!(
                "{} lists {} prepared branches, more than the {PREPARED_PER_RM_MAX} this tool reads",
                self.name,
                xids.len()
            )),
            Ok(xids) => Ok(xids.into_iter().filter(|x| x.origin().is_some()).collect()),
            Err(e) => {
                connections.drop_connection(&self.name);
                Err(e)
            }
        }
    }
}

/// The prepared branches of `global` in every RM that answered.
fn prepared_of(scan: &Scan, global: &Xid) -> Vec<(String, Xid)> {
    let mut found = Vec::new();
    for (rm, result) in scan {
        if let Ok(xids) = result {
            found.extend(xids.iter().filter(|x| x.global() == *global).map(|x| (rm.clone(), *x)));
        }
    }
    found
}

/// Seconds since `pg_prepared_xacts.prepared` of this database's decree branches, by gid.
fn pg_prepared_ages(name: &str, dsn: &str) -> Result<HashMap<String, u64>, String> {
    let rm = decree_rm::PgRm::connect(name, dsn).map_err(|e| e.to_string())?;
    let mut client = rm.client().map_err(|e| e.to_string())?;
    let rows = client
        .query(
            "SELECT gid, GREATEST(0, EXTRACT(EPOCH FROM now() - prepared))::bigint FROM pg_prepared_xacts \
             WHERE database = current_database() AND gid LIKE 'decree:%'",
            &[],
        )
        .map_err(|e| format!("{name}: pg_prepared_xacts: {e}"))?;
    let mut ages = HashMap::with_capacity(rows.len());
    for row in rows {
        let (Ok(gid), Ok(age)) = (row.try_get::<_, String>(0), row.try_get::<_, i64>(1)) else { continue };
        ages.insert(gid, age.max(0) as u64);
    }
    Ok(ages)
}

/// One line of the heuristics file: time, action, Xid, what the log said, who, branches.
fn heuristic_line(action: &str, xid: &Xid, logged: &str, prepared: &[(String, Xid)]) -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let user =
        std::env::var("USER").or_else(|_| std::env::var("LOGNAME")).unwrap_or_else(|_| "unknown".into());
    let branches: Vec<String> = prepared.iter().map(|(rm, x)| format!("{rm}={x}")).collect();
    format!(
        "{} heuristic {action} {xid} logged_decision=\"{logged}\" user={user} pid={} \
         prepared_branches=[{}]\n",
        format_utc(now),
        std::process::id(),
        branches.join(" ")
    )
}

/// Appends `bytes` to `path` and fsyncs; fsyncs the directory too when the file is new.
fn append_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let existed = path.exists();
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    if !existed {
        if let Some(dir) = path.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
    }
    Ok(())
}

/// "1h02m03s" style durations for the age column.
/// The listing's line about a pair member's log.
fn pair_line(pair: &PairState) -> String {
    let forced = pair.forced.map_or_else(|| "none".to_string(), |e| e.to_string());
    format!(
        "pair member {}: highest epoch seen {}, last forced promotion {forced} (resolve through the pair's primary)",
        pair.member.get(),
        pair.seen
    )
}

fn format_duration(s: u64) -> String {
    let (d, h, m, sec) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{sec}s"),
        (0, 0, _) => format!("{m}m{sec:02}s"),
        (0, _, _) => format!("{h}h{m:02}m{sec:02}s"),
        _ => format!("{d}d{h:02}h{m:02}m"),
    }
}

/// Unix seconds as `YYYY-MM-DDTHH:MM:SSZ` (civil-from-days, proleptic Gregorian).
fn format_utc(unix_s: u64) -> String {
    let days = (unix_s / 86_400) as i64;
    let rem = unix_s % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

/// Parses an Xid as `decree recover list` prints it (`decree:<format>:<gtrid>:<bqual>`).
pub fn parse_xid(text: &str) -> Result<Xid, AdminError> {
    Xid::from_gid(text.trim()).map_err(|e| AdminError::BadXid {
        xid: text.to_string(),
        reason: format!(
            "{e}; expected decree:<format hex>:<gtrid hex>:<bqual hex> as `decree recover list` prints it"
        ),
    })
}

/// The factories of `config`'s `[[rm]]` entries ([`ServerConfig::rm_factories`]), with the
/// error as this module reports it.
pub fn factories_for(config: &ServerConfig) -> Result<Vec<Arc<dyn RmFactory>>, AdminError> {
    config.rm_factories().map_err(|e| AdminError::Config(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_times_and_durations_format_as_people_read_them() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_utc(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(format_duration(5), "5s");
        assert_eq!(format_duration(125), "2m05s");
        assert_eq!(format_duration(3723), "1h02m03s");
        assert_eq!(format_duration(90_061), "1d01h01m");
    }

    #[test]
    fn xids_parse_from_their_printed_form_and_bad_ones_are_named() {
        let xid = Xid::decree(Origin { node: 3, incarnation: 4, session: 5, sequence: 6 });
        assert_eq!(parse_xid(&xid.to_gid()).unwrap(), xid);
        let e = parse_xid("other-tm-1").unwrap_err().to_string();
        assert!(e.starts_with("other-tm-1: "), "{e}");
    }

    #[test]
    fn heuristic_lines_name_the_action_xid_and_branches() {
        let xid = Xid::decree(Origin { node: 3, incarnation: 4, session: 5, sequence: 6 });
        let line = heuristic_line("commit", &xid, "none", &[("pg-a".into(), xid.branch(0))]);
        assert!(line.ends_with('\n') && line.matches('\n').count() == 1, "{line}");
        assert!(line.contains(&format!("heuristic commit {xid}")), "{line}");
        assert!(line.contains(&format!("pg-a={}", xid.branch(0))), "{line}");
    }
}
