//! etcd in the simulation (issue 33): decree-pair's linearizable model of etcd
//! (`election::model::Etcd`, leases expiring on the simulated clock), the requests members
//! send it and its answers, carried with a delay, sometimes lost, and cut off from one
//! member for a while by the nemesis; and each member's clock, which runs fast or slow
//! within [`DRIFT_PPM_MAX`].
//!
//! etcd keeps true time (the simulation's); a member measures its lease on its own clock
//! (`CLOCK_BOOTTIME` in `decree serve`, which a pause does not stop). What a request does
//! happens at etcd when it arrives; a lost request never arrives, and its sender learns
//! only by its deadline ([`REQUEST_TIMEOUT`]). Not for the link or the clients: `net.rs`.

use crate::world::{Event, Time, World, MS, SECOND};
use decree_pair::election::model::Etcd;
use decree_pair::election::{from_json, Keys, LeaseId, Read, Txn, View};
use decree_pair::link::leader::BackupRun;
use decree_pair::Epoch;

/// The lease's TTL (`[pair.etcd] lease_ttl_s`; 1 s as in the elected kill loop).
pub const TTL: Time = SECOND;

/// What a member takes off its lease (`margin_ms`'s default): it covers the drift below
/// and the time etcd takes to act on a keepalive.
pub const MARGIN: Time = 200 * MS;

/// The bound on a member's clock drift against etcd's, in parts per million: ±1 %.
pub const DRIFT_PPM_MAX: i64 = 10_000;

/// An etcd request's deadline (`request_timeout_ms`'s default).
pub const REQUEST_TIMEOUT: Time = SECOND;

/// Requests in flight to etcd at once (a model's bound: each member has a handful).
const IN_FLIGHT_MAX: usize = 4096;

/// Nanoseconds per simulated microsecond.
const NS: u64 = 1_000;

/// A way to break one of the election's rules, in the simulation's glue only, so that a
/// test can show a seed that finds it (decree-pair's rules are not changed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Break {
    /// `record_sync` naming a backup that caught up, without its lease compare: a deposed
    /// leader's late write lands.
    LateSyncWrite,
    /// `record_sync` recording the backup out of sync (`alone_after_ms`), without its lease
    /// compare: a leader paused past its lease lands it after the backup took over, and
    /// goes alone.
    LateAloneWrite,
    /// The in-sync check ignores run ids: a restarted backup is taken for the one that
    /// caught up.
    RunIdIgnored,
    /// The fence is ignored: a member acts (acknowledges, answers `Outcome`, calls the
    /// resource managers) after its lease lapsed.
    FenceIgnored,
    /// A switchover without its checks and without stopping first: the primary hands the
    /// lead to the other member's current process whatever its state (not caught up, not
    /// the run recorded in sync, the primary alone), at once, and goes on acting (what is
    /// in flight answered, recovery passes) until it reads that the leader key is gone.
    HandOverUnsynced,
    /// `led_by` without its `since` check: the leader of the record's epoch leads again in
    /// any process whatever its log holds, a member whose disk was lost included (the
    /// candidate's view of the record says its leader's log holds nothing).
    SinceIgnored,
    /// The alone rule without its record: a primary whose decisions waited `alone_after_ms`
    /// for its backup acknowledges alone at once, without recording the backup out of sync
    /// first (the backup, still named in sync, may take over without what was acknowledged
    /// alone).
    AloneUnrecorded,
    /// `led_by` without its exception for the record's leader: the member that minted the
    /// record's epoch may lead again only in the process the record names, so a primary
    /// whose backup is out of sync (it ran alone) and whose process ended (it stepped down,
    /// or died) is locked out of its pair, with the out-of-sync backup.
    ReturningLeaderRefused,
}

/// What an elected seed draws beyond the pair's scenario.
#[derive(Debug, Clone)]
pub struct Elected {
    /// Each member's clock drift, in parts per million (within ±[`DRIFT_PPM_MAX`]).
    pub drift_ppm: [i64; 2],
    /// Requests to etcd lost, per mille.
    pub loss_per_mille: u64,
    /// The rule broken on purpose, if any.
    pub broken: Option<Break>,
    /// Whether the nemesis asks for switchovers: on by default since finding 16 (a
    /// switchover to a backup that dies before it campaigns locked the pair out) is fixed;
    /// off with `DECREE_SIM_SWITCHOVERS=0`.
    pub switchovers: bool,
    /// `[pair.etcd] alone_after_ms`: how long decisions wait for the backup before the
    /// primary records it out of sync and acknowledges alone; `None` waits for ever (the
    /// default).
    pub alone_after: Option<Time>,
}

/// A request to etcd.
#[derive(Debug, Clone)]
pub enum Call {
    /// Take a lease and register under it.
    Grant,
    /// Renew `lease`; `sent` is the sender's clock when it left (nanoseconds).
    KeepAlive { lease: LeaseId, sent: u64 },
    /// Read the pair's keys (a backup about to campaign).
    Read,
    /// Take the lead: the campaign's transaction for `epoch`.
    Campaign { txn: Txn, epoch: Epoch },
    /// Record who is in sync (a leader's `record_sync`): `backup` is the process named, or
    /// none (the backup recorded out of sync: the leader goes alone once it is written).
    RecordSync { txn: Txn, backup: Option<BackupRun> },
    /// A switchover's `hand_over` transaction, then the revocation of `lease` (`decree
    /// serve` revokes its lease once the transaction is answered).
    HandOver { txn: Txn, lease: LeaseId },
    /// Read the leader key (a leader's watch on it).
    ReadLeader,
    /// Give the lease up (a clean stop).
    Revoke { lease: LeaseId },
}

/// etcd's answer.
#[derive(Debug, Clone)]
pub enum Answer {
    /// A lease was granted.
    Granted(LeaseId),
    /// A keepalive's answer: whether `lease` still lived.
    KeptAlive { lease: LeaseId, sent: u64, alive: bool },
    /// The pair's keys.
    Viewed(View),
    /// Whether the campaign's transaction succeeded.
    Campaigned { epoch: Epoch, won: bool },
    /// Whether the sync record naming `backup` was written.
    Recorded { written: bool, backup: Option<BackupRun> },
    /// Whether a switchover's transaction applied (its sender's process is gone by then).
    HandedOver { written: bool },
    /// The leader key's value.
    LeaderIs(Option<decree_pair::election::Leader>),
}

/// etcd and the way to it.
pub struct EtcdWorld {
    /// The model.
    pub etcd: Etcd,
    /// The pair's keys.
    pub keys: Keys,
    /// What the seed drew.
    pub elected: Elected,
    /// Member `i` cannot reach etcd until then.
    pub cut_until: [Option<Time>; 2],
    /// Requests sent and not yet arrived.
    pub in_flight: usize,
}

impl EtcdWorld {
    /// etcd with no key, for a pair whose seed drew `elected`.
    pub fn new(elected: Elected) -> EtcdWorld {
        for ppm in elected.drift_ppm {
            assert!(ppm.abs() <= DRIFT_PPM_MAX, "a drift within the stated bound");
        }
        EtcdWorld {
            etcd: Etcd::default(),
            keys: Keys::new("/decree", "sim"),
            elected,
            cut_until: [None, None],
            in_flight: 0,
        }
    }

    /// Member `index`'s clock at true time `now` (nanoseconds; never goes back).
    pub fn clock_ns(&self, index: usize, now: Time) -> u64 {
        let rate = 1_000_000 + i128::from(self.elected.drift_ppm[index]);
        (i128::from(now * NS) * rate / 1_000_000) as u64
    }

    /// How long true time takes to pass `local` on member `index`'s clock.
    pub fn true_span(&self, index: usize, local: Time) -> Time {
        let rate = 1_000_000 + i128::from(self.elected.drift_ppm[index]);
        (i128::from(local) * 1_000_000 / rate) as Time
    }

    /// Whether the rule `rule` is broken on purpose in this run.
    pub fn broken(&self, rule: Break) -> bool {
        self.elected.broken == Some(rule)
    }

    /// The pair's keys as read at `now`.
    pub fn view(&mut self, now: Time) -> View {
        let at = now * NS;
        let keys = self.keys.clone();
        let leader = self.etcd.get(at, &keys.leader);
        let sync = self.etcd.get(at, &keys.sync);
        let counter = self.etcd.get(at, &keys.epoch);
        View {
            leader: Read {
                value: leader
                    .as_ref()
                    .map(|e| from_json(&keys.leader, &e.value).expect("the leader key parses")),
                mod_revision: leader.map_or(0, |e| e.mod_revision),
            },
            sync: Read {
                value: sync
                    .as_ref()
                    .map(|e| from_json(&keys.sync, &e.value).expect("the sync record parses")),
                mod_revision: sync.map_or(0, |e| e.mod_revision),
            },
            counter: Read {
                value: counter.as_ref().map(|e| e.value.parse().expect("a count")),
                mod_revision: counter.map_or(0, |e| e.mod_revision),
            },
            // Nobody pauses the simulated pair.
            pause: Read::absent(),
        }
    }

    /// What `call` does at etcd at `now`, and its answer (none for a revocation).
    fn apply(&mut self, now: Time, member: usize, call: Call) -> Option<Answer> {
        let at = now * NS;
        let ttl = TTL * NS;
        Some(match call {
            Call::Grant => {
                let lease = self.etcd.grant(at, ttl);
                let registration = decree_pair::election::Registration {
                    run: String::new(),
                    link: format!("member{}", member + 1),
                    clients: String::new(),
                };
                let member_id = decree_pair::MemberId::new(member as u8 + 1).expect("1 or 2");
                let put = decree_pair::election::Op::Put {
                    key: self.keys.member(member_id),
                    value: decree_pair::election::to_json(&registration),
                    lease: Some(lease),
                };
                assert!(
                    self.etcd.txn(at, &Txn { compares: vec![], ops: vec![put] }),
                    "a fresh lease registers"
                );
                Answer::Granted(lease)
            }
            Call::KeepAlive { lease, sent } => {
                Answer::KeptAlive { lease, sent, alive: self.etcd.keep_alive(lease, at, ttl) }
            }
            Call::Read => Answer::Viewed(self.view(now)),
            Call::Campaign { txn, epoch } => Answer::Campaigned { epoch, won: self.etcd.txn(at, &txn) },
            Call::RecordSync { txn, backup } => Answer::Recorded { written: self.etcd.txn(at, &txn), backup },
            Call::HandOver { txn, lease } => {
                let written = self.etcd.txn(at, &txn);
                self.etcd.revoke(lease);
                Answer::HandedOver { written }
            }
            Call::ReadLeader => Answer::LeaderIs(self.view(now).leader.value),
            Call::Revoke { lease } => {
                self.etcd.revoke(lease);
                return None;
            }
        })
    }

    /// What etcd holds of the pair, for a diagnosis.
    pub fn describe(&self, now: Time) -> String {
        let mut etcd = EtcdWorld {
            etcd: self.etcd.clone(),
            keys: self.keys.clone(),
            ..EtcdWorld::new(self.elected.clone())
        };
        let view = etcd.view(now);
        format!(
            "; etcd: leader {:?}, sync {:?}, counter {:?}",
            view.leader.value, view.sync.value, view.counter.value
        )
    }

    /// Whether the pair's records disagree: a sync record of an epoch other than the
    /// counter's (what a late write of a deposed leader leaves; nobody can campaign then).
    pub fn inconsistent(&mut self, now: Time) -> Option<String> {
        let view = self.view(now);
        let (Some(sync), Some(counter)) = (view.sync.value, view.counter.value) else { return None };
        let epoch = Epoch::from_raw(sync.epoch);
        (epoch.count() != counter)
            .then(|| format!("the sync record speaks of epoch {epoch}, the counter is at {counter}"))
    }
}

impl World {
    /// The election's etcd (elected seeds only).
    pub fn etcd(&mut self) -> &mut EtcdWorld {
        self.etcd.as_mut().expect("an elected run")
    }

    /// Member `index` sends `call` to etcd: it arrives after a delay, unless it is lost or
    /// the member is cut off from etcd; whether it left.
    pub fn etcd_send(&mut self, index: usize, call: Call) -> bool {
        let now = self.now;
        let cut = self.etcd().cut_until[index].is_some_and(|until| now < until);
        let loss = self.etcd().elected.loss_per_mille;
        if cut || self.rng.chance(loss) {
            let line = format!("member {}: etcd request lost: {}", index + 1, call_name(&call));
            self.note(|| line);
            return false;
        }
        let delay = self.etcd_delay();
        let life = self.members[index].life;
        let etcd = self.etcd();
        etcd.in_flight += 1;
        assert!(etcd.in_flight <= IN_FLIGHT_MAX, "etcd requests in flight are bounded");
        self.after(delay, Event::EtcdArrive { member: index, life, call });
        true
    }

    /// A request reaches etcd and acts there; its answer goes back.
    pub fn etcd_arrive(&mut self, index: usize, life: u64, call: Call) {
        let now = self.now;
        let etcd = self.etcd();
        etcd.in_flight -= 1;
        let name = call_name(&call);
        let answer = etcd.apply(now, index, call);
        self.note(|| format!("etcd: member {}'s {name} -> {answer:?}", index + 1));
        if let Some(Answer::Campaigned { epoch, won: true }) = &answer {
            self.oracle.won_on_etcd(now, *epoch);
        }
        let Some(answer) = answer else { return };
        if self.etcd().cut_until[index].is_some_and(|until| now < until) {
            return;
        }
        let delay = self.etcd_delay();
        self.after(delay, Event::EtcdAnswer { member: index, life, answer });
    }

    /// A one-way delay to or from etcd: mostly short, sometimes slow (a busy etcd).
    fn etcd_delay(&mut self) -> Time {
        if self.rng.chance(20) {
            self.rng.range(20 * MS, 600 * MS)
        } else {
            self.rng.range(200, 3 * MS)
        }
    }

    /// Member `index` cannot reach etcd for `duration` (its requests and answers are lost).
    pub fn etcd_cut(&mut self, index: usize, duration: Time) {
        let until = self.now + duration;
        self.etcd().cut_until[index] = Some(until);
        self.note(|| format!("member {} is cut off from etcd for {} ms", index + 1, duration / MS));
    }
}

/// A request's name, for the trace.
fn call_name(call: &Call) -> &'static str {
    match call {
        Call::Grant => "grant",
        Call::KeepAlive { .. } => "keepalive",
        Call::Read => "read",
        Call::Campaign { .. } => "campaign",
        Call::RecordSync { .. } => "record_sync",
        Call::HandOver { .. } => "hand_over",
        Call::ReadLeader => "leader read",
        Call::Revoke { .. } => "revoke",
    }
}
