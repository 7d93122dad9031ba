//! The simulation's world and its loop: the virtual clock, the queue of events, the
//! scenario a seed draws, and the step that runs every member until it is idle and then
//! checks the invariants.
//!
//! Time is virtual (microseconds) and only moves when the next event is taken from the
//! queue, which is ordered by time and then by the order events were scheduled: nothing
//! depends on the machine's clock, threads or hashers, so a seed replays exactly. After
//! each event the world *settles*: every running member takes the frames waiting for it,
//! its log's durability reports and its decide answers, until none has anything left;
//! only then are the invariants checked, so a check never sees a step half done.

use crate::member::{Member, Proc};
use crate::net::Network;
use crate::oracle::{Invariant, Oracle, Violation};
use crate::rm::Databases;
use crate::rng::Rng;
use decree_pair::link::follower::AckMode;
use decree_pair::outbox::OutboxLimits;
use decree_pair::wire::LinkMessage;
use std::collections::BTreeMap;

/// Virtual time in microseconds since the run began.
pub type Time = u64;

/// A millisecond of virtual time.
pub const MS: Time = 1_000;

/// A second of virtual time.
pub const SECOND: Time = 1_000_000;

/// What happens at a moment of the run.
#[derive(Debug, Clone)]
pub enum Event {
    /// A link frame reaches member `to`'s end of connection `conn`.
    Deliver { conn: u64, to: usize, frame: LinkMessage },
    /// Member `to` learns that the other end of `conn` closed (a FIN or a reset).
    Notice { conn: u64, to: usize },
    /// A primary's leader dials its backup (the first dial, or a redial).
    Dial { member: usize, life: u64 },
    /// The member's log writes and syncs what is queued (its writer's turn).
    DiskTurn { member: usize, life: u64 },
    /// The member's outcome memory flushes (every 5 ms, as `decree serve`'s).
    OutcomeFlush { member: usize, life: u64 },
    /// The member's recovery worker passes: its periodic pass (which schedules the next),
    /// or one a session's close asked for.
    Recovery { member: usize, life: u64, periodic: bool },
    /// A client's request reaches a member.
    Request { member: usize, client: usize, token: u64, request: crate::client::Request },
    /// A member's reply reaches a client.
    Reply { client: usize, token: u64, reply: crate::client::Reply },
    /// A client's next move.
    ClientTurn { client: usize, life: u64 },
    /// The next fault, or the operator's next move.
    Nemesis,
    /// A partition of the link ends.
    Heal,
    /// A paused member (SIGSTOP) continues (SIGCONT).
    Resume { member: usize },
    /// The faults stop: the liveness phase begins.
    Liveness,
    /// A stopping member's shutdown ends.
    Exit { member: usize, life: u64 },
    /// A primary's link timer: the link ends if it still waits for the backup.
    LinkTimer { member: usize, life: u64, conn: u64 },
    /// A member's request reaches etcd (elected runs).
    EtcdArrive { member: usize, life: u64, call: crate::etcd::Call },
    /// etcd's answer reaches a member.
    EtcdAnswer { member: usize, life: u64, answer: crate::etcd::Answer },
    /// A member's lease turn: a keepalive, or a new lease.
    Keepalive { member: usize, life: u64 },
    /// A member reads etcd: a backup to campaign, a leader its leader key.
    Poll { member: usize, life: u64 },
    /// A member that is down starts again: a step of a sequence of faults the nemesis set
    /// off at a crash point (`nemesis.rs`), which must come in its order.
    Restart { member: usize },
    /// A member's process is killed if it still lives life `life`: a later step of such a
    /// sequence (a process started since is not the one the sequence aimed at).
    Kill { member: usize, life: u64 },
}

/// What a seed draws: the pair's configuration and how hard the faults come.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// The seed everything else comes from.
    pub seed: u64,
    /// When the backup acknowledges.
    pub ack: AckMode,
    /// The primary's outbox bounds.
    pub limits: OutboxLimits,
    /// Outcomes each member remembers.
    pub outcomes_max: u32,
    /// Clients.
    pub clients: usize,
    /// Databases (resource managers).
    pub databases: usize,
    /// How long the safety phase (with faults) lasts.
    pub safety: Time,
    /// How long the liveness phase may take to reach strict with every branch finished.
    pub liveness: Time,
    /// Mean time between two faults.
    pub fault_gap: Time,
    /// Frames are also dropped, duplicated and reordered within a connection (which TCP
    /// never does: a finding that needs this is about robustness, not a real run).
    pub chaos: bool,
    /// The operator sometimes promotes while the primary still runs (paused or cut off):
    /// the mistake of issue 32's defects 8 to 10.
    pub mistakes: bool,
    /// etcd elects the primary and no operator promotes (issue 33); `None`: the operator.
    pub elected: Option<crate::etcd::Elected>,
}

impl Scenario {
    /// The scenario of `seed`.
    pub fn from_seed(seed: u64) -> Scenario {
        let mut rng = Rng::new(seed ^ 0x5CE7_A210);
        let ack = if rng.chance(300) { AckMode::Received } else { AckMode::Durable };
        let limits = OutboxLimits {
            batch_records_max: *rng.pick(&[1, 2, 4, 8, 64]),
            batch_bytes_max: 1 << 20,
            unacked_batches_max: *rng.pick(&[2, 4, 16, 64, 256]),
        };
        Scenario {
            seed,
            ack,
            limits,
            outcomes_max: *rng.pick(&[16, 64, 256, 1024]),
            clients: rng.range(1, 6) as usize,
            databases: rng.range(1, 3) as usize,
            safety: rng.range(2, 12) * SECOND,
            liveness: 20 * SECOND,
            fault_gap: rng.range(50, 1000) * MS,
            chaos: rng.chance(100),
            mistakes: rng.chance(300),
            elected: None,
        }
    }

    /// The elected scenario of `seed` (issue 33): the pair's draws as [`Scenario::from_seed`]
    /// makes them, no operator (so no operator's mistakes), and the election's own draws
    /// from a stream of their own; `broken` breaks one of the election's rules on purpose.
    pub fn elected(seed: u64, broken: Option<crate::etcd::Break>) -> Scenario {
        let mut rng = Rng::new(seed ^ 0xE7CD_0033);
        let drift = crate::etcd::DRIFT_PPM_MAX as u64;
        let mut drift_ppm = || rng.range(0, 2 * drift) as i64 - drift as i64;
        let drift_ppm = [drift_ppm(), drift_ppm()];
        let loss_per_mille = *rng.pick(&[0, 10, 50]);
        // The nemesis asks for switchovers (tests may turn them off).
        let switchovers = true;
        // From a stream of its own, so that the draws above stay as they were: half the
        // seeds wait for ever (the default), the others go alone after 100 ms to 2 s.
        let mut alone = Rng::new(seed ^ 0xA10E_0033);
        let alone_after = alone.chance(500).then(|| alone.range(100, 2_000) * MS);
        let elected = crate::etcd::Elected { drift_ppm, loss_per_mille, broken, switchovers, alone_after };
        Scenario { mistakes: false, elected: Some(elected), ..Scenario::from_seed(seed) }
    }
}

/// What a run found.
#[derive(Debug, Clone)]
pub struct Report {
    /// What the seed drew.
    pub scenario: Scenario,
    /// The first violated invariant, if any (the run stops there).
    pub violations: Vec<Violation>,
    /// Events taken from the queue.
    pub steps: u64,
    /// Decisions acknowledged to clients.
    pub acknowledged: usize,
    /// Promotions the run went through.
    pub promotions: u64,
    /// Member crashes (kills and power losses).
    pub crashes: u64,
    /// Crash points whose sequence ran (`nemesis.rs`): a census says how often the
    /// sequence it aims at was played.
    pub crash_points: u64,
    /// Switchovers begun (elected runs): the primary stopped to hand its lead over.
    pub switchovers: u64,
    /// Disks lost (elected runs; the operator's runs lose one only by mistake).
    pub disks_lost: u64,
    /// Decides a stopping primary took, read before its stop (`client.rs`, `LATE_READ`).
    pub late_decides: u64,
    /// Virtual time at the end.
    pub end: Time,
    /// One line per event and fault, when asked for (`DECREE_SIM_TRACE`).
    pub trace: Vec<String>,
}

/// The phase of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Faults come; the invariants of safety are checked.
    Safety,
    /// No more faults, no new load: the pair must return to strict and finish everything.
    Liveness,
}

/// Everything the simulation holds.
pub struct World {
    /// Now.
    pub now: Time,
    order: u64,
    queue: BTreeMap<(Time, u64), Event>,
    /// The one source of randomness.
    pub rng: Rng,
    /// What the seed drew.
    pub scenario: Scenario,
    /// The two members.
    pub members: Vec<Member>,
    /// The link's connections.
    pub net: Network,
    /// The clients.
    pub clients: Vec<crate::client::Client>,
    /// The databases.
    pub databases: Databases,
    /// The invariants' books.
    pub oracle: Oracle,
    /// etcd, when it elects the primary.
    pub etcd: Option<crate::etcd::EtcdWorld>,
    /// Where the servers' decide answers land (their callbacks run inside a step).
    pub answers: crate::client::AnswerQueue,
    /// The phase.
    pub phase: Phase,
    /// Counters for the report.
    pub promotions: u64,
    /// Member crashes so far.
    pub crashes: u64,
    /// The crash point the nemesis set, waiting for its moment (elected runs in `received`
    /// mode): a sequence of faults that needs one precise moment to matter.
    pub crash_point: Option<crate::nemesis::CrashPoint>,
    /// Crash points whose sequence ran so far.
    pub crash_points: u64,
    /// Switchovers begun so far (elected runs: the nemesis asks the primary).
    pub switchovers: u64,
    /// Disks lost so far in elected runs.
    pub disks_lost: u64,
    /// Decides a stopping primary took so far.
    pub late_decides: u64,
    /// The member the nemesis spares until it leads, after the other's disk was lost.
    pub spared: Option<usize>,
    trace: Option<Vec<String>>,
    steps: u64,
}

impl World {
    /// Schedules `event` at `at` (not before now).
    pub fn schedule(&mut self, at: Time, event: Event) {
        let at = at.max(self.now);
        self.order += 1;
        self.queue.insert((at, self.order), event);
    }

    /// Schedules `event` `after` from now.
    pub fn after(&mut self, after: Time, event: Event) {
        self.schedule(self.now + after, event);
    }

    /// Notes a line in the trace (when tracing).
    pub fn note(&mut self, line: impl FnOnce() -> String) {
        if let Some(trace) = &mut self.trace {
            let at = self.now;
            trace.push(format!("{:>6}.{:03} ms  {}", at / MS, at % MS, line()));
        }
    }

    /// Whether the trace is kept.
    pub fn tracing(&self) -> bool {
        self.trace.is_some()
    }

    fn new(scenario: Scenario, trace: bool) -> World {
        let mut rng = Rng::new(scenario.seed);
        let names: Vec<String> = (0..scenario.databases).map(|i| format!("db{i}")).collect();
        let databases = Databases::new(&names);
        let members = (0..2).map(|index| Member::new(index, rng.fork())).collect();
        let clients = (0..scenario.clients).map(crate::client::Client::new).collect();
        World {
            now: 0,
            order: 0,
            queue: BTreeMap::new(),
            rng,
            members,
            net: Network::new(scenario.chaos),
            clients,
            databases,
            oracle: Oracle::new(scenario.ack, scenario.elected.is_some()),
            etcd: scenario.elected.clone().map(crate::etcd::EtcdWorld::new),
            answers: crate::client::AnswerQueue::default(),
            phase: Phase::Safety,
            promotions: 0,
            crashes: 0,
            crash_point: None,
            crash_points: 0,
            switchovers: 0,
            disks_lost: 0,
            late_decides: 0,
            spared: None,
            trace: trace.then(Vec::new),
            steps: 0,
            scenario,
        }
    }

    /// Both members start as backups; the operator promotes member 1 (forced: it never
    /// caught up with anyone), the clients start, and the faults begin.
    fn boot(&mut self) {
        for index in 0..2 {
            self.start_backup(index);
        }
        // Elected: both campaign, the first to reach etcd leads the new pair.
        if self.etcd.is_none() {
            self.promote(0, true, "the first promotion");
        }
        for client in 0..self.clients.len() {
            let life = self.clients[client].life;
            let delay = self.rng.range(1, 5) * MS;
            self.after(delay, Event::ClientTurn { client, life });
        }
        let gap = self.scenario.fault_gap;
        self.after(gap, Event::Nemesis);
        self.schedule(self.scenario.safety, Event::Liveness);
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Deliver { conn, to, frame } => self.deliver(conn, to, frame),
            Event::Notice { conn, to } => self.notice(conn, to),
            Event::Dial { member, life } => self.dial(member, life),
            Event::DiskTurn { member, life } => self.disk_turn(member, life),
            Event::OutcomeFlush { member, life } => self.outcome_flush(member, life),
            Event::Recovery { member, life, periodic } => self.recovery(member, life, periodic),
            Event::Request { member, client, token, request } => self.request(member, client, token, request),
            Event::Reply { client, token, reply } => self.reply(client, token, reply),
            Event::ClientTurn { client, life } => self.client_turn(client, life),
            Event::Nemesis => self.nemesis(),
            Event::Heal => self.heal(),
            Event::Resume { member } => self.resume(member),
            Event::Liveness => self.begin_liveness(),
            Event::Exit { member, life } => self.exit(member, life),
            Event::LinkTimer { member, life, conn } => self.link_timer(member, life, conn),
            Event::EtcdArrive { member, life, call } => self.etcd_arrive(member, life, call),
            Event::EtcdAnswer { member, life, answer } => self.etcd_answer(member, life, answer),
            Event::Keepalive { member, life } => self.keepalive(member, life),
            Event::Poll { member, life } => self.poll(member, life),
            Event::Restart { member } => self.restart(member),
            Event::Kill { member, life } => self.kill(member, life),
        }
    }

    /// Runs every member until none has anything left to do, then takes the resource
    /// managers' news.
    fn settle(&mut self) {
        // Answers are taken after each member's turn, so that the invariants see the other
        // member as it was when the answer was given.
        loop {
            let mut progress = self.take_answers();
            for member in 0..self.members.len() {
                progress |= self.member_turn(member);
                progress |= self.take_answers();
            }
            if !progress {
                break;
            }
        }
        for xid in self.databases.take_reused() {
            let now = self.now;
            // After a promotion forced while the other member led (defect 8's mistake), a
            // member whose disk was lost can mint an epoch used before, and its Xids again
            // (seed 1795790134030: 2.1 minted twice): the mistake's, not a new defect.
            let defect = self.oracle.fallback(None);
            self.oracle.violate(
                now,
                Invariant::XidUnique,
                defect,
                format!("{xid} was handed to two transactions"),
            );
        }
        let events = self.databases.take_events();
        for event in events {
            let now = self.now;
            self.oracle.rm_event(now, &event, &self.databases, &self.members);
        }
    }

    /// Which members may take the lead as holders of everything acknowledged: both without
    /// an election (a caught-up backup may be promoted); on etcd, those the sync record
    /// names with their current process (a caught-up backup the leader recorded out of sync
    /// before going alone may not campaign, and lacks what was acknowledged alone).
    fn named_in_sync(&mut self) -> [bool; 2] {
        let now = self.now;
        let runs = [self.members[0].candidacy.run, self.members[1].candidacy.run];
        let Some(etcd) = self.etcd.as_mut() else { return [true, true] };
        let sync = etcd.view(now).sync.value;
        std::array::from_fn(|i| {
            let run = crate::election::run_name(runs[i]);
            sync.as_ref()
                .is_some_and(|s| s.members.iter().any(|m| usize::from(m.member) == i + 1 && m.run == run))
        })
    }

    /// The invariants that are checked after every step.
    fn check(&mut self) {
        let now = self.now;
        let named = self.named_in_sync();
        self.oracle.check_holders(now, &self.members, named);
        if let Some(why) = self.etcd.as_mut().and_then(|etcd| etcd.inconsistent(now)) {
            self.oracle.violate(now, Invariant::EtcdRecords, None, why);
        }
    }

    /// Whether the pair is back to strict with every branch finished and no decide waiting.
    fn returned_to_strict(&self) -> bool {
        let primaries: Vec<&Member> =
            self.members.iter().filter(|m| matches!(m.proc, Proc::Primary(_))).collect();
        let [primary] = primaries[..] else { return false };
        let Proc::Primary(p) = &primary.proc else { return false };
        let strict = p.leader.node().role == (decree_pair::Role::Primary { alone: false });
        let backup_caught_up = self.members.iter().any(|m| match &m.proc {
            Proc::Backup(b) => b.follower.node().caught_up,
            _ => false,
        });
        strict
            && backup_caught_up
            && !p.stopping
            && self.databases.prepared().is_empty()
            && self.clients.iter().all(|c| c.quiet())
    }
}

/// Runs the scenario of `seed` to its end, or to its first violated invariant.
pub fn run(seed: u64, trace: bool) -> Report {
    run_scenario(Scenario::from_seed(seed), trace)
}

/// Runs `scenario` to its end, or to its first violated invariant.
pub fn run_scenario(scenario: Scenario, trace: bool) -> Report {
    let mut world = World::new(scenario, trace);
    world.boot();
    world.settle();
    let deadline = world.scenario.safety + world.scenario.liveness;
    let mut live = false;
    while let Some(((at, _), event)) = world.queue.pop_first() {
        if at > deadline {
            break;
        }
        world.now = at;
        world.steps += 1;
        if world.tracing() && !matches!(event, Event::OutcomeFlush { .. }) {
            let line = format!("{event:?}");
            world.note(|| crate::net::shorten(&line));
        }
        world.handle(event);
        world.settle();
        if world.crash_point_reached() {
            world.settle();
        }
        world.check();
        if !world.oracle.violations.is_empty() {
            break;
        }
        if world.phase == Phase::Liveness && world.returned_to_strict() {
            live = true;
            break;
        }
    }
    if world.oracle.violations.is_empty() && !live {
        let (defect, why) = world.diagnose_liveness();
        let now = world.now;
        world.oracle.violate(now, Invariant::Liveness, defect, why);
    }
    let violations = world.oracle.violations.clone();
    for v in &violations {
        let line = v.to_string();
        world.note(|| line);
    }
    Report {
        acknowledged: world.oracle.acknowledged(),
        violations,
        steps: world.steps,
        promotions: world.promotions,
        crashes: world.crashes,
        crash_points: world.crash_points,
        switchovers: world.switchovers,
        disks_lost: world.disks_lost,
        late_decides: world.late_decides,
        end: world.now,
        trace: world.trace.take().unwrap_or_default(),
        scenario: world.scenario.clone(),
    }
}
