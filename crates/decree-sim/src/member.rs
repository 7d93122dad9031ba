//! A pair member in the simulation: its disk, its process (down, a backup, a primary) and
//! the loop that runs it, which is a model of `decree serve`'s tokio tasks around the real
//! code.
//!
//! Real: the backup is `decree_server::sim_api::follow` (decree-pair's `Follower` over the
//! member's log and outcome memory), a promotion is `Follower::promote` followed by
//! `SimPrimary::lead` over the reopened log (what `pair.rs` does), every frame goes through
//! the sans-IO steps of `Leader` and `Follower`, every decide through the server's commit
//! path, every recovery pass through the server's. Modelled here, as closely as the
//! runtime does it: the follower's accept loop (one link served at a time, the others
//! accepted and closed while one is served, waiting in the backlog while the member is
//! paused; a log failure stops it for good), the leader's dial loop
//! (redial 100 ms after a link ends, none after a deposition), the recovery thread's
//! schedule, the outcome memory's 5 ms flush, and a deposed primary's shutdown (no new
//! request; the decides in flight finish; then the process exits).

use crate::client::ServerSession;
use crate::disk::SimLog;
use crate::world::{Event, Time, World, MS};
use decree_log::io::Storage;
use decree_log::outcomes::OutcomeMemory;
use decree_log::testing::fault::{CrashMode, FaultStorage};
use decree_log::{EngineKind, Log};
use decree_pair::link::follower::{AckMode, DurableSink, Follower, FollowerLink};
use decree_pair::link::leader::{Leader, LeaderLink, REDIAL_DELAY};
use decree_pair::link::stall::StallWatch;
use decree_pair::link::{LinkEnd, LinkStep};
use decree_pair::{Epoch, MemberId, Role};
use decree_server::config::{PairAck, PairConfig, ServerConfig};
use decree_server::sim_api::{Lead, SimPrimary};
use parking_lot::Mutex;
use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// A virtual time as the stall rule's clock reads it.
fn micros(t: Time) -> Duration {
    Duration::from_micros(t)
}

/// The node id both members share.
pub const NODE: u32 = 7;

/// Frames a member reads from one inbox before it lets the others run.
const FRAMES_PER_TURN: usize = 16;

/// How often the outcome memory flushes (`decree serve`'s `OUTCOME_FLUSH_DELAY`).
const OUTCOME_FLUSH_EVERY: Time = 5 * MS;

/// Replicated outcome records a backup takes before its memory is flushed at once (the
/// memory flushes on its own thread at 256, which the simulation must not let happen).
const OUTCOME_RECORDS_PER_FLUSH: usize = 64;

/// How long a link's TCP keepalive takes to end a connection whose peer is gone (idle
/// 2 s, then 3 probes 1 s apart: `decree-pair`'s `link` module).
const TCP_KEEPALIVE_DEAD: Time = 5_000 * MS;

/// One of the two members.
pub struct Member {
    /// 0 or 1 (member id 1 or 2).
    pub index: usize,
    /// Its disk: the `PAIR` file, the outcome memory and the log.
    pub disk: FaultStorage,
    /// Its process's life: each start is a new one; events of an older life are dropped.
    pub life: u64,
    /// What runs.
    pub proc: Proc,
    /// Paused (SIGSTOP) until then.
    pub paused_until: Option<Time>,
    /// A disk turn is scheduled.
    pub disk_turn_due: bool,
    /// Why its last link ended, for the diagnosis of a liveness failure.
    pub last_end: Option<String>,
    /// When it last led (promotion, until it stopped leading).
    pub led_at: Option<Time>,
    /// Its process's part in the election on etcd (elected runs).
    pub candidacy: crate::election::Candidacy,
    /// When its current process started: a `received` backup that started after a
    /// decision was decided may have lost it with its previous process (the oracle).
    pub started_at: Time,
    /// When its disk was last lost (elected runs): it lost every decision decided before.
    pub disk_lost_at: Option<Time>,
}

/// A member's process.
pub enum Proc {
    /// Not running (crashed, or stopped after a deposition).
    Down,
    /// A backup: its follower and the link it serves.
    Backup(Box<BackupProc>),
    /// A primary: its server, its leader and its link.
    Primary(Box<PrimaryProc>),
}

/// A backup's process.
pub struct BackupProc {
    /// The real follower.
    pub follower: Arc<Follower>,
    /// Its log (the replica appends to it).
    pub log: Arc<SimLog>,
    /// The link being served.
    pub served: Option<Served>,
    /// Connections accepted by the kernel and not yet taken by the member (a paused member
    /// takes none); taken while a link is served, they are closed.
    pub backlog: VecDeque<u64>,
    /// The follower stopped serving after its log failed (fail-stop).
    pub failed: bool,
    /// Outcome records replicated since the memory's last flush.
    pub outcome_records: usize,
}

/// The durability reports of a served link's batches: sequence, and the log's error.
pub type Reports = Arc<Mutex<Vec<(u64, Result<(), String>)>>>;

/// The link a backup serves.
pub struct Served {
    /// Its connection.
    pub conn: u64,
    /// The sans-IO state (taken out while a step runs).
    pub link: Option<FollowerLink>,
    /// The log's durability reports of this link's batches.
    pub reports: Reports,
    /// The follower's stall rule on this link (decree-pair's `link::stall`).
    pub watch: StallWatch,
}

/// A primary's process.
pub struct PrimaryProc {
    /// The real server.
    pub server: SimPrimary,
    /// Its leader.
    pub leader: Arc<Leader>,
    /// Its log.
    pub log: Arc<SimLog>,
    /// The link to the backup: its connection and sans-IO state.
    pub link: Option<(u64, Option<LeaderLink>)>,
    /// When the current link opened.
    pub link_opened_at: Time,
    /// Connections another member dialled to this one's link address, waiting for their
    /// `Hello` (the listener `decree serve` keeps as a primary: `Leader::on_dialled`).
    pub dialled: Vec<u64>,
    /// The leader's stall rule on the current link (decree-pair's `link::stall`).
    pub link_watch: StallWatch,
    /// The leader's run ended (deposed, or its storage failed): no more dials.
    pub leader_done: bool,
    /// Set by the server's deposition.
    pub stop: watch::Receiver<bool>,
    /// Shutting down after a deposition.
    pub stopping: bool,
    /// When its shutdown began.
    pub stopped_at: Time,
    /// Decide answers the server still holds (neither given nor dropped): `decree serve`
    /// waits for every connection, so a stopping primary exits only once none is left.
    pub answers_out: Arc<AtomicUsize>,
    /// Its exit is scheduled.
    pub exiting: bool,
    /// Promoted with `--force`.
    pub forced: bool,
    /// When it was promoted.
    pub promoted_at: Time,
    /// The epoch it leads.
    pub epoch: Epoch,
    /// Its clients' sessions, by the client's connection token.
    pub sessions: BTreeMap<u64, ServerSession>,
    /// A switchover stopped it: the backup process it hands the lead to once it exited.
    pub handing: Option<decree_pair::link::leader::BackupRun>,
}

impl Member {
    /// Member `index`, never started, on an empty disk.
    pub fn new(index: usize, disk_seed: u64) -> Member {
        Member {
            index,
            disk: FaultStorage::new(disk_seed),
            life: 0,
            proc: Proc::Down,
            paused_until: None,
            disk_turn_due: false,
            last_end: None,
            led_at: None,
            candidacy: Default::default(),
            started_at: 0,
            disk_lost_at: None,
        }
    }

    /// Its id in the pair.
    pub fn id(&self) -> MemberId {
        MemberId::new(self.index as u8 + 1).expect("1 or 2")
    }

    /// Its log directory.
    pub fn dir(&self) -> PathBuf {
        PathBuf::from(format!("/member{}", self.index + 1))
    }

    /// Whether it is paused (SIGSTOP).
    pub fn paused(&self) -> bool {
        self.paused_until.is_some()
    }

    /// Its log, if it runs.
    pub fn log(&self) -> Option<&Arc<SimLog>> {
        match &self.proc {
            Proc::Down => None,
            Proc::Backup(b) => Some(&b.log),
            Proc::Primary(p) => Some(&p.log),
        }
    }

    /// The highest epoch it has seen, if it runs.
    pub fn seen(&self) -> Option<Epoch> {
        match &self.proc {
            Proc::Down => None,
            Proc::Backup(b) => Some(b.follower.node().seen),
            Proc::Primary(p) => Some(p.leader.node().seen),
        }
    }

    /// Whether it runs as a primary that still leads in its own eyes (not stopping).
    pub fn leading(&self) -> bool {
        matches!(&self.proc, Proc::Primary(p) if !p.stopping && p.leader.node().leads().is_some())
    }

    /// A line on its state, for a diagnosis.
    pub fn describe(&self) -> String {
        let paused = if self.paused() { ", paused" } else { "" };
        match &self.proc {
            Proc::Down => "down".to_string(),
            Proc::Backup(b) => {
                let node = b.follower.node();
                format!(
                    "backup (seen {}, caught up {}, serving {:?}, {} waiting{}{paused})",
                    node.seen,
                    node.caught_up,
                    b.served.as_ref().map(|s| s.conn),
                    b.backlog.len(),
                    if b.failed { ", stopped serving" } else { "" }
                )
            }
            Proc::Primary(p) => {
                let node = p.leader.node();
                format!(
                    "primary (leads {:?} of {}, link {:?}, {} decides wait for the backup, {} records in the outbox{}{}{paused})",
                    node.role,
                    p.epoch,
                    p.link.as_ref().map(|(c, _)| *c),
                    p.server.waiting(),
                    p.leader.lag().records,
                    if p.stopping { ", stopping" } else { "" },
                    if p.leader_done { ", leader done" } else { "" }
                )
            }
        }
    }

    /// Whether it runs as a backup that says it holds everything its primary holds.
    pub fn caught_up(&self) -> bool {
        matches!(&self.proc, Proc::Backup(b) if b.follower.node().caught_up)
    }
}

/// The configuration of member `index` in `scenario`.
fn config(member: &Member, scenario: &crate::world::Scenario) -> ServerConfig {
    let mut config = ServerConfig::new(member.dir(), EngineKind::Journal);
    config.node = NODE;
    config.limits.outcomes_remembered_max = scenario.outcomes_max;
    let address = |i: usize| format!("127.0.0.1:{}", 9000 + i).parse().expect("an address");
    config.pair = Some(PairConfig {
        member: member.id().get(),
        link: address(member.index),
        peer_link: address(1 - member.index),
        peer_clients: None,
        ack: match scenario.ack {
            AckMode::Durable => PairAck::Durable,
            AckMode::Received => PairAck::Received,
        },
        tls: None,
        // The simulator carries frames itself, through no transport; a real member's
        // configuration needs one of the two.
        secret_file: None,
        busy_poll_us: 0,
        link_stall_ms: decree_server::config::LINK_STALL_MS_DEFAULT,
        // The operator promotes here; the election's rules run against the model of etcd
        // in decree-pair's own tests.
        etcd: None,
    });
    config
}

impl World {
    /// Starts member `index`'s process as a backup over its disk.
    pub fn start_backup(&mut self, index: usize) {
        let member = &self.members[index];
        assert!(matches!(member.proc, Proc::Down), "start a member that is down");
        let storage: Arc<dyn Storage> = Arc::new(member.disk.clone());
        let (dir, config) = (member.dir(), config(member, &self.scenario));
        let opened = SimLog::open(&storage, &dir).map(Arc::new).and_then(|log| {
            let outcomes = OutcomeMemory::open(
                storage.clone(),
                &dir,
                self.scenario.outcomes_max,
                Duration::from_secs(3600),
            )?;
            Ok((log, outcomes))
        });
        // Under an election each process names itself by its run id in its `Hello`.
        let run = self.etcd.is_some().then(|| ((member.life + 1) << 8) | (index as u64 + 1));
        let follower = opened.map_err(|e| e.to_string()).and_then(|(log, outcomes)| {
            let follower =
                decree_server::sim_api::follow(&config, log.clone() as Arc<dyn Log>, outcomes, storage);
            let follower = follower.map(|f| match run {
                Some(run) => f.with_run(run),
                None => f,
            });
            follower.map(|f| (Arc::new(f), log)).map_err(|e| e.to_string())
        });
        let (follower, log) = match follower {
            Ok(opened) => opened,
            Err(why) => {
                let now = self.now;
                self.oracle.violate(
                    now,
                    crate::Invariant::Start,
                    None,
                    format!("member {} cannot start: {why}", index + 1),
                );
                return;
            }
        };
        let member = &mut self.members[index];
        member.life += 1;
        member.started_at = self.now;
        member.disk_turn_due = false;
        let seen = follower.node().seen;
        member.proc = Proc::Backup(Box::new(BackupProc {
            follower,
            log,
            served: None,
            backlog: VecDeque::new(),
            failed: false,
            outcome_records: 0,
        }));
        let life = member.life;
        self.machine_back(index);
        self.note(|| format!("member {} starts as a backup (seen {seen})", index + 1));
        self.after(OUTCOME_FLUSH_EVERY, Event::OutcomeFlush { member: index, life });
        if self.etcd.is_some() {
            self.candidacy_starts(index);
            assert_eq!(run, Some(self.members[index].candidacy.run), "the follower names this process");
        }
    }

    /// The operator's `decree promote [--force]` of member `index`: the rules decide, then
    /// the member leads as `pair.rs` makes it. Returns whether it was promoted.
    pub fn promote(&mut self, index: usize, forced: bool, why: &str) -> bool {
        let Proc::Backup(backup) = &self.members[index].proc else { return false };
        let follower = backup.follower.clone();
        // As `pair.rs` does: above the newest incarnation among this node's prepared branches.
        let prepared =
            decree_server::sim_api::prepared_highest(&self.databases.factories(index as u8 + 1), NODE);
        let node = match follower.promote(forced, prepared) {
            Ok(node) => node,
            Err(e) => {
                let line = format!("member {}: promotion refused: {e}", index + 1);
                self.note(|| line);
                return false;
            }
        };
        drop(follower);
        self.take_lead(index, node, forced, why)
    }

    /// Backup `index`, whose rules now lead (`node`), becomes a primary as `pair.rs` makes
    /// it after a promotion or an election. Returns whether it leads.
    pub fn take_lead(
        &mut self,
        index: usize,
        node: decree_pair::rules::Node,
        forced: bool,
        why: &str,
    ) -> bool {
        let Proc::Backup(backup) = std::mem::replace(&mut self.members[index].proc, Proc::Down) else {
            unreachable!("checked")
        };
        let BackupProc { follower, log, served, backlog, .. } = *backup;
        // The follower stops: the link it served and those waiting close.
        for conn in served.map(|s| s.conn).into_iter().chain(backlog) {
            self.close(conn, index);
        }
        let pair_state = follower.pair_state();
        assert_eq!(Arc::strong_count(&follower), 1, "the follower is released before its log reopens");
        drop(follower);
        log.flush(); // The log's owner closes it: what is queued is written.
        drop(log);
        let member = &self.members[index];
        let storage: Arc<dyn Storage> = Arc::new(member.disk.clone());
        let (dir, config) = (member.dir(), config(member, &self.scenario));
        let log = Arc::new(SimLog::open(&storage, &dir).expect("the log reopens"));
        let outcomes =
            OutcomeMemory::open(storage.clone(), &dir, self.scenario.outcomes_max, Duration::from_secs(3600))
                .expect("the outcome memory reopens");
        let (stop_tx, stop) = watch::channel(false);
        let factories = self.databases.factories(member.id().get());
        let lead = Lead {
            config,
            log: log.clone(),
            outcomes,
            factories,
            node,
            limits: self.scenario.limits,
            storage,
            pair_state,
            stop: Arc::new(stop_tx),
        };
        let server = SimPrimary::lead(lead);
        let leader = server.leader();
        let stall = leader.stall();
        let epoch = node.seen;
        let life = self.members[index].life;
        self.members[index].proc = Proc::Primary(Box::new(PrimaryProc {
            server,
            leader,
            log,
            link: None,
            link_opened_at: 0,
            dialled: Vec::new(),
            link_watch: StallWatch::new(stall, Duration::ZERO),
            leader_done: false,
            stop,
            stopping: false,
            stopped_at: 0,
            answers_out: Arc::new(AtomicUsize::new(0)),
            exiting: false,
            forced,
            promoted_at: self.now,
            epoch,
            sessions: BTreeMap::new(),
            handing: None,
        }));
        self.members[index].led_at = Some(self.now);
        self.promotions += 1;
        let now = self.now;
        let other_leads = self.members[1 - index].leading();
        self.oracle.promoted(now, epoch, other_leads);
        self.note(|| {
            format!(
                "member {} promoted{} to lead {epoch}: {why}",
                index + 1,
                if forced { " (forced)" } else { "" }
            )
        });
        self.after(1, Event::Recovery { member: index, life, periodic: true });
        self.after(1, Event::Dial { member: index, life });
        true
    }

    /// Member `index`'s process dies: killed (its writes reach the disk, its sockets are
    /// closed by the kernel) or its machine loses power (what was not synced is lost or
    /// torn as `mode` says, and nobody is told).
    pub fn crash(&mut self, index: usize, power_loss: Option<CrashMode>) {
        if matches!(self.members[index].proc, Proc::Down) {
            return;
        }
        let member = &mut self.members[index];
        // The crashed disk first: the dying process's objects write to the old one.
        member.disk = member.disk.crash_with(power_loss.unwrap_or(CrashMode::KeepUnsynced));
        member.paused_until = None;
        let old = std::mem::replace(&mut member.proc, Proc::Down);
        match power_loss {
            // Elected runs model the link's TCP keepalive (`decree-pair`'s link: 2 s idle,
            // then 3 probes 1 s apart): the peer's end of a link to a machine that lost
            // power ends within 5 s. Operator runs leave it out, so that their census stays.
            Some(_) if self.etcd.is_some() => {
                let peers = self.conns_of(index);
                self.power_lost(index);
                for conn in peers {
                    self.after(TCP_KEEPALIVE_DEAD, Event::Notice { conn, to: 1 - index });
                }
            }
            Some(_) => self.power_lost(index),
            None => {
                for conn in self.conns_of(index) {
                    self.close(conn, index);
                }
            }
        }
        self.crashes += 1;
        let what = match power_loss {
            Some(mode) => format!("loses power ({mode:?})"),
            None => "is killed".to_string(),
        };
        self.note(|| format!("member {} {what}", index + 1));
        self.sessions_lost(index, power_loss.is_some());
        drop(old);
    }

    /// A primary's shutdown begins (deposed, or switching over): it takes no new request
    /// (but a decide its connection read just before, `LATE_READ`), its link ends, nobody
    /// answers the decides waiting for the backup, and those whose write is on its way
    /// finish.
    pub(crate) fn begin_stop(&mut self, index: usize, why: &str) {
        let Proc::Primary(p) = &mut self.members[index].proc else { return };
        p.stopping = true;
        p.stopped_at = self.now;
        p.server.abandon_pending();
        let link = p.link.as_ref().map(|(conn, _)| *conn);
        p.leader_done = true;
        let line = format!("member {} {why}", index + 1);
        self.note(|| line);
        // The leader's run ends with the stop (`Leader::run`): nothing confirms any more.
        if let Some(conn) = link {
            self.link_ended(index, conn, LinkEnd::Stopped("stopped".into()));
        }
    }

    /// A stopping primary's shutdown ends: its memory and log are synced, it exits.
    pub fn exit(&mut self, index: usize, life: u64) {
        let member = &mut self.members[index];
        if member.life != life {
            return;
        }
        let Proc::Primary(p) = &member.proc else { return };
        let handing = p.handing;
        let _ = p.server.sync_outcomes();
        p.log.flush();
        member.proc = Proc::Down;
        member.led_at = None;
        for conn in self.conns_of(index) {
            self.close(conn, index);
        }
        self.sessions_lost(index, false);
        self.note(|| format!("member {} exited", index + 1));
        if self.etcd.is_some() {
            self.rejoin(index, handing);
        }
    }

    /// The member's log writes and syncs what is queued.
    pub fn disk_turn(&mut self, index: usize, life: u64) {
        let member = &mut self.members[index];
        if member.life != life {
            return;
        }
        if let Some(until) = member.paused_until {
            self.schedule(until, Event::DiskTurn { member: index, life });
            return;
        }
        member.disk_turn_due = false;
        let Some(log) = member.log().cloned() else { return };
        let failed = log.failed();
        log.flush();
        if !failed && log.failed() {
            self.oracle.log_failed(index, life);
            self.note(|| format!("member {}: its log failed (fail-stop)", index + 1));
        }
    }

    /// The member's outcome memory flushes; the next flush is scheduled.
    pub fn outcome_flush(&mut self, index: usize, life: u64) {
        let member = &mut self.members[index];
        if member.life != life {
            return;
        }
        if let Some(until) = member.paused_until {
            self.schedule(until, Event::OutcomeFlush { member: index, life });
            return;
        }
        match &mut member.proc {
            Proc::Down => return,
            Proc::Backup(b) => {
                let _ = b.follower.sync_outcomes();
                b.outcome_records = 0;
            }
            Proc::Primary(p) => {
                let _ = p.server.sync_outcomes();
            }
        }
        self.after(OUTCOME_FLUSH_EVERY, Event::OutcomeFlush { member: index, life });
    }

    /// The member's recovery worker passes (a primary's); the next pass is scheduled.
    pub fn recovery(&mut self, index: usize, life: u64, periodic: bool) {
        let member = &self.members[index];
        if member.life != life {
            return;
        }
        if let Some(until) = member.paused_until {
            self.schedule(until, Event::Recovery { member: index, life, periodic });
            return;
        }
        let Proc::Primary(p) = &member.proc else { return };
        if p.stopping {
            return;
        }
        if !self.may_act(index) {
            // The fence: no resource manager call while the lease is not provably alive.
            if periodic {
                let next = self.rng.range(50, 400) * MS;
                self.after(next, Event::Recovery { member: index, life, periodic });
            }
            return;
        }
        let Proc::Primary(p) = &self.members[index].proc else { unreachable!("checked") };
        let (now, epoch) = (self.now, p.epoch);
        self.oracle.acts(now, index, epoch, || "runs a recovery pass".to_string());
        let Proc::Primary(p) = &self.members[index].proc else { unreachable!("checked") };
        let clean = p.server.recovery_pass();
        let _ = p.server.sync_outcomes();
        let line = format!("member {} recovery pass: {clean:?}", index + 1);
        self.note(|| line);
        if periodic {
            let next = self.rng.range(50, 400) * MS;
            self.after(next, Event::Recovery { member: index, life, periodic });
        }
    }

    /// One turn of member `index`: its durability reports, the frames waiting for it, its
    /// stop signal and its disk. Returns whether it did anything.
    pub fn member_turn(&mut self, index: usize) -> bool {
        if self.members[index].paused() {
            return false;
        }
        let progress = match &self.members[index].proc {
            Proc::Down => return false,
            Proc::Backup(_) => self.backup_turn(index),
            Proc::Primary(_) => self.primary_turn(index),
        };
        let member = &mut self.members[index];
        let life = member.life;
        if !member.disk_turn_due && member.log().is_some_and(|log| log.has_queued()) {
            member.disk_turn_due = true;
            let latency = if self.rng.chance(20) {
                self.rng.range(5 * MS, 30 * MS)
            } else {
                self.rng.range(100, 3 * MS)
            };
            self.after(latency, Event::DiskTurn { member: index, life });
        }
        progress
    }

    fn backup_turn(&mut self, index: usize) -> bool {
        let Proc::Backup(b) = &mut self.members[index].proc else { unreachable!("a backup") };
        let follower = b.follower.clone();
        if b.served.is_some() && !b.backlog.is_empty() {
            // The real follower's accept loop runs beside the served link and closes every
            // other connection at once (issue 32, defect 11).
            for conn in std::mem::take(&mut b.backlog) {
                self.link_ended(
                    index,
                    conn,
                    LinkEnd::Refused(format!("refused link {conn}: a link is open")),
                );
            }
            return true;
        }
        let Proc::Backup(b) = &mut self.members[index].proc else { unreachable!("a backup") };
        let Some(served) = &mut b.served else {
            if b.failed {
                return false;
            }
            return self.serve_next(index);
        };
        let conn = served.conn;
        let mut watch = served.watch;
        let deadline = watch.deadline();
        let reports = std::mem::take(&mut *served.reports.lock());
        let mut link = served.link.take().expect("the link is in place between steps");
        let mut progress = !reports.is_empty();
        let mut end = None;
        for (sequence, result) in reports {
            let step = follower.on_durable(&mut link, sequence, result);
            if let Some(e) = self.carry(conn, index, step) {
                end = Some(e);
                break;
            }
        }
        while end.is_none() && link.wants_frames() {
            let Some(frame) = self.take_frames(conn, index, 1).pop() else { break };
            progress = true;
            watch.heard(micros(self.now));
            let outcomes = match &frame {
                decree_pair::wire::LinkMessage::Batch { records, .. } => {
                    records.iter().filter(|r| r.kind == decree_pair::RecordKind::Outcome).count()
                }
                _ => 0,
            };
            if let Some(seen) = follower.newer_epoch(&link, &frame) {
                if let Err(e) = follower.persist_seen(seen) {
                    end = Some(e);
                    break;
                }
            }
            let step = follower.on_frame(&mut link, frame);
            end = self.carry(conn, index, step);
            self.replicated_outcomes(index, outcomes);
        }
        let Proc::Backup(b) = &mut self.members[index].proc else { unreachable!("still a backup") };
        match end {
            Some(end) => {
                drop(link);
                self.link_ended(index, conn, end);
            }
            None => {
                watch.waits(follower.awaits_primary(&link), micros(self.now));
                let served = b.served.as_mut().expect("served");
                served.link = Some(link);
                served.watch = watch;
                if watch.deadline() != deadline {
                    self.stall_timer(index, conn, watch);
                }
            }
        }
        progress
    }

    /// Counts replicated outcome records, flushing the memory before its own thread would.
    fn replicated_outcomes(&mut self, index: usize, records: usize) {
        let Proc::Backup(b) = &mut self.members[index].proc else { return };
        b.outcome_records += records;
        if b.outcome_records >= OUTCOME_RECORDS_PER_FLUSH {
            let _ = b.follower.sync_outcomes();
            b.outcome_records = 0;
        }
    }

    /// A backup with no link served takes the next accepted connection.
    fn serve_next(&mut self, index: usize) -> bool {
        let Proc::Backup(b) = &mut self.members[index].proc else { return false };
        let Some(conn) = b.backlog.pop_front() else { return false };
        let reports: Reports = Arc::default();
        let sink_reports = reports.clone();
        let sink: DurableSink =
            Arc::new(move |sequence, result| sink_reports.lock().push((sequence, result)));
        let (link, hello) = b.follower.open_link(sink);
        let watch = StallWatch::new(b.follower.stall(), micros(self.now));
        b.served = Some(Served { conn, link: Some(link), reports, watch });
        self.stall_timer(index, conn, watch);
        self.note(|| format!("member {} serves link {conn}", index + 1));
        self.send(conn, index, vec![hello]);
        true
    }

    fn primary_turn(&mut self, index: usize) -> bool {
        let Proc::Primary(p) = &mut self.members[index].proc else { unreachable!("a primary") };
        let mut progress = false;
        if !p.stopping && *p.stop.borrow() {
            self.begin_stop(index, "was deposed: stopping");
            progress = true;
        }
        let Proc::Primary(p) = &mut self.members[index].proc else { unreachable!("a primary") };
        let answered = p.answers_out.load(Ordering::Relaxed) == 0;
        if p.stopping && !p.exiting && !p.log.has_queued() && answered {
            p.exiting = true;
            let life = self.members[index].life;
            let delay = self.rng.range(100, 2 * MS);
            self.after(delay, Event::Exit { member: index, life });
        }
        progress |= self.answer_dialled(index);
        let Proc::Primary(p) = &mut self.members[index].proc else { unreachable!("a primary") };
        if self.etcd.is_some() && !p.stopping {
            progress |= self.record_caught_up(index);
        }
        let Proc::Primary(p) = &mut self.members[index].proc else { unreachable!("a primary") };
        let Some((conn, slot)) = &mut p.link else { return progress };
        let conn = *conn;
        let leader = p.leader.clone();
        let mut link = slot.take().expect("the link is in place between steps");
        let mut watch = p.link_watch;
        let mut end = None;
        let frames = self.take_frames(conn, index, FRAMES_PER_TURN);
        progress |= !frames.is_empty();
        let deadline = watch.deadline();
        if !frames.is_empty() {
            watch.heard(micros(self.now));
        }
        for frame in frames {
            let step = leader.on_frame(&mut link, frame);
            if let Some(e) = self.carry(conn, index, step) {
                end = Some(e);
                break;
            }
        }
        if end.is_none() {
            end = leader.outlived_alone(&link);
        }
        if end.is_none() {
            let frames = leader.poll_send(&mut link);
            watch.waits(link.awaits_backup(), micros(self.now));
            progress |= !frames.is_empty();
            self.send(conn, index, frames);
        }
        match end {
            Some(end) => self.link_ended(index, conn, end),
            None => {
                if let Proc::Primary(p) = &mut self.members[index].proc {
                    p.link_watch = watch;
                    if let Some((_, slot)) = &mut p.link {
                        *slot = Some(link);
                    }
                }
                if watch.deadline() != deadline {
                    self.stall_timer(index, conn, watch);
                }
            }
        }
        progress || self.has_frames(conn, index)
    }

    /// Sends a step's frames; returns the link's end if the step ends it.
    fn carry(&mut self, conn: u64, index: usize, step: LinkStep) -> Option<LinkEnd> {
        if self.tracing() {
            for frame in &step.send {
                let line = format!("member {} sends on {conn}: {frame:?}", index + 1);
                self.note(|| crate::net::shorten(&line));
            }
        }
        self.send(conn, index, step.send);
        step.end
    }

    /// The link on `conn` ended at member `index`'s end (or the connection was refused,
    /// or closed while it waited in the backlog).
    pub fn link_ended(&mut self, index: usize, conn: u64, end: LinkEnd) {
        self.close(conn, index);
        let why = end.to_string();
        let line = format!("member {}: link {conn} ended: {why}", index + 1);
        self.note(|| line);
        let member = &mut self.members[index];
        let life = member.life;
        match &mut member.proc {
            Proc::Down => {}
            Proc::Backup(b) => {
                if b.served.as_ref().is_some_and(|s| s.conn == conn) {
                    b.served = None;
                    member.last_end = Some(why);
                    if let LinkEnd::Storage(_) = end {
                        self.follower_stopped(index);
                    }
                } else {
                    b.backlog.retain(|&c| c != conn);
                }
            }
            Proc::Primary(p) => {
                p.dialled.retain(|&c| c != conn);
                if p.link.as_ref().is_some_and(|(c, _)| *c == conn) {
                    p.link = None;
                    member.last_end = Some(why);
                    match end {
                        LinkEnd::Stopped(_) | LinkEnd::Storage(_) => p.leader_done = true,
                        _ => {
                            self.after(REDIAL_DELAY.as_micros() as Time, Event::Dial { member: index, life })
                        }
                    }
                }
            }
        }
    }

    /// The follower's serving ended for good (its log failed): its listener closes, the
    /// connections waiting are reset.
    fn follower_stopped(&mut self, index: usize) {
        let Proc::Backup(b) = &mut self.members[index].proc else { return };
        b.failed = true;
        let waiting: Vec<u64> = b.backlog.drain(..).collect();
        for conn in waiting {
            self.close(conn, index);
        }
        self.note(|| format!("member {}: the backup stops serving links (its log failed)", index + 1));
    }

    /// A primary's leader dials its backup.
    pub fn dial(&mut self, index: usize, life: u64) {
        let member = &self.members[index];
        if member.life != life {
            return;
        }
        if let Some(until) = member.paused_until {
            self.schedule(until, Event::Dial { member: index, life });
            return;
        }
        let Proc::Primary(p) = &member.proc else { return };
        if p.leader_done || p.link.is_some() || p.stopping {
            return;
        }
        if let Some(until) = self.net.partitioned_until.filter(|&until| self.now < until) {
            // The connection's SYN is retransmitted until the network heals.
            let delay = self.net_delay();
            self.schedule(until + delay, Event::Dial { member: index, life });
            return;
        }
        let target = 1 - index;
        let listening = matches!(&self.members[target].proc, Proc::Primary(t) if !t.stopping);
        let accepting = matches!(&self.members[target].proc, Proc::Backup(b) if !b.failed);
        if !listening && !accepting {
            let line = format!("member {}: cannot reach the backup (refused)", index + 1);
            self.note(|| line);
            self.after(REDIAL_DELAY.as_micros() as Time, Event::Dial { member: index, life });
            return;
        }
        let conn = self.connect(index, target);
        let Proc::Primary(p) = &mut self.members[index].proc else { unreachable!("checked") };
        let (link, hello) = p.leader.open_link();
        p.link = Some((conn, Some(link)));
        p.link_opened_at = self.now;
        p.link_watch = StallWatch::new(p.leader.stall(), micros(self.now));
        let watch = p.link_watch;
        self.stall_timer(index, conn, watch);
        match &mut self.members[target].proc {
            // A primary's link listener: it answers the hello and closes.
            Proc::Primary(t) => t.dialled.push(conn),
            Proc::Backup(b) => b.backlog.push_back(conn),
            Proc::Down => unreachable!("checked"),
        }
        let what = if listening { "dials a primary" } else { "opens a link" };
        self.note(|| format!("member {} {what}: link {conn} to member {}", index + 1, target + 1));
        self.send(conn, index, vec![hello]);
    }

    /// A primary answers the members that dialled its link address: the first frame of
    /// each goes to `Leader::on_dialled`, its answer is sent, and the connection closes.
    fn answer_dialled(&mut self, index: usize) -> bool {
        let Proc::Primary(p) = &mut self.members[index].proc else { return false };
        let (dialled, leader) = (p.dialled.clone(), p.leader.clone());
        let mut progress = false;
        for conn in dialled {
            let Some(frame) = self.take_frames(conn, index, 1).pop() else { continue };
            progress = true;
            let step = leader.on_dialled(frame);
            let end = self.carry(conn, index, step);
            let line = format!("member {} answered a dial on {conn}: {end:?}", index + 1);
            self.note(|| line);
            self.close(conn, index);
            if let Proc::Primary(p) = &mut self.members[index].proc {
                p.dialled.retain(|&c| c != conn);
            }
        }
        progress
    }

    /// Wakes member `index` when the link on `conn` stalls unless its peer is heard first
    /// (decree-pair's stall rule, as the tokio loops' timers).
    fn stall_timer(&mut self, index: usize, conn: u64, watch: StallWatch) {
        let life = self.members[index].life;
        if let Some(deadline) = watch.deadline() {
            let at = (deadline.as_micros() as Time).max(self.now);
            self.schedule(at, Event::LinkTimer { member: index, life, conn });
        }
    }

    /// The stall timer of member `index`'s link on `conn`: ends the link if it still
    /// waits for its peer and nothing was heard for the stall bound.
    pub fn link_timer(&mut self, index: usize, life: u64, conn: u64) {
        let member = &self.members[index];
        if member.life != life {
            return;
        }
        if let Some(until) = member.paused_until {
            self.schedule(until, Event::LinkTimer { member: index, life, conn });
            return;
        }
        let now = micros(self.now);
        let (watch, peer) = match &member.proc {
            Proc::Primary(p) if p.link.as_ref().is_some_and(|(c, link)| *c == conn && link.is_some()) => {
                (p.link_watch, "backup")
            }
            Proc::Backup(b) if b.served.as_ref().is_some_and(|s| s.conn == conn && s.link.is_some()) => {
                (b.served.as_ref().expect("checked").watch, "primary")
            }
            _ => return,
        };
        if watch.stalled(now) {
            self.link_ended(index, conn, watch.end(peer));
        }
    }

    /// Member `index` stops (SIGSTOP) for `duration`.
    pub fn pause(&mut self, index: usize, duration: Time) {
        let member = &mut self.members[index];
        if matches!(member.proc, Proc::Down) || member.paused() {
            return;
        }
        member.paused_until = Some(self.now + duration);
        self.schedule(self.now + duration, Event::Resume { member: index });
        self.note(|| format!("member {} paused for {} ms", index + 1, duration / MS));
    }

    /// A paused member continues.
    pub fn resume(&mut self, index: usize) {
        let member = &mut self.members[index];
        if member.paused_until.is_some_and(|until| until <= self.now) {
            member.paused_until = None;
            self.note(|| format!("member {} continues", index + 1));
        }
    }

    /// Whether member `index` leads in strict mode.
    pub fn strict(&self, index: usize) -> bool {
        matches!(&self.members[index].proc, Proc::Primary(p) if p.leader.node().role == Role::Primary { alone: false })
    }
}
