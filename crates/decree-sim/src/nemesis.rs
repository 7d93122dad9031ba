//! The faults and the operator (a model of a person following docs/replication.md).
//!
//! During the safety phase a fault comes every so often: a member killed or its machine
//! powered off (with what was unsynced lost, kept, or torn), a member restarted, a
//! promotion, a partition of the link, a member paused (SIGSTOP) and continued, a failed
//! sync of a member's log, a client's death. The operator promotes only when no running
//! member leads: the caught-up backup without `--force`, else the member that led last
//! with `--force` (it holds what it acknowledged). Two mistakes come in some seeds
//! (`Scenario::mistakes`): promoting while the primary still runs (paused or cut off),
//! and losing a member's disk, after which the other is promoted with `--force`; decisions
//! the promoted member lacks then are forfeited (`Oracle::forfeit`), later ones are not.
//! In `received` mode at most one member is down at a time (what that mode promises).
//!
//! Elected runs in `received` mode also arm a **crash point** now and then, like the kill
//! loop's (`decree-crashtest`): the sequence of issue 33's restarted `received` backup,
//! which random faults almost never line up. It waits for the moment a strict primary
//! acknowledges a decision that its backup acknowledged on receipt and has not written
//! yet; then the backup is killed (its log's queue, that decision with it, is lost), the
//! client dies before its phase two (the decision's branches stay prepared), and the
//! primary stops (SIGSTOP) for longer than its lease; the backup restarts in a new process
//! (a new run id) before the primary continues, and in half the runs the primary is then
//! killed. Only the run id rule keeps that backup, in the sync record under its old run
//! id, from being elected without the decision: the primary, the leader of record, must
//! come back to lead (`Break::RunIdIgnored` breaks it on purpose).
//!
//! Elected runs in `durable` mode also lose a member's machine with its disk now and then
//! (`elected_disk_lost`): it restarts empty, and `led_by`'s `since` check must keep it from
//! leading again as the record's leader (`Break::SinceIgnored` breaks it on purpose).
//!
//! In the liveness phase the faults stop, chaos ends, the network heals, paused members continue, the
//! clients start no new transaction, and the operator restarts what is down and promotes
//! as above until the pair is back to strict.

use crate::etcd::{MARGIN, TTL};
use crate::member::Proc;
use crate::world::{Event, Phase, World, MS, SECOND};
use decree_core::Xid;
use decree_log::testing::fault::{CrashMode, FaultStorage};
use decree_pair::link::follower::AckMode;
use decree_pair::Role;

/// A crash point the nemesis armed: a sequence of faults that matters only at one moment,
/// which the nemesis waits for instead of hoping a random fault lands on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashPoint {
    /// Issue 33's restarted `received` backup: waiting for a strict primary to acknowledge
    /// a decision its backup acknowledged on receipt and has not written yet.
    Armed,
    /// That moment came in this step: `primary` acknowledged `xid`, decided by `client`.
    Reached { primary: usize, client: usize, xid: Xid },
}

impl World {
    /// The next fault (safety phase) or operator's move (liveness phase).
    pub fn nemesis(&mut self) {
        match self.phase {
            Phase::Safety => {
                self.fault();
                let gap = self.scenario.fault_gap;
                let next = self.rng.range(gap / 4, gap * 2);
                self.after(next, Event::Nemesis);
            }
            Phase::Liveness => {
                self.operator(false);
                self.after(100 * MS, Event::Nemesis);
            }
        }
    }

    fn fault(&mut self) {
        let roll = self.rng.range(0, 99);
        let member = self.rng.range(0, 1) as usize;
        // After an elected disk loss the other member, the only holder of every decision,
        // is spared what would end its process until it leads (`elected_disk_lost`).
        let spared = self.spared == Some(member) && !self.members[member].leading();
        if !spared && self.spared.is_some_and(|s| self.members[s].leading()) {
            self.spared = None;
        }
        match roll {
            0..=17 if spared => {}
            0..=17 => self.crash_member(member),
            18..=34 => self.restart(member),
            35..=49 if self.etcd.is_some() => {
                // No operator promotes under an election: etcd is cut off from a member.
                self.operator(true);
                let duration = self.rng.range(10, 3000) * MS;
                self.etcd_cut(member, duration);
            }
            35..=49 => self.operator(true),
            50..=59 => {
                let duration = self.rng.range(10, 3000) * MS;
                self.partition(duration);
            }
            60..=67 => {
                let duration = self.rng.range(10, 3000) * MS;
                self.pause(member, duration);
            }
            68..=72 if spared => {}
            68..=72 => {
                if let Some(log) = self.members[member].log() {
                    log.fail_next_sync();
                    self.note(|| format!("member {}: its log's next sync will fail", member + 1));
                }
            }
            73..=81 => {
                let client = self.rng.range(0, self.clients.len() as u64 - 1) as usize;
                self.client_crash(client);
            }
            // No operator's mistakes under an election: this range arms the crash point.
            82..=85 if self.etcd.is_some() && self.scenario.ack == AckMode::Received => {
                self.arm_crash_point()
            }
            82..=89 if self.scenario.mistakes => self.mistaken_promotion(member),
            // Unused by an elected run's other faults: a member's disk is lost (issue 33).
            86..=89 if self.etcd.is_some() => self.elected_disk_lost(member),
            // Unused by an elected run's other faults: the operator's `decree switchover`.
            94..=97 if self.scenario.elected.as_ref().is_some_and(|e| e.switchovers) => {
                if let Some(primary) = (0..self.members.len()).find(|&i| self.members[i].leading()) {
                    self.switchover(primary);
                }
            }
            90..=93 if self.scenario.mistakes => self.disk_lost(member),
            _ => {}
        }
    }

    /// Kills member `index` or cuts its power (in `received` mode only while the other
    /// member runs).
    fn crash_member(&mut self, index: usize) {
        let other_down = matches!(self.members[1 - index].proc, Proc::Down);
        if self.scenario.ack == AckMode::Received && other_down {
            return;
        }
        let power_loss = self.rng.chance(500).then(|| {
            *self.rng.pick(&[
                CrashMode::DropUnsynced,
                CrashMode::KeepRandomUnsynced,
                CrashMode::TearLastWrite,
                CrashMode::ZeroLastWrite,
            ])
        });
        self.crash(index, power_loss);
    }

    /// Restarts member `index` if it is down: it comes back as a backup.
    pub(crate) fn restart(&mut self, index: usize) {
        if matches!(self.members[index].proc, Proc::Down) {
            self.start_backup(index);
        }
    }

    /// The operator's rule: when no running member leads, promote the caught-up backup, or
    /// else the member that led last (forced: it holds what it acknowledged). In the
    /// liveness phase (`!faults`) it first restarts what is down.
    pub fn operator(&mut self, faults: bool) {
        for index in 0..self.members.len() {
            // A member whose log failed (fail-stop) answers every decide `LogFailed`: the
            // operator restarts it.
            if self.members[index].log().is_some_and(|log| log.failed()) {
                self.crash(index, None);
            }
        }
        if !faults {
            for index in 0..self.members.len() {
                self.restart(index);
            }
        }
        if self.etcd.is_some()
            || self.members.iter().any(|m| m.leading() || matches!(&m.proc, Proc::Primary(p) if !p.exiting))
        {
            // Under an election the operator only restarts: etcd chooses who leads.
            return;
        }
        if let Some(index) = (0..self.members.len()).find(|&i| self.members[i].caught_up()) {
            self.promote(index, false, "no member leads; this backup caught up");
            return;
        }
        let last = (0..self.members.len())
            .filter(|&i| self.members[i].led_at.is_some())
            .max_by_key(|&i| self.members[i].led_at);
        match last {
            Some(index) if matches!(self.members[index].proc, Proc::Backup(_)) => {
                self.promote(index, true, "no member leads; this one led last");
            }
            Some(_) => {}
            None => {
                // The member that led last lost its disk: the one that saw the newest epoch
                // is all there is (a blank one would mint an epoch used before).
                let backups =
                    (0..self.members.len()).filter(|&i| matches!(self.members[i].proc, Proc::Backup(_)));
                let newest = backups.max_by_key(|&i| self.members[i].seen());
                if let Some(index) =
                    newest.filter(|&i| self.members[i].seen() != Some(decree_pair::Epoch::NONE))
                {
                    self.forfeit_for(index);
                    self.promote(index, true, "no member leads, and the one that led last lost its disk");
                }
            }
        }
    }

    /// The mistake: member `index` is promoted while the other still leads (paused, cut
    /// off, or simply running): forced unless it caught up.
    fn mistaken_promotion(&mut self, index: usize) {
        if !matches!(self.members[index].proc, Proc::Backup(_)) || !self.members[1 - index].leading() {
            return;
        }
        let forced = !self.members[index].caught_up();
        if forced {
            self.forfeit_for(index);
        }
        self.promote(index, forced, "the operator believes the primary is down (it is not)");
    }

    /// Member `index`'s disk is lost: it comes back empty (a new backup), and if no one
    /// leads, the other member is promoted with `--force`.
    fn disk_lost(&mut self, index: usize) {
        let other = &self.members[1 - index];
        // Only a disk whose data lives on in the other member (which runs, and has seen an
        // epoch) is lost: losing both is starting over, which this simulation does not.
        let other_holds =
            !matches!(other.proc, Proc::Down) && other.seen().is_some_and(|e| e != decree_pair::Epoch::NONE);
        if !matches!(self.members[index].proc, Proc::Down)
            || self.scenario.ack == AckMode::Received
            || !other_holds
        {
            return;
        }
        let seed = self.rng.fork();
        self.members[index].disk = FaultStorage::new(seed);
        self.members[index].led_at = None;
        self.note(|| format!("member {}'s disk is lost", index + 1));
        let other = 1 - index;
        if matches!(self.members[other].proc, Proc::Backup(_)) {
            let forced = !self.members[other].caught_up();
            if forced {
                self.forfeit_for(other);
            }
            self.promote(other, forced, "the other member's disk is lost");
        }
    }

    /// Elected runs (issue 33): member `index`'s machine is lost with its disk (a power
    /// loss, the disk replaced) and comes back empty 10 to 500 ms later, a new backup that
    /// must catch up and must not lead: when it led, the sync record still names it as the
    /// leader of its epoch, its lease holding the leader key up to a TTL more, and only
    /// `led_by`'s `since` check (its log must hold the epoch the record says its leader's
    /// log holds) keeps it from taking the lead with nothing once the lease lapses
    /// (`Break::SinceIgnored` breaks it). Only a disk whose data lives on is lost: the
    /// other member runs and the sync record names its current process, so that it may
    /// campaign and holds every acknowledged decision; `durable` seeds only (in `received`
    /// mode the other member may hold a decision in memory alone, as for the operator's
    /// mistake). When the lost member led, its clients die with it (a rack lost), so that
    /// what it acknowledged last may still have branches prepared. Until the other member
    /// leads, the nemesis kills it no more (nor fails its
    /// log): a new process of it is out of sync, and with the only other log gone nobody
    /// could lead without the operator's `decree promote --force`, which elected runs do
    /// not model (seed 678, before: the other member lost power, cut off from etcd, before
    /// it could campaign).
    fn elected_disk_lost(&mut self, index: usize) {
        let other = &self.members[1 - index];
        // The other member must be able to take over: running, its log healthy (a backup
        // whose log failed is restarted, a new process out of sync: seeds 159 and 683).
        let healthy = match &other.proc {
            Proc::Down => false,
            Proc::Backup(b) => !b.failed && !b.log.failed(),
            Proc::Primary(p) => !p.log.failed(),
        };
        if matches!(self.members[index].proc, Proc::Down)
            || !healthy
            || self.scenario.ack == AckMode::Received
        {
            return;
        }
        let Some(etcd) = self.etcd.as_ref() else { return };
        // Read on a copy: a read expires leases in the model, which the pair's own reads do.
        let mut copy = crate::etcd::EtcdWorld {
            etcd: etcd.etcd.clone(),
            ..crate::etcd::EtcdWorld::new(etcd.elected.clone())
        };
        let view = copy.view(self.now);
        let run = crate::election::run_name(other.candidacy.run);
        if !view.sync.value.is_some_and(|sync| sync.names(other.id(), &run)) {
            return;
        }
        let led = self.members[index].leading();
        self.crash(index, Some(CrashMode::DropUnsynced));
        if led {
            // The rack goes with it: the clients die too, before the phase two of what it
            // acknowledged last, whose branches stay prepared for the next leader to finish.
            for client in 0..self.clients.len() {
                self.client_crash(client);
            }
        }
        let seed = self.rng.fork();
        self.members[index].disk = FaultStorage::new(seed);
        self.members[index].led_at = None;
        self.members[index].disk_lost_at = Some(self.now);
        self.disks_lost += 1;
        self.spared = Some(1 - index);
        self.note(|| {
            format!("member {}'s disk is lost with its machine (the other member is in sync)", index + 1)
        });
        let restart = self.rng.range(10, 500) * MS;
        self.after(restart, Event::Restart { member: index });
    }

    /// A forced promotion of `index` is about to happen on purpose: what it lacks of the
    /// acknowledged decisions is given up.
    fn forfeit_for(&mut self, index: usize) {
        let Some(log) = self.members[index].log().cloned() else { return };
        let now = self.now;
        self.oracle.forfeit(now, |xid| log.holds(xid));
    }

    /// Kills member `index` if it still lives `life` and the faults still come (in
    /// `received` mode only while the other member runs, as every kill).
    pub(crate) fn kill(&mut self, index: usize, life: u64) {
        if self.members[index].life == life && self.phase == Phase::Safety {
            self.crash_member(index);
        }
    }

    /// Arms the crash point of a restarted `received` backup, unless one is armed already.
    fn arm_crash_point(&mut self) {
        if self.crash_point.is_none() {
            self.crash_point = Some(CrashPoint::Armed);
            self.note(|| "crash point armed: a restarted received backup".to_string());
        }
    }

    /// Primary `primary` acknowledged `xid` of client `client` (`role`: its role then): the
    /// armed crash point is reached if it acknowledged strictly and its backup holds `xid`
    /// only in its log's queue (acknowledged on receipt, not written yet).
    pub fn acknowledged_at(&mut self, primary: usize, client: usize, xid: Xid, role: Role) {
        if self.crash_point == Some(CrashPoint::Armed)
            && role == (Role::Primary { alone: false })
            && self.unwritten_on_backup(1 - primary, &xid)
        {
            self.crash_point = Some(CrashPoint::Reached { primary, client, xid });
        }
    }

    /// Whether member `backup` is a caught-up backup whose log holds `xid` in its queue only.
    fn unwritten_on_backup(&self, backup: usize, xid: &Xid) -> bool {
        matches!(&self.members[backup].proc, Proc::Backup(b)
            if b.follower.node().caught_up && b.log.holds(xid) && !b.log.durably_holds(xid))
    }

    /// After a step has settled: runs the crash point's sequence if its moment came in the
    /// step and still holds (else the crash point waits for another). Whether it ran.
    pub fn crash_point_reached(&mut self) -> bool {
        let Some(CrashPoint::Reached { primary, client, xid }) = self.crash_point else { return false };
        let holds = self.phase == Phase::Safety
            && self.members[primary].leading()
            && !self.members[primary].paused()
            && self.unwritten_on_backup(1 - primary, &xid);
        if !holds {
            self.crash_point = Some(CrashPoint::Armed);
            return false;
        }
        self.crash_point = None;
        self.crash_points += 1;
        self.received_backup_lost(primary, client, xid);
        true
    }

    /// Issue 33's restarted `received` backup, from the moment `primary` acknowledged `xid`
    /// that its backup holds only in its log's queue: the backup is killed (the queue, and
    /// `xid` with it, is lost), the client dies before committing a branch, the primary
    /// stops for longer than its lease (so that it neither finishes `xid` nor lets the
    /// backup catch up), the backup restarts in a new process, and in half the runs the
    /// primary is killed before it continues. The pair must wait for the primary, which
    /// holds `xid`: the restarted backup is out of sync until it catches up again.
    fn received_backup_lost(&mut self, primary: usize, client: usize, xid: Xid) {
        let backup = 1 - primary;
        self.note(|| {
            format!(
                "crash point: member {} acknowledged {xid} on receipt, not written yet; member {} acknowledged \
                 it to client {client}",
                backup + 1,
                primary + 1
            )
        });
        self.crash(backup, None);
        if self.clients[client].txn.as_ref().is_some_and(|t| t.xid == xid) {
            self.client_crash(client);
        }
        let stopped = self.rng.range(TTL + MARGIN, 3 * SECOND);
        self.pause(primary, stopped);
        let restart = self.rng.range(10 * MS, 500 * MS);
        self.after(restart, Event::Restart { member: backup });
        if self.rng.chance(500) {
            let life = self.members[primary].life;
            let kill = restart + self.rng.range(MS, 200 * MS);
            self.after(kill, Event::Kill { member: primary, life });
        }
    }

    /// The liveness phase begins: faults stop, the network heals, members continue.
    pub fn begin_liveness(&mut self) {
        self.phase = Phase::Liveness;
        self.crash_point = None;
        self.net.partitioned_until = None;
        // Chaos is a fault like the others: frames lost within a connection at its rate
        // through every catch-up would let none of hundreds of batches through, which no
        // reconnect can mend (docs/simulation.md, defect 6).
        self.net.chaos = false;
        if let Some(etcd) = &mut self.etcd {
            etcd.cut_until = [None, None];
        }
        for index in 0..self.members.len() {
            self.members[index].paused_until = None;
        }
        self.note(|| "liveness phase: no more faults, no new transactions".to_string());
        self.operator(false);
    }

    /// Why the pair did not return to strict in the liveness phase, and the defect that
    /// shows, as far as the state tells.
    pub fn diagnose_liveness(&self) -> (Option<u8>, String) {
        let leading: Vec<usize> = (0..self.members.len()).filter(|&i| self.members[i].leading()).collect();
        let ends: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("member {}: {}", m.index + 1, m.last_end.clone().unwrap_or_default()))
            .collect();
        let state: Vec<String> =
            self.members.iter().map(|m| format!("member {}: {}", m.index + 1, m.describe())).collect();
        let waiting = self.clients.iter().filter(|c| !c.quiet()).count();
        let prepared = self.databases.prepared();
        let first = prepared.first().map(|(xid, _, _)| format!(" (first: {xid})")).unwrap_or_default();
        let etcd = self.etcd.as_ref().map(|e| e.describe(self.now)).unwrap_or_default();
        let summary = format!(
            "not back to strict: {}; last link ends: {}; {waiting} clients wait; {} branches prepared{first}{etcd}",
            state.join(", "),
            ends.join(", "),
            prepared.len()
        );
        if let Some(why) = self.epoch_won_by_the_dead() {
            return (Some(15), format!("{why}: {summary}"));
        }
        if let Some(why) = self.handed_to_the_dead() {
            return (Some(16), format!("{why}: {summary}"));
        }
        let stuck_overflow = self.members.iter().any(|m| match &m.proc {
            Proc::Primary(p) => p.server.waiting() > 0 && p.leader.lag().records == 0 && p.link.is_some(),
            _ => false,
        });
        if stuck_overflow {
            let why =
                "decides wait for the backup but none of their records is in the outbox: the overflow is \
                       drained only when an acknowledgement confirms a ticket";
            return (Some(13), format!("{why}: {summary}"));
        }
        let newest = leading.iter().filter_map(|&i| self.members[i].seen()).max();
        let stale = leading.iter().copied().find(|&i| self.members[i].seen() < newest);
        let swallowed = stale.is_some_and(|i| {
            self.clients
                .iter()
                .any(|c| c.txn.is_some() && c.conn.as_ref().is_some_and(|conn| conn.member == i))
        });
        if swallowed {
            return (Some(10), format!("an old primary keeps a client's decide unanswered: {summary}"));
        }
        if leading.len() > 1 {
            return (Some(8), format!("two members lead and neither learns of the other: {summary}"));
        }
        let highest = self.members.iter().filter(|m| m.leading()).filter_map(|m| m.seen()).max();
        let above = self.databases.prepared().into_iter().find(|(xid, _, _)| {
            let incarnation = xid.origin().map(|o| decree_pair::Epoch::from_raw(o.incarnation));
            incarnation.zip(highest).is_some_and(|(i, h)| i > h)
        });
        if let Some((xid, _, _)) = above {
            let why = format!(
                "{xid} stays prepared: its incarnation is above the epoch of the member that leads now (which \
                 minted a lower one after the newest epoch's disk was lost), so no pass ever rolls it back"
            );
            return (Some(14), format!("{why}: {summary}"));
        }
        if ends.iter().any(|e| e.contains("too far behind")) {
            return (Some(6), format!("the live set does not fit the outbox: {summary}"));
        }
        if self.half_open() {
            return (
                Some(6),
                format!("a half-open link (its other end lost power) holds a member: {summary}"),
            );
        }
        if self.net.dropped > 0 {
            let dropped = self.net.dropped;
            return (
                Some(6),
                format!("chaos dropped {dropped} frames and the link did not recover: {summary}"),
            );
        }
        (None, summary)
    }

    /// When nobody leads and etcd's sync record names one member alone: that entry, the
    /// record's epoch and the member (what findings 15 and 16 look at).
    fn led_by_nobody_but(
        &self,
    ) -> Option<(decree_pair::election::InSync, decree_pair::Epoch, &crate::member::Member)> {
        let etcd = self.etcd.as_ref()?;
        let mut etcd = crate::etcd::EtcdWorld {
            etcd: etcd.etcd.clone(),
            ..crate::etcd::EtcdWorld::new(etcd.elected.clone())
        };
        let view = etcd.view(self.now);
        let sync = view.sync.value.filter(|_| view.leader.value.is_none())?;
        let [only] = &sync.members[..] else { return None };
        let epoch = decree_pair::Epoch::from_raw(sync.epoch);
        let member = self.members.get(usize::from(only.member).checked_sub(1)?)?;
        Some((only.clone(), epoch, member))
    }

    /// New finding 15 (elected runs): nobody leads, and the sync record names one member
    /// alone for an epoch that member's log and `PAIR` never heard of: its process won the
    /// campaign in etcd and died before `promote_elected` recorded the epoch. The rules let
    /// nobody lead then (`led_by` wants the epoch in the member's log, as after a lost disk):
    /// only the operator's `decree promote --force` can.
    fn epoch_won_by_the_dead(&self) -> Option<String> {
        let (only, epoch, member) = self.led_by_nobody_but()?;
        let unknown = match &member.proc {
            Proc::Backup(b) => b.follower.highest_known() < epoch,
            _ => false,
        };
        unknown.then(|| {
            format!(
                "epoch {epoch} was won on etcd by member {}'s process {}, which died before recording it; \
                 member {} knows only {:?}, so no member may campaign",
                only.member,
                only.run,
                only.member,
                member.seen()
            )
        })
    }

    /// New finding 16 (elected runs, switchovers): nobody leads, and the sync record is a
    /// switchover's (it names one member alone for an epoch the other minted) naming a
    /// process of that member which is not its current one: the backup the lead was handed
    /// to died before it campaigned. Its new process is out of sync (a new run id), and the
    /// old primary, which holds every decision, was taken off the record: nobody may lead.
    fn handed_to_the_dead(&self) -> Option<String> {
        let (only, epoch, member) = self.led_by_nobody_but()?;
        let current = crate::election::run_name(member.candidacy.run);
        let handed = epoch.member().is_some_and(|m| m != member.id());
        (handed && only.run != current).then(|| {
            format!(
                "the lead of {epoch} was handed over to member {}'s process {}, which died before it \
                 campaigned; its process {current} is out of sync and the old primary is off the record, so no \
                 member may campaign",
                only.member, only.run
            )
        })
    }

    /// Whether a member's link (the one its leader holds or its follower serves) lost its
    /// other end without a word.
    fn half_open(&self) -> bool {
        self.members.iter().any(|m| {
            let conn = match &m.proc {
                Proc::Backup(b) => b.served.as_ref().map(|s| s.conn),
                Proc::Primary(p) => p.link.as_ref().map(|(c, _)| *c),
                Proc::Down => None,
            };
            conn.and_then(|c| self.net.conns.get(&c)).is_some_and(|c| c.dead[1 - c.end_of(m.index)])
        })
    }
}
