//! The primary's end of the link: dials the backup, sends its live set and then every
//! batch the [`Outbox`] cuts, and turns the backup's acknowledgements into confirmed
//! tickets (the decisions whose clients may now be answered).
//!
//! On every link it opens the leader says `Hello` with the sequence of the next batch,
//! pushes the live set (asked of the server through [`LiveSet`]) into the outbox behind
//! what is already there, and sends `CaughtUp` after its last batch; when the backup
//! acknowledges that batch, the leader is strict again. Batches cut before the link opened
//! and never acknowledged are not resent: the live set holds what of them still matters,
//! and the backup's acknowledgement of a later batch confirms them too. A refusal of a
//! newer epoch makes the leader step down and return.
//!
//! The link commits in groups the way the log does (no timer: if nothing is in flight,
//! send now): while a batch of this link awaits its acknowledgement, records
//! shipped meanwhile wait in the outbox and go together, as one batch, when the
//! acknowledgement comes. Under load that makes batches grow with the backup's round trip
//! instead of leaving one wake-up at a time, each send costing the primary's CPU (figures
//! in docs/measurements.md, "The link's group commit").

use super::{read_message, spawn_writer, LinkEnd, LinkReport, LinkStep, LinkStream, Plaintext, Transport};
use crate::outbox::{Outbox, OutboxFull, OutboxLimits, Ticket};
use crate::rules::{Command, Event, Node, Role};
use crate::wire::{LinkMessage, LinkRecord};
use parking_lot::Mutex;
use std::net::SocketAddr;
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
    outbox: Mutex<Outbox>,
    wake: Notify,
    server: Arc<dyn LiveSet>,
    node_id: u32,
    transport: Arc<dyn Transport>,
    report: Mutex<LinkReport>,
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
            outbox: Mutex::new(Outbox::new(limits)),
            wake: Notify::new(),
            server,
            node_id,
            transport: Arc::new(Plaintext),
            report: Mutex::new(LinkReport::default()),
        }
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
        let _ = stream.set_nodelay(true);
        let stream = match self.transport.dial(stream).await {
            Ok(stream) => stream,
            Err(why) => return LinkEnd::Refused(why),
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
        loop {
            tokio::select! {
                message = read_message(&mut reader, &mut buf, self.transport.as_ref()) => {
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
            }
            for frame in self.poll_send(&mut link) {
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
        let hello = LinkMessage::Hello { epoch, member, node: self.node_id, next_sequence };
        let link = LeaderLink {
            epoch,
            sent_up_to: next_sequence - 1,
            acknowledged_up_to: next_sequence - 1,
            caught_up_to_send: None,
            caught_up_at: None,
        };
        (link, hello)
    }

    /// Steps the rules with one frame of the backup and carries out their commands: the
    /// frames to send in answer, and the link's end if it ends. The caller sends what
    /// [`Leader::poll_send`] returns next, unless the link ended.
    pub fn on_frame(&self, link: &mut LeaderLink, message: LinkMessage) -> LinkStep {
        let (epoch, view) = message.rule_view();
        let commands =
            self.node.lock().step(Event::Peer { epoch, message: view }).expect("only promotions are refused");
        let mut step = LinkStep::default();
        for command in commands {
            match command {
                Command::SendLiveSet => match self.push_live_set() {
                    Ok(up_to) => {
                        link.caught_up_to_send = Some(up_to);
                        link.caught_up_at = Some(up_to);
                    }
                    Err(end) => return step.ends(end),
                },
                Command::ConfirmUpTo(sequence) => self.confirm_up_to(link, sequence),
                Command::Refuse { seen } => {
                    step.send.push(LinkMessage::Refuse { seen });
                    return step.ends(LinkEnd::Protocol("the backup spoke for an older epoch".into()));
                }
                Command::PersistSeen(seen) => {
                    // The server records it durably when it handles the deposition.
                    self.server.deposed(seen);
                }
                Command::StepDown | Command::Rejoin(_) | Command::Join { .. } => {}
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
            let strict = self.node.lock().step(Event::BackupCaughtUp).expect("not a promotion");
            if strict.contains(&Command::BecomeStrict) {
                tracing::info!("the backup caught up: acknowledging with it from now on");
            }
        }
    }

    /// Pushes the live set behind what the outbox holds; returns the sequence whose
    /// acknowledgement ends the backup's catch-up.
    fn push_live_set(&self) -> Result<u64, LinkEnd> {
        let records = self.server.live_records();
        let up_to = {
            let mut outbox = self.outbox.lock();
            for record in records {
                // The live set is bounded by the live transactions; a backup too far
                // behind to take it is told so by the link ending.
                if outbox.push(record, None).is_err() {
                    return Err(LinkEnd::Closed("the backup is too far behind to take the live set".into()));
                }
            }
            outbox.cut();
            outbox.next_sequence() - 1
        };
        Ok(up_to)
    }

    /// The frames to send now: every batch cut since the last one sent (cutting one from
    /// the records queued only when nothing this link sent awaits an acknowledgement: the
    /// link's group commit), then `CaughtUp` once the live set's last batch has gone. The
    /// runtime calls it after each frame it received and each time a shipped record woke
    /// the link.
    pub fn poll_send(&self, link: &mut LeaderLink) -> Vec<LinkMessage> {
        let epoch = link.epoch;
        let mut frames: Vec<LinkMessage> = {
            let mut outbox = self.outbox.lock();
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
        if let Some(up_to) = link.caught_up_to_send.filter(|&up_to| up_to <= link.sent_up_to) {
            link.caught_up_to_send = None;
            frames.push(LinkMessage::CaughtUp { epoch, up_to });
        }
        frames
    }
}

/// What one link has sent, and where its catch-up stands (the primary's side, sans-IO:
/// made by [`Leader::open_link`], stepped by [`Leader::on_frame`] and [`Leader::poll_send`]).
#[derive(Debug)]
pub struct LeaderLink {
    /// The epoch this link leads (every frame it sends carries it).
    epoch: crate::epoch::Epoch,
    /// The last batch sent on this link.
    sent_up_to: u64,
    /// The last batch the backup acknowledged on this link (at its opening: the last
    /// batch cut before it, which the live set covers).
    acknowledged_up_to: u64,
    /// The live set's last batch, until `CaughtUp` naming it is sent.
    caught_up_to_send: Option<u64>,
    /// The live set's last batch, until the backup acknowledges it: then it caught up.
    caught_up_at: Option<u64>,
}

impl LeaderLink {
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
    use crate::rules::{Event, Node};
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
        let xid = Xid::decree(Origin { node: 7, incarnation: node.seen.raw(), session: 1, sequence: 1 });
        leader.ship_lazy(LinkRecord { kind: RecordKind::Completion, xid, payload: Vec::new() }).unwrap();
        assert_eq!(leader.poll_send(&mut link).len(), 1, "the completion's batch goes");
        let step = leader.on_frame(&mut link, LinkMessage::Ack { epoch: node.seen, sequence: 1 });
        assert!(step.end.is_none() && step.send.is_empty());
        assert_eq!(*server.0.lock(), vec![Vec::<Ticket>::new()]);
    }

    /// The link's group commit rests on this count: the bug it guards against is a link
    /// that waits for an acknowledgement that will never come (of a batch cut before the
    /// link opened, which is not resent) and so never sends again.
    #[test]
    fn only_batches_this_link_sent_and_the_backup_did_not_acknowledge_are_in_flight() {
        let mut link = LeaderLink {
            epoch: Epoch::NONE,
            sent_up_to: 7,
            acknowledged_up_to: 7,
            caught_up_to_send: None,
            caught_up_at: None,
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
}
