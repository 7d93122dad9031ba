//! The invariants, checked as the run goes (every acknowledgement, every branch's
//! transition, every `Outcome` answer) and after every step (who holds what), and the
//! guess of which of issue 32's defects a violation shows.
//!
//! The books: every `DecideOk` a member gave (with its role and mode at that moment), the
//! branches' transitions (from the databases), the `Outcome` answers, the promotions. A
//! forced promotion forfeits the acknowledged decisions the promoted member lacks at that
//! moment (the operator said the other member's disk is gone, or was wrong: that loss is
//! `--force`'s documented risk); every later acknowledgement is checked in full.
//!
//! The defect a violation is attributed to is a heuristic over the context (the role and
//! mode of the acknowledging member, whether a newer epoch existed, whether a log had
//! failed, whether the decision was shipped before the current link opened); the seeds
//! in docs/simulation.md were each read in their trace.

use crate::disk::SimLog;
use crate::member::{Member, Proc};
use crate::rm::{Actor, BranchState, Databases, RmEvent};
use crate::world::{Time, MS};
use decree_core::{Outcome, Xid};
use decree_pair::link::follower::AckMode;
use decree_pair::{Epoch, Role};
use std::collections::{BTreeMap, BTreeSet};

/// What was violated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invariant {
    /// An acknowledged decision with a branch still prepared is held by every member that
    /// says it holds everything (a caught-up backup, a primary) of its epoch or later.
    HeldByCaughtUp,
    /// A decision acknowledged in strict mode is durable (or, in `received` mode,
    /// received) on the backup at that moment.
    StrictAckOnBackup,
    /// Only a member that leads acknowledges (`rules::may_acknowledge`).
    AckOnlyWhileLeading,
    /// No Xid has a branch committed and another rolled back.
    Atomicity,
    /// No `DecideOk` for an Xid with a rolled-back branch, and no rollback of a branch of
    /// an acknowledged decision.
    AckedNeverRolledBack,
    /// Every `Outcome` answer agrees with what was acknowledged and done.
    OutcomeAgrees,
    /// After the faults stop, the pair returns to strict with every branch finished and
    /// every decide answered.
    Liveness,
    /// A member starts over its own disk (no refused log or state file).
    Start,
    /// No two sessions are handed the same Xid (an epoch is never minted twice).
    XidUnique,
    /// No two members acknowledge in the same epoch.
    OneAckerPerEpoch,
    /// Elected: a member acknowledges, answers a known `Outcome` and runs a recovery pass
    /// only while no newer epoch was won on etcd (its fence closes before its lease lapses,
    /// and nobody wins before the lease lapses).
    ActsOnlyWhileElected,
    /// Elected: the sync record speaks of the epoch the counter holds (else no member can
    /// ever campaign again, and only the operator can choose who leads).
    EtcdRecords,
}

/// A violated invariant.
#[derive(Debug, Clone)]
pub struct Violation {
    /// When.
    pub at: Time,
    /// Which.
    pub invariant: Invariant,
    /// Issue 32's defect it shows, as far as the context tells.
    pub defect: Option<u8>,
    /// What happened.
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let defect = self.defect.map_or("unclassified".to_string(), |d| format!("defect {d}"));
        write!(
            f,
            "at {}.{:03} ms: {:?} ({defect}): {}",
            self.at / MS,
            self.at % MS,
            self.invariant,
            self.detail
        )
    }
}

/// One `DecideOk`.
#[derive(Debug, Clone, Copy)]
pub struct Ack {
    /// The member that gave it.
    pub member: usize,
    /// The epoch it led.
    pub epoch: Epoch,
    /// Its role in its rules at that moment.
    pub role: Role,
    /// When.
    pub at: Time,
    /// When its decide reached the member.
    pub decided_at: Time,
    /// When the member's current link opened.
    pub link_opened_at: Time,
}

/// One promotion.
#[derive(Debug, Clone, Copy)]
struct Promotion {
    at: Time,
    epoch: Epoch,
}

/// The invariants' books.
pub struct Oracle {
    ack_mode: AckMode,
    acks: BTreeMap<Xid, Ack>,
    /// Acknowledged, not forfeited, with a branch still prepared.
    open: BTreeSet<Xid>,
    forfeited: BTreeSet<Xid>,
    answered_rolled_back: BTreeSet<Xid>,
    decided_at: BTreeMap<Xid, Time>,
    promotions: Vec<Promotion>,
    /// Members whose log failed in their current life (index, life).
    failed_logs: BTreeSet<(usize, u64)>,
    /// A member was promoted while the other still led (the operator's mistake): from
    /// then on two members may act as primaries, and nothing tells the old one.
    split_brain: bool,
    /// etcd elects the primary: nothing is ever forfeited, and an `Outcome` answered
    /// committed must never be rolled back afterwards either.
    elected: bool,
    /// The member that acknowledged first in each epoch.
    ackers: BTreeMap<Epoch, usize>,
    /// Elected: Xids answered committed to an `Outcome` question.
    answered_committed: BTreeSet<Xid>,
    /// Elected: the epochs won on etcd, with when the campaign's transaction applied.
    won: Vec<(Time, Epoch)>,
    /// The violations found (the run stops at the first).
    pub violations: Vec<Violation>,
}

/// What a member that must hold a decision holds: a backup's log, a primary's state.
fn holds(member: &Member, xid: &Xid) -> bool {
    match &member.proc {
        Proc::Down => true,
        Proc::Backup(b) => b.log.holds(xid),
        Proc::Primary(p) => p.server.holds(xid) || p.log.holds(xid),
    }
}

impl Oracle {
    /// Empty books for a pair acknowledging as `ack_mode` says, `elected` on etcd.
    pub fn new(ack_mode: AckMode, elected: bool) -> Oracle {
        Oracle {
            ack_mode,
            acks: BTreeMap::new(),
            open: BTreeSet::new(),
            forfeited: BTreeSet::new(),
            answered_rolled_back: BTreeSet::new(),
            decided_at: BTreeMap::new(),
            promotions: Vec::new(),
            failed_logs: BTreeSet::new(),
            split_brain: false,
            elected,
            ackers: BTreeMap::new(),
            answered_committed: BTreeSet::new(),
            won: Vec::new(),
            violations: Vec::new(),
        }
    }

    /// Decisions acknowledged so far.
    pub fn acknowledged(&self) -> usize {
        self.acks.len()
    }

    /// Records a violation.
    pub fn violate(&mut self, at: Time, invariant: Invariant, defect: Option<u8>, detail: String) {
        self.violations.push(Violation { at, invariant, defect, detail });
    }

    /// A decide reached a member.
    pub fn decide_received(&mut self, at: Time, xid: Xid) {
        self.decided_at.insert(xid, at);
    }

    /// Member `index` was promoted to lead `epoch`; `other_leads` when the other member
    /// still led.
    pub fn promoted(&mut self, at: Time, epoch: Epoch, other_leads: bool) {
        self.promotions.push(Promotion { at, epoch });
        self.split_brain |= other_leads;
    }

    /// A campaign for `epoch` succeeded at etcd.
    pub fn won_on_etcd(&mut self, at: Time, epoch: Epoch) {
        assert!(self.won.iter().all(|(_, e)| *e < epoch), "each epoch won on etcd is above the last");
        self.won.push((at, epoch));
    }

    /// Member `member`, leading `epoch`, does `what` (acknowledges, answers, recovers):
    /// in an elected run, only while no newer epoch was won.
    pub fn acts(&mut self, at: Time, member: usize, epoch: Epoch, what: impl FnOnce() -> String) {
        let newer = self.won.iter().find(|(_, e)| *e > epoch).map(|(when, e)| (*when, *e));
        if let Some((when, newer)) = newer.filter(|_| self.elected) {
            let detail = format!(
                "member {} (epoch {epoch}) {} after epoch {newer} was won at {} ms",
                member + 1,
                what(),
                when / MS
            );
            self.violate(at, Invariant::ActsOnlyWhileElected, None, detail);
        }
    }

    /// The defect a violation without a better clue shows: two primaries at once, the old
    /// one never told (defect 8), if the run had them.
    pub(crate) fn fallback(&self, found: Option<u8>) -> Option<u8> {
        found.or(self.split_brain.then_some(8))
    }

    /// A member's log failed.
    pub fn log_failed(&mut self, index: usize, life: u64) {
        self.failed_logs.insert((index, life));
    }

    /// A forced promotion: the acknowledged decisions with a branch prepared that the
    /// promoted member does not hold are given up (`--force`'s documented risk).
    pub fn forfeit(&mut self, _at: Time, holds: impl Fn(&Xid) -> bool) {
        assert!(!self.elected, "no operator forces a promotion in an elected run: nothing is forfeited");
        let lost: Vec<Xid> = self.open.iter().filter(|x| !holds(x)).copied().collect();
        for xid in lost {
            self.open.remove(&xid);
            self.forfeited.insert(xid);
        }
    }

    /// Whether `ack` was given while a newer epoch than the acknowledging member's existed.
    fn superseded(&self, ack: &Ack) -> bool {
        self.promotions.iter().any(|p| p.epoch > ack.epoch && p.at <= ack.at)
    }

    /// The defect that an acknowledged decision missing at member `at_member` (or rolled
    /// back by it) shows, as far as the context tells.
    fn classify(&self, ack: &Ack, at_member: Option<(usize, u64)>) -> Option<u8> {
        if at_member.is_some_and(|m| self.failed_logs.contains(&m)) {
            return Some(5);
        }
        if !matches!(ack.role, Role::Primary { .. }) {
            return Some(3);
        }
        if self.superseded(ack) {
            return Some(if ack.role == (Role::Primary { alone: true }) { 9 } else { 8 });
        }
        if ack.role == (Role::Primary { alone: true }) {
            return Some(1);
        }
        if ack.decided_at < ack.link_opened_at {
            // Confirmed by an acknowledgement on a link that opened after it was shipped.
            return Some(4);
        }
        None
    }

    /// A member answered a decide with `DecideOk` (`role` is its rules' role at that
    /// moment): checks who may acknowledge, what the backup holds, and what the branches
    /// and earlier answers say.
    pub fn acknowledged_by(
        &mut self,
        at: Time,
        xid: Xid,
        ack: Ack,
        members: &[Member],
        databases: &Databases,
    ) {
        let who = format!("member {} (epoch {}, {:?})", ack.member + 1, ack.epoch, ack.role);
        self.acts(at, ack.member, ack.epoch, || format!("acknowledged {xid}"));
        let first = *self.ackers.entry(ack.epoch).or_insert(ack.member);
        if first != ack.member {
            let detail = format!("{who} acknowledged {xid}; member {} acknowledged in that epoch", first + 1);
            self.violate(at, Invariant::OneAckerPerEpoch, self.fallback(None), detail);
        }
        if !matches!(ack.role, Role::Primary { .. }) {
            self.violate(at, Invariant::AckOnlyWhileLeading, Some(3), format!("{who} acknowledged {xid}"));
        }
        let states = databases.states(&xid);
        if states.contains(&BranchState::RolledBack) {
            let defect = self.classify(&ack, None);
            self.violate(
                at,
                Invariant::AckedNeverRolledBack,
                defect,
                format!("{who} acknowledged {xid}, a branch of which was rolled back"),
            );
        }
        if self.answered_rolled_back.contains(&xid) {
            self.violate(
                at,
                Invariant::OutcomeAgrees,
                self.classify(&ack, None),
                format!("{who} acknowledged {xid}, answered rolled back before"),
            );
        }
        // A decision whose branches are all finished needs no copy any more (the other
        // member may have finished and forgotten it, once promoted).
        if ack.role == (Role::Primary { alone: false }) && states.contains(&BranchState::Prepared) {
            self.check_backup_holds(at, &xid, &ack, &members[1 - ack.member]);
        }
        let ack = Ack { decided_at: self.decided_at.get(&xid).copied().unwrap_or(at), ..ack };
        self.acks.insert(xid, ack);
        if states.contains(&BranchState::Prepared) {
            self.open.insert(xid);
        }
    }

    /// A strict acknowledgement: the backup holds the decision durably (received, in
    /// `received` mode) at this moment.
    fn check_backup_holds(&mut self, at: Time, xid: &Xid, ack: &Ack, peer: &Member) {
        let durable = self.ack_mode == AckMode::Durable;
        let decided_at = self.decided_at.get(xid).copied().unwrap_or(at);
        // A backup whose disk was lost (elected runs) after the decision was decided lost it
        // with the disk, its acknowledgement on its way: the primary holds it, and the
        // member, back empty and not caught up, may not lead (`led_by`'s `since`) until it
        // caught up again (seed 1030: an acknowledgement a partition held for 3 s).
        let lost_disk = peer.disk_lost_at.is_some_and(|lost| lost >= decided_at);
        let held = match &peer.proc {
            Proc::Down if lost_disk => return,
            Proc::Backup(b) if lost_disk && !b.follower.node().caught_up => return,
            Proc::Backup(b) if durable => b.log.durably_holds(xid),
            // So may one whose log failed after it acknowledged (it stops, fail-stop, and is
            // no longer caught up: never promoted without `--force`): that is its crash.
            Proc::Backup(b) if b.failed && !b.follower.node().caught_up => return,
            // So may one killed after its acknowledgement left, and restarted before this
            // primary read it: its new process is not caught up, and out of sync until it is
            // (the run id rule keeps it from leading meanwhile), as one that is down.
            Proc::Backup(b) if !b.follower.node().caught_up && peer.started_at > decided_at => return,
            Proc::Backup(b) => b.log.holds(xid),
            Proc::Primary(p) => p.server.holds(xid) || p.log.holds(xid),
            // In `received` mode a crashed backup may have lost it: one member down at a time.
            Proc::Down if !durable => return,

            Proc::Down => SimLog::read_decisions(&peer.disk, &peer.dir()).contains(xid),
        };
        if !held {
            let ack = Ack { decided_at, ..*ack };
            let defect = self.classify(&ack, Some((peer.index, peer.life)));
            let detail = format!(
                "member {} acknowledged {xid} in strict mode; member {} does not hold it{} ({})",
                ack.member + 1,
                peer.index + 1,
                if durable { " durably" } else { "" },
                peer.describe()
            );
            self.violate(at, Invariant::StrictAckOnBackup, defect, detail);
        }
    }

    /// A branch moved: atomicity, acknowledged decisions, earlier answers.
    pub fn rm_event(&mut self, at: Time, event: &RmEvent, databases: &Databases, members: &[Member]) {
        let xid = event.global;
        let states = databases.states(&xid);
        let by = match event.by {
            Actor::Client(c) => format!("client {c}"),
            Actor::Member(m) => format!("member {m}"),
        };
        let ack = self.acks.get(&xid).copied();
        let roller = match event.by {
            Actor::Member(m) => Some((m as usize - 1, members[m as usize - 1].life)),
            Actor::Client(_) => None,
        };
        let defect = self.fallback(ack.and_then(|a| self.classify(&a, roller)));
        let forfeited = self.forfeited.contains(&xid);
        if states.contains(&BranchState::Committed) && states.contains(&BranchState::RolledBack) && !forfeited
        {
            let detail = format!(
                "{xid}: {by} moved branch {} on {} to {:?}; its branches are {states:?}",
                event.branch, event.rm, event.to
            );
            self.violate(at, Invariant::Atomicity, defect, detail);
        }
        if let Some(a) = ack.filter(|_| event.to == BranchState::RolledBack && !self.forfeited.contains(&xid))
        {
            let detail = format!(
                "{by} rolled back branch {} of {xid}, acknowledged by member {} (epoch {}, {:?})",
                event.branch,
                a.member + 1,
                a.epoch,
                a.role
            );
            self.violate(at, Invariant::AckedNeverRolledBack, defect, detail);
        }
        if event.to == BranchState::RolledBack && self.answered_committed.contains(&xid) {
            let detail = format!("{by} rolled back a branch of {xid}, answered committed before");
            self.violate(at, Invariant::OutcomeAgrees, defect, detail);
        }
        if event.to == BranchState::Committed && self.answered_rolled_back.contains(&xid) {
            self.violate(
                at,
                Invariant::OutcomeAgrees,
                defect,
                format!("{by} committed a branch of {xid}, answered rolled back before"),
            );
        }
        if !states.contains(&BranchState::Prepared) {
            self.open.remove(&xid);
        }
    }

    /// Member `index` answered `Outcome` for `xid`.
    pub fn outcome_answer(
        &mut self,
        at: Time,
        member: &Member,
        xid: Xid,
        answer: Outcome,
        databases: &Databases,
    ) {
        let index = member.index;
        let states = databases.states(&xid);
        let ack = self.acks.get(&xid).copied();
        let defect = self.fallback(ack.and_then(|a| self.classify(&a, Some((index, member.life)))));
        let given = !self.forfeited.contains(&xid);
        if let (Proc::Primary(p), false) = (&member.proc, answer == Outcome::Unknown) {
            self.acts(at, index, p.epoch, || format!("answered {xid} {answer:?}"));
        }
        match answer {
            Outcome::RolledBack => {
                if given && (ack.is_some() || states.contains(&BranchState::Committed)) {
                    let detail = format!(
                        "member {} answered {xid} rolled back: acknowledged {}, branches {states:?}",
                        index + 1,
                        ack.is_some()
                    );
                    self.violate(at, Invariant::OutcomeAgrees, defect, detail);
                }
                self.answered_rolled_back.insert(xid);
            }
            Outcome::Committed if given && states.contains(&BranchState::RolledBack) => {
                let detail = format!("member {} answered {xid} committed: branches {states:?}", index + 1);
                self.violate(at, Invariant::OutcomeAgrees, defect, detail);
            }
            Outcome::Committed if self.elected => {
                self.answered_committed.insert(xid);
            }
            _ => {}
        }
    }

    /// After every step: each acknowledged decision with a branch still prepared is held
    /// by each running member that says it holds everything of the decision's epoch (a
    /// backup only while `named[index]`: see `World::named_in_sync`).
    pub fn check_holders(&mut self, at: Time, members: &[Member], named: [bool; 2]) {
        let mut missing = Vec::new();
        for xid in &self.open {
            let ack = self.acks[xid];
            for member in members {
                let epoch = match &member.proc {
                    Proc::Backup(b) if b.follower.node().caught_up && named[member.index] => {
                        b.follower.node().seen
                    }
                    Proc::Primary(p) if !p.stopping => p.epoch,
                    _ => continue,
                };
                if ack.epoch <= epoch && !holds(member, xid) {
                    missing.push((*xid, ack, member.index, member.life));
                }
            }
        }
        if let Some((xid, ack, index, life)) = missing.into_iter().next() {
            let defect = self.classify(&ack, Some((index, life)));
            let role = match &members[index].proc {
                Proc::Backup(_) => "a caught-up backup",
                _ => "a primary",
            };
            let detail = format!(
                "member {} ({role}) lacks {xid}, acknowledged by member {} (epoch {}, {:?}) at {} ms",
                index + 1,
                ack.member + 1,
                ack.epoch,
                ack.role,
                ack.at / MS
            );
            self.violate(at, Invariant::HeldByCaughtUp, defect, detail);
        }
    }
}
