//! The backup's end of the link: accepts the primary's connection, applies its batches to
//! the backup's own log through [`Replica`], and acknowledges each batch once it and every
//! batch before it are durable there ([`AckMode::Durable`], the default) or handed to the
//! log ([`AckMode::Received`]). A failure of the log stops the backup (fail-stop).
//!
//! Every frame goes through the rules first ([`Node::step`]); the follower carries out the
//! commands in order, and a `PersistSeen` is durable (the `PAIR` file) before the next
//! command runs. `CaughtUp` is handed to the rules only once the batches up to its `up_to`
//! are durable and every live Xid the primary did not send since its `Hello` is forgotten.

use super::{read_message, spawn_writer, LinkEnd, LinkReport, LinkStep, LinkStream, Plaintext, Transport};
use crate::epoch::{Epoch, MemberId};
use crate::replica::{Replica, ReplicaError};
use crate::rules::{Command, Event, Node, PeerMessage, PromoteRefused};
use crate::state_cell::StateCell;
use crate::state_file::{self, PairState};
use crate::wire::{LinkMessage, RecordKind};
use decree_core::Xid;
use decree_log::io::Storage;
use parking_lot::Mutex;
use std::collections::{BTreeSet, HashSet};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

/// When a backup acknowledges a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AckMode {
    /// Once the batch is durable in the backup's log under its sync policy: an
    /// acknowledged decision survives the loss of either machine, power included.
    #[default]
    Durable,
    /// Once the batch is in the backup's memory (handed to its log), which writes it with
    /// its own policy: X Platform's model, faster, and an acknowledged decision survives
    /// the loss of either machine but not a power loss of both at once.
    Received,
}

/// Why a promotion did not happen.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PromoteError {
    /// The rules refused it (already leading, or not caught up and not forced).
    #[error("{0}")]
    Refused(crate::rules::PromoteRefused),
    /// The new epoch could not be made durable: nothing changed, the member stays a backup.
    #[error("the promotion could not be recorded: {0}")]
    Storage(String),
}

/// A backup member: its rules, its durable state and its copy of the decisions.
pub struct Follower {
    node: Mutex<Node>,
    state: StateCell,
    replica: Mutex<Replica>,
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    node_id: u32,
    ack: AckMode,
    transport: Arc<dyn Transport>,
    report: Mutex<LinkReport>,
    /// How long the link's reader stays awake after each frame (zero: it sleeps at once).
    busy_poll: Duration,
    /// Turns the reader spent awake without a frame, for tests and figures.
    busy_poll_turns: AtomicU64,
    /// The log refused a write (it stops for good: fail-stop); set by the write's callback,
    /// which a stopped log calls at once, so that `Received` acknowledges nothing after.
    log_failed: Arc<AtomicBool>,
    /// This process's run id, sent in every `Hello`.
    run: u64,
    /// How long a link may wait for the primary with nothing heard ([`super::stall`]).
    stall: Duration,
}

/// The link being served, until it ends (and why).
type ServedLink = Pin<Box<dyn Future<Output = LinkEnd> + Send>>;

/// The longest busy poll a backup accepts: past a few milliseconds it only burns a CPU.
pub const BUSY_POLL_MAX: Duration = Duration::from_millis(10);

/// The link's end when the copy refuses a batch (a protocol error of the primary) or its
/// log failed (fail-stop).
fn replica_end(e: ReplicaError) -> LinkEnd {
    match e {
        ReplicaError::Log(e) => LinkEnd::Storage(format!("the backup's log failed: {e}")),
        refused => LinkEnd::Protocol(refused.to_string()),
    }
}

/// How long a connection may take to pass the transport's checks (the TLS handshake)
/// before the backup closes it: a peer that connects and says nothing holds no link.
pub(super) const OPENING_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections being opened (in their TLS handshake) at once, at most.
pub(super) const OPENINGS_MAX: usize = 8;

/// Where a backup's log reports each applied batch's durability (its sequence, and the
/// log's error if it failed): the runtime hands each report back to
/// [`Follower::on_durable`]. Called from the log's threads: it must never block.
pub type DurableSink = Arc<dyn Fn(u64, Result<(), String>) + Send + Sync>;

/// One primary's link on the backup's side, sans-IO: made by [`Follower::open_link`],
/// stepped by [`Follower::on_frame`] and [`Follower::on_durable`].
pub struct FollowerLink {
    stream: Stream,
    /// A `CaughtUp` that waits for its batches' durability: no frame is read meanwhile.
    deferred: Option<LinkMessage>,
    durable: DurableSink,
    /// The primary's `Hello` came, and checked out.
    greeted: bool,
}

impl FollowerLink {
    /// Whether the runtime should read the next frame: not while a catch-up waits for its
    /// batches to be durable (only durability reports are taken then).
    pub fn wants_frames(&self) -> bool {
        self.deferred.is_none()
    }
}

/// What one link has received since the primary's `Hello`, for the end of the catch-up.
struct Stream {
    epoch: Epoch,
    /// Decisions received since the `Hello`, until the catch-up ends: the primary holds
    /// them. Not kept after it (memory follows the live set, not the history).
    received: HashSet<Xid>,
    /// Between the primary's `Hello` and the end of the catch-up.
    joining: bool,
    /// The highest sequence up to which every batch is acknowledged (durable, or received
    /// under [`AckMode::Received`]).
    acked_up_to: u64,
    /// Acknowledged batches above a gap (their callbacks came back out of order).
    acked_above: BTreeSet<u64>,
}

impl Follower {
    /// A backup over `replica`'s log in `dir` (whose `PAIR` file it reads or creates), as
    /// member `member` of node `node_id`.
    pub fn open(
        member: MemberId,
        node_id: u32,
        replica: Replica,
        storage: Arc<dyn Storage>,
        dir: PathBuf,
    ) -> Result<Follower, LinkEnd> {
        let storage_error = |e: decree_log::LogError| LinkEnd::Storage(e.to_string());
        let state = match state_file::load(storage.as_ref(), &dir).map_err(storage_error)? {
            Some(state) => {
                state_file::check_member(&state, member, &dir).map_err(storage_error)?;
                state
            }
            None => {
                let state = PairState { member, seen: Epoch::NONE, forced: None };
                state_file::store(storage.as_ref(), &dir, None, &state).map_err(storage_error)?;
                state
            }
        };
        Ok(Follower {
            node: Mutex::new(Node::start(member, state.seen)),
            state: StateCell::new(state),
            replica: Mutex::new(replica),
            storage,
            dir,
            node_id,
            ack: AckMode::Durable,
            transport: Arc::new(Plaintext),
            report: Mutex::new(LinkReport::default()),
            busy_poll: Duration::ZERO,
            busy_poll_turns: AtomicU64::new(0),
            log_failed: Arc::new(AtomicBool::new(false)),
            run: 0,
            stall: super::stall::LINK_STALL_DEFAULT,
        })
    }

    /// Ends a link that waits for the primary and hears nothing for `stall` (the default
    /// is [`super::stall::LINK_STALL_DEFAULT`]).
    pub fn with_stall(mut self, stall: Duration) -> Follower {
        assert!(!stall.is_zero(), "a link stall bound of zero");
        self.stall = stall;
        self
    }

    /// How long a link may wait for the primary with nothing heard.
    pub fn stall(&self) -> Duration {
        self.stall
    }

    /// Whether `link` waits for the primary: its `Hello`, or the `CaughtUp` that ends the
    /// catch-up while this backup owes no acknowledgement (nor waits for its own log to
    /// end a catch-up). The runtime ends a link that waits with nothing heard for the stall
    /// bound ([`super::stall`]): a `CaughtUp` lost within a connection, which TCP never
    /// does but a middlebox or a bug may, left the backup not caught up for good.
    pub fn awaits_primary(&self, link: &FollowerLink) -> bool {
        if !link.greeted {
            return true;
        }
        let received = self.node.lock().next_sequence - 1;
        let owes = received > link.stream.acked_up_to;
        link.stream.joining && link.deferred.is_none() && !owes
    }

    /// Names this process with `run` in every `Hello` (the primary records it in sync).
    pub fn with_run(mut self, run: u64) -> Follower {
        self.run = run;
        self
    }

    /// Accepts every link through `transport` (TLS with the pair's certificates) instead
    /// of plain TCP.
    pub fn with_transport(mut self, transport: Arc<dyn Transport>) -> Follower {
        self.transport = transport;
        self
    }

    /// Whether a primary's link is open, and why the last one ended.
    pub fn link_report(&self) -> LinkReport {
        self.report.lock().clone()
    }

    /// Keeps the link's reader awake for `budget` after each frame, so that the primary's
    /// next batch is read without waking a sleeping CPU: on a backup whose machine halts
    /// idle CPUs, that wake-up is most of what a decision waits for on the link. Costs up to
    /// a CPU of the backup while decisions flow; serve with [`Follower::serve_on_own_thread`]
    /// (a runtime thread of the server's asleep in the IO driver would still be woken by
    /// every frame, and the spinning task would hold a thread the server's tasks need).
    pub fn with_busy_poll(mut self, budget: Duration) -> Follower {
        assert!(budget <= BUSY_POLL_MAX, "busy poll {budget:?} above {BUSY_POLL_MAX:?}");
        self.busy_poll = budget;
        self
    }

    /// How long the link's reader stays awake after each frame (zero: no busy poll).
    pub fn busy_poll(&self) -> Duration {
        self.busy_poll
    }

    /// Turns the link's reader has spent awake waiting for a frame (busy polling).
    pub fn busy_poll_turns(&self) -> u64 {
        self.busy_poll_turns.load(Ordering::Relaxed)
    }

    /// Acknowledges batches as `ack` says (durable by default).
    pub fn with_ack_mode(mut self, ack: AckMode) -> Follower {
        self.ack = ack;
        self
    }

    /// The rules' view of this member now.
    pub fn node(&self) -> Node {
        *self.node.lock()
    }

    /// The durable state of this member (`PAIR`).
    pub fn pair_state(&self) -> PairState {
        self.state.get()
    }

    /// The operator's promotion: steps the rules (refused on a member that has not caught
    /// up, unless `forced`) with the highest epoch the copy's Xids carry, or this node's
    /// prepared branches in the resource managers (`prepared_highest`), and makes the new
    /// epoch (and a forced promotion) durable in `PAIR` before returning the node, which
    /// now leads. The caller stops this follower before it serves anything.
    pub fn promote(&self, forced: bool, prepared_highest: Epoch) -> Result<Node, PromoteError> {
        // A newer epoch the link recorded and the rules have not stepped yet counts too:
        // the promotion mints above it, never below (issue 32, defect 7). So does the
        // newest incarnation among this node's prepared branches: an epoch whose leader's
        // disk was lost is known only there (defect 14).
        self.step_promotion(|highest| {
            Ok(Event::Promote { forced, log_highest: highest.max(prepared_highest) })
        })
    }

    /// etcd's election made this member the leader of `epoch` (issue 33): steps the rules
    /// and makes the epoch durable in `PAIR` as [`Follower::promote`] does. Refused when
    /// `epoch` is not above every epoch this member knows (one the link recorded since the
    /// campaign read [`Follower::highest_known`] included).
    pub fn promote_elected(&self, epoch: Epoch) -> Result<Node, PromoteError> {
        self.step_promotion(|highest| match epoch > highest {
            true => Ok(Event::Elected { epoch }),
            false => Err(PromoteRefused::NotAbove { seen: highest, elected: epoch }),
        })
    }

    /// The highest epoch this member knows: in its `PAIR` record or among its copy's Xids.
    /// A campaign on etcd mints above it.
    pub fn highest_known(&self) -> Epoch {
        self.replica.lock().highest_incarnation().max(self.state.get().seen)
    }

    /// Steps the rules with the promotion `event` makes of the highest epoch known (the
    /// copy's Xids, `PAIR`'s record as it is stored) and stores the result in `PAIR`.
    fn step_promotion(
        &self,
        event: impl FnOnce(Epoch) -> Result<Event, PromoteRefused>,
    ) -> Result<Node, PromoteError> {
        let log_highest = self.replica.lock().highest_incarnation();
        let mut node = self.node.lock();
        let mut promoted = *node;
        self.state.change(
            |previous| {
                let event = event(log_highest.max(previous.seen)).map_err(PromoteError::Refused)?;
                let commands = promoted.step(event).map_err(PromoteError::Refused)?;
                let mut next = previous;
                for command in commands {
                    match command {
                        Command::PersistSeen(seen) => next.seen = seen,
                        Command::RecordForcedPromotion(epoch) => next.forced = Some(epoch),
                        Command::RecoverThenServe(_) => {}
                        other => unreachable!("a promotion commands no {other:?}"),
                    }
                }
                Ok(Some(next))
            },
            |previous, next| {
                state_file::store(self.storage.as_ref(), &self.dir, Some(previous), next)
                    .map_err(|e| PromoteError::Storage(e.to_string()))
            },
        )?;
        *node = promoted;
        Ok(promoted)
    }

    /// How many decisions the copy holds.
    pub fn live_count(&self) -> usize {
        self.replica.lock().live_count()
    }

    /// Makes every outcome the copy remembered durable (its outcome memory's flush).
    pub fn sync_outcomes(&self) -> Result<(), decree_log::LogError> {
        self.replica.lock().sync_outcomes()
    }

    /// Accepts links until `stop`; one link at a time is served. Openings (the transport's
    /// checks: TLS, or the pair's secret) run beside the served link, each within
    /// [`OPENING_TIMEOUT`] and at most [`OPENINGS_MAX`] at once, so that a peer that connects
    /// and says nothing delays no one. A connection that passes them while a link is served
    /// is closed at once (issue 32, defect 11), not left waiting to become the link later: the
    /// peer is the other member, which dials again every 100 ms, and a link whose peer
    /// vanished ends within [`super::LINK_SILENCE_MAX`].
    pub async fn serve(self: Arc<Self>, listener: TcpListener, stop: watch::Receiver<bool>) {
        let mut openings = tokio::task::JoinSet::new();
        self.clone().accept_links(listener, stop, &mut openings).await;
        // No opening in flight outlives the serving: each holds this follower, and with it
        // the log, which a promoted member reopens at once (issue 32, defect 7).
        openings.shutdown().await;
    }

    async fn accept_links(
        self: Arc<Self>,
        listener: TcpListener,
        mut stop: watch::Receiver<bool>,
        openings: &mut tokio::task::JoinSet<()>,
    ) {
        let (opened_tx, mut opened_rx) = mpsc::channel::<(LinkStream, SocketAddr)>(OPENINGS_MAX);
        let mut served: Option<(ServedLink, SocketAddr)> = None;
        loop {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                accepted = listener.accept() => {
                    if let Ok((stream, from)) = accepted {
                        self.clone().open_connection(stream, from, openings, &opened_tx);
                    }
                }
                Some(_) = openings.join_next(), if !openings.is_empty() => {}
                Some((stream, from)) = opened_rx.recv() => {
                    if let Some((_, serving)) = &served {
                        let why = format!("refused a link from {from}: the link from {serving} is open");
                        tracing::warn!("{why}");
                        self.report.lock().refused(why);
                        drop(stream);
                        continue;
                    }
                    self.report.lock().opened();
                    served = Some((Box::pin(self.clone().serve_link(stream)), from));
                }
                end = async { served.as_mut().expect("polled only while served").0.as_mut().await }, if served.is_some() => {
                    let (_, from) = served.take().expect("a link was served");
                    self.report.lock().ended(end.to_string());
                    tracing::info!(%from, "replication link ended: {end}");
                    if let LinkEnd::Storage(why) = end {
                        // Fail-stop: a backup whose log failed acknowledges nothing more.
                        tracing::error!("the backup stops: {why}");
                        return;
                    }
                }
            }
        }
    }

    /// Serves links as [`Follower::serve`] does, on a thread of its own (`decree-pair-link`)
    /// with a single-threaded runtime of its own, which alone polls the link's socket: what
    /// [`Follower::with_busy_poll`] needs. The thread ends when `stop` is set or the backup
    /// stops (fail-stop).
    pub fn serve_on_own_thread(
        self: Arc<Self>,
        listener: std::net::TcpListener,
        stop: watch::Receiver<bool>,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        listener.set_nonblocking(true)?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        std::thread::Builder::new().name("decree-pair-link".into()).spawn(move || {
            runtime.block_on(async move {
                match TcpListener::from_std(listener) {
                    Ok(listener) => self.serve(listener, stop).await,
                    Err(e) => tracing::error!("the backup's link listener cannot be polled: {e}"),
                }
            })
        })
    }

    /// One turn of a busy poll: other threads of this CPU run first (`sched_yield`), then
    /// the runtime polls its IO driver without sleeping and runs what is ready.
    async fn busy_poll_turn(&self) {
        self.busy_poll_turns.fetch_add(1, Ordering::Relaxed);
        std::thread::yield_now();
        tokio::task::yield_now().await;
    }

    /// Opens an accepted connection through the transport in its own task; what passes
    /// goes to `opened`, what does not is logged with the reason and closed.
    fn open_connection(
        self: Arc<Self>,
        stream: tokio::net::TcpStream,
        from: SocketAddr,
        openings: &mut tokio::task::JoinSet<()>,
        opened: &mpsc::Sender<(LinkStream, SocketAddr)>,
    ) {
        if openings.len() >= OPENINGS_MAX {
            tracing::warn!(%from, "replication link refused: {OPENINGS_MAX} openings already under way");
            return;
        }
        super::tune(&stream);
        let opened = opened.clone();
        openings.spawn(async move {
            let why = match tokio::time::timeout(OPENING_TIMEOUT, self.transport.accept(stream, from)).await {
                Ok(Ok(stream)) => {
                    let _ = opened.send((stream, from)).await;
                    return;
                }
                Ok(Err(why)) => why,
                Err(_) => format!("not opened within {OPENING_TIMEOUT:?}"),
            };
            tracing::warn!(%from, "replication link refused: {why}");
            self.report.lock().refused(format!("refused a link from {from}: {why}"));
        });
    }

    async fn serve_link(self: Arc<Self>, stream: LinkStream) -> LinkEnd {
        let (mut reader, writer) = tokio::io::split(stream);
        let out = spawn_writer(writer);
        // Unbounded because the log's callbacks must never block; it holds at most one
        // report per batch applied and not yet seen by the loop below, which reads reports
        // and frames alike. The link holds the sender, so the channel never closes.
        let (durable_tx, mut durable_rx) = mpsc::unbounded_channel::<(u64, Result<(), String>)>();
        let sink: DurableSink = Arc::new(move |sequence, result| {
            let _ = durable_tx.send((sequence, result));
        });
        let (mut link, hello) = self.open_link(sink);
        if out.send(hello).await.is_err() {
            return LinkEnd::Closed("the writer stopped".into());
        }
        let mut buf = Vec::new();
        // Until when the reader stays awake for the next frame (busy polling).
        let mut awake_until: Option<Instant> = None;
        // The stall rule counts on the link's own clock, from its opening.
        let opened = tokio::time::Instant::now();
        let mut watch = super::stall::StallWatch::new(self.stall, Duration::ZERO);
        loop {
            watch.waits(self.awaits_primary(&link), opened.elapsed());
            let deadline = watch.deadline().map(|after| opened + after);
            let awake = awake_until.is_some_and(|until| Instant::now() < until);
            // While a catch-up waits for its batches' durability, no frame is read.
            let reading = link.wants_frames();
            // A turn that wins drops the read, which loses nothing: `read_message` keeps
            // every byte it took in `buf` before it awaits again.
            let message = tokio::select! {
                message = read_message(&mut reader, &mut buf, self.transport.as_ref()), if reading => {
                    match message {
                        Ok(message) => message,
                        Err(end) => return end,
                    }
                }
                _ = self.busy_poll_turn(), if awake && reading => continue,
                _ = tokio::time::sleep_until(deadline.unwrap_or(opened)), if deadline.is_some() => {
                    if watch.stalled(opened.elapsed()) {
                        return watch.end("primary");
                    }
                    continue;
                }
                Some((sequence, result)) = durable_rx.recv() => {
                    if let Some(end) = send_step(self.on_durable(&mut link, sequence, result), &out).await {
                        return end;
                    }
                    continue;
                }
            };
            watch.heard(opened.elapsed());
            if !self.busy_poll.is_zero() {
                awake_until = Some(Instant::now() + self.busy_poll);
            }
            if let Some(seen) = self.newer_epoch(&link, &message) {
                // Durable before the rules act on it, without a runtime thread waiting on
                // the sync: `on_frame` then finds it recorded.
                let me = self.clone();
                match tokio::task::spawn_blocking(move || me.persist_seen(seen)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(end)) => return end,
                    Err(e) => return LinkEnd::Storage(e.to_string()),
                }
            }
            if let Some(end) = send_step(self.on_frame(&mut link, message), &out).await {
                return end;
            }
        }
    }

    /// A primary's link just opened (sans-IO: the runtime, or a simulation, carries the
    /// frames): its state, and the `Hello` to send first. `durable` is where the log
    /// reports each applied batch's durability, for [`Follower::on_durable`].
    pub fn open_link(&self, durable: DurableSink) -> (FollowerLink, LinkMessage) {
        let hello = {
            let node = self.node.lock();
            LinkMessage::Hello {
                epoch: node.seen,
                member: node.member,
                node: self.node_id,
                next_sequence: node.next_sequence,
                run: self.run,
            }
        };
        let stream = Stream {
            epoch: Epoch::NONE,
            received: HashSet::new(),
            joining: false,
            acked_up_to: 0,
            acked_above: BTreeSet::new(),
        };
        (FollowerLink { stream, deferred: None, durable, greeted: false }, hello)
    }

    /// Whether `message` may come now on `link`: the primary's `Hello` first, naming this
    /// pair's node and the other member (issue 32, defects 7 and 11: neither was checked,
    /// and a `Batch` before any `Hello` was applied), then anything but a second `Hello`.
    fn check_greeting(&self, link: &FollowerLink, message: &LinkMessage) -> Result<(), LinkEnd> {
        match (link.greeted, message) {
            (false, LinkMessage::Hello { node, member, .. }) => {
                super::check_peer(self.node_id, self.node.lock().member, *node, *member)
            }
            (false, other) => Err(LinkEnd::Protocol(format!("{other:?} before the primary's hello"))),
            (true, LinkMessage::Hello { .. }) => Err(LinkEnd::Protocol("a second hello on one link".into())),
            (true, _) => Ok(()),
        }
    }

    /// The newer epoch `message` carries, if it carries one: the runtime may make it
    /// durable ([`Follower::persist_seen`]) before [`Follower::on_frame`], which then finds
    /// it recorded.
    pub fn newer_epoch(&self, link: &FollowerLink, message: &LinkMessage) -> Option<Epoch> {
        // A frame the link refuses records nothing.
        self.check_greeting(link, message).ok()?;
        let (epoch, _) = message.rule_view();
        (crate::rules::fence(self.node.lock().seen, epoch) == crate::rules::Fence::Newer).then_some(epoch)
    }

    /// Steps the rules with one frame and carries out their commands: the frames to send
    /// in answer, and the link's end if it ends. A `CaughtUp` whose batches are not all
    /// durable yet waits (the link then wants no frame: [`FollowerLink::wants_frames`])
    /// until [`Follower::on_durable`] has seen them.
    pub fn on_frame(&self, link: &mut FollowerLink, message: LinkMessage) -> LinkStep {
        let step = self.frame_step(link, message);
        self.after_step(step)
    }

    fn frame_step(&self, link: &mut FollowerLink, message: LinkMessage) -> LinkStep {
        let mut step = LinkStep::default();
        if let Err(end) = self.check_greeting(link, &message) {
            return step.ends(end);
        }
        link.greeted = true;
        let (epoch, view) = message.rule_view();
        if let PeerMessage::CaughtUp { up_to } = view {
            let (seen, next_sequence) = {
                let node = self.node.lock();
                (node.seen, node.next_sequence)
            };
            // A CaughtUp past a gap goes to the rules, which ask for the link to be dialled again.
            if seen == epoch && up_to < next_sequence {
                if link.stream.acked_up_to < up_to {
                    link.deferred = Some(message);
                    return step;
                }
                if let Err(end) = self.finish_catch_up(&mut link.stream, up_to, &mut step.send) {
                    return step.ends(end);
                }
            }
        }
        self.apply_rules(link, message, step)
    }

    /// A batch's durability report (from the [`DurableSink`]): acknowledges every batch
    /// durable without a gap, and ends a waiting catch-up once its batches are.
    pub fn on_durable(&self, link: &mut FollowerLink, sequence: u64, result: Result<(), String>) -> LinkStep {
        let step = self.durable_step(link, sequence, result);
        self.after_step(step)
    }

    /// A step that ends the link on a failure of the log makes the member unpromotable
    /// until it catches up again from a healthy log (issue 32, defect 5): what it
    /// acknowledged may not be on its disk.
    fn after_step(&self, step: LinkStep) -> LinkStep {
        if let Some(LinkEnd::Storage(_)) = &step.end {
            self.node.lock().step(Event::LogFailed).expect("not a promotion");
        }
        step
    }

    fn durable_step(&self, link: &mut FollowerLink, sequence: u64, result: Result<(), String>) -> LinkStep {
        let mut step = LinkStep::default();
        if let Err(end) = self.batch_acked(&mut link.stream, sequence, result, &mut step.send) {
            return step.ends(end);
        }
        let ready = match &link.deferred {
            Some(LinkMessage::CaughtUp { up_to, .. }) => link.stream.acked_up_to >= *up_to,
            _ => false,
        };
        if !ready {
            return step;
        }
        let message = link.deferred.take().expect("checked");
        let (_, PeerMessage::CaughtUp { up_to }) = message.rule_view() else {
            unreachable!("a deferred CaughtUp")
        };
        if let Err(end) = self.finish_catch_up(&mut link.stream, up_to, &mut step.send) {
            return step.ends(end);
        }
        self.apply_rules(link, message, step)
    }

    /// Steps the rules with `message` and carries out their commands into `step`.
    fn apply_rules(&self, link: &mut FollowerLink, message: LinkMessage, mut step: LinkStep) -> LinkStep {
        let (epoch, view) = message.rule_view();
        let commands =
            self.node.lock().step(Event::Peer { epoch, message: view }).expect("only promotions are refused");
        for command in commands {
            let done = match command {
                Command::PersistSeen(seen) => self.persist_seen(seen),
                Command::Rejoin(_) | Command::StepDown => Ok(()),
                Command::Join { epoch, .. } => {
                    link.stream = Stream {
                        epoch,
                        received: HashSet::new(),
                        joining: true,
                        acked_up_to: self.node.lock().next_sequence - 1,
                        acked_above: BTreeSet::new(),
                    };
                    Ok(())
                }
                Command::AppendThenAck { sequence, .. } => {
                    let LinkMessage::Batch { records, .. } = &message else {
                        unreachable!("only batches append")
                    };
                    self.append_then_ack(link, sequence, records, &mut step.send)
                }
                Command::AckAgain { sequence, .. } if sequence <= link.stream.acked_up_to => {
                    let stream = &link.stream;
                    step.send.push(LinkMessage::Ack { epoch: stream.epoch, sequence: stream.acked_up_to });
                    Ok(())
                }
                Command::AckAgain { .. } => Ok(()), // Its first acknowledgement is still coming.
                Command::Refuse { seen } => {
                    step.send.push(LinkMessage::Refuse { seen });
                    Ok(())
                }
                Command::Resend { from, .. } => {
                    Err(LinkEnd::Protocol(format!("batch {from} is missing; the primary must dial again")))
                }
                other => Err(LinkEnd::Protocol(format!("{other:?} cannot happen on a backup's link"))),
            };
            if let Err(end) = done {
                return step.ends(end);
            }
        }
        step
    }

    /// Checks a batch, applies it through the replica, and acknowledges it now (received)
    /// or when the log reports it durable.
    fn append_then_ack(
        &self,
        link: &mut FollowerLink,
        sequence: u64,
        records: &[crate::wire::LinkRecord],
        send: &mut Vec<LinkMessage>,
    ) -> Result<(), LinkEnd> {
        if link.stream.joining {
            let decisions = records.iter().filter(|r| r.kind == RecordKind::Decision);
            link.stream.received.extend(decisions.map(|r| r.xid));
        }
        let sink = link.durable.clone();
        let received = self.ack == AckMode::Received;
        let failed = self.log_failed.clone();
        let done = Box::new(move |result: Result<(), decree_log::LogError>| {
            if result.is_err() {
                failed.store(true, Ordering::SeqCst);
            }
            // Under `Received` the batch was acknowledged already: only a failure is
            // reported, and it stops the backup.
            if !received || result.is_err() {
                sink(sequence, result.map_err(|e| e.to_string()));
            }
        });
        let checked = self.replica.lock().check(records).map_err(replica_end)?;
        // Handed to the log first, even under `Received`: a log that failed refuses it,
        // and a batch it refused is never acknowledged (issue 32, defect 5: a backup whose
        // log had failed acknowledged what it could no longer hold).
        self.replica.lock().apply_checked(records, checked, done).map_err(replica_end)?;
        if received {
            if self.log_failed.load(Ordering::SeqCst) {
                return Err(LinkEnd::Storage("the backup's log failed: it refused the batch".into()));
            }
            self.batch_acked(&mut link.stream, sequence, Ok(()), send)?;
        }
        Ok(())
    }

    /// Records a batch's durability and acknowledges every batch durable without a gap.
    fn batch_acked(
        &self,
        stream: &mut Stream,
        sequence: u64,
        result: Result<(), String>,
        send: &mut Vec<LinkMessage>,
    ) -> Result<(), LinkEnd> {
        if let Err(e) = result {
            return Err(LinkEnd::Storage(format!("the backup's log failed: {e}")));
        }
        stream.acked_above.insert(sequence);
        let before = stream.acked_up_to;
        while stream.acked_above.remove(&(stream.acked_up_to + 1)) {
            stream.acked_up_to += 1;
        }
        if stream.acked_up_to > before {
            send.push(LinkMessage::Ack { epoch: stream.epoch, sequence: stream.acked_up_to });
        }
        Ok(())
    }

    /// The batches up to `up_to` are durable: forgets what the primary did not send since
    /// its `Hello`, and acknowledges `up_to`.
    fn finish_catch_up(
        &self,
        stream: &mut Stream,
        up_to: u64,
        send: &mut Vec<LinkMessage>,
    ) -> Result<(), LinkEnd> {
        assert!(stream.acked_up_to >= up_to, "a catch-up ends once its batches are durable");
        if !stream.joining {
            return Ok(()); // A second CaughtUp on one link: nothing more to forget.
        }
        let dropped =
            self.replica.lock().retain(&stream.received).map_err(|e| LinkEnd::Storage(e.to_string()))?;
        stream.received = HashSet::new();
        stream.joining = false;
        tracing::info!(up_to, dropped, "caught up with the primary");
        // Said even when no batch carried the live set (an empty one), so that the primary
        // learns the catch-up ended.
        send.push(LinkMessage::Ack { epoch: stream.epoch, sequence: up_to });
        Ok(())
    }

    /// Makes `seen` the highest epoch in `PAIR`, durably, before anything else happens
    /// (nothing to do when it is recorded already). Blocks on the state file's syncs.
    pub fn persist_seen(&self, seen: Epoch) -> Result<(), LinkEnd> {
        self.state.change(
            |state| Ok((state.seen < seen).then_some(PairState { seen, ..state })),
            |previous, next| {
                state_file::store(self.storage.as_ref(), &self.dir, Some(previous), next)
                    .map_err(|e| LinkEnd::Storage(e.to_string()))
            },
        )?;
        Ok(())
    }
}

/// Sends a step's frames, in order; returns the link's end if the step ends it.
async fn send_step(step: LinkStep, out: &mpsc::Sender<LinkMessage>) -> Option<LinkEnd> {
    for frame in step.send {
        let _ = out.send(frame).await;
    }
    step.end
}
