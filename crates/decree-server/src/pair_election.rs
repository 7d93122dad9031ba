//! What a pair member (`pair.rs`) asks of the election on etcd, in both builds: with the
//! `etcd` feature these start `election.rs`'s tasks; without it `[pair.etcd]` is refused
//! by the configuration's validation, so no election ever exists and each is a no-op.

use crate::fence::Fence;
use crate::ServerError;
use decree_core::RmFactory;
use decree_pair::link::follower::Follower;
use decree_pair::link::leader::Leader;
use decree_pair::Epoch;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};

#[cfg(feature = "etcd")]
pub(crate) use crate::election::Election;

/// Never made: this build has no etcd client.
#[cfg(not(feature = "etcd"))]
pub(crate) enum Election {}

/// A run id for this process: new at every start (a restarted backup is never taken for
/// the one that caught up).
pub(crate) fn new_run_id() -> u64 {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 8];
    ring::rand::SystemRandom::new().fill(&mut bytes).expect("the system's random source");
    u64::from_be_bytes(bytes).max(1)
}

/// Starts the election when `[pair.etcd]` says so: registers this member and keeps its
/// lease until `stop`.
#[cfg(feature = "etcd")]
pub(crate) async fn start(
    pair: &crate::config::PairConfig,
    run: u64,
    clients: String,
    stop: watch::Receiver<bool>,
) -> Result<Option<Arc<Election>>, ServerError> {
    let Some(etcd) = &pair.etcd else { return Ok(None) };
    let member = decree_pair::MemberId::new(pair.member).expect("validated");
    let registration = decree_pair::election::Registration {
        run: crate::election::run_name(run),
        link: pair.link.to_string(),
        clients,
    };
    let election = Election::start(etcd, member, run, registration).await?;
    tokio::spawn(election.clone().keep_alive(stop));
    Ok(Some(election))
}

/// Starts the election when `[pair.etcd]` says so (never, in this build).
#[cfg(not(feature = "etcd"))]
pub(crate) async fn start(
    pair: &crate::config::PairConfig,
    _run: u64,
    _clients: String,
    _stop: watch::Receiver<bool>,
) -> Result<Option<Arc<Election>>, ServerError> {
    assert!(pair.etcd.is_none(), "validation refuses [pair.etcd] in a build without etcd");
    Ok(None)
}

/// Campaigns in the background while this member is a backup: the epoch it won comes on
/// the receiver (nothing ever comes without an election).
#[cfg(feature = "etcd")]
pub(crate) fn campaign(
    election: &Option<Arc<Election>>,
    follower: &Arc<Follower>,
    factories: &[Arc<dyn RmFactory>],
    node: u32,
    stop: watch::Receiver<bool>,
) -> mpsc::Receiver<Epoch> {
    let (won_tx, won) = mpsc::channel(1);
    let Some(election) = election.clone() else { return won };
    let (follower, factories) = (follower.clone(), factories.to_vec());
    tokio::spawn(async move {
        let highest = || {
            let (follower, factories) = (follower.clone(), factories.clone());
            async move {
                let prepared =
                    tokio::task::spawn_blocking(move || crate::pair::prepared_highest(&factories, node))
                        .await
                        .unwrap_or(Epoch::NONE);
                follower.highest_known().max(prepared)
            }
        };
        if let Some(epoch) = election.campaign(highest, stop).await {
            let _ = won_tx.send(epoch).await;
        }
    });
    won
}

/// Campaigns in the background (never, in this build).
#[cfg(not(feature = "etcd"))]
pub(crate) fn campaign(
    _election: &Option<Arc<Election>>,
    _follower: &Arc<Follower>,
    _factories: &[Arc<dyn RmFactory>],
    _node: u32,
    _stop: watch::Receiver<bool>,
) -> mpsc::Receiver<Epoch> {
    mpsc::channel(1).1
}

/// Leads `epoch` on etcd in the background: records caught-up backups in sync and runs
/// `step_down` when the lead is lost.
#[cfg(feature = "etcd")]
pub(crate) fn lead(
    election: &Option<Arc<Election>>,
    leader: &Arc<Leader>,
    epoch: Epoch,
    step_down: Box<dyn Fn(Option<Epoch>) + Send + Sync>,
    stop: watch::Receiver<bool>,
) {
    if let Some(election) = election.clone() {
        tokio::spawn(election.lead(epoch, leader.caught_up_backups(), step_down, stop));
    }
}

/// Leads on etcd in the background (never, in this build).
#[cfg(not(feature = "etcd"))]
pub(crate) fn lead(
    _election: &Option<Arc<Election>>,
    _leader: &Arc<Leader>,
    _epoch: Epoch,
    _step_down: Box<dyn Fn(Option<Epoch>) + Send + Sync>,
    _stop: watch::Receiver<bool>,
) {
}

/// The fence this member's acts check, under an election.
#[cfg(feature = "etcd")]
pub(crate) fn fence(election: &Option<Arc<Election>>) -> Option<Arc<Fence>> {
    election.as_ref().map(|e| e.fence())
}

/// The fence this member's acts check (none, in this build).
#[cfg(not(feature = "etcd"))]
pub(crate) fn fence(_election: &Option<Arc<Election>>) -> Option<Arc<Fence>> {
    None
}

/// Gives up the lease at a clean stop, so that the other member campaigns at once.
#[cfg(feature = "etcd")]
pub(crate) async fn resign(election: &Option<Arc<Election>>) {
    if let Some(election) = election {
        election.resign().await;
    }
}

/// Gives up the lease (none, in this build).
#[cfg(not(feature = "etcd"))]
pub(crate) async fn resign(_election: &Option<Arc<Election>>) {}

/// The election's figures for `decree status`.
#[cfg(feature = "etcd")]
pub(crate) fn status(election: &Option<Arc<Election>>) -> Option<serde_json::Value> {
    use std::sync::atomic::Ordering;
    let election = election.as_ref()?;
    Some(serde_json::json!({
        "run": crate::election::run_name(election.run()),
        "lease_alive": election.lease_alive(),
        "leader_key": election.keys().leader,
        "requests": election.requests.load(Ordering::Relaxed),
        "keepalives": election.keepalives.load(Ordering::Relaxed),
        "campaigns": election.campaigns.load(Ordering::Relaxed),
    }))
}

/// The election's figures (none, in this build).
#[cfg(not(feature = "etcd"))]
pub(crate) fn status(_election: &Option<Arc<Election>>) -> Option<serde_json::Value> {
    None
}
