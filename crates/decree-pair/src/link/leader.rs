//! The primary's end of the link: dials the backup, sends its live set and then every
//! batch the [`Outbox`] cuts, and turns the backup's acknowledgements into confirmed
//! tickets (the decisions whose clients may now be answered).
//!
//! On every link it opens the leader says `Hello` with the sequence of the next batch and
//! sends nothing more until the backup's `Hello`. Then, while no decision can be shipped
//! or acknowledged alone (the [`DecisionGate`] is held exclusively), it takes the live set
//! (asked of the server through [`LiveSet`]) and starts the outbox's catch-up with it: the
//! live set streams first, under the outbox's bounds, then `CaughtUp` names its last batch.
//! A primary running alone turns strict at that moment, not when the backup has caught up:
//! every decision acknowledged before the snapshot is in it, every later one waits for the
//! backup (decides wait while a backup catches up). Batches cut before the link opened and
//! never acknowledged are dropped (the live set holds what of them still matters), and
//! their decisions are confirmed only by the acknowledgement of the live set's last batch.
//! A link that waits for its backup (its hello, a batch's acknowledgement, the catch-up's)
//! and hears nothing for the stall bound ([`super::stall`], `pair.link_stall_ms`) is ended
//! and dialled again (a half-open connection or a lost frame would stall it forever). A refusal
//! of a newer epoch makes the leader step down and return.
//!
//! The link commits in groups the way the log does (no timer: if nothing is in flight,
//! send now): while a batch of this link awaits its acknowledgement, records
//! shipped meanwhile wait in the outbox and go together, as one batch, when the
//! acknowledgement comes. Under load that makes batches grow with the backup's round trip
//! instead of leaving one wake-up at a time, each send costing the primary's CPU (figures
//! in docs/measurements.md, "The link's group commit").

use super::follower::OPENING_TIMEOUT;
use super::{read_message, spawn_writer, LinkEnd, LinkReport, LinkStep, LinkStream, Plaintext, Transport};
use crate::outbox::{Outbox, OutboxFull, OutboxLimits, Ticket};
use crate::rules::{Command, Event, Node, Role};
use crate::wire::{LinkMessage, LinkRecord};
use parking_lot::{Mutex, RwLock, RwLockReadGuard};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::{watch, Notify};

/// What the server gives the leader: its live set for a catch-up, and where confirmed
/// tickets go.
pub trait LiveSet: Send + Sync {
    /// The records of every live decision (and remembered outcome), taken while no new
    /// record can be pushed, so that the stream and the snapshot miss nothing between them.
    fn live_records(&self) -> Vec<LinkRecord>;
    /// These decisions are durable on the backup; called on every acknowledgement, with no
    /// ticket too, since each frees room in the outbox.
    fn confirmed(&self, tickets: Vec<Ticket>);
    /// The leader stepped down: a newer epoch exists.
    fn deposed(&self, seen: crate::epoch::Epoch);
}

/// Delay between two dials of an unreachable backup.
pub const REDIAL_DELAY: Duration = Duration::from_millis(100);

/// A primary member's link to its backup.
pub struct Leader {
    node: Mutex<Node>,
    /// Shared by every decision being shipped or acknowledged alone, exclusive while the
    /// live set's snapshot is taken: nothing decided meanwhile is missed.
    gate: RwLock<()>,
    outbox: Mutex<Outbox>,
    wake: Notify,
    server: Arc<dyn LiveSet>,
    node_id: u32,
    transport: Arc<dyn Transport>,
    report: Mutex<LinkReport>,
    /// This process's run id, sent in every `Hello`.
    run: u64,
    /// The backup process that caught up last (its member and run id): it holds every
    /// decision this primary acknowledged since, for an election on etcd to record.
    caught_up: watch::Sender<Option<BackupRun>>,
    /// How long a link may wait for the backup with nothing heard ([`super::stall`]).
    stall: Duration,
    /// How many times this member went alone ([`Leader::go_alone`]); changed only under
    /// the gate and the node's lock. A link whose live set was taken before the last turn
    /// cannot count its catch-up: decisions acknowledged alone since are not on it.
    alone_turns: AtomicU64,
}

/// A backup's process, named by its member id and the run id its `Hello` carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackupRun {
    /// The backup's member id.
    pub member: crate::epoch::MemberId,
    /// Its process's run id.
    pub run: u64,
}

/// How far the backup is behind this primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lag {
    /// Records sent or waiting to be sent, not yet acknowledged by the backup.
    pub records: usize,
    /// Decisions whose answer waits for the backup's confirmation.
    pub tickets: usize,
    /// How long the oldest of those records has waited.
    pub oldest: Option<Duration>,
}

impl Leader {
    /// The link of `node`, which must lead.
    pub fn new(node: Node, node_id: u32, limits: OutboxLimits, server: Arc<dyn LiveSet>) -> Leader {
        assert!(node.leads().is_some(), "only a primary leads a link");
        Leader {
            node: Mutex::new(node),
            gate: RwLock::new(()),
            outbox: Mutex::new(Outbox::new(limits)),
            wake: Notify::new(),
            server,
            node_id,
            transport: Arc::new(Plaintext),
            report: Mutex::new(LinkReport::default()),
            run: 0,
            caught_up: watch::channel(None).0,
            stall: super::stall::LINK_STALL_DEFAULT,
            alone_turns: AtomicU64::new(0),
        }
    }

    /// Ends a link that waits for the backup and hears nothing for `stall` (the default is
    /// [`super::stall::LINK_STALL_DEFAULT`]).
    pub fn with_stall(mut self, stall: Duration) -> Leader {
        assert!(!stall.is_zero(), "a link stall bound of zero");
        self.stall = stall;
        self
    }

    /// How long a link may wait for the backup with nothing heard.
    pub fn stall(&self) -> Duration {
        self.stall
    }

    /// Names this process with `run` in every `Hello`.
    pub fn with_run(mut self, run: u64) -> Leader {
        self.run = run;
        self
    }

    /// The backup process that caught up last, as it changes: while this primary stays
    /// strict, that process holds every decision acknowledged since (an election on etcd
    /// records it in sync).
    pub fn caught_up_backups(&self) -> watch::Receiver<Option<BackupRun>> {
        self.caught_up.subscribe()
    }

    /// Opens every link through `transport` (TLS with the pair's certificates) instead of
    /// plain TCP.
    pub fn with_transport(mut self, transport: Arc<dyn Transport>) -> Leader {
        self.transport = transport;
        self
    }

    /// Counts links on from `earlier` (this member's report as a backup), so that the
    /// totals a member shows cover both of its roles.
    pub fn with_link_totals(self, earlier: &LinkReport) -> Leader {
        *self.report.lock() = LinkReport::continuing(earlier);
        self
    }

    /// How this member's link connections are opened (TLS or plaintext).
    pub(super) fn transport(&self) -> &Arc<dyn Transport> {
        &self.transport
    }

    /// Whether a link to the backup is open, and why the last one ended.
    pub fn link_report(&self) -> LinkReport {
        self.report.lock().clone()
    }

    /// What the backup has not acknowledged yet.
    pub fn lag(&self) -> Lag {
        let outbox = self.outbox.lock();
        Lag {
            records: outbox.unacked_records(),
            tickets: outbox.unacked_tickets(),
            oldest: outbox.oldest_unacked().map(|since| since.elapsed()),
        }
    }

    /// The rules' view of this member now.
    pub fn node(&self) -> Node {
        *self.node.lock()
    }

    /// Holds off the catch-up's snapshot while the caller reads the role, acknowledges a
    /// decision alone or ships it: each decision is then either in the snapshot or in the
    /// stream after it, with its ticket.
    pub fn decision_gate(&self) -> DecisionGate<'_> {
        DecisionGate { _shared: self.gate.read(), leader: self }
    }

    /// Turns a strict primary alone (the election recorded its backup out of sync first):
    /// with no decision between reading the role and shipping (the gate is held
    /// exclusively), so each decision is either shipped before, with its ticket, or
    /// acknowledged on its own write after. Returns whether this member now leads alone.
    ///
    /// The backup process that caught up is forgotten, and the link open now ends at its
    /// next turn ([`Leader::outlived_alone`]): decisions acknowledged alone are on neither
    /// its live set nor its stream, so neither a catch-up begun before (it would make the
    /// primary strict and be recorded in sync without them) nor the same link kept open
    /// (the primary would stay alone for as long as it lasts, and nobody could take over)
    /// may stand. The backup says hello again on a new link and catches up from there.
    pub fn go_alone(&self) -> bool {
        let _exclusive = self.gate.write();
        let mut node = self.node.lock();
        let strict = node.role == Role::Primary { alone: false };
        node.step(Event::GoAlone).expect("not a promotion");
        if strict {
            self.alone_turns.fetch_add(1, Ordering::SeqCst);
            self.caught_up.send_replace(None);
            self.wake.notify_one();
        }
        node.role == Role::Primary { alone: true }
    }

    /// Whether `link` must end because this member went alone after its live set was taken
    /// (see [`Leader::go_alone`]). The runtime asks before each [`Leader::poll_send`];
    /// [`Leader::on_frame`] asks too.
    pub fn outlived_alone(&self, link: &LeaderLink) -> Option<LinkEnd> {
        (link.started && link.alone_turns != self.alone_turns.load(Ordering::SeqCst)).then(|| {
            LinkEnd::Closed(
                "the primary went alone (its backup recorded out of sync): the backup catches up again on a new link"
                    .into(),
            )
        })
    }

    /// Queues a record for the backup; `ticket` names a decision whose answer waits for
    /// the backup's confirmation. Refused while the backup is too far behind.
    pub fn ship(&self, record: LinkRecord, ticket: Option<Ticket>) -> Result<(), OutboxFull> {
        self.outbox.lock().push(record, ticket)?;
        self.wake.notify_one();
        Ok(())
    }

    /// Queues a record no client waits for (a completion, an outcome) without waking the
    /// link while a batch awaits its acknowledgement: the record goes with the next batch,
    /// which that acknowledgement or the next decision sends. Waking the link for each of
    /// them cost a send and a backup wake-up per record under load, for records that are
    /// lazy by design. Refused like [`Leader::ship`].
    pub fn ship_lazy(&self, record: LinkRecord) -> Result<(), OutboxFull> {
        if self.node().role == (Role::Primary { alone: true }) {
            // No catch-up began since the promotion: the next one's live set holds it.
            return Ok(());
        }
        let wake = {
            let mut outbox = self.outbox.lock();
            let (quiet, next) = (outbox.unacked_count() == 0, outbox.next_sequence());
            outbox.push(record, None)?;
            // A batch the push cut must go now, and with nothing awaiting an acknowledgement
            // no acknowledgement would send the record.
            quiet || outbox.next_sequence() != next
        };
        if wake {
            self.wake.notify_one();
        }
        Ok(())
    }

    /// Dials `backup` until `stop` or until deposed, serving each link until it ends.
    pub async fn run(self: Arc<Self>, backup: SocketAddr, mut stop: watch::Receiver<bool>) -> LinkEnd {
        loop {
            if *stop.borrow() {
                return LinkEnd::Stopped("stopped".into());
            }
            let end = tokio::select! {
                _ = stop.wait_for(|s| *s) => return LinkEnd::Stopped("stopped".into()),
                end = self.clone().open_and_serve(backup) => end,
            };
            self.report.lock().ended(end.to_string());
            tracing::info!(%backup, "replication link: {end}");
            if let LinkEnd::Stopped(_) | LinkEnd::Storage(_) = end {
                return end;
            }
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return LinkEnd::Stopped("stopped".into()),
                _ = tokio::time::sleep(REDIAL_DELAY) => {}
            }
        }
    }

    /// Dials the backup, opens the link through the transport, and serves it until it ends.
    async fn open_and_serve(self: Arc<Self>, backup: SocketAddr) -> LinkEnd {
        let stream = match TcpStream::connect(backup).await {
            Ok(stream) => stream,
            Err(e) => return LinkEnd::Closed(format!("cannot reach the backup at {backup}: {e}")),
        };
        super::tune(&stream);
        // Bounded like the backup's end of an opening: a peer that accepts and says nothing
        // (a paused process) must not hold the dialler.
        let stream = match tokio::time::timeout(OPENING_TIMEOUT, self.transport.dial(stream)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(why)) => return LinkEnd::Refused(why),
            Err(_) => {
                return LinkEnd::Closed(format!(
                    "the link to {backup} did not open within {OPENING_TIMEOUT:?}"
                ))
            }
        };
        self.report.lock().opened();
        self.serve_link(stream).await
    }

    async fn serve_link(self: Arc<Self>, stream: LinkStream) -> LinkEnd {
        let (mut reader, writer) = tokio::io::split(stream);
        let out = spawn_writer(writer);
        let (mut link, hello) = self.open_link();
        if out.send(hello).await.is_err() {
            return LinkEnd::Closed("the writer stopped".into());
        }
        let mut buf = Vec::new();
        let closed = |_| LinkEnd::Closed("the writer stopped".into());
        // The stall rule counts on the link's own clock, from its opening.
        let opened = tokio::time::Instant::now();
        let mut watch = super::stall::StallWatch::new(self.stall, Duration::ZERO);
        loop {
            let deadline = watch.deadline().map(|after| opened + after);
            tokio::select! {
                message = read_message(&mut reader, &mut buf, self.transport.as_ref()) => {
                    watch.heard(opened.elapsed());
                    let message = match message {
                        Ok(message) => message,
                        Err(end) => return end,
                    };
                    let step = self.on_frame(&mut link, message);
                    for frame in step.send {
                        let _ = out.send(frame).await;
                    }
                    if let Some(end) = step.end {
                        return end;
                    }
                }
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep_until(deadline.unwrap_or(opened)), if deadline.is_some() => {
                    if watch.stalled(opened.elapsed()) {
                        return watch.end("backup");
                    }
                }
            }
            if let Some(end) = self.outlived_alone(&link) {
                return end;
            }
            let frames = self.poll_send(&mut link);
            watch.waits(link.awaits_backup(), opened.elapsed());
            for frame in frames {
                if let Err(end) = out.send(frame).await.map_err(closed) {
                    return end;
                }
            }
        }
    }

    /// A link to the backup just opened (sans-IO: the runtime, or a simulation, carries
    /// the frames): its state, and the `Hello` to send first.
    pub fn open_link(&self) -> (LeaderLink, LinkMessage) {
        let (epoch, member) = {
            let node = self.node.lock();
            (node.seen, node.member)
        };
        let next_sequence = self.outbox.lock().next_sequence();
        let hello = LinkMessage::Hello { epoch, member, node: self.node_id, next_sequence, run: self.run };
        let link = LeaderLink {
            epoch,
            peer: None,
            started: false,
            sent_up_to: next_sequence - 1,
            acknowledged_up_to: next_sequence - 1,
            caught_up_to_send: None,
            caught_up_at: None,
            alone_turns: 0,
        };
        (link, hello)
    }

    /// Steps the rules with one frame of the backup and carries out their commands: the
    /// frames to send in answer, and the link's end if it ends. The caller sends what
    /// [`Leader::poll_send`] returns next, unless the link ended.
    pub fn on_frame(&self, link: &mut LeaderLink, message: LinkMessage) -> LinkStep {
        if let Err(end) = self.check_greeting(link, &message) {
            return LinkStep::default().ends(end);
        }
        if let Some(end) = self.outlived_alone(link) {
            return LinkStep::default().ends(end);
        }
        if let LinkMessage::Hello { member, run, .. } = message {
            let peer = BackupRun { member, run };
            link.peer = Some(peer);
            // Another process of the backup: the one that caught up is gone, and this one
            // holds nothing until it catches up (a switchover must not name either).
            self.caught_up.send_if_modified(|last| {
                let gone = last.is_some_and(|last| last != peer);
                if gone {
                    *last = None;
                }
                gone
            });
        }
        let (epoch, view) = message.rule_view();
        let commands =
            self.node.lock().step(Event::Peer { epoch, message: view }).expect("only promotions are refused");
        let mut step = LinkStep::default();
        for command in commands {
            match command {
                Command::SendLiveSet => self.start_catch_up(link),
                Command::ConfirmUpTo(sequence) => self.confirm_up_to(link, sequence),
                Command::Refuse { seen } => {
                    step.send.push(LinkMessage::Refuse { seen });
                    return step.ends(LinkEnd::Protocol("the backup spoke for an older epoch".into()));
                }
                Command::PersistSeen(seen) => {
                    // The server records it durably when it handles the deposition.
                    self.server.deposed(seen);
                }
                Command::StepDown | Command::Rejoin(_) | Command::Join { .. } | Command::BecomeStrict => {}
                other => {
                    return step
                        .ends(LinkEnd::Protocol(format!("{other:?} cannot happen on a primary's link")))
                }
            }
        }
        if self.node.lock().role == Role::Backup {
            return step.ends(LinkEnd::Stopped("deposed by a newer epoch".into()));
        }
        step
    }

    /// Another member dialled this primary's link address (sans-IO: the runtime, or a
    /// simulation, carries the frames), which only a member that believes it leads does:
    /// one of the two is stale (issue 32, defects 8 to 10: after a promotion both dialled
    /// and neither listened, so an old primary never learned of the new epoch). Its first
    /// frame must be its `Hello`: one of an older epoch is answered `Refuse` with this
    /// member's, which deposes the dialler; one of a newer epoch deposes this member (the
    /// newer epoch is recorded first, as on its own link). The connection ends either way.
    pub fn on_dialled(&self, message: LinkMessage) -> LinkStep {
        let step = LinkStep::default();
        let LinkMessage::Hello { epoch, node, member, .. } = message else {
            return step.ends(LinkEnd::Protocol(format!("a dialling member's first frame was {message:?}")));
        };
        if let Err(end) = super::check_peer(self.node_id, self.node().member, node, member) {
            return step.ends(end);
        }
        let seen = self.node().seen;
        match crate::rules::fence(seen, epoch) {
            crate::rules::Fence::Stale => {
                let mut step = step;
                step.send.push(LinkMessage::Refuse { seen });
                step.ends(LinkEnd::Closed(format!(
                    "a member of the older epoch {epoch} dialled: told it of {seen}"
                )))
            }
            crate::rules::Fence::Current => step
                .ends(LinkEnd::Protocol(format!("a member dialled with this primary's own epoch {epoch}"))),
            crate::rules::Fence::Newer => {
                // As a refusal naming the newer epoch: the rules record it, step down, rejoin.
                let view = crate::rules::PeerMessage::Refused;
                let commands =
                    self.node.lock().step(Event::Peer { epoch, message: view }).expect("not a promotion");
                for command in commands {
                    if let Command::PersistSeen(newer) = command {
                        self.server.deposed(newer);
                    }
                }
                step.ends(LinkEnd::Stopped(format!("deposed by the member of epoch {epoch}, which dialled")))
            }
        }
    }

    /// Whether the backup's `message` may come now: its `Hello` (naming this pair's node and
    /// the other member) before anything but a refusal, and only once (issue 32, defects 7
    /// and 11: an acknowledgement before the hello confirmed batches of an earlier link).
    fn check_greeting(&self, link: &LeaderLink, message: &LinkMessage) -> Result<(), LinkEnd> {
        match (link.started, message) {
            (_, LinkMessage::Refuse { .. }) => Ok(()),
            (false, LinkMessage::Hello { node, member, .. }) => {
                super::check_peer(self.node_id, self.node().member, *node, *member)
            }
            (false, other) => Err(LinkEnd::Protocol(format!("{other:?} before the backup's hello"))),
            (true, LinkMessage::Hello { .. }) => Err(LinkEnd::Protocol("a second hello on one link".into())),
            (true, _) => Ok(()),
        }
    }

    /// The backup acknowledged every batch up to `sequence`: confirms their tickets, and
    /// ends the catch-up when the live set's last batch is among them.
    fn confirm_up_to(&self, link: &mut LeaderLink, sequence: u64) {
        link.acknowledged_up_to = link.acknowledged_up_to.max(sequence);
        let tickets = self.outbox.lock().acknowledge(sequence);
        // Even with no ticket: the outbox has room again, and what waits for room (the
        // server's overflow) must go now, not at some later decision's confirmation.
        self.server.confirmed(tickets);
        if link.caught_up_at.is_some_and(|at| sequence >= at) && link.caught_up_to_send.is_none() {
            link.caught_up_at = None;
            let mut node = self.node.lock();
            if link.alone_turns != self.alone_turns.load(Ordering::SeqCst) {
                // The member went alone since this live set was taken (under the node's
                // lock, as here): it lacks what was acknowledged alone; the link ends.
                return;
            }
            node.step(Event::BackupCaughtUp).expect("not a promotion");
            tracing::info!("the backup caught up (the live set's last batch is durable there)");
            // A strict primary acknowledges nothing its backup lacks: from now on this
            // backup process holds every decision acknowledged (once the role is strict).
            self.caught_up.send_replace(link.peer);
        }
    }

    /// The backup said hello: takes the live set while no decision is shipped or
    /// acknowledged alone, and starts the outbox's catch-up with it (from the sequence
    /// this link's `Hello` named: nothing was sent on the link before).
    fn start_catch_up(&self, link: &mut LeaderLink) {
        if link.started {
            return; // A second hello on one link: the live set is on its way already.
        }
        let _exclusive = self.gate.write();
        let mark = self.outbox.lock().mark();
        let records = self.server.live_records();
        self.outbox.lock().begin_catch_up(mark, link.sent_up_to + 1, records);
        link.started = true;
        link.alone_turns = self.alone_turns.load(Ordering::SeqCst);
        link.caught_up_to_send = Some(0);
    }

    /// The frames to send now: every batch cut since the last one sent (cutting one from
    /// the records queued only when nothing this link sent awaits an acknowledgement: the
    /// link's group commit), then `CaughtUp` once the live set's last batch has gone. The
    /// runtime calls it after each frame it received and each time a shipped record woke
    /// the link.
    pub fn poll_send(&self, link: &mut LeaderLink) -> Vec<LinkMessage> {
        if !link.started {
            return Vec::new(); // The live set goes first, after the backup's hello.
        }
        let epoch = link.epoch;
        let mut frames: Vec<LinkMessage> = {
            let mut outbox = self.outbox.lock();
            // The live set streams as fast as the unacknowledged bound allows.
            while outbox.catch_up_last().is_none() && outbox.cut().is_some() {}
            if link.caught_up_to_send.is_some() {
                if let Some(last) = outbox.catch_up_last() {
                    link.caught_up_to_send = Some(last);
                    link.caught_up_at = Some(last);
                }
            }
            if link.in_flight() == 0 {
                outbox.cut();
            }
            outbox
                .resend_from(link.sent_up_to + 1)
                .map(|b| LinkMessage::Batch { epoch, sequence: b.sequence, records: b.records.clone() })
                .collect()
        };
        if let Some(LinkMessage::Batch { sequence, .. }) = frames.last() {
            link.sent_up_to = *sequence;
        }
        if let Some(up_to) = link
            .caught_up_to_send
            .filter(|&up_to| link.caught_up_at == Some(up_to) && up_to <= link.sent_up_to)
        {
            link.caught_up_to_send = None;
            frames.push(LinkMessage::CaughtUp { epoch, up_to });
        }
        frames
    }
}

/// A decision's way through the leader (see [`Leader::decision_gate`]).
pub struct DecisionGate<'a> {
    _shared: RwLockReadGuard<'a, ()>,
    leader: &'a Leader,
}

impl DecisionGate<'_> {
    /// The member's role now. It may turn strict while the gate is held, but the snapshot
    /// waits for the gate: a decision acknowledged alone under it is in the snapshot.
    pub fn role(&self) -> Role {
        self.leader.node().role
    }

    /// Queues a decision's record, as [`Leader::ship`].
    pub fn ship(&self, record: LinkRecord, ticket: Option<Ticket>) -> Result<(), OutboxFull> {
        self.leader.ship(record, ticket)
    }
}

/// What one link has sent, and where its catch-up stands (the primary's side, sans-IO:
/// made by [`Leader::open_link`], stepped by [`Leader::on_frame`] and [`Leader::poll_send`]).
#[derive(Debug)]
pub struct LeaderLink {
    /// The epoch this link leads (every frame it sends carries it).
    epoch: crate::epoch::Epoch,
    /// The backup's process, from its `Hello`.
    peer: Option<BackupRun>,
    /// The backup said hello and the live set's catch-up began.
    started: bool,
    /// The last batch sent on this link.
    sent_up_to: u64,
    /// The last batch the backup acknowledged on this link (at its opening: the last
    /// batch cut before it, which the live set covers).
    acknowledged_up_to: u64,
    /// The live set's last batch, until `CaughtUp` naming it is sent.
    caught_up_to_send: Option<u64>,
    /// The live set's last batch, until the backup acknowledges it: then it caught up.
    caught_up_at: Option<u64>,
    /// The leader's count of turns to alone when the live set was taken.
    alone_turns: u64,
}

impl LeaderLink {
    /// Whether the link waits for the backup: its hello, an acknowledgement of a batch
    /// sent, or the acknowledgement that ends the catch-up (of the live set's last batch,
    /// which the backup repeats once it has caught up: with an empty live set, the only
    /// frame that can come). The runtime ends a link that waits with nothing heard for the
    /// stall bound ([`super::stall`]).
    pub fn awaits_backup(&self) -> bool {
        !self.started || self.in_flight() > 0 || self.caught_up_at.is_some()
    }

    /// Batches this link sent that await the backup's acknowledgement.
    fn in_flight(&self) -> u64 {
        self.sent_up_to.saturating_sub(self.acknowledged_up_to)
    }
}

#[cfg(test)]
mod tests {
    use super::{Leader, LeaderLink, LiveSet};
    use crate::epoch::{Epoch, MemberId};
    use crate::outbox::{OutboxLimits, Ticket};
    use crate::rules::{Event, Node, Role};
    use crate::wire::{LinkMessage, LinkRecord, RecordKind};
    use decree_core::{Origin, Xid};
    use parking_lot::Mutex;
    use std::sync::Arc;

    /// A server that counts the acknowledgements it is told of.
    #[derive(Default)]
    struct Counting(Mutex<Vec<Vec<Ticket>>>);

    impl LiveSet for Counting {
        fn live_records(&self) -> Vec<LinkRecord> {
            Vec::new()
        }
        fn confirmed(&self, tickets: Vec<Ticket>) {
            self.0.lock().push(tickets);
        }
        fn deposed(&self, _seen: Epoch) {}
    }

    /// The bug this guards against (found by the simulator, seed 363): the server's
    /// overflow, decisions a full outbox refused, is drained in `confirmed`, which was
    /// called only when an acknowledgement confirmed a ticket; acknowledgements of batches
    /// of completions alone left those decisions waiting beside an idle link.
    #[test]
    fn an_acknowledgement_that_confirms_no_ticket_still_reaches_the_server() {
        let server = Arc::new(Counting::default());
        let mut node = Node::start(MemberId::new(1).unwrap(), Epoch::NONE);
        node.step(Event::Promote { forced: true, log_highest: Epoch::NONE }).unwrap();
        let leader = Leader::new(node, 7, OutboxLimits::default(), server.clone());
        let (mut link, _hello) = leader.open_link();
        // Member 2's hello, from its process `run`, expecting batch `next_sequence`.
        let hello_of = |run: u64, next_sequence: u64| LinkMessage::Hello {
            epoch: node.seen,
            member: MemberId::new(2).unwrap(),
            node: 7,
            next_sequence,
            run,
        };
        let hello = hello_of(0x77, 1);
        let caught_up = leader.caught_up_backups();
        assert!(leader.on_frame(&mut link, hello.clone()).end.is_none());
        assert_eq!(leader.node().role, Role::Primary { alone: false }, "strict from the snapshot on");
        assert_eq!(leader.poll_send(&mut link), vec![LinkMessage::CaughtUp { epoch: node.seen, up_to: 0 }]);
        assert_eq!(*caught_up.borrow(), None, "not caught up before its acknowledgement");
        let xid = Xid::decree(Origin { node: 7, incarnation: node.seen.raw(), session: 1, sequence: 1 });
        leader.ship_lazy(LinkRecord { kind: RecordKind::Completion, xid, payload: Vec::new() }).unwrap();
        assert_eq!(leader.poll_send(&mut link).len(), 1, "the completion's batch goes");
        let step = leader.on_frame(&mut link, LinkMessage::Ack { epoch: node.seen, sequence: 1 });
        assert!(step.end.is_none() && step.send.is_empty());
        assert_eq!(*server.0.lock(), vec![Vec::<Ticket>::new()]);
        // The same acknowledgement ended the catch-up: the backup's process, by the run id
        // of its hello, is the one an election records in sync.
        let backup = super::BackupRun { member: MemberId::new(2).unwrap(), run: 0x77 };
        assert_eq!(*caught_up.borrow(), Some(backup));
        // The same process on a new link still holds everything; another process of the
        // backup holds nothing until it catches up (simulator finding 16: a switchover
        // named the process that had caught up while its successor was catching up).
        let (mut again, _hello) = leader.open_link();
        assert!(leader.on_frame(&mut again, hello).end.is_none());
        assert_eq!(*caught_up.borrow(), Some(backup), "the same process linked again");
        let (mut next, _hello) = leader.open_link();
        assert!(leader.on_frame(&mut next, hello_of(0x78, 2)).end.is_none());
        assert_eq!(*caught_up.borrow(), None, "the backup's next process has not caught up");
    }

    /// Found by the simulator once it played `alone_after_ms` (seeds 10, 83, 128, ...): a
    /// primary that went alone kept its link, and the backup on it, which had caught up or
    /// was catching up, never said hello again, so the primary stayed alone for good and no
    /// failover could follow; and a catch-up whose live set was taken before the turn to
    /// alone, ending after it, made the primary strict and named the backup in sync without
    /// the decisions acknowledged alone meanwhile.
    #[test]
    fn going_alone_ends_the_link_and_a_catch_up_begun_before_it_does_not_count() {
        let mut node = Node::start(MemberId::new(1).unwrap(), Epoch::NONE);
        node.step(Event::Promote { forced: true, log_highest: Epoch::NONE }).unwrap();
        let leader = Leader::new(node, 7, OutboxLimits::default(), Arc::new(Counting::default()));
        let hello = LinkMessage::Hello {
            epoch: node.seen,
            member: MemberId::new(2).unwrap(),
            node: 7,
            next_sequence: 1,
            run: 0x77,
        };
        let caught_up = leader.caught_up_backups();
        let (mut link, _hello) = leader.open_link();
        assert!(leader.on_frame(&mut link, hello.clone()).end.is_none());
        assert_eq!(leader.poll_send(&mut link), vec![LinkMessage::CaughtUp { epoch: node.seen, up_to: 0 }]);
        assert!(leader.outlived_alone(&link).is_none(), "a strict primary's link lives on");
        assert!(leader.go_alone(), "strict, then alone");
        assert!(leader.outlived_alone(&link).is_some(), "the link open when it went alone ends");
        // The acknowledgement that ends this catch-up, as if it raced the turn to alone
        // past the link's check: it counts for nothing.
        leader.confirm_up_to(&mut link, 1);
        assert_eq!(leader.node().role, Role::Primary { alone: true }, "still alone");
        assert_eq!(*caught_up.borrow(), None, "no backup process to record in sync");
        let step = leader.on_frame(&mut link, LinkMessage::Ack { epoch: node.seen, sequence: 1 });
        assert!(step.end.is_some(), "the next frame on the old link ends it");
        // The backup says hello on a new link: strict from its live set on, and once it
        // caught up, the process to record in sync.
        let (mut next, _hello) = leader.open_link();
        assert!(leader.on_frame(&mut next, hello).end.is_none());
        assert_eq!(leader.node().role, Role::Primary { alone: false });
        assert_eq!(leader.poll_send(&mut next), vec![LinkMessage::CaughtUp { epoch: node.seen, up_to: 0 }]);
        assert!(leader.on_frame(&mut next, LinkMessage::Ack { epoch: node.seen, sequence: 0 }).end.is_none());
        let backup = super::BackupRun { member: MemberId::new(2).unwrap(), run: 0x77 };
        assert_eq!(*caught_up.borrow(), Some(backup));
        assert!(leader.outlived_alone(&next).is_none());
    }

    /// The link's group commit rests on this count: the bug it guards against is a link
    /// that waits for an acknowledgement that will never come (of a batch cut before the
    /// link opened, which is not resent) and so never sends again.
    #[test]
    fn only_batches_this_link_sent_and_the_backup_did_not_acknowledge_are_in_flight() {
        let mut link = LeaderLink {
            epoch: Epoch::NONE,
            peer: None,
            started: true,
            sent_up_to: 7,
            acknowledged_up_to: 7,
            caught_up_to_send: None,
            caught_up_at: None,
            alone_turns: 0,
        };
        assert_eq!(link.in_flight(), 0, "batches cut before the link opened are not awaited");
        link.sent_up_to = 10;
        assert_eq!(link.in_flight(), 3);
        link.acknowledged_up_to = 9;
        assert_eq!(link.in_flight(), 1);
        link.acknowledged_up_to = 10;
        assert_eq!(link.in_flight(), 0, "an acknowledgement of the last batch sent frees the link");
        link.acknowledged_up_to = 12;
        assert_eq!(link.in_flight(), 0, "never negative");
    }

    /// Issue 32, defects 8 to 10: a member that dials a primary is a primary too; the one
    /// of the older epoch must learn of the newer at once.
    #[test]
    fn a_primary_dialled_by_an_older_one_refuses_it_and_by_a_newer_one_is_deposed() {
        let member = |id| MemberId::new(id).unwrap();
        let lead = |id| {
            let mut node = Node::start(member(id), Epoch::NONE);
            node.step(Event::Promote { forced: true, log_highest: Epoch::NONE }).unwrap();
            node
        };
        let (older, newer) = (lead(1), {
            let mut node = Node::start(member(2), lead(1).seen);
            node.step(Event::Promote { forced: true, log_highest: Epoch::NONE }).unwrap();
            node
        });
        assert!(newer.seen > older.seen);
        let hello = |node: Node| LinkMessage::Hello {
            epoch: node.seen,
            member: node.member,
            node: 7,
            next_sequence: 1,
            run: 0,
        };

        let server = Arc::new(Deposing::default());
        let leader = Leader::new(newer, 7, OutboxLimits::default(), server.clone());
        let step = leader.on_dialled(hello(older));
        assert_eq!(step.send, vec![LinkMessage::Refuse { seen: newer.seen }]);
        assert!(step.end.is_some() && server.0.lock().is_none() && leader.node().leads().is_some());
        let step = leader.on_dialled(LinkMessage::Ack { epoch: older.seen, sequence: 1 });
        assert!(step.send.is_empty() && step.end.is_some(), "a hello first");

        let server = Arc::new(Deposing::default());
        let leader = Leader::new(older, 7, OutboxLimits::default(), server.clone());
        let step = leader.on_dialled(hello(newer));
        assert!(step.send.is_empty() && step.end.is_some());
        assert_eq!(*server.0.lock(), Some(newer.seen), "the newer epoch is recorded");
        assert_eq!(leader.node().role, Role::Backup, "deposed");
    }

    /// A server that records its deposition.
    #[derive(Default)]
    struct Deposing(Mutex<Option<Epoch>>);

    impl LiveSet for Deposing {
        fn live_records(&self) -> Vec<LinkRecord> {
            Vec::new()
        }
        fn confirmed(&self, _tickets: Vec<Ticket>) {}
        fn deposed(&self, seen: Epoch) {
            *self.0.lock() = Some(seen);
        }
    }
}
