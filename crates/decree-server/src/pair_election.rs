//! What a pair member (`pair.rs`) asks of the election on etcd, in both builds: with the
//! `etcd` feature these start `election.rs`'s tasks; without it `[pair.etcd]` is refused
//! by the configuration's validation, so no election ever exists and each is a no-op.

use crate::fence::Fence;
use crate::pair::PrimaryLink;
use crate::ServerError;
use decree_core::RmFactory;
use decree_pair::link::follower::Follower;
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
/// the receiver (nothing ever comes without an election). The task holds the follower only
/// while it reads its highest epoch: the caller aborts it and awaits its end before the
/// follower's log is opened again (a campaign may be waiting on an unreachable etcd).
#[cfg(feature = "etcd")]
pub(crate) fn campaign(
    election: &Option<Arc<Election>>,
    follower: &Arc<Follower>,
    factories: &[Arc<dyn RmFactory>],
    node: u32,
    stop: watch::Receiver<bool>,
) -> (mpsc::Receiver<Epoch>, Option<tokio::task::JoinHandle<()>>) {
    let (won_tx, won) = mpsc::channel(1);
    let Some(election) = election.clone() else { return (won, None) };
    let (follower, factories) = (Arc::downgrade(follower), factories.to_vec());
    let task = tokio::spawn(async move {
        let highest = || {
            let (follower, factories) = (follower.clone(), factories.clone());
            async move {
                let prepared =
                    tokio::task::spawn_blocking(move || crate::pair::prepared_highest(&factories, node))
                        .await
                        .unwrap_or(Epoch::NONE);
                let known = follower.upgrade().map_or(Epoch::NONE, |f| f.highest_known());
                (known, prepared)
            }
        };
        if let Some(epoch) = election.campaign(highest, stop).await {
            let _ = won_tx.send(epoch).await;
        }
    });
    (won, Some(task))
}

/// Campaigns in the background (never, in this build).
#[cfg(not(feature = "etcd"))]
pub(crate) fn campaign(
    _election: &Option<Arc<Election>>,
    _follower: &Arc<Follower>,
    _factories: &[Arc<dyn RmFactory>],
    _node: u32,
    _stop: watch::Receiver<bool>,
) -> (mpsc::Receiver<Epoch>, Option<tokio::task::JoinHandle<()>>) {
    (mpsc::channel(1).1, None)
}

/// Leads `epoch` on etcd in the background: records caught-up backups in sync (and, with
/// `alone_after_ms`, a lost one out of sync before `primary` goes alone); `primary` steps
/// down when the lead is lost.
#[cfg(feature = "etcd")]
pub(crate) fn lead(
    election: &Option<Arc<Election>>,
    primary: &Arc<PrimaryLink>,
    epoch: Epoch,
    stop: watch::Receiver<bool>,
) {
    if let Some(election) = election.clone() {
        tokio::spawn(election.lead(epoch, primary.clone(), stop));
    }
}

/// Leads on etcd in the background (never, in this build).
#[cfg(not(feature = "etcd"))]
pub(crate) fn lead(
    _election: &Option<Arc<Election>>,
    _primary: &Arc<PrimaryLink>,
    _epoch: Epoch,
    _stop: watch::Receiver<bool>,
) {
}

/// A member forced to lead `epoch` records it in etcd once etcd answers, then leads it as
/// elected (`fenced` gives its state the lease's fence first).
#[cfg(feature = "etcd")]
pub(crate) fn record_forced(
    election: &Option<Arc<Election>>,
    primary: &Arc<PrimaryLink>,
    epoch: Epoch,
    fenced: Box<dyn FnOnce() + Send>,
    stop: watch::Receiver<bool>,
) {
    if let Some(election) = election.clone() {
        tokio::spawn(election.record_forced(epoch, primary.clone(), fenced, stop));
    }
}

/// Records a forced epoch (never, in this build).
#[cfg(not(feature = "etcd"))]
pub(crate) fn record_forced(
    _election: &Option<Arc<Election>>,
    _primary: &Arc<PrimaryLink>,
    _epoch: Epoch,
    _fenced: Box<dyn FnOnce() + Send>,
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

/// The backup a switchover would hand the lead to: the one this leader recorded in sync
/// on etcd, or why there is none.
#[cfg(feature = "etcd")]
pub(crate) fn switchover_target(
    election: &Option<Arc<Election>>,
) -> Result<decree_pair::link::leader::BackupRun, String> {
    let election = election.as_ref().ok_or_else(no_election)?;
    election.backup_in_sync().ok_or_else(|| {
        "no backup is recorded in sync on etcd: a switchover would lose what only this member holds".into()
    })
}

/// The backup a switchover would hand the lead to (never, in this build).
#[cfg(not(feature = "etcd"))]
pub(crate) fn switchover_target(
    _election: &Option<Arc<Election>>,
) -> Result<decree_pair::link::leader::BackupRun, String> {
    Err(no_election())
}

/// Why a pair without an election has no switchover.
fn no_election() -> String {
    "a switchover needs [pair.etcd] (without an election: stop this member, then decree promote the backup)"
        .into()
}

/// Hands the lead of `epoch` to `backup` (a switchover), this member having stopped acting.
#[cfg(feature = "etcd")]
pub(crate) async fn hand_over(
    election: &Option<Arc<Election>>,
    epoch: Epoch,
    backup: decree_pair::link::leader::BackupRun,
) -> Result<(), String> {
    election.as_ref().ok_or_else(no_election)?.hand_over(epoch, backup).await
}

/// Hands the lead over (never asked, in this build: no switchover target exists).
#[cfg(not(feature = "etcd"))]
pub(crate) async fn hand_over(
    _election: &Option<Arc<Election>>,
    _epoch: Epoch,
    _backup: decree_pair::link::leader::BackupRun,
) -> Result<(), String> {
    Err(no_election())
}

/// Pauses (`paused`) or resumes the pair's automatic failover: the operator's request
/// through this member's control socket; the answer for the operator.
#[cfg(feature = "etcd")]
pub(crate) async fn set_paused(election: &Option<Arc<Election>>, paused: bool) -> String {
    let Some(election) = election else { return format!("refused: {}", no_failover()) };
    match election.set_paused(paused).await {
        Ok(()) if paused => "paused: no member campaigns until decree resume (the primary leads on)".into(),
        Ok(()) => "resumed: the election acts again (a pair without a leader elects one now)".into(),
        Err(why) => format!("refused: {why}"),
    }
}

/// Pauses or resumes automatic failover (none, in this build).
#[cfg(not(feature = "etcd"))]
pub(crate) async fn set_paused(_election: &Option<Arc<Election>>, _paused: bool) -> String {
    format!("refused: {}", no_failover())
}

/// Why a pair without an election has no automatic failover to pause.
fn no_failover() -> &'static str {
    "this pair has no automatic failover to pause or resume (no [pair.etcd])"
}

/// The pause as etcd holds it, for `decree status`: `paused` true or false, `null` with
/// `paused_unknown` saying why when etcd did not answer within a second.
#[cfg(feature = "etcd")]
pub(crate) async fn pause_status(election: &Option<Arc<Election>>) -> Option<serde_json::Value> {
    let election = election.as_ref()?;
    let read = tokio::time::timeout(std::time::Duration::from_secs(1), election.paused()).await;
    Some(match read {
        Ok(Ok(None)) => serde_json::json!({ "paused": false }),
        Ok(Ok(Some(p))) => {
            serde_json::json!({ "paused": true, "paused_by": p.by, "paused_at_unix_ms": p.at_unix_ms })
        }
        Ok(Err(why)) => serde_json::json!({ "paused": null, "paused_unknown": why }),
        Err(_) => serde_json::json!({ "paused": null, "paused_unknown": "etcd did not answer within 1 s" }),
    })
}

/// The pause (none, in this build).
#[cfg(not(feature = "etcd"))]
pub(crate) async fn pause_status(_election: &Option<Arc<Election>>) -> Option<serde_json::Value> {
    None
}

/// Every pair under this member's prefix as etcd holds it, for `decree status --etcd`: one
/// JSON line, or the refusal.
#[cfg(feature = "etcd")]
pub(crate) async fn cluster(election: &Option<Arc<Election>>) -> String {
    let Some(election) = election else {
        return "refused: this member is not elected on etcd (no [pair.etcd])".into();
    };
    match election.cluster().await {
        Ok(view) => view.to_string(),
        Err(why) => format!("refused: {why}"),
    }
}

/// Every pair under the prefix (none, in this build).
#[cfg(not(feature = "etcd"))]
pub(crate) async fn cluster(_election: &Option<Arc<Election>>) -> String {
    "refused: this member is not elected on etcd (no [pair.etcd])".into()
}

/// The election's figures for `decree status`.
#[cfg(feature = "etcd")]
pub(crate) fn status(election: &Option<Arc<Election>>) -> Option<serde_json::Value> {
    use std::sync::atomic::Ordering;
    let election = election.as_ref()?;
    let trouble = election.trouble();
    Some(serde_json::json!({
        // `ok`, `unreachable` (an outage: retried) or `refused` (etcd said no: a configuration
        // to fix, on etcd's side or this member's; retried too), with the error naming the
        // endpoints and what to check.
        "state": trouble.as_ref().map_or("ok", |t| t.state),
        "error": trouble.map(|t| t.error),
        "endpoints": election.endpoints(),
        "lease": election.lease().map(|l| l.to_string()),
        "run": crate::election::run_name(election.run()),
        "lease_alive": election.lease_alive(),
        "leads": election.leads(),
        "leader_key": election.keys().leader,
        "requests": election.requests.load(Ordering::Relaxed),
        "operator_requests": election.operator_requests.load(Ordering::Relaxed),
        "keepalives": election.keepalives.load(Ordering::Relaxed),
        "lag_reports": election.lag_reports.load(Ordering::Relaxed),
        "campaigns": election.campaigns.load(Ordering::Relaxed),
        "campaigns_won": election.won.load(Ordering::Relaxed),
        "keepalive_age_ms": election.keepalive_age().map(|age| age.as_millis() as u64),
        "watchdog": election.watchdog.as_ref().map(|dog| serde_json::json!({
            "path": dog.path().display().to_string(),
            "armed": dog.is_armed(),
            "times_armed": dog.armed.load(Ordering::Relaxed),
            "feeds": dog.feeds.load(Ordering::Relaxed),
        })),
    }))
}

/// The election's figures for the Prometheus endpoint: etcd requests (keepalives apart:
/// none on the commit path), keepalives, campaigns, whether the lease provably lives and
/// whether this member leads on etcd.
#[cfg(feature = "etcd")]
pub(crate) fn render_metrics(out: &mut String, election: &Option<Arc<Election>>) {
    use std::fmt::Write;
    use std::sync::atomic::Ordering;
    let Some(e) = election else { return };
    let figures: [(&str, &str, &str, u64); 6] = [
        (
            "pair_etcd_requests_total",
            "counter",
            "etcd requests made, keepalives apart.",
            e.requests.load(Ordering::Relaxed),
        ),
        (
            "pair_etcd_keepalives_total",
            "counter",
            "Lease keepalives etcd answered.",
            e.keepalives.load(Ordering::Relaxed),
        ),
        (
            "pair_etcd_campaigns_total",
            "counter",
            "Campaign transactions sent.",
            e.campaigns.load(Ordering::Relaxed),
        ),
        (
            "pair_etcd_campaigns_won_total",
            "counter",
            "Campaigns this member won since it joined the pair (its start or its rejoin after stepping down): each is a change of leader to it.",
            e.won.load(Ordering::Relaxed),
        ),
        (
            "pair_etcd_lease_alive",
            "gauge",
            "1 while this member's lease provably lives.",
            u64::from(e.lease_alive()),
        ),
        ("pair_etcd_leads", "gauge", "1 while this member leads on etcd.", u64::from(e.leads())),
    ];
    for (name, kind, help, value) in figures {
        let _ =
            writeln!(out, "# HELP decree_{name} {help}\n# TYPE decree_{name} {kind}\ndecree_{name} {value}");
    }
    // Absent before the first keepalive is answered.
    if let Some(age) = e.keepalive_age() {
        let name = "pair_etcd_keepalive_age_seconds";
        let help =
            "How long ago the last keepalive etcd answered was sent: the lease lives for its TTL from then.";
        let _ = writeln!(
            out,
            "# HELP decree_{name} {help}\n# TYPE decree_{name} gauge\ndecree_{name} {}",
            age.as_secs_f64()
        );
    }
}

/// The election's figures for the Prometheus endpoint (none, in this build).
#[cfg(not(feature = "etcd"))]
pub(crate) fn render_metrics(_out: &mut String, _election: &Option<Arc<Election>>) {}

/// The election's figures (none, in this build).
#[cfg(not(feature = "etcd"))]
pub(crate) fn status(_election: &Option<Arc<Election>>) -> Option<serde_json::Value> {
    None
}

/// etcd's view of every pair under the prefix of `config`'s `[pair.etcd]`, read straight
/// from etcd by this process, so that no member needs to run (`decree status --etcd`,
/// `decree recover`): JSON as the members' `cluster` answer, or an error that names what is
/// wrong (no `[pair.etcd]`, etcd unreachable or refusing).
pub fn etcd_cluster(config: &crate::ServerConfig) -> Result<serde_json::Value, String> {
    let Some(etcd) = config.pair.as_ref().and_then(|p| p.etcd.as_ref()) else {
        return Err("the configuration has no [pair.etcd]: this member is not elected on etcd".into());
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime to ask etcd: {e}"))?;
    runtime.block_on(read_cluster(etcd))
}

#[cfg(feature = "etcd")]
async fn read_cluster(etcd: &crate::etcd_config::PairEtcdConfig) -> Result<serde_json::Value, String> {
    crate::election::read_cluster(etcd).await
}

#[cfg(not(feature = "etcd"))]
async fn read_cluster(_etcd: &crate::etcd_config::PairEtcdConfig) -> Result<serde_json::Value, String> {
    Err("this decree was built without the etcd feature".into())
}
