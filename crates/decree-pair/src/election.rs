//! Who leads a pair when etcd chooses (issue 33): the keys, the records and the etcd
//! transactions of the election, as pure functions the runtime carries out and the
//! simulator runs against its model of etcd ([`model`]).
//!
//! Per pair, under `{prefix}/{pair}/`:
//!
//! | key | written by | lease | holds |
//! |---|---|---|---|
//! | `leader` | the member taking the lead | the leader's | [`Leader`]: member, run id, epoch |
//! | `sync` | the leader only (and the first leader of a new pair) | none: it must outlive its writer | [`SyncRecord`]: the epoch, the members holding every decision acknowledged in it, each with its run id |
//! | `epoch` | the member taking the lead | none | the count of the latest epoch |
//! | `members/{id}` | each member | its own | [`Registration`]: run id, addresses |
//! | `pause` | the operator (`decree pause`, through a member) | none | [`Pause`]: who paused, when; no campaign while it exists |
//!
//! The rules, each a transaction (etcd's compare-and-swap on several keys at once):
//! - **Taking the lead** ([`campaign`]): the leader key is absent, the sync record names this
//!   member with its current run id for the latest epoch, the counter is what was read. It
//!   creates the leader key under this member's lease, raises the counter to
//!   `max(counter, own highest epoch's count) + 1` and rewrites the sync record as "the new
//!   epoch, this member alone". The new leader may acknowledge alone at once (the old one is
//!   presumed dead: that is the failover) until a backup catches up and is recorded.
//! - **Every write of the sync record by a leader** ([`record_sync`]) also requires the
//!   leader key to hold the writer's lease: a primary paused past its lease cannot land a
//!   late "backup out of sync" after the backup has taken over, go alone and acknowledge
//!   what the new primary will presume aborted.
//! - **A maintenance pause**: while the `pause` key exists no member campaigns (the campaign
//!   compares it absent), so an operator may restart members without a failover; the
//!   leader leads on. Removing it (`decree resume`) lets the election act again.
//! - **A switchover** ([`hand_over`]): the leader, once it stopped acting with every decision
//!   it acknowledged held by its backup, names the backup alone in the sync record and
//!   deletes the leader key, in one transaction that requires the key under its lease: the
//!   backup alone may then campaign, and does at once.
//! - A member is in sync only while the record names its **current run id**: a backup that
//!   restarted (and in `received` mode lost what it acknowledged from memory) is out of sync
//!   until it catches up again and the leader records it. The leader that wrote the record
//!   is the exception ([`SyncRecord::led_by`]): its own log holds what it acknowledged, so
//!   it may lead again from a new process, as long as its log knows the record's epoch.
//! - A **new pair** (no counter, no sync record) may be led by a member whose log holds no
//!   epoch. A member whose log holds one finds etcd without the pair's records: etcd lost
//!   them, and only the operator (`decree promote --force`) may choose who leads.
//! - **Self-fencing** ([`lease_alive`]): a member acknowledges, answers `Outcome` and calls a
//!   resource manager only while its lease provably lives: from when its last successful
//!   keepalive was sent, on a clock that counts suspension, for the TTL etcd answered, less
//!   a margin.

pub mod model;

use crate::epoch::{Epoch, MemberId, MEMBER_BITS};
use serde::{Deserialize, Serialize};

/// A process's run id: new at every start, so that a restarted member is not taken for the
/// one that was in sync.
pub type RunId = String;

/// An etcd lease id.
pub type LeaseId = i64;

/// The keys of one pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    /// The leader key.
    pub leader: String,
    /// The sync record's key.
    pub sync: String,
    /// The epoch counter's key.
    pub epoch: String,
    /// The prefix of the members' registrations.
    pub members: String,
    /// The maintenance pause's key.
    pub pause: String,
    /// The last change of leader's key (what `decree status --etcd` shows of it).
    pub last_change: String,
    /// The primary's replication lag as it last reported it (under its lease).
    pub lag: String,
}

impl Keys {
    /// The keys of pair `pair` under `prefix` (no trailing slash needed).
    pub fn new(prefix: &str, pair: &str) -> Keys {
        let base = format!("{}/{pair}", prefix.trim_end_matches('/'));
        Keys {
            leader: format!("{base}/leader"),
            sync: format!("{base}/sync"),
            epoch: format!("{base}/epoch"),
            members: format!("{base}/members/"),
            pause: format!("{base}/pause"),
            last_change: format!("{base}/last_change"),
            lag: format!("{base}/lag"),
        }
    }

    /// Member `member`'s registration key.
    pub fn member(&self, member: MemberId) -> String {
        format!("{}{}", self.members, member.get())
    }
}

/// A member and the run id of its current process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InSync {
    /// The member's id.
    pub member: u8,
    /// Its process's run id.
    pub run: RunId,
}

/// The sync record: who holds every decision acknowledged in `epoch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncRecord {
    /// The epoch (raw value) the record speaks of.
    pub epoch: u64,
    /// The members holding every decision acknowledged in it, the leader first.
    pub members: Vec<InSync>,
    /// The highest epoch the leader's own log and `PAIR` provably hold: its highest when it
    /// took the lead (it may die before recording the new epoch in `PAIR`), the led epoch
    /// once it has written the record again as it starts serving. Absent: the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<u64>,
}

impl SyncRecord {
    /// Whether the record names `member` with run id `run`.
    pub fn names(&self, member: MemberId, run: &str) -> bool {
        self.members.iter().any(|m| m.member == member.get() && m.run == run)
    }

    /// The member a switchover handed the lead to, when this record is a hand-over's: it
    /// names first a member that did not mint the record's epoch ([`hand_over`]).
    pub fn handed_to(&self) -> Option<u8> {
        let first = self.members.first()?.member;
        (Epoch::from_raw(self.epoch).member().map(MemberId::get) != Some(first)).then_some(first)
    }

    /// Whether `candidate` is the leader that wrote this record, back in any process: the
    /// record's epoch is one it minted, it is named first, and its log and `PAIR` know what
    /// the record says they hold (`since`: a member whose disk was lost does not). Its own
    /// log holds every decision it acknowledged (rpo = 0), whatever its run id, so it may
    /// lead again: a primary running alone whose process died is not locked out of its
    /// pair, nor is a member that won a campaign and died before recording the epoch in
    /// `PAIR` (issue 33's simulator, finding 15: nothing was acknowledged in that epoch).
    /// After a switchover the record names the backup first and this leader after it
    /// ([`hand_over`]): the same holds, once the backup has had its turn.
    pub fn led_by(&self, candidate: &Candidate) -> bool {
        let epoch = Epoch::from_raw(self.epoch);
        self.members.iter().any(|named| named.member == candidate.member.get())
            && epoch.member() == Some(candidate.member)
            && candidate.highest >= Epoch::from_raw(self.since.unwrap_or(self.epoch))
    }
}

/// The leader key's value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leader {
    /// The leading member.
    pub member: u8,
    /// Its process's run id.
    pub run: RunId,
    /// The epoch it leads (raw value).
    pub epoch: u64,
}

/// A member's registration (under its own lease): what the others and `decree status` see.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registration {
    /// Its process's run id.
    pub run: RunId,
    /// Where it listens for its primary's link.
    pub link: String,
    /// Where its clients connect.
    pub clients: String,
}

/// The last change of leader, written by the new leader once it won (the operator's
/// information only: no rule reads it): when, and how long the pair had no leader first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderChange {
    /// The new leader.
    pub member: u8,
    /// The epoch it leads (raw value).
    pub epoch: u64,
    /// When it won, in milliseconds since the Unix epoch (its clock).
    pub at_unix_ms: u64,
    /// How long the pair had no leader before it won, as this member saw it: from its first
    /// read of an absent leader key to its win (the lapse of the old leader's lease before
    /// that is not seen). Absent when it never read the key absent before winning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vacant_ms: Option<u64>,
}

/// The primary's replication lag as it reported it (the operator's information only: no rule
/// reads it), kept under its lease so that it goes with the primary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LagReport {
    /// The primary that measured it.
    pub member: u8,
    /// The epoch it leads (raw value).
    pub epoch: u64,
    /// Whether its link to the backup was up.
    pub linked: bool,
    /// Whether it was strict (every acknowledgement waits for the backup).
    pub strict: bool,
    /// Records sent or waiting to be sent, not yet acknowledged by the backup.
    pub records: u64,
    /// Decisions whose answer waited for the backup's confirmation.
    pub decisions_waiting: u64,
    /// How long the oldest of those records had waited, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_ms: Option<u64>,
    /// When it measured, in milliseconds since the Unix epoch (its clock).
    pub at_unix_ms: u64,
}

impl LagReport {
    /// Whether `self` says something `earlier` did not (the time of measure aside).
    pub fn differs_from(&self, earlier: &LagReport) -> bool {
        LagReport { at_unix_ms: 0, ..self.clone() } != LagReport { at_unix_ms: 0, ..earlier.clone() }
    }
}

/// Whether the primary writes `now_report` to etcd, `since_last` after it wrote `last`: when
/// it says something new and at least `every` passed, so that etcd takes one write per
/// `every` at most under load and none while nothing changes.
pub fn lag_report_due(
    last: Option<&LagReport>,
    since_last: std::time::Duration,
    every: std::time::Duration,
    now_report: &LagReport,
) -> bool {
    match last {
        None => true,
        Some(last) => since_last >= every && now_report.differs_from(last),
    }
}

/// The pause key's value: who paused the pair's automatic failover, and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pause {
    /// The member whose control socket took the operator's request.
    pub by: u8,
    /// When, in milliseconds since the Unix epoch (the operator's information only).
    pub at_unix_ms: u64,
}

/// One pair as etcd holds it, for `decree status --etcd`: who leads, who is in sync, the
/// latest epoch, the members registered, the pause.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PairView {
    /// The pair's name.
    pub pair: String,
    /// The leader key, if someone leads.
    pub leader: Option<Leader>,
    /// The sync record.
    pub sync: Option<SyncRecord>,
    /// The epoch counter.
    pub epoch_count: Option<u64>,
    /// The members registered now (under their leases), by member id.
    pub members: std::collections::BTreeMap<u8, Registration>,
    /// The maintenance pause, if one stands.
    pub pause: Option<Pause>,
    /// The last change of leader, once a leader recorded one.
    pub last_change: Option<LeaderChange>,
    /// The primary's replication lag as it last reported it, while its lease lives.
    pub lag: Option<LagReport>,
    /// Keys of the pair that do not parse, named with what is wrong.
    pub unreadable: Vec<String>,
}

/// Every pair under `prefix`, from the `(key, value)` pairs read under it (pure: what
/// `decree status --etcd` shows; a key that does not parse is named in its pair's view,
/// keys of no pair are ignored).
pub fn cluster(prefix: &str, entries: &[(String, String)]) -> Vec<PairView> {
    let base = format!("{}/", prefix.trim_end_matches('/'));
    let mut pairs: std::collections::BTreeMap<String, PairView> = std::collections::BTreeMap::new();
    for (key, value) in entries {
        let Some((pair, rest)) = key.strip_prefix(&base).and_then(|k| k.split_once('/')) else { continue };
        let view = pairs
            .entry(pair.to_string())
            .or_insert_with(|| PairView { pair: pair.into(), ..Default::default() });
        let read = match rest {
            "leader" => from_json(key, value).map(|l| view.leader = Some(l)),
            "sync" => from_json(key, value).map(|r| view.sync = Some(r)),
            "pause" => from_json(key, value).map(|p| view.pause = Some(p)),
            "last_change" => from_json(key, value).map(|c| view.last_change = Some(c)),
            "lag" => from_json(key, value).map(|l| view.lag = Some(l)),
            "epoch" => value
                .parse()
                .map(|c| view.epoch_count = Some(c))
                .map_err(|e| NotNow::Inconsistent(format!("{key} holds {value:?}: {e}"))),
            other => match other.strip_prefix("members/").map(str::parse::<u8>) {
                Some(Ok(id)) => from_json(key, value).map(|r| {
                    view.members.insert(id, r);
                }),
                _ => Ok(()),
            },
        };
        if let Err(e) = read {
            view.unreadable.push(e.to_string());
        }
    }
    for view in pairs.values_mut() {
        // A report stands beside the leader that wrote it only: a stepped-down leader's,
        // which lives until its lease does, would be taken for the new leader's.
        let current = |lag: &LagReport| {
            view.leader.as_ref().is_some_and(|l| (l.member, l.epoch) == (lag.member, lag.epoch))
        };
        if !view.lag.as_ref().is_some_and(current) {
            view.lag = None;
        }
    }
    pairs.into_values().collect()
}

/// A value as read, with the key's modification revision (0: the key is absent), which a
/// transaction compares so that nothing changed in between.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read<T> {
    /// The value, if the key exists.
    pub value: Option<T>,
    /// Its modification revision; 0 when absent.
    pub mod_revision: i64,
}

impl<T> Read<T> {
    /// An absent key.
    pub fn absent() -> Read<T> {
        Read { value: None, mod_revision: 0 }
    }
}

/// What a member read of its pair's keys before campaigning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    /// The leader key.
    pub leader: Read<Leader>,
    /// The sync record.
    pub sync: Read<SyncRecord>,
    /// The epoch counter.
    pub counter: Read<u64>,
    /// The maintenance pause.
    pub pause: Read<Pause>,
}

/// A member asking to lead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The member.
    pub member: MemberId,
    /// Its process's run id.
    pub run: RunId,
    /// Its lease, under which the leader key is created.
    pub lease: LeaseId,
    /// The highest epoch its log and its `PAIR` record hold: what `led_by` compares with
    /// the sync record's `since`, and the `since` its own record will say.
    pub highest: Epoch,
    /// The newest incarnation among this node's prepared branches in the resource managers
    /// (issue 32, defect 14: a campaign mints above it). It says nothing of this member's
    /// log: a member whose disk was lost finds its old epoch there, the branches of the
    /// decisions it acknowledged and no longer holds, and was taken for the leader of record
    /// whose log holds the epoch (the simulator, elected disk loss, seed 46).
    pub prepared: Epoch,
}

/// One condition of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compare {
    /// The key's modification revision is this (0: the key is absent).
    ModRevision(String, i64),
    /// The key exists and is held by this lease.
    Lease(String, LeaseId),
}

/// One write of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Puts `value` at `key`, under `lease` when given.
    Put { key: String, value: String, lease: Option<LeaseId> },
    /// Deletes `key`.
    Delete(String),
}

/// An etcd transaction: if every compare holds, every op is applied, atomically.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Txn {
    /// The conditions.
    pub compares: Vec<Compare>,
    /// The writes, when they hold.
    pub ops: Vec<Op>,
}

/// Why a member may not campaign now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotNow {
    /// Someone leads.
    #[error("member {0} leads epoch {1}")]
    Led(u8, Epoch),
    /// The sync record does not name this member's current process for the latest epoch.
    #[error("this member is not in sync for epoch {0}: only a member named in the sync record may lead")]
    OutOfSync(Epoch),
    /// The pair's records are missing while this member's log holds an epoch.
    #[error(
        "etcd holds no record of this pair but this member's log holds epoch {0}: etcd lost its data; \
         only the operator may choose who leads (decree promote --force)"
    )]
    RecordsLost(Epoch),
    /// The records do not parse, or disagree (a counter below the sync record's epoch).
    #[error("the pair's records in etcd are inconsistent: {0}")]
    Inconsistent(String),
    /// The operator paused automatic failover (`decree pause`).
    #[error(
        "automatic failover is paused (by member {0}'s decree pause): decree resume lets the election act"
    )]
    Paused(u8),
    /// A switchover handed the lead to another member, which campaigns first: this one
    /// may campaign only once that member has had [`HAND_OVER_TURN_TTLS`] lease TTLs to.
    #[error("the lead was handed over to member {0}, which campaigns first")]
    HandedOver(u8),
    /// An epoch above this member's forced one was minted meanwhile: it must step down.
    #[error("epoch count {0} was minted after this member's forced epoch: it must step down")]
    Superseded(u64),
}

/// The epoch of count `count` minted by `member`.
pub fn epoch_of(count: u64, member: MemberId) -> Epoch {
    Epoch::from_raw((count << MEMBER_BITS) | u64::from(member.get()))
}

/// The transaction that makes `me` the leader, and the epoch it will lead, or why it may
/// not try now. The transaction fails (someone else moved first) unless every key is still
/// as `view` read it.
pub fn campaign(view: &View, me: &Candidate, keys: &Keys) -> Result<(Txn, Epoch), NotNow> {
    if let Some(to) = view.sync.value.as_ref().and_then(SyncRecord::handed_to) {
        if to != me.member.get() && view.leader.value.is_none() && view.pause.value.is_none() {
            return Err(NotNow::HandedOver(to));
        }
    }
    campaign_after_turn(view, me, keys)
}

/// The epoch this member's process (`member`, `run`) leads by `view`'s leader key, if the
/// key names it: a campaign it sent won although its answer was lost (and so was the read
/// after it). Its lease still holds the key: it must lead, or nobody ever will until the
/// lease lapses, which its keepalives prevent (the simulator's seed 1795802648032).
pub fn won(view: &View, member: MemberId, run: &str) -> Option<Epoch> {
    let leader = view.leader.value.as_ref()?;
    (leader.member == member.get() && leader.run == run).then(|| Epoch::from_raw(leader.epoch))
}

/// How many lease TTLs the member a switchover handed the lead to has to campaign before
/// the other member may: it campaigns as soon as it sees the leader key go, so its turn
/// ends only if it is dead or cut off (simulator finding 16: a switchover to a backup whose
/// process had died locked the pair out, nobody being allowed to lead).
pub const HAND_OVER_TURN_TTLS: u32 = 2;

/// [`campaign`], once the member a switchover handed the lead to has had its turn (the
/// runtime counts [`HAND_OVER_TURN_TTLS`] lease TTLs from when it first read the
/// hand-over's record): the old leader, named after it, holds every decision too.
pub fn campaign_after_turn(view: &View, me: &Candidate, keys: &Keys) -> Result<(Txn, Epoch), NotNow> {
    if let Some(leader) = &view.leader.value {
        return Err(NotNow::Led(leader.member, Epoch::from_raw(leader.epoch)));
    }
    if let Some(pause) = &view.pause.value {
        return Err(NotNow::Paused(pause.by));
    }
    let counter = match (&view.sync.value, view.counter.value) {
        (None, None) if me.highest == Epoch::NONE => 0,
        (None, None) => return Err(NotNow::RecordsLost(me.highest)),
        (Some(sync), Some(counter)) => {
            let epoch = Epoch::from_raw(sync.epoch);
            if epoch.count() != counter {
                return Err(NotNow::Inconsistent(format!(
                    "the sync record speaks of epoch {epoch} and the counter is at {counter}"
                )));
            }
            if !sync.names(me.member, &me.run) && !sync.led_by(me) {
                return Err(NotNow::OutOfSync(epoch));
            }
            counter
        }
        (Some(_), None) => return Err(NotNow::Inconsistent("a sync record without a counter".into())),
        (None, Some(counter)) => {
            return Err(NotNow::Inconsistent(format!("a counter at {counter} without a sync record")))
        }
    };
    let epoch = epoch_of(counter.max(me.highest.max(me.prepared).count()) + 1, me.member);
    let mut txn = take_the_lead(view, 0, me, (epoch, me.highest), keys);
    // A pause written after the read makes the campaign fail.
    txn.compares.push(Compare::ModRevision(keys.pause.clone(), 0));
    Ok((txn, epoch))
}

/// The transaction that makes `me` lead `epoch`, unless the keys changed since `view` (the
/// leader key's mod revision must be `leader_revision`): the leader key under its lease,
/// the counter at the epoch's count, the sync record naming it alone, its log holding
/// `since`.
fn take_the_lead(
    view: &View,
    leader_revision: i64,
    me: &Candidate,
    (epoch, since): (Epoch, Epoch),
    keys: &Keys,
) -> Txn {
    let leader = Leader { member: me.member.get(), run: me.run.clone(), epoch: epoch.raw() };
    let sync = SyncRecord {
        epoch: epoch.raw(),
        members: vec![InSync { member: me.member.get(), run: me.run.clone() }],
        since: Some(since.raw()),
    };
    Txn {
        compares: vec![
            Compare::ModRevision(keys.leader.clone(), leader_revision),
            Compare::ModRevision(keys.sync.clone(), view.sync.mod_revision),
            Compare::ModRevision(keys.epoch.clone(), view.counter.mod_revision),
        ],
        ops: vec![
            Op::Put { key: keys.leader.clone(), value: to_json(&leader), lease: Some(me.lease) },
            Op::Put { key: keys.epoch.clone(), value: epoch.count().to_string(), lease: None },
            Op::Put { key: keys.sync.clone(), value: to_json(&sync), lease: None },
        ],
    }
}

/// The transaction by which a member promoted with `decree promote --force` while etcd was
/// unreachable records its epoch `forced` once etcd answers again: it takes the leader key
/// (removing a stale one of an older epoch, whose holder's lease has not lapsed yet: that
/// holder stops acting when its lease does), raises the counter to the forced epoch's count
/// and names itself alone in the sync record. Refused when a newer epoch leads or was
/// minted meanwhile (this member must step down). Fails unless every key is still as
/// `view` read it.
pub fn record_forced(view: &View, me: &Candidate, forced: Epoch, keys: &Keys) -> Result<Txn, NotNow> {
    if let Some(leader) = &view.leader.value {
        let epoch = Epoch::from_raw(leader.epoch);
        if epoch > forced {
            return Err(NotNow::Led(leader.member, epoch));
        }
    }
    if let Some(counter) = view.counter.value.filter(|&c| c > forced.count()) {
        return Err(NotNow::Superseded(counter));
    }
    // A stale leader key is replaced: the compare is on the revision read, not on absence.
    Ok(take_the_lead(view, view.leader.mod_revision, me, (forced, forced), keys))
}

/// The transaction by which the leader `leader` (holding `lease`) records who is in sync
/// for its epoch: itself and, when `backup` is given, the backup's current process (once it
/// caught up); without one, the leader alone (as it starts serving, and when the backup is
/// out of sync: only after this succeeds may the leader acknowledge alone). It fails unless
/// the leader key still holds the writer's lease.
pub fn record_sync(keys: &Keys, leader: &Leader, lease: LeaseId, backup: Option<InSync>) -> Txn {
    let mut members = vec![InSync { member: leader.member, run: leader.run.clone() }];
    members.extend(backup);
    // Written by a leader that serves: its `PAIR` holds the epoch.
    let sync = SyncRecord { epoch: leader.epoch, members, since: Some(leader.epoch) };
    Txn {
        compares: vec![Compare::Lease(keys.leader.clone(), lease)],
        ops: vec![Op::Put { key: keys.sync.clone(), value: to_json(&sync), lease: None }],
    }
}

/// The transaction by which the leader `leader` (holding `lease`) hands the lead to its
/// in-sync backup `backup` (a switchover): the sync record names the backup first, so that
/// it campaigns first (the old leader, rejoining as its backup, does not race it for the
/// lead: [`NotNow::HandedOver`]), and the leader itself after it, so that it may lead again
/// if the backup never campaigns (its process died after its last acknowledgement: no check
/// before the hand-over can exclude that); and the leader key goes, so that the backup
/// campaigns at once. Sent only once the leader stopped acting and answered what was in
/// flight: every decision it acknowledged is held by both (it was strict). It fails
/// unless the leader key still holds the lease.
pub fn hand_over(keys: &Keys, leader: &Leader, lease: LeaseId, backup: InSync) -> Txn {
    // Both logs hold the epoch (the backup caught up in it): `since` is the epoch.
    let members = vec![backup, InSync { member: leader.member, run: leader.run.clone() }];
    let sync = SyncRecord { epoch: leader.epoch, members, since: None };
    Txn {
        compares: vec![Compare::Lease(keys.leader.clone(), lease)],
        ops: vec![
            Op::Put { key: keys.sync.clone(), value: to_json(&sync), lease: None },
            Op::Delete(keys.leader.clone()),
        ],
    }
}

/// What etcd says of resolving in-doubt transactions by hand on a stopped member's log
/// (`decree recover`): whether anyone else may act on them meanwhile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandResolution {
    /// A member leads (another one, or a newer epoch than this log has seen): its recovery
    /// acts on these transactions with decisions this log may lack.
    Led {
        /// The leader.
        member: u8,
        /// The epoch it leads (raw value).
        epoch: u64,
    },
    /// Nobody leads, no other member is registered, and the sync record names this member
    /// for the pair's latest epoch: its log holds every acknowledged decision and nobody
    /// acts beside it.
    Alone,
    /// Neither is proven; why.
    Unproven(String),
}

/// [`HandResolution`] for member `me`, whose log has seen epoch `seen` (raw), from its
/// pair's `view`.
pub fn hand_resolution(view: &PairView, me: u8, seen: u64) -> HandResolution {
    if let Some(l) = &view.leader {
        return HandResolution::Led { member: l.member, epoch: l.epoch };
    }
    if let Some(other) = view.members.keys().find(|&&m| m != me) {
        return HandResolution::Unproven(format!(
            "member {other} is registered on etcd: it runs (or its lease has not lapsed yet) and may lead at any moment"
        ));
    }
    let Some(sync) = &view.sync else {
        return HandResolution::Unproven("etcd holds no sync record for the pair".into());
    };
    let latest = view.epoch_count.is_some_and(|c| Epoch::from_raw(sync.epoch).count() >= c);
    if !sync.members.iter().any(|m| m.member == me) || !latest || sync.epoch > seen {
        return HandResolution::Unproven(format!(
            "the sync record (epoch {}) does not name this member for the pair's latest epoch with this log",
            Epoch::from_raw(sync.epoch)
        ));
    }
    HandResolution::Alone
}

/// The transaction by which the leader holding `lease` records `change`: it fails unless the
/// leader key still holds that lease, so that a deposed leader's late write never names it.
pub fn record_leader_change(keys: &Keys, lease: LeaseId, change: &LeaderChange) -> Txn {
    Txn {
        compares: vec![Compare::Lease(keys.leader.clone(), lease)],
        ops: vec![Op::Put { key: keys.last_change.clone(), value: to_json(change), lease: None }],
    }
}

/// The transaction by which the leader holding `lease` reports its lag, under that lease (a
/// dead primary's figure goes with it); it fails unless the leader key still holds the
/// lease, so that a deposed leader's late report never stands beside the new leader's.
pub fn report_lag(keys: &Keys, lease: LeaseId, report: &LagReport) -> Txn {
    Txn {
        compares: vec![Compare::Lease(keys.leader.clone(), lease)],
        ops: vec![Op::Put { key: keys.lag.clone(), value: to_json(report), lease: Some(lease) }],
    }
}

/// The transaction by which a leader that steps down takes back its lag report (only its
/// own: one under its lease), so that it does not stand while its lease lives on.
pub fn withdraw_lag(keys: &Keys, lease: LeaseId) -> Txn {
    Txn { compares: vec![Compare::Lease(keys.lag.clone(), lease)], ops: vec![Op::Delete(keys.lag.clone())] }
}

/// Whether a lease is provably alive at `now`: its last successful keepalive was sent at
/// `sent`, etcd answered `ttl`, and `margin` covers clock drift and the time etcd took to
/// act on the keepalive. All in nanoseconds of one monotonic clock that counts suspension
/// (CLOCK_BOOTTIME): a process paused or a machine suspended does not stop it.
pub fn lease_alive(sent: u64, ttl: u64, margin: u64, now: u64) -> bool {
    now >= sent && now - sent < ttl.saturating_sub(margin)
}

/// A record's JSON, as it is stored in etcd (readable with `etcdctl get`).
pub fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("the records serialize")
}

/// A record read from etcd, or what is wrong with it (naming the key).
pub fn from_json<T: for<'de> Deserialize<'de>>(key: &str, text: &str) -> Result<T, NotNow> {
    serde_json::from_str(text).map_err(|e| NotNow::Inconsistent(format!("{key} holds {text:?}: {e}")))
}

#[cfg(test)]
mod tests;
