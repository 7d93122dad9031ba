//! The pair's simulator's handle on a member's server (feature `sim`; `crates/decree-sim`):
//! the code `decree serve` runs as a pair member, reached without sockets, threads or
//! timers, so that one thread steps both members with a virtual network and clock.
//!
//! Everything here calls the server's own functions, never a copy: a primary is built by
//! `pair::lead` over `state_over` (as `pair.rs` does after a promotion), a decide goes
//! through `connection::check_decide` and `connection::commit_decision` (the connection's
//! commit path, with the backup's confirmation in `pair.rs`), the outcome rule is
//! `State::outcome`, a recovery pass `recovery::leading_pass`, and a backup is built by
//! `pair::follow`. What is not here is the IO around them: listeners, connections'
//! permits and readers, the recovery thread's schedule, the leader's dial loop and the
//! follower's accept loop, which the simulator models. Not for production use.

use crate::config::ServerConfig;
use crate::pair::{Deposed, PrimaryLink};
use crate::state::{SessionTxns, State};
use crate::ServerError;
use decree_core::{Decision, Outcome, RmFactory, Xid};
use decree_log::io::Storage;
use decree_log::outcomes::OutcomeMemory;
use decree_log::{Log, LogError};
use decree_pair::link::follower::Follower;
use decree_pair::link::leader::Leader;
use decree_pair::link::{LinkReport, Plaintext};
use decree_pair::outbox::OutboxLimits;
use decree_pair::rules::Node;
use decree_pair::{Epoch, PairState};
use decree_proto::Message;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use tokio::sync::watch;

/// Where a decide's answer goes (the connection's reply, in `decree serve`).
pub type Answer = Box<dyn FnOnce(Message) + Send>;

/// What a member needs to lead after its promotion.
pub struct Lead {
    /// The member's configuration: node id, log directory (where `PAIR` is), limits,
    /// and its `[pair]`.
    pub config: ServerConfig,
    /// The member's log, reopened after the follower let it go.
    pub log: Arc<dyn Log>,
    /// The member's outcome memory, reopened likewise.
    pub outcomes: OutcomeMemory,
    /// The resource managers it finishes phase two and presumed abort on.
    pub factories: Vec<Arc<dyn RmFactory>>,
    /// The rules' node the promotion returned (it leads its epoch).
    pub node: Node,
    /// The outbox's bounds.
    pub limits: OutboxLimits,
    /// Where `PAIR` is written when a newer epoch deposes the member.
    pub storage: Arc<dyn Storage>,
    /// The member's `PAIR` record after its promotion.
    pub pair_state: PairState,
    /// Set when the member must stop (a deposition).
    pub stop: Arc<watch::Sender<bool>>,
}

/// A member's server while it leads its epoch.
pub struct SimPrimary {
    state: Arc<State>,
    link: Arc<PrimaryLink>,
    stop: AtomicBool,
}

/// One client session of a primary.
pub struct SimSession {
    id: u64,
    txns: Arc<SessionTxns>,
}

impl SimSession {
    /// The session's id (in its Xids).
    pub fn id(&self) -> u64 {
        self.id
    }
}

impl SimPrimary {
    /// The primary phase of a promoted member, as `pair.rs` starts it.
    pub fn lead(lead: Lead) -> SimPrimary {
        let Lead { config, log, outcomes, factories, node, limits, storage, pair_state, stop } = lead;
        let epoch = node.leads().expect("a promoted node leads");
        let state = crate::state_over(&config, log, outcomes, factories, Some(epoch.raw()))
            .expect("the simulator writes only records its server reads");
        let state = Arc::new(state);
        let deposed = Deposed { stop, storage, dir: config.log_dir.clone(), pair_state };
        let stall =
            config.pair.as_ref().map_or(decree_pair::link::stall::LINK_STALL_DEFAULT, |p| p.link_stall());
        let setup = crate::pair::LinkSetup { transport: Arc::new(Plaintext), limits, stall };
        let link = crate::pair::lead(&state, node, config.node, setup, deposed, &LinkReport::default());
        SimPrimary { state, link, stop: AtomicBool::new(false) }
    }

    /// The leader of the member's link (its sans-IO steps carry the link).
    pub fn leader(&self) -> Arc<Leader> {
        self.link.leader().clone()
    }

    /// The incarnation in this run's Xids (the epoch it leads).
    pub fn incarnation(&self) -> u64 {
        self.state.incarnation
    }

    /// A client's `Hello`: a new session.
    pub fn open_session(&self) -> SimSession {
        let (id, txns) = self.state.open_session();
        SimSession { id, txns }
    }

    /// A client's `Decide`: checked, then committed; `answer` gets `DecideOk` or the error
    /// (at once when refused, later when the log and the backup have answered; never when
    /// the member stops first).
    pub fn decide(&self, session: &SimSession, decision: Decision, answer: Answer) {
        match crate::connection::check_decide(&self.state, session.id, &decision) {
            Ok(sequence) => crate::connection::commit_decision_traced(
                &self.state,
                session.txns.clone(),
                sequence,
                decision,
                answer,
                None,
            ),
            Err(refusal) => answer(*refusal),
        }
    }

    /// A client's `Complete`: whether it finished a decision of this session.
    pub fn complete(&self, session: &SimSession, xid: &Xid) -> bool {
        self.state.complete_own(xid, session.id, &session.txns, None)
    }

    /// The session's connection ended and every decide it sent was answered.
    pub fn close_session(&self, session: &SimSession) {
        self.state.close_session(session.id, &session.txns);
    }

    /// The answer to an `Outcome` request.
    pub fn outcome(&self, xid: &Xid) -> Outcome {
        self.state.outcome(xid)
    }

    /// One recovery pass (finish the orphans, presumed abort), unless deposed: `None`.
    pub fn recovery_pass(&self) -> Option<bool> {
        crate::recovery::leading_pass(&self.state, &self.stop)
    }

    /// Whether a decision of `xid` is live here or its outcome is remembered committed.
    pub fn holds(&self, xid: &Xid) -> bool {
        self.state.is_decided(xid)
    }

    /// The epoch that deposed this member, if one did.
    pub fn deposed_by(&self) -> Option<Epoch> {
        self.link.deposed_by()
    }

    /// The election on etcd took the lead away (`pair.rs`'s step-down: the lease is gone,
    /// or a member leads the `newer` epoch): the member stops as a deposed one does.
    pub fn step_down(&self, newer: Option<Epoch>) {
        self.link.step_down(newer);
    }

    /// The election recorded the backup out of sync (`alone_after_ms`): acknowledge alone
    /// (`pair.rs`'s `go_alone`, which answers what waited for the backup).
    pub fn go_alone(&self) {
        self.link.go_alone();
    }

    /// Decisions whose answer waits for the backup.
    pub fn waiting(&self) -> usize {
        self.link.waiting()
    }

    /// At shutdown (`serve`'s end): nobody answers the decides waiting for the backup.
    pub fn abandon_pending(&self) {
        self.link.abandon_pending();
    }

    /// Makes every remembered outcome durable (the memory's flush, which completes the
    /// finished decisions in the log).
    pub fn sync_outcomes(&self) -> Result<(), LogError> {
        self.state.outcomes.sync()
    }
}

/// The backup's side of a member over `log` and `outcomes`, as `pair.rs` opens it
/// (`config.pair` says the member and the acknowledgement mode).
pub fn follow(
    config: &ServerConfig,
    log: Arc<dyn Log>,
    outcomes: OutcomeMemory,
    storage: Arc<dyn Storage>,
) -> Result<Follower, ServerError> {
    let pair = config.pair.as_ref().expect("a pair member has a [pair]");
    crate::pair::follow(config, pair, log, outcomes, storage)
}

/// The newest incarnation among node `node`'s prepared branches in the resource managers
/// of `factories`, which a promotion mints above, as `pair.rs` computes it.
pub fn prepared_highest(factories: &[Arc<dyn decree_core::rm::RmFactory>], node: u32) -> decree_pair::Epoch {
    crate::pair::prepared_highest(factories, node)
}
