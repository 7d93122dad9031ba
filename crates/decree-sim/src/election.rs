//! A member's side of the election on etcd in the simulation (issue 33): a model of
//! `decree serve`'s `election.rs` tasks around decree-pair's pure rules, which it calls
//! as they are (`campaign`, `record_sync`, `lease_alive`, `SyncRecord::led_by` inside
//! `campaign`).
//!
//! Each start of a member is a new process with a new run id (given to its follower with
//! `with_run`, so that its `Hello` carries it) and a new lease, granted and registered at
//! start, renewed every quarter TTL on the member's own (drifting) clock. A backup reads
//! the pair's keys every [`POLL`] (the runtime's watch on the leader key, with its delay)
//! and campaigns when the leader key is absent; on winning it is promoted with
//! `Follower::promote_elected` and leads as an operator's promotion makes it. A leader
//! records each backup process that catches up (`Leader::caught_up_backups`) with
//! `record_sync`, retried while etcd does not answer, and steps down (`pair.rs`'s
//! step-down) when that write fails, its lease is gone or the leader key names another.
//! A member that stepped down (or was deposed on the link) rejoins as a backup in a new
//! process, as `decree serve` does under an election. With `alone_after_ms`
//! ([`crate::etcd::Elected::alone_after`]), a strict leader whose decisions have waited that long for the
//! backup records the backup out of sync (`record_sync` naming itself alone) and, once that
//! is written, goes alone (`PrimaryLink::go_alone`); the sync record's writes go one at a
//! time, as `election.rs`'s `lead` awaits each.
//!
//! The fence ([`World::may_act`]): a leader acknowledges, answers a known `Outcome` and
//! runs a recovery pass only while `lease_alive` holds on its own clock, from when its
//! last keepalive that etcd answered was sent. Held answers go when a keepalive succeeds
//! again, or never (it stepped down: the connection closes unanswered).
//!
//! A switchover ([`World::switchover`], issue 34) is `pair.rs`'s: refused unless the
//! leader is strict with the backup process recorded in sync the last to catch up on an
//! open link; then the server stops (fence ended, nothing waiting answered) and, once it
//! exited, sends decree-pair's `hand_over` as it is, revokes its lease and rejoins.
//!
//! Not modelled: the watch itself (a poll every [`POLL`] stands for it), a keepalive's
//! wait for its answer before the next (keepalives go every quarter TTL regardless); the
//! alone check measures how long decisions have waited without a break (the runtime takes
//! the oldest unacknowledged record's age), every [`POLL`] (the runtime every 50 ms).

use crate::client::Held;
use crate::etcd::{Answer, Break, Call, MARGIN, REQUEST_TIMEOUT, TTL};
use crate::member::{Proc, NODE};
use crate::world::{Event, Time, World, MS};
use decree_pair::election::{self as rules, Candidate, InSync, LeaseId, Txn};
use decree_pair::link::leader::BackupRun;
use decree_pair::Epoch;
use tokio::sync::watch;

/// How often a backup reads the pair's keys and a leader its leader key (the watch's
/// delay, and the poll that backs it up).
pub const POLL: Time = 100 * MS;

/// Answers a leader's fence may hold (each client has one decide and a question or two
/// in flight: far below this).
const HELD_MAX: usize = 4096;

/// Nanoseconds per simulated microsecond.
const NS: u64 = 1_000;

/// One process's part in the election.
#[derive(Default)]
pub struct Candidacy {
    /// Its run id.
    pub run: u64,
    /// Its lease, once granted.
    pub lease: Option<LeaseId>,
    /// When its grant in flight was sent: one at a time, as `decree serve` awaits its
    /// grant (`Election::start`, and again after a lease found gone); an answer after the
    /// request's deadline is dropped with the request, and its lease lapses unused.
    pub granting: Option<Time>,
    /// Its clock (nanoseconds) when the last keepalive etcd answered was sent.
    pub sent: Option<u64>,
    /// It stepped down: its fence never opens again.
    pub ended: bool,
    /// A leader's: its leader key's value.
    pub record: Option<rules::Leader>,
    /// A leader's: the backup processes that catch up.
    pub caught_up: Option<watch::Receiver<Option<BackupRun>>>,
    /// A leader's: the sync record's write not answered yet, the backup process it names
    /// (none: the backup out of sync), and when it was last sent.
    pub unrecorded: Option<(Txn, Option<BackupRun>, Time)>,
    /// A strict leader's: since when decisions have waited for the backup without a break
    /// (`alone_after_ms` counts from there).
    pub waiting_since: Option<Time>,
    /// A leader's: the backup process last recorded in sync (`backup_in_sync` in
    /// `election.rs`: the only one a switchover hands the lead to).
    pub recorded: Option<BackupRun>,
    /// Answers its fence holds.
    pub held: Vec<Held>,
    /// A backup's: when it first read a switchover's sync record that names the other
    /// member first (the record's mod revision, the time): it campaigns only after that
    /// member's turn (`election.rs`'s `HandOverTurn`).
    pub hand_over_read: Option<(i64, Time)>,
}

/// A run id's name in etcd's records (as `decree serve` writes it).
pub fn run_name(run: u64) -> String {
    format!("{run:016x}")
}

impl World {
    /// Whether member `index` may act now: its lease provably lives on its own clock.
    /// Always, without an election (the operator's promotion is the fence there).
    pub fn may_act(&self, index: usize) -> bool {
        let Some(etcd) = &self.etcd else { return true };
        if etcd.broken(Break::FenceIgnored) {
            return true;
        }
        let candidacy = &self.members[index].candidacy;
        let now = etcd.clock_ns(index, self.now);
        !candidacy.ended
            && candidacy.sent.is_some_and(|sent| rules::lease_alive(sent, TTL * NS, MARGIN * NS, now))
    }

    /// A member's process started (elected runs): a new run id, a lease to take, the
    /// keepalive and the poll to start.
    pub fn candidacy_starts(&mut self, index: usize) {
        let member = &mut self.members[index];
        let run = (member.life << 8) | (index as u64 + 1);
        member.candidacy = Candidacy { run, ..Candidacy::default() };
        let life = member.life;
        self.after(0, Event::Keepalive { member: index, life });
        self.after(POLL, Event::Poll { member: index, life });
    }

    /// The lease's turn: a keepalive every quarter TTL on the member's clock, or a new
    /// lease when it has none.
    pub fn keepalive(&mut self, index: usize, life: u64) {
        let member = &self.members[index];
        if member.life != life || matches!(member.proc, Proc::Down) {
            return;
        }
        if let Some(until) = member.paused_until {
            self.schedule(until, Event::Keepalive { member: index, life });
            return;
        }
        let (lease, granting, now) = (member.candidacy.lease, member.candidacy.granting, self.now);
        let call = match lease {
            // One grant at a time: the one in flight is awaited until its deadline.
            None if granting.is_some_and(|at| now < at + REQUEST_TIMEOUT) => None,
            None => {
                self.members[index].candidacy.granting = Some(now);
                Some(Call::Grant)
            }
            Some(lease) => Some(Call::KeepAlive { lease, sent: self.etcd().clock_ns(index, now) }),
        };
        if let Some(call) = call {
            self.etcd_send(index, call);
        }
        let period = self.etcd().true_span(index, TTL / 4);
        self.after(period, Event::Keepalive { member: index, life });
    }

    /// The poll: a backup reads the keys to campaign, a leader its leader key; a leader's
    /// unanswered sync record write is sent again.
    pub fn poll(&mut self, index: usize, life: u64) {
        let member = &self.members[index];
        if member.life != life || matches!(member.proc, Proc::Down) {
            return;
        }
        if let Some(until) = member.paused_until {
            self.schedule(until, Event::Poll { member: index, life });
            return;
        }
        let (backup, leader) = match &member.proc {
            Proc::Backup(_) => (member.candidacy.lease.is_some(), false),
            Proc::Primary(p) => (false, !p.stopping),
            Proc::Down => (false, false),
        };
        let now = self.now;
        let resend = member.candidacy.unrecorded.clone().filter(|(_, _, at)| now >= at + REQUEST_TIMEOUT);
        if backup {
            self.etcd_send(index, Call::Read);
        }
        if leader {
            self.etcd_send(index, Call::ReadLeader);
            if let Some((txn, backup, _)) = resend {
                // `record_in_sync` retries while etcd does not answer.
                self.members[index].candidacy.unrecorded = Some((txn.clone(), backup, now));
                self.etcd_send(index, Call::RecordSync { txn, backup });
            }
            self.alone_check(index);
        }
        self.after(POLL, Event::Poll { member: index, life });
    }

    /// etcd's answer reaches member `index`.
    pub fn etcd_answer(&mut self, index: usize, life: u64, answer: Answer) {
        let member = &self.members[index];
        if member.life != life || matches!(member.proc, Proc::Down) {
            return;
        }
        if let Some(until) = member.paused_until {
            self.schedule(until, Event::EtcdAnswer { member: index, life, answer });
            return;
        }
        let leading = matches!(&member.proc, Proc::Primary(p) if !p.stopping);
        let backup = matches!(member.proc, Proc::Backup(_));
        let lease = member.candidacy.lease;
        match answer {
            Answer::Granted(lease) => {
                let now = self.now;
                let candidacy = &mut self.members[index].candidacy;
                let awaited = candidacy.lease.is_none()
                    && candidacy.granting.is_some_and(|at| now < at + REQUEST_TIMEOUT);
                if awaited {
                    candidacy.lease = Some(lease);
                    candidacy.sent = None;
                    candidacy.granting = None;
                } else {
                    let line =
                        format!("member {}: lease {lease} answered past its deadline: unused", index + 1);
                    self.note(|| line);
                }
            }
            // An answer about a lease this process no longer holds (it took a new one).
            Answer::KeptAlive { lease: of, .. } if Some(of) != lease => {}
            Answer::KeptAlive { sent, alive: true, .. } => {
                let candidacy = &mut self.members[index].candidacy;
                candidacy.sent = Some(candidacy.sent.map_or(sent, |s| s.max(sent)));
                self.release_held(index);
            }
            Answer::KeptAlive { alive: false, .. } if leading => {
                self.step_down(index, None, "its lease is gone")
            }
            Answer::KeptAlive { alive: false, .. } => {
                // A backup takes a new lease and registers again.
                self.members[index].candidacy.lease = None;
            }
            Answer::Viewed(view) if backup => self.campaign(index, view),
            Answer::Campaigned { epoch, won: true } => self.elected(index, epoch),
            Answer::Recorded { written, backup } if leading => {
                self.members[index].candidacy.unrecorded = None;
                if written {
                    self.members[index].candidacy.recorded = backup;
                    match backup {
                        Some(_) => {
                            self.note(|| format!("member {}: the backup is recorded in sync", index + 1))
                        }
                        None => self.go_alone(index, "the backup is recorded out of sync"),
                    }
                } else {
                    self.step_down(
                        index,
                        None,
                        "the sync record was refused: the leader key is not its lease's",
                    );
                }
            }
            Answer::LeaderIs(leader) if leading => {
                let own = self.members[index].candidacy.record.clone();
                if leader != own {
                    let newer = leader.as_ref().map(|l| Epoch::from_raw(l.epoch));
                    self.step_down(index, newer, "the leader key names another");
                }
            }
            _ => {}
        }
    }

    /// A backup read the keys: it campaigns if the rules let it.
    fn campaign(&mut self, index: usize, mut view: rules::View) {
        let Proc::Backup(backup) = &self.members[index].proc else { return };
        let candidacy = &self.members[index].candidacy;
        let Some(lease) = candidacy.lease else { return };
        let run = run_name(candidacy.run);
        let prepared =
            decree_server::sim_api::prepared_highest(&self.databases.factories(index as u8 + 1), NODE);
        let highest = backup.follower.highest_known();
        let member = self.members[index].id();
        if self.etcd().broken(Break::RunIdIgnored) {
            // The broken check: any process of a member named in sync counts as in sync.
            for named in view.sync.value.iter_mut().flat_map(|s| s.members.iter_mut()) {
                if named.member == member.get() {
                    named.run = run.clone();
                }
            }
        }
        if self.etcd().broken(Break::SinceIgnored) {
            // The broken check: the record's leader holds nothing, any log is enough.
            if let Some(sync) = view.sync.value.as_mut() {
                sync.since = Some(Epoch::NONE.raw());
            }
        }
        if self.etcd().broken(Break::ReturningLeaderRefused) {
            // The broken check: named in another process, the record's leader is not named.
            for sync in view.sync.value.iter_mut() {
                if Epoch::from_raw(sync.epoch).member() == Some(member) {
                    sync.members.retain(|named| named.member != member.get() || named.run == run);
                }
            }
        }
        if let Some(epoch) = rules::won(&view, member, &run) {
            self.note(|| {
                format!("member {}: the leader key names it: its campaign for {epoch} won", index + 1)
            });
            return self.elected(index, epoch);
        }
        let candidate = Candidate { member, run, lease, highest, prepared };
        let keys = self.etcd().keys.clone();
        let turn_over = self.hand_over_turn_over(index, &view);
        let campaign = if turn_over { rules::campaign_after_turn } else { rules::campaign };
        match campaign(&view, &candidate, &keys) {
            Ok((txn, epoch)) => {
                self.note(|| format!("member {} campaigns for {epoch}", index + 1));
                self.etcd_send(index, Call::Campaign { txn, epoch });
            }
            Err(rules::NotNow::Led(..)) => {}
            Err(why) => {
                let line = format!("member {} may not campaign: {why}", index + 1);
                self.note(|| line);
            }
        }
    }

    /// Whether the turn of the member a switchover's sync record names first is over for
    /// member `index` (`HAND_OVER_TURN_TTLS` lease TTLs since it first read the record;
    /// false when the record is no hand-over's), as `election.rs`'s `HandOverTurn` counts.
    fn hand_over_turn_over(&mut self, index: usize, view: &rules::View) -> bool {
        let now = self.now;
        let read = &mut self.members[index].candidacy.hand_over_read;
        if view.sync.value.as_ref().and_then(rules::SyncRecord::handed_to).is_none() {
            *read = None;
            return false;
        }
        let revision = view.sync.mod_revision;
        let (_, since) = match *read {
            Some((r, since)) if r == revision => (r, since),
            _ => *read.insert((revision, now)),
        };
        now - since >= TTL * u64::from(rules::HAND_OVER_TURN_TTLS)
    }

    /// Member `index` won `epoch`: promoted as `pair.rs` promotes an elected backup.
    fn elected(&mut self, index: usize, epoch: Epoch) {
        let Proc::Backup(backup) = &self.members[index].proc else { return };
        let node = match backup.follower.promote_elected(epoch) {
            Ok(node) => node,
            Err(e) => {
                let line = format!("member {}: elected to {epoch} but cannot lead it: {e}", index + 1);
                self.note(|| line);
                return;
            }
        };
        if !self.take_lead(index, node, false, "elected on etcd") {
            return;
        }
        let Proc::Primary(p) = &self.members[index].proc else { unreachable!("it leads") };
        let caught_up = p.leader.caught_up_backups();
        let candidacy = &mut self.members[index].candidacy;
        let record =
            rules::Leader { member: index as u8 + 1, run: run_name(candidacy.run), epoch: epoch.raw() };
        candidacy.record = Some(record);
        candidacy.caught_up = Some(caught_up);
    }

    /// A leader records the backup process that caught up, if one did since the last
    /// turn (`election.rs`'s `record_in_sync`). Returns whether it sent anything.
    pub fn record_caught_up(&mut self, index: usize) -> bool {
        let candidacy = &mut self.members[index].candidacy;
        if candidacy.unrecorded.is_some() {
            return false; // One write at a time: the runtime awaits each.
        }
        let Some(receiver) = candidacy.caught_up.as_mut() else { return false };
        if !receiver.has_changed().unwrap_or(false) {
            return false;
        }
        let Some(backup) = *receiver.borrow_and_update() else { return false };
        let (Some(record), Some(lease)) = (candidacy.record.clone(), candidacy.lease) else { return false };
        let in_sync = InSync { member: backup.member.get(), run: run_name(backup.run) };
        let keys = self.etcd().keys.clone();
        let mut txn = rules::record_sync(&keys, &record, lease, Some(in_sync));
        if self.etcd().broken(Break::LateSyncWrite) {
            // The broken write: no compare of the leader key's lease.
            txn.compares.clear();
        }
        self.members[index].candidacy.unrecorded = Some((txn.clone(), Some(backup), self.now));
        self.etcd_send(index, Call::RecordSync { txn, backup: Some(backup) });
        true
    }

    /// The alone check of a leader (`election.rs`'s `lead`, with `alone_after_ms`): once its
    /// decisions have waited that long for the backup while it is strict, it records the
    /// backup out of sync, and goes alone when that is written ([`World::etcd_answer`]).
    fn alone_check(&mut self, index: usize) {
        let Some(after) = self.etcd.as_ref().and_then(|e| e.elected.alone_after) else { return };
        let now = self.now;
        let member = &mut self.members[index];
        let Proc::Primary(p) = &member.proc else { return };
        let strict = p.leader.node().role == (decree_pair::Role::Primary { alone: false });
        let candidacy = &mut member.candidacy;
        if !strict || p.server.waiting() == 0 {
            candidacy.waiting_since = None;
            return;
        }
        let since = *candidacy.waiting_since.get_or_insert(now);
        if now - since < after || candidacy.unrecorded.is_some() || candidacy.ended {
            return;
        }
        let (Some(record), Some(lease)) = (candidacy.record.clone(), candidacy.lease) else { return };
        if self.etcd().broken(Break::AloneUnrecorded) {
            return self.go_alone(index, "decisions waited: alone without a record (broken rule)");
        }
        let keys = self.etcd().keys.clone();
        let mut txn = rules::record_sync(&keys, &record, lease, None);
        if self.etcd().broken(Break::LateAloneWrite) {
            txn.compares.clear();
        }
        let line = format!(
            "member {}: decisions waited {} ms: recording the backup out of sync",
            index + 1,
            (now - since) / MS
        );
        self.note(|| line);
        self.members[index].candidacy.unrecorded = Some((txn.clone(), None, now));
        self.etcd_send(index, Call::RecordSync { txn, backup: None });
    }

    /// A strict leader acknowledges alone from now on (`PrimaryLink::go_alone`).
    fn go_alone(&mut self, index: usize, why: &str) {
        let Proc::Primary(p) = &self.members[index].proc else { return };
        p.server.go_alone();
        self.members[index].candidacy.waiting_since = None;
        let line = format!("member {}: {why}: acknowledging alone", index + 1);
        self.note(|| line);
    }

    /// A leader steps down: its fence ends, its held answers go unanswered, and the server
    /// stops as a deposed one does (then rejoins as a backup).
    fn step_down(&mut self, index: usize, newer: Option<Epoch>, why: &str) {
        let Proc::Primary(p) = &self.members[index].proc else { return };
        p.server.step_down(newer);
        let candidacy = &mut self.members[index].candidacy;
        candidacy.ended = true;
        candidacy.held.clear();
        let line = format!("member {} steps down: {why}", index + 1);
        self.note(|| line);
    }

    /// A leader's process ended (elected runs): when a switchover stopped it, the lead goes
    /// to `handing` (`pair.rs`'s `stop_leading`); its lease is given up, and it rejoins the
    /// pair as a backup in a new process.
    pub fn rejoin(&mut self, index: usize, handing: Option<BackupRun>) {
        let Some(lease) = self.members[index].candidacy.lease else {
            return self.start_backup(index);
        };
        let handed = handing.is_some_and(|backup| self.hand_over(index, backup));
        if !handed {
            self.etcd_send(index, Call::Revoke { lease });
        }
        self.start_backup(index);
    }

    /// Sends decree-pair's `hand_over` transaction naming `backup` alone in the sync record
    /// and deleting the leader key, guarded by member `index`'s lease, which is revoked after
    /// it (modelled as one request; when it is lost, `decree serve` revokes the lease once the
    /// transaction's deadline passed: the caller does so at once). Whether it left.
    fn hand_over(&mut self, index: usize, backup: BackupRun) -> bool {
        let candidacy = &self.members[index].candidacy;
        let (Some(record), Some(lease)) = (candidacy.record.clone(), candidacy.lease) else { return false };
        let in_sync = InSync { member: backup.member.get(), run: run_name(backup.run) };
        let keys = self.etcd().keys.clone();
        let txn = rules::hand_over(&keys, &record, lease, in_sync);
        let line = format!("member {} hands the lead of {:?} over to {backup:?}", index + 1, record.epoch);
        self.note(|| line);
        self.etcd_send(index, Call::HandOver { txn, lease })
    }

    /// The operator's `decree switchover` on member `index` (`pair.rs`'s
    /// `switchover_request`): refused unless it leads strictly with the backup process
    /// recorded in sync on etcd linked now and the last to catch up; then the server stops
    /// as at SIGTERM (its fence ends, what waits for the backup is never answered) and, once
    /// it exited, hands the lead over ([`World::rejoin`]). With
    /// [`Break::HandOverUnsynced`], none of this: the transaction goes at once to the other
    /// member's current process, and the primary goes on acting.
    pub fn switchover(&mut self, index: usize) {
        let broken = self.etcd().broken(Break::HandOverUnsynced);
        let member = &self.members[index];
        let Proc::Primary(p) = &member.proc else { return };
        if p.stopping || member.paused() {
            return;
        }
        if broken {
            let other = &self.members[1 - index];
            if matches!(other.proc, Proc::Backup(_)) {
                let backup = BackupRun { member: other.id(), run: other.candidacy.run };
                self.switchovers += 1;
                self.hand_over(index, backup);
            }
            return;
        }
        let recorded = member.candidacy.recorded;
        let linked = *p.leader.caught_up_backups().borrow();
        let strict = p.leader.node().role == (decree_pair::Role::Primary { alone: false });
        let Some(backup) = recorded.filter(|&b| strict && linked == Some(b) && p.link.is_some()) else {
            let line = format!(
                "member {}: switchover refused (recorded {recorded:?}, caught up {linked:?}, strict {strict}, linked {})",
                index + 1,
                p.link.is_some()
            );
            return self.note(|| line);
        };
        let Proc::Primary(p) = &mut self.members[index].proc else { unreachable!("checked") };
        p.handing = Some(backup);
        self.switchovers += 1;
        let candidacy = &mut self.members[index].candidacy;
        candidacy.ended = true;
        candidacy.held.clear();
        self.begin_stop(index, "switches over: stopping");
    }

    /// Holds `held` until the fence opens again (dropped once the member stepped down).
    pub fn hold(&mut self, index: usize, held: Held) {
        let candidacy = &mut self.members[index].candidacy;
        if candidacy.ended {
            return;
        }
        candidacy.held.push(held);
        assert!(candidacy.held.len() <= HELD_MAX, "the fence holds a bounded number of answers");
    }
}
