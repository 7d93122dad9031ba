//! The server as a member of a primary + backup pair (`[pair]`; docs/replication.md).
//!
//! A member starts as a **backup**: its log belongs to decree-pair's `Follower`, which
//! serves the primary's link; its client listeners answer `NotPrimary`; it runs no
//! recovery and calls no resource manager. `decree promote` (through the control socket,
//! `control.sock` in the log directory, mode 0600) steps the rules, which make the new
//! epoch durable first; the member then stops the follower, reopens its log (what the
//! follower wrote is the live set, its keys stay taken), builds the server's state with the
//! epoch as the incarnation, starts the `Leader` toward its peer and serves like a single
//! server, with one difference on the commit path ([`PrimaryLink::after_local_write`]): in
//! strict mode a decision durable here is *pending* until the backup confirms it, counted
//! as doubtful meanwhile (nothing rolls back its branches, `Outcome` never answers it
//! decided), and only then moves to its session and gets its `DecideOk`. A primary told of
//! a newer epoch records it and stops with [`crate::ServerError::Deposed`]; `decree serve`
//! then starts it again as a backup in the same process (`run_with`).
//!
//! The outcome memory follows too (each entry as it is remembered, and the whole memory
//! in every catch-up), so a promoted member answers `Outcome` for what the old primary had
//! finished. The link runs TLS with the pair's certificates when `[pair.tls]` says so
//! (`link_tls.rs`).

use crate::config::{PairAck, PairConfig, ServerConfig};
use crate::crash_points::{self, CrashPoint};
use crate::metrics::{PairFigures, PairRole};
use crate::pair_election;
use crate::state::State;
use crate::{Bound, Listeners, Prebound, ServerError};
use decree_core::{Decision, RmFactory, Xid};
use decree_log::io::StdStorage;
use decree_pair::link::follower::{AckMode, Follower};
use decree_pair::link::leader::{BackupRun, DecisionGate, Leader, LiveSet};
use decree_pair::link::Transport;
use decree_pair::outbox::{OutboxLimits, Ticket};
use decree_pair::rules::{self, Role};
use decree_pair::wire::{LinkRecord, RecordKind};
use decree_pair::{Epoch, MemberId, Replica};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::SystemTime;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{mpsc, oneshot, watch};

/// The control socket's name in the log directory.
pub const CONTROL_SOCKET: &str = "control.sock";

/// Longest request line the control socket reads.
const CONTROL_LINE_BYTES_MAX: u64 = 256;

/// How a decision of a pair came to be acknowledged (its span shows the backup's
/// confirmation as an event, `trace.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acknowledged {
    /// After its backup's confirmation, received at this time (`None` when spans are off:
    /// the clock is then not read).
    Confirmed(Option<SystemTime>),
    /// Without a backup's confirmation: a primary running alone, or one that went alone
    /// while the decision waited (etcd recorded the backup out of sync).
    Alone,
}

/// What runs once a decision (or a held outcome) may be acknowledged.
pub(crate) type Accept = Box<dyn FnOnce(Acknowledged) + Send>;

/// A decision durable here that waits for the backup's confirmation.
struct Pending {
    xid: Xid,
    record: LinkRecord,
    /// Moves the decision to its session (or the orphans) and sends its `DecideOk`; `None`
    /// while the local write (shipped beside it) is not durable yet.
    accept: Option<Accept>,
    /// Settled before the local write was durable: by the backup's confirmation, or by
    /// the primary going alone.
    settled: Option<Acknowledged>,
}

/// What the leader needs of the server, and where its confirmations go.
struct LinkShared {
    state: Weak<State>,
    leader: std::sync::OnceLock<Weak<Leader>>,
    /// Tickets waiting for the backup; bounded by the server's in-flight decides.
    pending: Mutex<HashMap<Ticket, Pending>>,
    /// Pending decisions the outbox could not take yet (the backup is behind).
    overflow: Mutex<VecDeque<(LinkRecord, Ticket)>>,
    /// The member is stopping: a decision shipped from now on is answered by nobody. Set
    /// and read under the `pending` lock, so that no decide slips in after the stop's one
    /// `abandon_pending` and waits for good.
    abandoned: AtomicBool,
    deposed: Mutex<Option<Epoch>>,
    on_deposed: Box<dyn Fn(Epoch) + Send + Sync>,
}

impl LiveSet for LinkShared {
    fn live_records(&self) -> Vec<LinkRecord> {
        // The pending lock first, then the state's: a confirmation moves a decision into
        // the state while holding it, so the snapshot sees it in one place or the other.
        let pending = self.pending.lock();
        let mut records: Vec<LinkRecord> = pending.values().map(|p| p.record.clone()).collect();
        if let Some(state) = self.state.upgrade() {
            records.extend(state.live_decisions().iter().map(decision_record));
            // What the primary remembers of finished transactions, so that a promoted
            // backup answers `Outcome` for them too.
            for (id, outcome) in state.outcomes.entries() {
                if let Ok((xid, _)) = Xid::decode(&id) {
                    records.push(LinkRecord { kind: RecordKind::Outcome, xid, payload: vec![outcome] });
                }
            }
        }
        // In one order in every run (the sets above are hash maps): what goes on the wire
        // does not depend on a hasher's seed, so that a simulation's seed replays exactly.
        records.sort_by_key(|r| (r.kind as u8, r.xid));
        // A decision read twice (pending, then confirmed; in a session, then an orphan).
        records.dedup_by(|a, b| a.kind == b.kind && a.xid == b.xid);
        records
    }

    fn confirmed(&self, tickets: Vec<Ticket>) {
        self.settle(tickets, true);
    }

    fn deposed(&self, seen: Epoch) {
        *self.deposed.lock() = Some(seen);
        // A deposed member acknowledges nothing more: answers its lease's fence holds
        // (etcd away) are dropped, so that their connections end and the server can stop.
        if let Some(fence) = self.state.upgrade().and_then(|s| s.fence().cloned()) {
            fence.end();
        }
        (self.on_deposed)(seen);
    }
}

impl LinkShared {
    /// Acknowledges the decisions of `tickets`, confirmed by the backup or not (the primary
    /// went alone), or marks those whose local write is still on its way.
    fn settle(&self, tickets: Vec<Ticket>, by_backup: bool) {
        let state = self.state.upgrade();
        let how = match by_backup {
            // The clock is read for the decide spans only.
            true => Acknowledged::Confirmed(
                state.as_ref().filter(|s| s.trace.is_some()).map(|_| SystemTime::now()),
            ),
            false => Acknowledged::Alone,
        };
        // A member deposed meanwhile acknowledges nothing more (issue 32, defect 3).
        let role = self.leader.get().and_then(Weak::upgrade).map_or(Role::Backup, |l| l.node().role);
        let acknowledging = rules::may_acknowledge(role, true, true);
        let mut pending = self.pending.lock();
        for ticket in tickets {
            let Some(entry) = pending.get_mut(&ticket) else { continue };
            if entry.accept.is_none() {
                entry.settled = Some(how); // The local write is still on its way.
                continue;
            }
            let p = pending.remove(&ticket).expect("present");
            if !acknowledging {
                continue;
            }
            (p.accept.expect("checked"))(how);
            if let Some(state) = &state {
                state.confirm(&p.xid);
            }
        }
        drop(pending);
        let Some(leader) = self.leader.get().and_then(Weak::upgrade) else { return };
        let mut overflow = self.overflow.lock();
        while let Some((record, ticket)) = overflow.front() {
            if leader.ship(record.clone(), Some(*ticket)).is_err() {
                break;
            }
            overflow.pop_front();
        }
    }
}

/// A leading member's link to its backup, as the commit path uses it.
pub(crate) struct PrimaryLink {
    leader: Arc<Leader>,
    shared: Arc<LinkShared>,
    next_ticket: AtomicU64,
}

impl PrimaryLink {
    /// The leader of this member's link (the simulator steps it).
    #[cfg(feature = "sim")]
    pub(crate) fn leader(&self) -> &Arc<Leader> {
        &self.leader
    }

    /// A decision of `xid` (its record `payload`) is durable here: in strict mode it waits
    /// for the backup (`accept` runs on confirmation); alone, `accept` runs now, under the
    /// leader's decision gate, so that the next catch-up's live set holds it; a member
    /// deposed meanwhile answers nothing (its client asks `Outcome` of the new primary,
    /// whose log may hold the decision already).
    pub(crate) fn after_local_write(&self, state: &State, xid: Xid, payload: Vec<u8>, accept: Accept) {
        let gate = self.leader.decision_gate();
        let role = gate.role();
        match role {
            Role::Primary { alone: true } => {
                assert!(rules::may_acknowledge(role, true, false), "alone: on the local write");
                accept(Acknowledged::Alone);
            }
            Role::Primary { alone: false } => {
                state.unconfirm(&xid);
                let record = LinkRecord { kind: RecordKind::Decision, xid, payload };
                self.ship_pending(&gate, record, Some(accept));
            }
            Role::Backup => tracing::warn!(%xid, "deposed: the decide is not answered"),
        }
    }

    /// In strict mode, ships `xid`'s decision before its local write, so that the backup's
    /// write and the primary's run at once; returns the ticket that [`PrimaryLink::written`]
    /// or [`PrimaryLink::write_failed`] settles. `None` when the primary runs alone (the
    /// decision then goes through [`PrimaryLink::after_local_write`]).
    pub(crate) fn ship_before_write(&self, state: &State, xid: Xid, payload: &[u8]) -> Option<Ticket> {
        let gate = self.leader.decision_gate();
        if gate.role() != (Role::Primary { alone: false }) {
            return None;
        }
        state.unconfirm(&xid);
        let record = LinkRecord { kind: RecordKind::Decision, xid, payload: payload.to_vec() };
        Some(self.ship_pending(&gate, record, None))
    }

    /// The local write of `ticket`'s decision is durable: `accept` runs now if the backup
    /// confirmed it already, else at its confirmation.
    pub(crate) fn written(&self, state: &State, ticket: Ticket, accept: Accept) {
        let mut pending = self.shared.pending.lock();
        match pending.get_mut(&ticket) {
            Some(entry) if entry.settled.is_some() => {
                let entry = pending.remove(&ticket).expect("present");
                if rules::may_acknowledge(self.leader.node().role, true, true) {
                    accept(entry.settled.expect("checked"));
                    state.confirm(&entry.xid);
                }
            }
            Some(entry) => {
                entry.accept = Some(accept);
                // Under the pending lock: no confirmation can answer it before the kill.
                crash_points::pass(CrashPoint::DecideWritten, &entry.xid);
            }
            None => {} // Abandoned at shutdown: nobody answers it.
        }
    }

    /// The local write of `ticket`'s decision failed: it is answered `LogFailed` and stays
    /// doubtful (it may be durable here or on the backup); no confirmation accepts it.
    pub(crate) fn write_failed(&self, ticket: Ticket) {
        self.shared.pending.lock().remove(&ticket);
    }

    /// Registers a pending decision and ships it with its ticket (kept for later when the
    /// outbox is full).
    /// Once the member stops, it is shipped (the backup may hold it, as it may hold those
    /// abandoned) but not kept: a connection's reader can take a decide it read before the
    /// stop after the stop's `abandon_pending`, and a kept answer would hold its connection,
    /// and so the stopping server, open for good (the elected kill loop, cycles 222, 798).
    fn ship_pending(&self, gate: &DecisionGate<'_>, record: LinkRecord, accept: Option<Accept>) -> Ticket {
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        {
            let mut pending = self.shared.pending.lock();
            if self.shared.abandoned.load(Ordering::Relaxed) {
                drop(pending);
                let _ = gate.ship(record, Some(ticket));
                return ticket; // `written` finds no entry: nobody answers it.
            }
            let entry = Pending { xid: record.xid, record: record.clone(), accept, settled: None };
            pending.insert(ticket, entry);
        }
        if gate.ship(record.clone(), Some(ticket)).is_err() {
            self.shared.overflow.lock().push_back((record, ticket));
        }
        ticket
    }

    /// The primary remembers `outcome` for the finished `xid`: the backup remembers it too.
    /// Returns whether it was shipped (a full outbox drops it): the completion of `xid`
    /// must then stay home too ([`PrimaryLink::ship_completion`]).
    pub(crate) fn ship_outcome(&self, xid: &Xid, outcome: u8) -> bool {
        let record = LinkRecord { kind: RecordKind::Outcome, xid: *xid, payload: vec![outcome] };
        self.leader.ship_lazy(record).is_ok()
    }

    /// The primary remembers `outcome` for `xid` and must know when the backup holds it too
    /// (a heuristic, before its branch is forgotten): `held` runs at the backup's
    /// confirmation, or now on a primary alone (the next live set carries the outcome
    /// memory); a deposed member never runs it.
    pub(crate) fn ship_outcome_held(&self, xid: &Xid, outcome: u8, held: Box<dyn FnOnce() + Send>) {
        let gate = self.leader.decision_gate();
        match gate.role() {
            Role::Primary { alone: true } => held(),
            Role::Primary { alone: false } => {
                let record = LinkRecord { kind: RecordKind::Outcome, xid: *xid, payload: vec![outcome] };
                self.ship_pending(&gate, record, Some(Box::new(move |_| held())));
            }
            Role::Backup => tracing::warn!(%xid, "deposed: a heuristic outcome is not shipped"),
        }
    }

    /// `xid` is finished: the backup may forget it (lost when the backup is far behind:
    /// the next catch-up forgets it then), but only once its outcome was shipped
    /// (`outcome_shipped`): a backup that forgot a decision whose outcome a full outbox
    /// dropped answered `Unknown` for an acknowledged commit after a failover (the pair
    /// kill loop, 2026-11-28); kept live there, the decision answers `Committed`.
    pub(crate) fn ship_completion(&self, xid: &Xid, outcome_shipped: bool) {
        if !outcome_shipped {
            return;
        }
        let record = LinkRecord { kind: RecordKind::Completion, xid: *xid, payload: Vec::new() };
        let _ = self.leader.ship_lazy(record);
    }

    /// Decisions shipped or queued for the backup whose answer waits for its confirmation
    /// (bounded by the server's in-flight decides).
    pub(crate) fn waiting(&self) -> usize {
        self.shared.pending.lock().values().filter(|p| p.settled.is_none()).count()
    }

    /// The member's role now (a deposed member is a backup).
    pub(crate) fn role(&self) -> Role {
        self.leader.node().role
    }

    /// The epoch that deposed this member, if one did.
    pub(crate) fn deposed_by(&self) -> Option<Epoch> {
        *self.shared.deposed.lock()
    }

    /// The election on etcd took the lead away (the lease is gone, or a member leads the
    /// `newer` epoch): this member stops as a deposed one does, and rejoins as a backup.
    #[cfg_attr(not(any(feature = "etcd", feature = "sim")), allow(dead_code))]
    pub(crate) fn step_down(&self, newer: Option<Epoch>) {
        let seen = newer.unwrap_or_else(|| self.leader.node().seen);
        LiveSet::deposed(&*self.shared, seen);
    }

    /// At shutdown: the pending decides, and those shipped from now on, are answered by
    /// nobody (their clients see the connection close and ask `Outcome`), so that their
    /// connections can end.
    pub(crate) fn abandon_pending(&self) {
        let mut pending = self.shared.pending.lock();
        self.shared.abandoned.store(true, Ordering::Relaxed);
        pending.clear();
        drop(pending);
        self.shared.overflow.lock().clear();
    }
}

/// What the election on etcd (`election.rs`, and the simulator's model of it) asks of a
/// leading member's link.
#[cfg(any(feature = "etcd", feature = "sim"))]
#[cfg_attr(not(feature = "etcd"), allow(dead_code))] // the simulator asks only `go_alone`
impl PrimaryLink {
    /// The election on etcd recorded the backup out of sync (`alone_after_ms`): from now on
    /// decisions are acknowledged on the local write, and those waiting for the backup are
    /// acknowledged now (each is durable here, or will be: its write's end accepts it).
    pub(crate) fn go_alone(&self) {
        if !self.leader.go_alone() {
            return;
        }
        self.shared.overflow.lock().clear();
        let tickets: Vec<Ticket> = self.shared.pending.lock().keys().copied().collect();
        self.shared.settle(tickets, false);
        tracing::warn!("the backup is recorded out of sync on etcd: acknowledging alone");
    }

    /// The replication lag as this primary reports it on etcd (`decree status --etcd`).
    pub(crate) fn lag_report(&self) -> decree_pair::election::LagReport {
        let (node, lag) = (self.leader.node(), self.leader.lag());
        let at_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        decree_pair::election::LagReport {
            member: node.member.get(),
            epoch: node.seen.raw(),
            linked: self.leader.link_report().connected,
            strict: node.role == (Role::Primary { alone: false }),
            records: lag.records as u64,
            decisions_waiting: self.waiting() as u64,
            oldest_ms: lag.oldest.map(|d| d.as_millis() as u64),
            at_unix_ms,
        }
    }

    /// The backup processes that catch up, as they do (an election records each in sync).
    pub(crate) fn caught_up_backups(&self) -> watch::Receiver<Option<decree_pair::link::leader::BackupRun>> {
        self.leader.caught_up_backups()
    }

    /// How long the oldest record shipped to the backup has waited for its
    /// acknowledgement, while strict and some decision waits (`None` otherwise).
    pub(crate) fn strict_wait(&self) -> Option<std::time::Duration> {
        if self.leader.node().role != (Role::Primary { alone: false }) || self.waiting() == 0 {
            return None;
        }
        self.leader.lag().oldest
    }
}

fn decision_record(decision: &Decision) -> LinkRecord {
    LinkRecord { kind: RecordKind::Decision, xid: decision.xid, payload: decision.encode() }
}

/// What the control socket and the metrics report, and what the control socket acts on.
enum Member {
    Backup(Arc<Follower>, PairAck),
    /// The leader, this member's promotion, and the server's state (for its metrics).
    Primary(Arc<Leader>, Promotion, Weak<State>),
    Changing,
}

/// This member's promotion, for `decree status`.
#[derive(Debug, Clone, Copy)]
struct Promotion {
    /// When the promotion was asked (wall clock, for the operator).
    at: std::time::SystemTime,
    /// How long it took until the new epoch was durable and the log reopened.
    took: std::time::Duration,
    forced: bool,
}

/// A promotion asked through the control socket, and where its answer goes.
type PromoteRequest = (bool, oneshot::Sender<String>);

/// How this member came to lead: the new node, when it was asked (wall clock and monotonic,
/// for `decree status`), whether it was forced, and where the operator's answer goes (none
/// when etcd elected it).
struct Promoted {
    node: decree_pair::rules::Node,
    asked: (std::time::SystemTime, std::time::Instant),
    forced: bool,
    reply: Option<oneshot::Sender<String>>,
}

/// Runs a pair member until stopped (or deposed): the backup phase, then, once promoted
/// (by `decree promote`, or by etcd's election under `[pair.etcd]`), the primary phase.
pub(crate) async fn run(
    config: ServerConfig,
    factories: Vec<Arc<dyn RmFactory>>,
    stop: Arc<watch::Sender<bool>>,
    mut stop_rx: watch::Receiver<bool>,
    ready: std::sync::mpsc::Sender<(Bound, u32, u64)>,
    listeners: Listeners,
) -> Result<(), ServerError> {
    let pair = config.pair.clone().expect("pair mode has a [pair]");
    let log_config = config.log_config()?;
    let io = |what: &str, e: &dyn std::fmt::Display| ServerError::Io(format!("{what}: {e}"));
    let transport = link_transport(&pair)?;
    let run_id = pair_election::new_run_id();
    let follower = open_follower(&config, &log_config, &pair, transport.clone(), run_id)?;
    let election = pair_election::start(&pair, run_id, clients_address(&config), stop_rx.clone()).await?;
    let member = Arc::new(Mutex::new(Member::Backup(follower.clone(), pair.ack)));
    let (promote_tx, promote_rx) = mpsc::channel::<PromoteRequest>(4);
    let control = bind_control(&config.log_dir)?;
    let switchover = Arc::new(Switchover { target: Mutex::new(None), stop: stop.clone() });
    let answers =
        ControlAnswers { member: member.clone(), election: election.clone(), switchover: switchover.clone() };
    tokio::spawn(serve_control(control, answers, promote_tx));
    // Bound once for both roles: a backup's figures are what an operator watches too.
    let (metrics_addr, _metrics) = serve_metrics(&config, member.clone(), election.clone()).await?;

    let link = TcpListener::bind(pair.link)
        .await
        .map_err(|e| io(&format!("cannot listen on pair.link {}", pair.link), &e))?;
    let (follower_stop, follower_stop_rx) = watch::channel(false);
    let following = serve_follower(&follower, link, follower_stop_rx, pair.busy_poll_us)?;
    let (mut bound, refusing) = refuse_clients(&config, &pair).await?;
    bound.metrics = metrics_addr;
    tracing::info!(member = pair.member, epoch = %follower.pair_state().seen, "pair member started as a backup");
    let _ = ready.send((bound.clone(), config.node, 0));

    let (campaign_stop, campaign_stop_rx) = watch::channel(false);
    let (won, campaigning) =
        pair_election::campaign(&election, &follower, &factories, config.node, campaign_stop_rx);
    let signals = if listeners.stop_on_signals { crate::install_signals() } else { None };
    let waiting = Waiting {
        follower: &follower,
        factories: &factories,
        node: config.node,
        elected: election.is_some(),
    };
    let promoted = waiting.promotion(promote_rx, won, &mut stop_rx, signals).await;
    let _ = campaign_stop.send(true);
    // Ended before the log is opened again: it may hold the follower for a moment.
    if let Some(task) = campaigning {
        task.abort();
        let _ = task.await;
    }
    let Some(promoted) = promoted else {
        let _ = follower_stop.send(true);
        let _ = following.await;
        remove_socket(&bound);
        pair_election::resign(&election).await;
        return Ok(());
    };
    let (node, epoch) = (promoted.node, promoted.node.seen);
    *member.lock() = Member::Changing;
    let _ = follower_stop.send(true);
    let _ = following.await;
    // Taken over, never closed: a client connecting now waits for the primary to answer.
    let handed = refusing.hand_over().await;
    // The follower's log must be closed before the state reopens it (one owner).
    let (pair_state, backup_link) = (follower.pair_state(), follower.link_report());
    drop(follower);
    let state = Arc::new(crate::open_state(&config, &log_config, factories, None, Some(epoch.raw()))?);
    let deposed = Deposed {
        stop: stop.clone(),
        storage: Arc::new(StdStorage),
        dir: config.log_dir.clone(),
        pair_state,
    };
    let link = LinkSetup { transport, limits: OutboxLimits::default(), stall: pair.link_stall() };
    let primary = lead(&state, node, config.node, link, deposed, &backup_link);
    let leader = primary.leader.clone();
    lead_on_etcd(&election, &state, &primary, epoch, promoted.forced, stop_rx.clone());
    let promotion =
        Promotion { at: promoted.asked.0, took: promoted.asked.1.elapsed(), forced: promoted.forced };
    *member.lock() = Member::Primary(leader.clone(), promotion, Arc::downgrade(&state));
    tokio::spawn(leader.clone().run(pair.peer_link, stop_rx.clone()));
    listen_as_primary(&leader, pair.link, &stop_rx).await;
    tracing::warn!(member = pair.member, %epoch, elected = promoted.reply.is_none(), "promoted: this member leads the pair");
    let answer = format!("promoted: member {} leads epoch {epoch}", pair.member);
    let listening = answer_once_listening(promoted.reply, answer);
    // The metrics endpoint bound above goes on serving, the state's figures now included.
    let config = ServerConfig { metrics: None, ..config };
    let listeners = Listeners { bound: handed, ..listeners };
    let served = crate::serve(config, state, stop, stop_rx, listening, listeners).await;
    stop_leading(&election, &switchover, epoch, served, primary.deposed_by()).await
}

/// A switchover asked through the control socket: the backup to hand the lead to, and the
/// server's stop, which ends the primary phase once what is in flight is answered.
struct Switchover {
    target: Mutex<Option<BackupRun>>,
    stop: Arc<watch::Sender<bool>>,
}

/// After the primary phase answered its last decision: hands the lead of `epoch` over when
/// a switchover asked for it, then gives up the lease (the backup campaigns at once). A
/// member deposed or handed over rejoins as the backup (under an election: `run_with`).
async fn stop_leading(
    election: &Option<Arc<pair_election::Election>>,
    switchover: &Switchover,
    epoch: Epoch,
    served: Result<(), ServerError>,
    deposed_by: Option<Epoch>,
) -> Result<(), ServerError> {
    let handing = switchover.target.lock().take();
    if let Some(backup) = handing {
        if let Err(why) = pair_election::hand_over(election, epoch, backup).await {
            tracing::error!(
                "the switchover did not hand the lead over ({why}): the lease goes, the election chooses"
            );
        }
    }
    pair_election::resign(election).await;
    served?;
    match (deposed_by, handing) {
        (Some(seen), _) => Err(ServerError::Deposed(seen.to_string())),
        (None, Some(backup)) => {
            Err(ServerError::Deposed(format!("{epoch}, handed over to member {}", backup.member.get())))
        }
        (None, None) => Ok(()),
    }
}

/// Starts a switchover on a primary whose backup is in sync (recorded in etcd, linked and
/// caught up now): the answer names the backup that takes the lead, or why not.
fn switchover_request(answers: &ControlAnswers) -> String {
    let leader = match &*answers.member.lock() {
        Member::Primary(leader, ..) => leader.clone(),
        _ => return "refused: this member does not lead: ask the primary".into(),
    };
    let backup = match pair_election::switchover_target(&answers.election) {
        Ok(backup) => backup,
        Err(why) => return format!("refused: {why}"),
    };
    let (node, linked) = (leader.node(), *leader.caught_up_backups().borrow());
    if node.role != (Role::Primary { alone: false })
        || linked != Some(backup)
        || !leader.link_report().connected
    {
        return format!(
            "refused: the backup (member {}) is not linked and in sync now: wait until `decree status` on it says caught up",
            backup.member.get()
        );
    }
    *answers.switchover.target.lock() = Some(backup);
    let _ = answers.switchover.stop.send(true);
    format!(
        "switching over: member {} stops leading epoch {} once what is in flight is answered; member {} (in sync) takes the lead",
        node.member.get(),
        node.seen,
        backup.member.get()
    )
}

/// Under an election, leads `epoch` on etcd: an elected member's acts wait for its lease
/// from the start; a forced one (the operator's, etcd gone) records its epoch once etcd
/// answers, fenced from then on. Either steps down through `primary` when the lead is lost.
fn lead_on_etcd(
    election: &Option<Arc<pair_election::Election>>,
    state: &Arc<State>,
    primary: &Arc<PrimaryLink>,
    epoch: Epoch,
    forced: bool,
    stop: watch::Receiver<bool>,
) {
    let fence = pair_election::fence(election);
    if !forced {
        if let Some(fence) = fence {
            state.set_fence(fence);
        }
        pair_election::lead(election, primary, epoch, stop);
        return;
    }
    let fencing = state.clone();
    let fenced = Box::new(move || {
        if let Some(fence) = fence {
            fencing.set_fence(fence);
        }
    });
    pair_election::record_forced(election, primary, epoch, fenced, stop);
}

/// The channel `crate::serve` reports its listeners on; `answer` goes to the operator's
/// `decree promote` once they are bound, so that a client told "promoted" connects at once.
fn answer_once_listening(
    reply: Option<oneshot::Sender<String>>,
    answer: String,
) -> std::sync::mpsc::Sender<(Bound, u32, u64)> {
    let (listening, bound_rx) = std::sync::mpsc::channel::<(Bound, u32, u64)>();
    tokio::task::spawn_blocking(move || {
        if let (Ok(_), Some(reply)) = (bound_rx.recv(), reply) {
            let _ = reply.send(answer);
        }
    });
    listening
}

/// Where this member's clients connect, as `NotPrimary` names it (`tcp:` first).
fn clients_address(config: &ServerConfig) -> String {
    match (&config.tcp, &config.unix) {
        (Some(addr), _) => format!("tcp:{addr}"),
        (None, Some(path)) => format!("unix:{}", path.display()),
        (None, None) => String::new(),
    }
}

/// A backup waiting to lead.
struct Waiting<'a> {
    follower: &'a Arc<Follower>,
    factories: &'a [Arc<dyn RmFactory>],
    node: u32,
    /// Whether etcd elects this pair's primary (the operator's unforced promotion is then
    /// refused: the election decides).
    elected: bool,
}

impl Waiting<'_> {
    /// Waits for the operator's promotion or etcd's election (`won`); `None` on a stop.
    async fn promotion(
        &self,
        mut promote_rx: mpsc::Receiver<PromoteRequest>,
        mut won: mpsc::Receiver<Epoch>,
        stop_rx: &mut watch::Receiver<bool>,
        mut signals: Option<crate::Signals>,
    ) -> Option<Promoted> {
        loop {
            tokio::select! {
                _ = crate::wait_for_stop(stop_rx, &mut signals) => return None,
                Some(epoch) = won.recv() => {
                    let asked = (std::time::SystemTime::now(), std::time::Instant::now());
                    match self.follower.promote_elected(epoch) {
                        Ok(node) => return Some(Promoted { node, asked, forced: false, reply: None }),
                        // Its leader key lapses with no one behind it; the other member (or
                        // this one, restarted) campaigns again above the newer epoch.
                        Err(e) => tracing::error!(%epoch, error = %e, "elected on etcd but cannot lead that epoch"),
                    }
                }
                Some((forced, reply)) = promote_rx.recv() => {
                    if self.elected && !forced {
                        let why = "refused: this pair elects its primary on etcd ([pair.etcd]); `decree promote --force` \
                                   only if etcd is gone for good";
                        let _ = reply.send(why.to_string());
                        continue;
                    }
                    // When the operator asked, not when the member started: `decree status`
                    // shows how long ago it was promoted and how long the promotion took.
                    let asked = (std::time::SystemTime::now(), std::time::Instant::now());
                    let listing = (self.factories.to_vec(), self.node);
                    let prepared = tokio::task::spawn_blocking(move || prepared_highest(&listing.0, listing.1))
                        .await
                        .unwrap_or(Epoch::NONE);
                    match self.follower.promote(forced, prepared) {
                        Ok(node) => return Some(Promoted { node, asked, forced, reply: Some(reply) }),
                        Err(e) => { let _ = reply.send(format!("refused: {e}")); }
                    }
                }
            }
        }
    }
}

/// How the link proves each member to the other: TLS with the pair's certificates, or the
/// pair's secret (validation refuses a pair with neither).
fn link_transport(pair: &PairConfig) -> Result<Arc<dyn Transport>, ServerError> {
    Ok(match (&pair.tls, &pair.secret_file) {
        (Some(tls), _) => Arc::new(crate::link_tls::LinkTls::load(tls)?),
        (None, Some(secret)) => Arc::new(crate::link_secret::SharedSecret(Arc::new(
            crate::link_secret::LinkSecret::load(secret)?,
        ))),
        (None, None) => unreachable!("validate_pair refuses a pair whose link is not authenticated"),
    })
}

/// The newest incarnation among node `node`'s prepared branches in the resource managers.
/// A promotion mints above it, so that the branches of an epoch this member never heard of
/// (its leader's disk was lost, then this member was forced to lead) are an older
/// incarnation's to it, which recovery rolls back, instead of a newer one's, which nobody
/// ever would (issue 32, defect 14). A resource manager that cannot be listed is named in
/// the log and skipped: its branches of such an epoch stay prepared.
pub(crate) fn prepared_highest(factories: &[Arc<dyn RmFactory>], node: u32) -> Epoch {
    let mut highest = Epoch::NONE;
    for factory in factories {
        match factory.connect().and_then(|mut rm| rm.recover()) {
            Ok(prepared) => {
                let ours = prepared.iter().filter_map(|x| x.origin()).filter(|o| o.node == node);
                highest = ours.map(|o| Epoch::from_raw(o.incarnation)).fold(highest, Epoch::max);
            }
            Err(e) => tracing::warn!(
                rm = factory.name(),
                error = %e,
                "the promotion cannot list this resource manager's prepared branches: branches of an epoch \
                 this member never heard of, if it holds any, will stay prepared"
            ),
        }
    }
    highest
}

/// Keeps the link address `link` this member's as a primary: an old primary that dials it
/// learns of the new epoch at its first contact and steps down (issue 32, defects 8 to 10).
async fn listen_as_primary(leader: &Arc<Leader>, link: std::net::SocketAddr, stop: &watch::Receiver<bool>) {
    match TcpListener::bind(link).await {
        Ok(listener) => {
            tokio::spawn(leader.clone().listen(listener, stop.clone()));
        }
        Err(e) => tracing::error!(
            %link,
            error = %e,
            "cannot listen on pair.link as the primary: an old primary that still runs will not learn of this epoch from it"
        ),
    }
}

/// What a deposition does: record the newer epoch in `PAIR` of `dir` on `storage` (over
/// `pair_state`, the member's last record), then stop the server through `stop`.
pub(crate) struct Deposed {
    pub(crate) stop: Arc<watch::Sender<bool>>,
    pub(crate) storage: Arc<dyn decree_log::io::Storage>,
    pub(crate) dir: PathBuf,
    pub(crate) pair_state: decree_pair::PairState,
}

/// How a primary's link is opened and bounded: the transport (TLS, the pair's secret or
/// plaintext), the outbox's bounds and the stall rule's bound (`pair.link_stall_ms`).
pub(crate) struct LinkSetup {
    /// Turns each connection into the link's stream.
    pub(crate) transport: Arc<dyn Transport>,
    /// The outbox's bounds.
    pub(crate) limits: OutboxLimits,
    /// How long the link may wait for the backup with nothing heard (decree-pair's
    /// `link::stall`).
    pub(crate) stall: std::time::Duration,
}

/// The primary phase of a member whose promotion made `node` lead, over `state` (opened
/// with the new epoch as its incarnation): the leader, its link as `link` says, and the
/// commit path's link to it; a deposition does what `deposed` says. Its link counts go on
/// from `backup_link` (this member's as a backup). `decree serve` and the pair's
/// simulator (`decree-sim`) both start a primary here.
pub(crate) fn lead(
    state: &Arc<State>,
    node: decree_pair::rules::Node,
    node_id: u32,
    link: LinkSetup,
    deposed: Deposed,
    backup_link: &decree_pair::link::LinkReport,
) -> Arc<PrimaryLink> {
    let on_deposed = deposition(deposed);
    start_link(state, node, node_id, link, on_deposed, backup_link)
}

/// The leader of the epoch `node` leads and the commit path's link to it, for `state`; its
/// link counts go on from `backup_link` (this member's as a backup).
fn start_link(
    state: &Arc<State>,
    node: decree_pair::rules::Node,
    node_id: u32,
    link: LinkSetup,
    on_deposed: Box<dyn Fn(Epoch) + Send + Sync>,
    backup_link: &decree_pair::link::LinkReport,
) -> Arc<PrimaryLink> {
    let shared = Arc::new(LinkShared {
        state: Arc::downgrade(state),
        leader: std::sync::OnceLock::new(),
        pending: Mutex::new(HashMap::new()),
        overflow: Mutex::new(VecDeque::new()),
        abandoned: AtomicBool::new(false),
        deposed: Mutex::new(None),
        on_deposed,
    });
    let leader = Leader::new(node, node_id, link.limits, shared.clone())
        .with_transport(link.transport)
        .with_stall(link.stall)
        .with_link_totals(backup_link);
    let leader = Arc::new(leader);
    let _ = shared.leader.set(Arc::downgrade(&leader));
    let primary = Arc::new(PrimaryLink { leader, shared, next_ticket: AtomicU64::new(1) });
    state.set_pair(primary.clone());
    primary
}

/// Stops a task when dropped (the metrics endpoint, when the member stops).
struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

/// Binds the metrics endpoint of `config` (if any) for the member's whole run: the pair's
/// figures in every role, the state server's too once it leads.
async fn serve_metrics(
    config: &ServerConfig,
    member: Arc<Mutex<Member>>,
    election: Option<Arc<pair_election::Election>>,
) -> Result<(Option<std::net::SocketAddr>, AbortOnDrop), ServerError> {
    let Some(addr) = config.metrics else { return Ok((None, AbortOnDrop(None))) };
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| ServerError::Io(format!("cannot listen for metrics on {addr}: {e}")))?;
    let bound = listener.local_addr().ok();
    let render: crate::metrics::Render = Arc::new(move |format| {
        let (figures, state) = {
            let member = member.lock();
            let state = match &*member {
                Member::Primary(_, _, state) => state.upgrade(),
                _ => None,
            };
            (pair_figures(&member), state)
        };
        let mut out = state.map(|state| crate::metrics::render(&state, format)).unwrap_or_default();
        crate::metrics::render_pair(&mut out, figures.as_ref());
        pair_election::render_metrics(&mut out, &election);
        out
    });
    Ok((bound, AbortOnDrop(Some(tokio::spawn(crate::metrics::serve(listener, render))))))
}

/// Decisions whose answer waits for the backup: every pending one, those the outbox could
/// not take yet and those whose local write is still on its way included (`in_outbox`, the
/// leader's count, while the state is gone at shutdown).
fn decisions_waiting(state: &Weak<State>, in_outbox: usize) -> usize {
    state.upgrade().and_then(|state| state.pair().map(|link| link.waiting())).unwrap_or(in_outbox)
}

/// The member's figures for the metrics; `None` while it changes role.
fn pair_figures(member: &Member) -> Option<PairFigures> {
    let (node, report, role) = match member {
        Member::Backup(follower, _) => {
            let node = follower.node();
            let role = PairRole::Backup { caught_up: node.caught_up, live_decisions: follower.live_count() };
            (node, follower.link_report(), role)
        }
        Member::Primary(leader, _, state) => {
            let (node, lag) = (leader.node(), leader.lag());
            let role = PairRole::Primary {
                strict: node.role == (Role::Primary { alone: false }),
                lag_records: lag.records,
                lag: lag.oldest.unwrap_or_default(),
                decisions_waiting: decisions_waiting(state, lag.tickets),
            };
            (node, leader.link_report(), role)
        }
        Member::Changing => return None,
    };
    Some(PairFigures {
        member: node.member.get(),
        epoch_raw: node.seen.raw(),
        link_connected: report.connected,
        link_opens_total: report.opens_total,
        link_ends_total: report.ends_total,
        role,
    })
}

/// Serves the backup's link on the server's runtime or, when it busy-polls, on a thread of
/// its own; the handle resolves when the link's serving ends.
fn serve_follower(
    follower: &Arc<Follower>,
    link: TcpListener,
    stop: watch::Receiver<bool>,
    busy_poll_us: u64,
) -> Result<tokio::task::JoinHandle<()>, ServerError> {
    if busy_poll_us == 0 {
        return Ok(tokio::spawn(follower.clone().serve(link, stop)));
    }
    let cannot =
        |e: std::io::Error| ServerError::Io(format!("cannot start the link's busy-polling thread: {e}"));
    let link = link.into_std().map_err(cannot)?;
    let thread = follower.clone().serve_on_own_thread(link, stop).map_err(cannot)?;
    Ok(tokio::task::spawn_blocking(move || {
        let _ = thread.join();
    }))
}

/// The backup's side of this member: its log and outcome memory as the replica's copy,
/// acknowledging as `pair.ack` says, accepting links through `transport`.
fn open_follower(
    config: &ServerConfig,
    log_config: &decree_log::LogConfig,
    pair: &PairConfig,
    transport: Arc<dyn Transport>,
    run: u64,
) -> Result<Arc<Follower>, ServerError> {
    let log = decree_log::open(log_config)?;
    // The backup keeps the outcomes the primary remembers, in the file its own state opens
    // once promoted.
    let capacity = config.limits.outcomes_remembered_max;
    let outcomes = crate::open_outcomes(log_config, None, capacity, crate::OUTCOME_FLUSH_DELAY)?;
    let follower = follow(config, pair, Arc::from(log), outcomes, Arc::new(StdStorage))?
        .with_transport(transport)
        .with_run(run)
        .with_busy_poll(std::time::Duration::from_micros(pair.busy_poll_us));
    Ok(Arc::new(follower))
}

/// The backup's side of member `pair.member` over `log` and `outcomes` (its copy), with
/// its `PAIR` in the log directory on `storage`, acknowledging as `pair.ack` says.
/// `decree serve` and the pair's simulator (`decree-sim`) both open a backup here.
pub(crate) fn follow(
    config: &ServerConfig,
    pair: &PairConfig,
    log: Arc<dyn decree_log::Log>,
    outcomes: decree_log::outcomes::OutcomeMemory,
    storage: Arc<dyn decree_log::io::Storage>,
) -> Result<Follower, ServerError> {
    let member_id = MemberId::new(pair.member).expect("validated");
    let replica = Replica::open(log).with_outcomes(outcomes);
    let follower = Follower::open(member_id, config.node, replica, storage, config.log_dir.clone())
        .map_err(|e| ServerError::Io(format!("pair state: {e}")))?;
    let ack = match pair.ack {
        PairAck::Durable => AckMode::Durable,
        PairAck::Received => AckMode::Received,
    };
    Ok(follower.with_ack_mode(ack).with_stall(pair.link_stall()))
}

/// What a leader does when a newer epoch deposes it: record that epoch in `PAIR` (so that
/// after a restart it is refused at once), then stop the server.
fn deposition(deposed: Deposed) -> Box<dyn Fn(Epoch) + Send + Sync> {
    let Deposed { stop, storage, dir, pair_state } = deposed;
    let state = Mutex::new(pair_state);
    Box::new(move |seen| {
        let mut current = state.lock();
        if seen > current.seen {
            let next = decree_pair::PairState { seen, ..*current };
            match decree_pair::state_file::store(storage.as_ref(), &dir, Some(&current), &next) {
                Ok(()) => *current = next,
                Err(e) => tracing::error!(error = %e, "cannot record the newer epoch"),
            }
        }
        tracing::error!(%seen, "deposed by a newer epoch: stopping; restart this member to rejoin as a backup");
        let _ = stop.send(true);
    })
}

/// A backup's client listeners, each answered by a task that hands it back when told.
struct Refusing {
    stop: watch::Sender<bool>,
    unix: Option<tokio::task::JoinHandle<UnixListener>>,
    tcp: Option<tokio::task::JoinHandle<TcpListener>>,
}

impl Refusing {
    /// Stops refusing and returns the listeners, still bound, for the primary phase.
    async fn hand_over(self) -> Prebound {
        let _ = self.stop.send(true);
        let unix = match self.unix {
            Some(task) => task.await.ok(),
            None => None,
        };
        let tcp = match self.tcp {
            Some(task) => task.await.ok(),
            None => None,
        };
        Prebound { unix, tcp }
    }
}

/// Accepts on `listener` until `stop`, giving each connection to `answer`; returns the
/// listener, still bound.
async fn accept_until<L: Accepting>(
    listener: L,
    mut stop: watch::Receiver<bool>,
    answer: impl Fn(L::Stream),
) -> L {
    loop {
        tokio::select! {
            accepted = listener.accept_one() => match accepted {
                Ok(stream) => answer(stream),
                // Out of descriptors, say: the next accept may succeed, this one is lost.
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
            },
            // The only change is the stop (and a sender gone is one too).
            _ = stop.changed() => return listener,
        }
    }
}

/// A client listener of either kind, for [`accept_until`].
trait Accepting {
    type Stream;
    async fn accept_one(&self) -> std::io::Result<Self::Stream>;
}

impl Accepting for UnixListener {
    type Stream = tokio::net::UnixStream;
    async fn accept_one(&self) -> std::io::Result<Self::Stream> {
        self.accept().await.map(|(stream, _)| stream)
    }
}

impl Accepting for TcpListener {
    type Stream = tokio::net::TcpStream;
    async fn accept_one(&self) -> std::io::Result<Self::Stream> {
        self.accept().await.map(|(stream, _)| stream)
    }
}

/// The client listeners of a backup: every connection gets `NotPrimary` and is closed.
async fn refuse_clients(config: &ServerConfig, pair: &PairConfig) -> Result<(Bound, Refusing), ServerError> {
    let why = match &pair.peer_clients {
        Some(peer) => {
            format!("this server is a backup member of a pair: its primary serves clients (try {peer})")
        }
        None => "this server is a backup member of a pair: its primary serves clients".to_string(),
    };
    let mut bound = Bound::default();
    let (stop, stopped) = watch::channel(false);
    let mut refusing = Refusing { stop, unix: None, tcp: None };
    if let Some(path) = &config.unix {
        let listener = crate::bind_unix(path)?;
        bound.unix = Some(path.clone());
        let why = why.clone();
        refusing.unix = Some(tokio::spawn(accept_until(listener, stopped.clone(), move |stream| {
            tokio::spawn(refuse_one(stream, why.clone()));
        })));
    }
    if let Some(addr) = config.tcp {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| ServerError::Io(format!("cannot listen on tcp {addr}: {e}")))?;
        bound.tcp = listener.local_addr().ok();
        let tls = config.tls.as_ref().map(crate::tls::TlsListener::load).transpose()?.map(Arc::new);
        refusing.tcp = Some(tokio::spawn(accept_until(listener, stopped, move |stream| match &tls {
            Some(tls) => {
                tokio::spawn(refuse_over_tls(stream, tls.clone(), why.clone()));
            }
            None => {
                tokio::spawn(refuse_one(stream, why.clone()));
            }
        })));
    }
    Ok((bound, refusing))
}

/// A backup's TLS client listener: the `NotPrimary` answer goes inside TLS, to a client
/// that proved itself like any other (a plaintext client is told TLS is required).
async fn refuse_over_tls(stream: tokio::net::TcpStream, tls: Arc<crate::tls::TlsListener>, why: String) {
    use crate::tls::Upgraded;
    let bound = std::time::Duration::from_secs(5);
    match tokio::time::timeout(bound, tls.upgrade(stream)).await {
        Ok(Ok(Upgraded::Tls(stream, _))) => refuse_one(*stream, why).await,
        Ok(Ok(Upgraded::Plaintext(stream))) => {
            let why = "this listener requires TLS: connect with tls:host:port and a client certificate";
            crate::tls::refuse_plaintext(stream, why.into()).await;
        }
        Ok(Ok(Upgraded::Closed)) | Ok(Err(_)) | Err(_) => {}
    }
}

/// Answers one client connection with `NotPrimary` after its first bytes, then closes.
async fn refuse_one<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut stream: S, why: String) {
    let mut first = [0u8; 64];
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), stream.read(&mut first)).await;
    let mut buf = Vec::new();
    let message = decree_proto::Message::Error { code: decree_proto::ErrorCode::NotPrimary, message: why };
    decree_proto::encode_frame(&mut buf, 0, &message);
    let _ = stream.write_all(&buf).await;
    let _ = stream.shutdown().await;
}

/// Removes the backup phase's client socket (the primary phase binds its own).
fn remove_socket(bound: &Bound) {
    if let Some(path) = &bound.unix {
        let _ = std::fs::remove_file(path);
    }
}

/// Binds the control socket in the log directory with mode 0600.
fn bind_control(dir: &Path) -> Result<UnixListener, ServerError> {
    crate::bind_unix(&dir.join(CONTROL_SOCKET))
}

/// Answers `status` and `promote [--force]`, one line each, for `decree status` and
/// `decree promote` (and, in a build with the `crash-points` feature, `crash-point
/// <name>:<nth>`, which arms a crash point: see `crash_points.rs`).
async fn serve_control(
    listener: UnixListener,
    answers: ControlAnswers,
    promote: mpsc::Sender<PromoteRequest>,
) {
    while let Ok((stream, _)) = listener.accept().await {
        let (answers, promote) = (answers.clone(), promote.clone());
        let member = answers.member.clone();
        tokio::spawn(async move {
            let (reader, mut writer) = stream.into_split();
            let mut line = String::new();
            let mut reader = BufReader::new(reader.take(CONTROL_LINE_BYTES_MAX));
            if reader.read_line(&mut line).await.is_err() {
                return;
            }
            let answer = match line.trim() {
                "status" => {
                    let pause = pair_election::pause_status(&answers.election).await;
                    status_line(&member.lock(), &answers.election, pause)
                }
                "switchover" => switchover_request(&answers),
                "cluster" => pair_election::cluster(&answers.election).await,
                "pause" => pair_election::set_paused(&answers.election, true).await,
                "resume" => pair_election::set_paused(&answers.election, false).await,
                "promote" | "promote --force" => {
                    let forced = line.trim().ends_with("--force");
                    let already = match &*member.lock() {
                        Member::Primary(leader, ..) => Some(leader.node().seen),
                        _ => None,
                    };
                    match already {
                        Some(epoch) => format!("refused: this member already leads epoch {epoch}"),
                        None => {
                            let (tx, rx) = oneshot::channel();
                            if promote.send((forced, tx)).await.is_err() {
                                "refused: the server is stopping".to_string()
                            } else {
                                rx.await.unwrap_or_else(|_| "refused: the server is stopping".to_string())
                            }
                        }
                    }
                }
                // Only in a build with the `crash-points` feature (the pair kill loop's).
                #[cfg(feature = "crash-points")]
                request if request.starts_with("crash-point ") => {
                    let spec = request.trim_start_matches("crash-point ");
                    crash_points::arm(spec).unwrap_or_else(|e| format!("refused: {e}"))
                }
                other => {
                    format!(
                        "refused: unknown request {other:?} (status, cluster, promote, promote --force, switchover, pause, resume)"
                    )
                }
            };
            let _ = writer.write_all(format!("{answer}\n").as_bytes()).await;
        });
    }
}

/// What the control socket reports on.
#[derive(Clone)]
struct ControlAnswers {
    member: Arc<Mutex<Member>>,
    election: Option<Arc<pair_election::Election>>,
    switchover: Arc<Switchover>,
}

/// The member's state as one JSON line: role, epoch, whether the peer is in sync, the
/// link, the replication lag (on a primary), this member's promotion and its election.
fn status_line(
    member: &Member,
    election: &Option<Arc<pair_election::Election>>,
    pause: Option<serde_json::Value>,
) -> String {
    let (node, report, mut status) = match member {
        Member::Backup(follower, ack) => {
            let node = follower.node();
            let status = serde_json::json!({
                "role": "backup",
                "ack": match ack { PairAck::Durable => "durable", PairAck::Received => "received" },
                "live_decisions": follower.live_count(),
                "busy_poll_us": follower.busy_poll().as_micros() as u64,
                "busy_poll_turns": follower.busy_poll_turns(),
            });
            (node, follower.link_report(), status)
        }
        Member::Primary(leader, promotion, state) => {
            let node = leader.node();
            let lag = leader.lag();
            let waiting = decisions_waiting(state, lag.tickets);
            let at_ms =
                promotion.at.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
            let status = serde_json::json!({
                "role": "primary",
                "strict": node.role == (Role::Primary { alone: false }),
                "lag": {
                    "records": lag.records,
                    "decisions_waiting": waiting,
                    "oldest_ms": lag.oldest.map(|d| d.as_secs_f64() * 1e3),
                },
                "promotion": {
                    "at_unix_ms": at_ms,
                    "took_ms": promotion.took.as_secs_f64() * 1e3,
                    "forced": promotion.forced,
                },
            });
            (node, leader.link_report(), status)
        }
        Member::Changing => return "{\"role\":\"changing\"}".to_string(),
    };
    let common = serde_json::json!({
        "member": node.member.get(),
        "epoch": node.seen.to_string(),
        "epoch_raw": node.seen.raw(),
        "caught_up": node.caught_up,
        "link": { "connected": report.connected, "last_end": report.last_end },
        "rm_calls": crate::rm_calls::json(),
    });
    if let (Some(status), serde_json::Value::Object(common)) = (status.as_object_mut(), common) {
        status.extend(common);
        if let Some(mut etcd) = pair_election::status(election) {
            if let (Some(etcd), Some(serde_json::Value::Object(pause))) = (etcd.as_object_mut(), pause) {
                etcd.extend(pause);
            }
            status.insert("etcd".into(), etcd);
        }
    }
    status.to_string()
}

/// Sends one control request to the server whose log is in `dir` and returns its answer
/// (what `decree promote` and `decree status` do).
pub fn control_request(dir: &Path, request: &str) -> Result<String, ServerError> {
    use std::io::{BufRead, Write};
    let path = dir.join(CONTROL_SOCKET);
    let mut stream = std::os::unix::net::UnixStream::connect(&path).map_err(|e| {
        ServerError::Io(format!(
            "cannot reach the pair member's control socket {}: {e} (is it running?)",
            path.display()
        ))
    })?;
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .map_err(|e| ServerError::Io(e.to_string()))?;
    stream.write_all(format!("{request}\n").as_bytes()).map_err(|e| ServerError::Io(e.to_string()))?;
    let mut answer = String::new();
    std::io::BufReader::new(stream).read_line(&mut answer).map_err(|e| ServerError::Io(e.to_string()))?;
    Ok(answer.trim_end().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use decree_core::Origin;
    use decree_log::EngineKind;
    use decree_pair::link::{LinkReport, Plaintext};

    /// A strict primary's link over a fresh log in `dir`, built as `lead` builds it (no
    /// backup dials in: nothing confirms).
    fn strict_primary(dir: &Path, limits: OutboxLimits) -> (Arc<State>, Arc<PrimaryLink>) {
        let member = MemberId::new(1).expect("not 0");
        let epoch = Epoch::mint(member, &[]);
        let config = ServerConfig::new(dir, EngineKind::Journal);
        let log_config = config.log_config().expect("a valid log config");
        let state = crate::open_state(&config, &log_config, Vec::new(), None, Some(epoch.raw()))
            .expect("the state opens");
        let state = Arc::new(state);
        let node = rules::Node {
            member,
            seen: epoch,
            role: Role::Primary { alone: false },
            caught_up: false,
            next_sequence: 1,
        };
        let setup = LinkSetup {
            transport: Arc::new(Plaintext),
            limits,
            stall: decree_pair::link::stall::LINK_STALL_DEFAULT,
        };
        let link = start_link(&state, node, 1, setup, Box::new(|_| {}), &LinkReport::default());
        (state, link)
    }

    /// The connection a decide's answer holds open, while its `accept` is kept.
    fn accept_holding(connection: &Arc<()>) -> Accept {
        let connection = connection.clone();
        Box::new(move |_| drop(connection))
    }

    /// Regression (the 1,000-cycle elected kill loop, cycles 222 and 798: a switchover's old
    /// primary never stopped): a connection's reader can take a decide it read before the
    /// stop after the stop's one `abandon_pending`. Its answer was kept waiting for a backup
    /// that was gone, so its connection never ended, and the stopping server waited for
    /// every connection for good while its lease lapsed.
    #[test]
    fn a_decide_taken_after_the_pending_were_abandoned_is_answered_by_nobody_at_once() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (state, link) = strict_primary(dir.path(), OutboxLimits::default());
        let xid =
            |sequence| Xid::decree(Origin { node: 1, incarnation: state.incarnation, session: 1, sequence });

        // Before the stop, a decide waits for the backup (the test can tell).
        let before = Arc::new(());
        let ticket = link.ship_before_write(&state, xid(1), b"d1").expect("strict: shipped first");
        link.written(&state, ticket, accept_holding(&before));
        assert_eq!(link.waiting(), 1);
        assert_eq!(Arc::strong_count(&before), 2, "kept until the backup confirms");

        link.abandon_pending();
        assert_eq!(Arc::strong_count(&before), 1, "abandoned at the stop");

        // After it, both paths of a strict decide let the answer go at once.
        let shipped_first = Arc::new(());
        let ticket = link.ship_before_write(&state, xid(2), b"d2").expect("strict: shipped first");
        link.written(&state, ticket, accept_holding(&shipped_first));
        let written_first = Arc::new(());
        link.after_local_write(&state, xid(3), b"d3".to_vec(), accept_holding(&written_first));
        assert_eq!(Arc::strong_count(&shipped_first), 1, "shipped before its write: not kept");
        assert_eq!(Arc::strong_count(&written_first), 1, "shipped after its write: not kept");
        assert_eq!(link.waiting(), 0);
    }

    /// Regression (the operator pair kill loop in CI, 2026-11-28: an acknowledged transfer
    /// answered `Unknown` by the new primary): a full outbox dropped a finished decision's
    /// outcome, its completion shipped once there was room, and the backup forgot the
    /// decision with no outcome to answer from. The completion now follows its outcome.
    #[test]
    fn a_completion_ships_only_when_its_outcome_did() {
        let xid = |sequence| Xid::decree(Origin { node: 1, incarnation: 1, session: 1, sequence });
        // Nothing acknowledges: one batch in flight and one being filled, then refusals.
        let full = tempfile::tempdir().expect("a temporary directory");
        let tiny = OutboxLimits { batch_records_max: 1, batch_bytes_max: 1 << 20, unacked_batches_max: 1 };
        let (_state, link) = strict_primary(full.path(), tiny);
        let shipped: Vec<bool> = (1..=3).map(|s| link.ship_outcome(&xid(s), 1)).collect();
        assert_eq!(shipped, [true, true, false], "a full outbox drops a lazy outcome, and says so");

        let roomy = tempfile::tempdir().expect("a temporary directory");
        let (_state, link) = strict_primary(roomy.path(), OutboxLimits::default());
        link.ship_completion(&xid(3), false);
        assert_eq!(link.leader.lag().records, 0, "the outcome was dropped: the completion stays home");
        link.ship_completion(&xid(4), true);
        assert_eq!(link.leader.lag().records, 1, "the outcome was shipped: so is the completion");
    }
}
