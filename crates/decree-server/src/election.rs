//! The pair's election on etcd as `decree serve` runs it (`[pair.etcd]`, issue 33): the
//! rules are decree-pair's `election` (pure, tested against a model of etcd); this module
//! carries out their transactions and keeps the member's lease.
//!
//! - At start the member connects, takes a lease and registers under it
//!   (`members/{id}`: its run id and addresses). While etcd is unreachable or refuses it
//!   (credentials, certificate, permissions), the member runs all the same, as a backup
//!   that takes no part in the election: `decree status` and the log say why, naming the
//!   endpoints, and it tries again with a bounded backoff. Only a configuration it can
//!   check alone (an unreadable TLS or password file) stops it at start. A keepalive every
//!   quarter of the TTL moves the member's [`Fence`] to `sent + TTL - margin` (sent: when
//!   the keepalive left, on `CLOCK_BOOTTIME`); every act of a primary checks the fence
//!   just before it.
//! - A backup campaigns whenever the leader key is absent (a watch on it tells, a poll
//!   backs the watch up): one transaction, which succeeds only if the sync record names
//!   this member's current run (or this member as the leader that wrote it).
//! - A primary records its backup in sync once that backup's process caught up (its run
//!   id came in its `Hello`), by a transaction that also requires the leader key under its
//!   own lease. It steps down when its lease is gone or the leader key names someone else.
//! - No etcd request is on the commit path: the commit path reads the fence, an atomic.
//! - On SIGTERM a member revokes its lease: its leader key goes at once and the backup
//!   campaigns without waiting for the TTL.

use crate::etcd_config::PairEtcdConfig;
use crate::fence::Fence;
use crate::pair::PrimaryLink;
use crate::ServerError;
use decree_etcd::{Cause, Etcd, EtcdConfig, EtcdError, KeepAlive, LeaseId, TlsPaths, WatchEvent};
use decree_pair::election::{
    self as rules, Candidate, InSync, Keys, Leader as LeaderRecord, NotNow, Read, View,
};
use decree_pair::link::leader::BackupRun;
use decree_pair::{Epoch, MemberId};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The first and the longest pause between two attempts to take a lease while etcd is
/// unreachable or refuses this member (doubling in between).
const ACQUIRE_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));

/// Why etcd does not serve this member now.
#[derive(Clone, Debug)]
pub(crate) struct Trouble {
    /// `unreachable` (no answer: an outage) or `refused` (etcd answered no: its
    /// configuration or this member's is wrong, and retrying will not help until fixed).
    pub(crate) state: &'static str,
    /// The error, naming the endpoints, the operation and what to check.
    pub(crate) error: String,
}

/// How often a leader with `alone_after_ms` looks at how long decisions have waited.
const ALONE_CHECK: Duration = Duration::from_millis(50);

/// The primary writes its lag to etcd at most this often, and only when it changed.
const LAG_REPORT_EVERY: Duration = Duration::from_secs(2);

/// How often the primary measures its lag for etcd (finer than [`LAG_REPORT_EVERY`], so that
/// a change waits at most one period and a half for its write).
const LAG_MEASURE: Duration = Duration::from_secs(1);

/// Keys `decree status --etcd` reads under the prefix, at most (a few per pair and member).
const CLUSTER_KEYS_MAX: i64 = 4096;

/// The longest pause between two reads of the leader key by a backup whose watch fails.
const POLL_MAX: Duration = Duration::from_millis(500);

/// When this member, not the one a switchover handed the lead to, first read the
/// hand-over's sync record (named by its mod revision): it campaigns only once that member
/// has had its turn ([`rules::HAND_OVER_TURN_TTLS`] lease TTLs, on this process's clock).
#[derive(Debug, Default)]
struct HandOverTurn {
    first_read: Option<(i64, tokio::time::Instant)>,
}

impl HandOverTurn {
    /// Whether the turn of the member `view`'s hand-over record names first is over
    /// (false when the record is no hand-over's: [`rules::campaign`] applies).
    fn over(&mut self, view: &View, lease_ttl: Duration) -> bool {
        if view.sync.value.as_ref().and_then(rules::SyncRecord::handed_to).is_none() {
            self.first_read = None;
            return false;
        }
        let revision = view.sync.mod_revision;
        let now = tokio::time::Instant::now();
        let (_, since) = match self.first_read {
            Some((read, since)) if read == revision => (read, since),
            _ => *self.first_read.insert((revision, now)),
        };
        now.duration_since(since) >= lease_ttl * rules::HAND_OVER_TURN_TTLS
    }
}

/// This member's side of the election.
pub(crate) struct Election {
    etcd: Etcd,
    keys: Keys,
    member: MemberId,
    run: u64,
    config: PairEtcdConfig,
    /// This member's lease: `None` until etcd first granted one (etcd may be unreachable, or
    /// refuse this member, when it starts: it serves as a backup meanwhile).
    lease: Mutex<Option<LeaseId>>,
    /// Set once the lease is granted and registered: campaigns wait for it.
    leased: watch::Sender<bool>,
    /// What is wrong with etcd now, for `decree status`: `None` while it answers.
    trouble: Mutex<Option<Trouble>>,
    fence: Arc<Fence>,
    registration: String,
    /// Set while this member leads: a lost lease then means stepping down.
    leading: AtomicBool,
    /// Set when the lease is found gone (a leader steps down on it).
    lease_lost: watch::Sender<bool>,
    /// etcd requests the election made, keepalives excepted (none on the commit path).
    pub(crate) requests: AtomicU64,
    /// etcd reads made for the operator (`decree status` reads the pause; `--etcd`, every
    /// pair), counted apart: asking the status does not change `requests`.
    pub(crate) operator_requests: AtomicU64,
    /// Keepalives answered.
    pub(crate) keepalives: AtomicU64,
    /// The primary's lag reports among `requests` (a timer's writes for the operator, made
    /// whenever the lag changed, commits or not: none is on the commit path).
    pub(crate) lag_reports: AtomicU64,
    /// Campaign transactions sent.
    pub(crate) campaigns: AtomicU64,
    /// Campaigns this member won (each a leader change to it) since it joined the pair: its
    /// start, or its rejoin after stepping down (as every count of this election).
    pub(crate) won: AtomicU64,
    /// The backup process the sync record names now, as this member (leading) last wrote it.
    recorded: Mutex<Option<BackupRun>>,
    /// When this member first read the leader key absent since it last saw a leader: how
    /// long the pair had no leader, as it saw it, when it wins.
    vacant_since: Mutex<Option<std::time::Instant>>,
    /// The watchdog device, when configured: fed at each keepalive while this member
    /// leads with its lease provably alive, disarmed otherwise.
    pub(crate) watchdog: Option<crate::watchdog::Watchdog>,
}

/// The name of a run id in etcd's records.
pub(crate) fn run_name(run: u64) -> String {
    format!("{run:016x}")
}

/// Reads a record, `Read::absent` when the key is absent.
fn parse<T: for<'de> serde::Deserialize<'de>>(key: &str, got: decree_etcd::Got) -> Result<Read<T>, NotNow> {
    match got.entry {
        None => Ok(Read::absent()),
        Some(entry) => {
            let text = String::from_utf8_lossy(&entry.value);
            Ok(Read { value: Some(rules::from_json(key, &text)?), mod_revision: entry.mod_revision })
        }
    }
}

/// The etcd user's password from `file`, refused when other users may read it.
fn read_password(file: &std::path::Path) -> Result<String, ServerError> {
    use std::os::unix::fs::PermissionsExt;
    let named = |e: &dyn std::fmt::Display| {
        ServerError::Io(format!("[pair.etcd] password_file {}: {e}", file.display()))
    };
    let mode = std::fs::metadata(file).map_err(|e| named(&e))?.permissions().mode();
    if mode & 0o077 != 0 {
        let why = format!("mode {:o} lets other users read it: chmod 600 {}", mode & 0o777, file.display());
        return Err(named(&why));
    }
    std::fs::read_to_string(file).map_err(|e| named(&e))
}

fn etcd_error(e: EtcdError) -> ServerError {
    ServerError::Io(format!("etcd: {e}"))
}

/// `e` with what it means for this member's configuration, when etcd refused it (see
/// [`decree_etcd::Refusal`]): the operator reads what to fix, not only a gRPC status.
fn explain(config: &PairEtcdConfig, e: &EtcdError, refusal: Option<decree_etcd::Refusal>) -> Trouble {
    use decree_etcd::Refusal;
    let user = config.user.as_deref().unwrap_or("(none)");
    let keys = format!("{}/{}/", config.prefix, config.pair);
    let hint = match refusal {
        None => return Trouble { state: "unreachable", error: format!("etcd is unreachable: {e}") },
        Some(Refusal::BadCredentials) => {
            format!("etcd refused user {user}'s password: check [pair.etcd] user and password_file")
        }
        Some(Refusal::AuthRequired) => {
            "etcd has authentication on: set [pair.etcd] user and password_file".to_string()
        }
        Some(Refusal::PermissionDenied) => {
            format!("etcd user {user} may not read and write {keys}: grant its role readwrite on that prefix")
        }
        Some(Refusal::ClientCertificate) => {
            let cert = config.tls.as_ref().map_or("(none)".into(), |t| t.cert.display().to_string());
            format!(
                "etcd refused this member's client certificate {cert}: it must be signed by the CA \
                 etcd trusts (its --trusted-ca-file)"
            )
        }
        Some(Refusal::ServerCertificate) => {
            let ca = config.tls.as_ref().map_or("(none)".into(), |t| t.ca.display().to_string());
            format!("this member does not trust etcd's certificate: check [pair.etcd.tls] ca ({ca})")
        }
        Some(Refusal::NotPlaintext) => {
            "the endpoint speaks TLS, not plaintext: write https:// and add [pair.etcd.tls]".to_string()
        }
    };
    Trouble { state: "refused", error: format!("{hint} ({e})") }
}

/// The etcd client's settings for `config`: endpoints, deadline, TLS files, and the user
/// with the password read from its file (an unreadable one is an error naming it).
fn client_config(config: &PairEtcdConfig) -> Result<EtcdConfig, ServerError> {
    let mut etcd_config = EtcdConfig::new(config.endpoints.clone());
    etcd_config.request_timeout = Duration::from_millis(config.request_timeout_ms);
    etcd_config.tls =
        config.tls.as_ref().map(|t| TlsPaths { ca: t.ca.clone(), cert: t.cert.clone(), key: t.key.clone() });
    if let (Some(user), Some(file)) = (&config.user, &config.password_file) {
        let password = read_password(file)?;
        etcd_config.user = Some((user.clone(), password.trim_end().to_string()));
    }
    Ok(etcd_config)
}

/// Every pair under `prefix` as `etcd` holds it (`decree status --etcd`, `decree
/// recover`), at most [`CLUSTER_KEYS_MAX`] keys read: JSON, with `truncated` when more were
/// left.
async fn cluster_of(etcd: &Etcd, prefix: &str) -> Result<serde_json::Value, EtcdError> {
    let prefix = format!("{}/", prefix.trim_end_matches('/'));
    let (entries, more) = etcd.get_prefix(prefix.clone(), CLUSTER_KEYS_MAX).await?;
    let entries: Vec<(String, String)> = entries
        .iter()
        .map(|e| {
            (String::from_utf8_lossy(&e.key).into_owned(), String::from_utf8_lossy(&e.value).into_owned())
        })
        .collect();
    let pairs = rules::cluster(&prefix, &entries);
    Ok(serde_json::json!({ "prefix": prefix, "pairs": pairs, "truncated": more }))
}

/// Every pair under `config`'s prefix, read straight from etcd by a process of its own
/// (no member needs to run): `decree status --etcd` and `decree recover`. An etcd that
/// cannot be reached, or refuses, is an error that says why.
pub(crate) async fn read_cluster(config: &PairEtcdConfig) -> Result<serde_json::Value, String> {
    let client = client_config(config).map_err(|e| e.to_string())?;
    let etcd = Etcd::connect(&client).await.map_err(|e| explain(config, &e, e.refusal()).error)?;
    match cluster_of(&etcd, &config.prefix).await {
        Ok(view) => Ok(view),
        Err(e) => {
            let refusal = match e.refusal() {
                Some(refusal) => Some(refusal),
                None => etcd.diagnose().await,
            };
            Err(explain(config, &e, refusal).error)
        }
    }
}

impl Election {
    /// Connects to etcd (no request yet: a configuration that cannot work, such as an
    /// unreadable TLS file or password file, fails here and the member exits); the lease is
    /// taken and the member registered by [`Election::keep_alive`], retried while etcd is
    /// unreachable or refuses this member, which serves as a backup meanwhile.
    pub(crate) async fn start(
        config: &PairEtcdConfig,
        member: MemberId,
        run: u64,
        registration: rules::Registration,
    ) -> Result<Arc<Election>, ServerError> {
        let watchdog = match &config.watchdog {
            Some(path) => Some(crate::watchdog::Watchdog::new(path).map_err(ServerError::Io)?),
            None => None,
        };
        let etcd = Etcd::connect(&client_config(config)?).await.map_err(etcd_error)?;
        Ok(Arc::new(Election {
            etcd,
            keys: Keys::new(&config.prefix, &config.pair),
            member,
            run,
            config: config.clone(),
            lease: Mutex::new(None),
            leased: watch::channel(false).0,
            trouble: Mutex::new(Some(Trouble {
                state: "connecting",
                error: format!("no answer from etcd at {} yet", config.endpoints.join(",")),
            })),
            fence: Arc::new(Fence::closed()),
            registration: rules::to_json(&registration),
            leading: AtomicBool::new(false),
            lease_lost: watch::channel(false).0,
            requests: AtomicU64::new(0),
            operator_requests: AtomicU64::new(0),
            keepalives: AtomicU64::new(0),
            lag_reports: AtomicU64::new(0),
            campaigns: AtomicU64::new(0),
            won: AtomicU64::new(0),
            recorded: Mutex::new(None),
            vacant_since: Mutex::new(None),
            watchdog,
        }))
    }

    /// Takes a lease and registers under it, again and again (the pause doubling up to
    /// [`ACQUIRE_BACKOFF`]) until etcd grants both or `stop`; meanwhile `decree status` and
    /// the log say why not.
    async fn acquire(&self, stop: &mut watch::Receiver<bool>) -> Option<KeepAlive> {
        let mut pause = ACQUIRE_BACKOFF.0;
        loop {
            self.requests.fetch_add(1, Ordering::Relaxed);
            let granted = match self.etcd.grant_lease(self.config.lease_ttl()).await {
                Ok(lease) => self.register(lease.id).await.map(|()| lease.id),
                Err(e) => Err(e),
            };
            match granted {
                Ok(lease) => {
                    *self.lease.lock() = Some(lease);
                    if self.trouble.lock().take().is_some_and(|t| t.state != "connecting") {
                        tracing::warn!(endpoints = %self.etcd.endpoints(), "etcd answers this member again");
                    }
                    self.leased.send_replace(true);
                    tracing::info!(pair = %self.config.pair, %lease, run = %run_name(self.run), "registered on etcd");
                    return Some(self.etcd.keep_alive(lease));
                }
                Err(e) => {
                    // A connection closed without a word may be etcd refusing this member.
                    let refusal = match e.refusal() {
                        Some(refusal) => Some(refusal),
                        None => self.etcd.diagnose().await,
                    };
                    self.report(&explain(&self.config, &e, refusal));
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = stop.changed() => return None,
            }
            pause = (pause * 2).min(ACQUIRE_BACKOFF.1);
        }
    }

    /// Records what keeps this member from its lease for `decree status`, logging it when
    /// it changes.
    fn report(&self, trouble: &Trouble) {
        let mut now = self.trouble.lock();
        if now.as_ref().map(|t| &t.error) != Some(&trouble.error) {
            tracing::error!(
                state = trouble.state,
                "{}: this member serves as a backup only and takes no part in the election until etcd \
                 grants it a lease; retrying",
                trouble.error
            );
        }
        *now = Some(trouble.clone());
    }

    /// What is wrong with etcd now, if anything.
    pub(crate) fn trouble(&self) -> Option<Trouble> {
        self.trouble.lock().clone()
    }

    /// This member's lease, once granted.
    pub(crate) fn lease(&self) -> Option<LeaseId> {
        *self.lease.lock()
    }

    /// The etcd endpoints, comma-separated.
    pub(crate) fn endpoints(&self) -> &str {
        self.etcd.endpoints()
    }

    /// The fence this member's acts check.
    pub(crate) fn fence(&self) -> Arc<Fence> {
        self.fence.clone()
    }

    /// The pair's keys.
    pub(crate) fn keys(&self) -> &Keys {
        &self.keys
    }

    /// This process's run id.
    pub(crate) fn run(&self) -> u64 {
        self.run
    }

    /// Whether this member leads on etcd (elected, or its forced epoch recorded).
    pub(crate) fn leads(&self) -> bool {
        self.leading.load(Ordering::SeqCst)
    }

    /// Whether the lease provably lives now.
    pub(crate) fn lease_alive(&self) -> bool {
        !self.fence.ended() && self.fence.alive()
    }

    /// How long ago the last answered keepalive was sent (`None` before the first).
    pub(crate) fn keepalive_age(&self) -> Option<Duration> {
        self.fence.keepalive_age()
    }

    async fn register(&self, lease: LeaseId) -> Result<(), EtcdError> {
        let put = decree_etcd::Op::Put {
            key: self.keys.member(self.member).into_bytes(),
            value: self.registration.clone().into_bytes(),
            lease: Some(lease),
        };
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.etcd.txn(&[], &[put], &[]).await.map(|_| ())
    }

    /// Renews the lease every quarter of its TTL until `stop`, moving the fence; a lease
    /// found gone ends the fence of a leader (it steps down) and is taken again by a backup.
    pub(crate) async fn keep_alive(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let ttl = self.config.lease_ttl();
        let period = ttl / 4;
        let Some(mut keeper) = self.acquire(&mut stop).await else { return };
        let mut complained = false;
        loop {
            self.tend_watchdog();
            match keeper.renew().await {
                Ok(answer) => {
                    self.keepalives.fetch_add(1, Ordering::Relaxed);
                    let nanos = |d: Duration| d.as_nanos() as u64;
                    let answered_ttl = answer.ttl.min(ttl);
                    self.fence.renewed(
                        nanos(answer.sent.since_boot()),
                        nanos(answered_ttl),
                        nanos(self.config.margin()),
                    );
                    if complained {
                        tracing::warn!("etcd answers keepalives again");
                        complained = false;
                    }
                    self.trouble.lock().take();
                }
                Err(EtcdError { cause: Cause::LeaseGone(_), .. }) => {
                    if let Some(renewed) = self.lease_gone().await {
                        keeper = renewed;
                    }
                }
                Err(e) => {
                    if !complained {
                        tracing::warn!(error = %e, "etcd does not answer keepalives: this member's lease may lapse");
                        complained = true;
                    }
                    *self.trouble.lock() = Some(explain(&self.config, &e, e.refusal()));
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(100)) => continue,
                        _ = stop.changed() => return,
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = stop.changed() => return,
            }
        }
    }

    /// The lease is gone: a leader steps down (its leader key went with it); a backup takes
    /// a new lease and registers again.
    async fn lease_gone(&self) -> Option<KeepAlive> {
        tracing::warn!("this member's etcd lease is gone");
        if self.leading.load(Ordering::SeqCst) {
            self.fence.end();
            self.lease_lost.send_replace(true);
            return None;
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
        let lease = match self.etcd.grant_lease(self.config.lease_ttl()).await {
            Ok(lease) => lease,
            Err(e) => {
                tracing::warn!(error = %e, "cannot take a new etcd lease; will retry");
                return None;
            }
        };
        *self.lease.lock() = Some(lease.id);
        if let Err(e) = self.register(lease.id).await {
            tracing::warn!(error = %e, "cannot register again on etcd; will retry");
        }
        Some(self.etcd.keep_alive(lease.id))
    }

    /// What etcd holds of the pair now.
    async fn view(&self) -> Result<View, String> {
        self.requests.fetch_add(4, Ordering::Relaxed);
        let get = |key: String| async move { self.etcd.get(key).await.map_err(|e| e.to_string()) };
        let (leader, sync, counter, pause) = tokio::try_join!(
            get(self.keys.leader.clone()),
            get(self.keys.sync.clone()),
            get(self.keys.epoch.clone()),
            get(self.keys.pause.clone())
        )?;
        let counter = match counter.entry {
            None => Read::absent(),
            Some(entry) => {
                let text = String::from_utf8_lossy(&entry.value);
                let count =
                    text.parse::<u64>().map_err(|e| format!("{} holds {text:?}: {e}", self.keys.epoch))?;
                Read { value: Some(count), mod_revision: entry.mod_revision }
            }
        };
        Ok(View {
            leader: parse(&self.keys.leader, leader).map_err(|e| e.to_string())?,
            sync: parse(&self.keys.sync, sync).map_err(|e| e.to_string())?,
            counter,
            pause: parse(&self.keys.pause, pause).map_err(|e| e.to_string())?,
        })
    }

    /// Campaigns until this member wins (the epoch it leads, durable in etcd) or `stop`.
    /// `highest` gives the highest epoch this member's log and `PAIR` hold and the newest
    /// incarnation of its node's prepared branches (`Candidate`'s `highest` and
    /// `prepared`), asked only when the leader key is absent.
    pub(crate) async fn campaign<F, Fut>(&self, highest: F, mut stop: watch::Receiver<bool>) -> Option<Epoch>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = (Epoch, Epoch)>,
    {
        let mut last_reason = String::new();
        let mut watch = None;
        let mut hand_over = HandOverTurn::default();
        // No campaign before this member holds a lease: the leader key lives under it.
        let mut leased = self.leased.subscribe();
        tokio::select! {
            _ = leased.wait_for(|leased| *leased) => {}
            _ = stop.changed() => return None,
        }
        loop {
            if *stop.borrow() {
                return None;
            }
            match self.try_campaign(&highest, &mut hand_over).await {
                Ok(Some(epoch)) => {
                    self.won.fetch_add(1, Ordering::Relaxed);
                    self.record_change(epoch).await;
                    return Some(epoch);
                }
                Ok(None) => {}
                Err(reason) if reason != last_reason => {
                    tracing::info!(%reason, "not campaigning now");
                    last_reason = reason;
                }
                Err(_) => {}
            }
            if watch.is_none() {
                self.requests.fetch_add(1, Ordering::Relaxed);
                watch = self.etcd.watch_prefix(self.keys.leader.clone(), None).await.ok();
            }
            // The watch tells of the leader key's end at once; the poll is its backstop.
            let poll = match watch {
                Some(_) => self.config.lease_ttl(),
                None => (self.config.lease_ttl() / 4).min(POLL_MAX),
            };
            tokio::select! {
                _ = tokio::time::sleep(poll) => {}
                _ = stop.changed() => return None,
                events = async { watch.as_mut().expect("some").next().await }, if watch.is_some() => {
                    match events {
                        Ok(events) if events.iter().any(|e| matches!(e, WatchEvent::Delete { .. })) => {}
                        Ok(_) => {}
                        Err(_) => watch = None,
                    }
                }
            }
        }
    }

    /// Feeds the watchdog while this member leads with its lease provably alive, disarms
    /// it otherwise (no-op without one).
    fn tend_watchdog(&self) {
        if let Some(dog) = &self.watchdog {
            dog.tend(self.leading.load(Ordering::SeqCst) && self.fence.alive());
        }
    }

    /// Records this member's win of `epoch` in etcd for `decree status --etcd` (when, and
    /// how long the pair had no leader as this member saw it): the operator's information
    /// only, so a failure is logged and the member leads on.
    async fn record_change(&self, epoch: Epoch) {
        let vacant_ms = self.vacant_since.lock().take().map(|t| t.elapsed().as_millis() as u64);
        let Some(lease) = self.lease() else { return };
        let at_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let change =
            rules::LeaderChange { member: self.member.get(), epoch: epoch.raw(), at_unix_ms, vacant_ms };
        let (compares, ops) =
            decree_etcd::election::txn(&rules::record_leader_change(&self.keys, lease.0, &change));
        self.requests.fetch_add(1, Ordering::Relaxed);
        match self.etcd.txn(&compares, &ops, &[]).await {
            Ok(result) if result.succeeded => {}
            Ok(_) => {
                tracing::info!(%epoch, "the change of leader is not recorded: this member no longer holds the leader key")
            }
            Err(e) => tracing::warn!(%epoch, error = %e, "cannot record the change of leader on etcd"),
        }
    }

    /// One campaign: `Ok(Some(epoch))` when won, `Ok(None)` when another member moved
    /// first, `Err(why)` when this member may not campaign now.
    async fn try_campaign<F, Fut>(
        &self,
        highest: &F,
        hand_over: &mut HandOverTurn,
    ) -> Result<Option<Epoch>, String>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = (Epoch, Epoch)>,
    {
        let view = self.view().await?;
        if let Some(epoch) = rules::won(&view, self.member, &run_name(self.run)) {
            tracing::warn!(%epoch, "the leader key names this process: a campaign won, its answer lost");
            return Ok(Some(epoch));
        }
        if let Some(leader) = &view.leader.value {
            *self.vacant_since.lock() = None;
            return Err(NotNow::Led(leader.member, Epoch::from_raw(leader.epoch)).to_string());
        }
        self.vacant_since.lock().get_or_insert_with(std::time::Instant::now);
        let Some(lease) = self.lease() else { return Err("this member holds no etcd lease yet".into()) };
        let (highest, prepared) = highest().await;
        let candidate =
            Candidate { member: self.member, run: run_name(self.run), lease: lease.0, highest, prepared };
        let campaign = if hand_over.over(&view, self.config.lease_ttl()) {
            rules::campaign_after_turn
        } else {
            rules::campaign
        };
        let (txn, epoch) = match campaign(&view, &candidate, &self.keys) {
            Ok(txn) => txn,
            Err(e) => return Err(e.to_string()),
        };
        let (compares, ops) = decree_etcd::election::txn(&txn);
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.campaigns.fetch_add(1, Ordering::Relaxed);
        match self.etcd.txn(&compares, &ops, &[]).await {
            Ok(result) if result.succeeded => Ok(Some(epoch)),
            Ok(_) => Ok(None),
            Err(e) => {
                // Sent once: it may have been applied. The leader key says.
                tracing::warn!(error = %e, "a campaign's transaction failed; reading the leader key");
                let view = self.view().await?;
                let won = view
                    .leader
                    .value
                    .is_some_and(|l| l.member == self.member.get() && l.run == candidate.run);
                Ok(won.then_some(epoch))
            }
        }
    }

    /// Leads `epoch` until the lease is lost or another member leads (then `primary` steps
    /// down, with the newer epoch when one is known), recording each backup process that
    /// catches up in the sync record meanwhile; with `alone_after_ms`, records the backup
    /// out of sync once decisions have waited that long for it, and only then lets
    /// `primary` acknowledge alone.
    pub(crate) async fn lead(
        self: Arc<Self>,
        epoch: Epoch,
        primary: Arc<PrimaryLink>,
        mut stop: watch::Receiver<bool>,
    ) {
        self.leading.store(true, Ordering::SeqCst);
        let record = LeaderRecord { member: self.member.get(), run: run_name(self.run), epoch: epoch.raw() };
        let mut lost = self.lease_lost.subscribe();
        let mut caught_up = primary.caught_up_backups();
        let alone_after = self.config.alone_after_ms.map(Duration::from_millis);
        let mut watch = None;
        let mut lag_tick = tokio::time::interval(LAG_MEASURE);
        let mut reported = None;
        // The record now says this member's log holds the led epoch (`PAIR` does since the
        // promotion): were its disk lost, the record's lead would not be its to take again.
        let starting = self.record_in_sync(&record, None).await;
        let newer = loop {
            if let Err(newer) = starting {
                break newer;
            }
            if watch.is_none() {
                self.requests.fetch_add(1, Ordering::Relaxed);
                watch = self.etcd.watch_prefix(self.keys.leader.clone(), None).await.ok();
            }
            tokio::select! {
                _ = stop.changed() => return,
                _ = lost.changed() => {
                    tracing::error!(%epoch, "the lease is gone: stepping down");
                    break None;
                }
                changed = caught_up.changed() => {
                    if changed.is_err() { return; }
                    let backup = *caught_up.borrow_and_update();
                    if let Some(backup) = backup {
                        if let Err(newer) = self.record_in_sync(&record, Some(backup)).await {
                            break newer;
                        }
                    }
                }
                _ = tokio::time::sleep(ALONE_CHECK), if alone_after.is_some() => {
                    let after = alone_after.expect("checked");
                    if primary.strict_wait().is_some_and(|waited| waited >= after) {
                        if let Err(newer) = self.record_in_sync(&record, None).await {
                            break newer;
                        }
                        primary.go_alone();
                    }
                }
                events = async { watch.as_mut().expect("some").next().await }, if watch.is_some() => {
                    match events {
                        Ok(events) => if let Some(newer) = self.lead_lost(&record, &events) { break newer },
                        Err(_) => watch = None,
                    }
                }
                _ = lag_tick.tick() => self.report_lag(&primary, &mut reported).await,
            }
        };
        self.fence.end();
        primary.step_down(newer);
        self.withdraw_lag().await;
    }

    /// Writes the primary's lag to etcd when it changed, at most once per
    /// [`LAG_REPORT_EVERY`] (the operator's information only: a failure is logged).
    async fn report_lag(&self, primary: &PrimaryLink, reported: &mut Option<(rules::LagReport, Instant)>) {
        let now = primary.lag_report();
        let (last, since) = match reported {
            Some((last, at)) => (Some(&*last), at.elapsed()),
            None => (None, Duration::ZERO),
        };
        let Some(lease) = self.lease() else { return };
        if !rules::lag_report_due(last, since, LAG_REPORT_EVERY, &now) {
            return;
        }
        let (compares, ops) = decree_etcd::election::txn(&rules::report_lag(&self.keys, lease.0, &now));
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.lag_reports.fetch_add(1, Ordering::Relaxed);
        match self.etcd.txn(&compares, &ops, &[]).await {
            Ok(result) if result.succeeded => *reported = Some((now, Instant::now())),
            Ok(_) => tracing::debug!("the lag is not reported: this member no longer holds the leader key"),
            Err(e) => tracing::debug!(error = %e, "cannot report the lag on etcd"),
        }
    }

    /// Takes back this member's lag report as it stops leading (its lease may live on).
    async fn withdraw_lag(&self) {
        let Some(lease) = self.lease() else { return };
        let (compares, ops) = decree_etcd::election::txn(&rules::withdraw_lag(&self.keys, lease.0));
        self.requests.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.etcd.txn(&compares, &ops, &[]).await {
            tracing::debug!(error = %e, "cannot take the lag report back from etcd");
        }
    }

    /// Whether `events` on the leader key end this member's lead (`Some`, with the newer
    /// leader's epoch when one is named): the key deleted, or written by another.
    fn lead_lost(&self, record: &LeaderRecord, events: &[WatchEvent]) -> Option<Option<Epoch>> {
        for event in events {
            match event {
                WatchEvent::Put(entry) => {
                    let text = String::from_utf8_lossy(&entry.value);
                    if let Ok(other) = rules::from_json::<LeaderRecord>(&self.keys.leader, &text) {
                        if other != *record {
                            tracing::error!(leader = other.member, "another member leads: stepping down");
                            return Some(Some(Epoch::from_raw(other.epoch)));
                        }
                    }
                }
                WatchEvent::Delete { .. } => {
                    tracing::error!("the leader key is gone: stepping down");
                    return Some(None);
                }
            }
        }
        None
    }

    /// A member forced to lead `epoch` (`decree promote --force`, etcd unreachable) records
    /// that epoch once etcd answers (taking the leader key, raising the counter), then
    /// leads it as an elected member does, `fenced` running first (its acts then check the
    /// lease too); it steps down instead when a newer epoch leads or was minted meanwhile.
    pub(crate) async fn record_forced(
        self: Arc<Self>,
        epoch: Epoch,
        primary: Arc<PrimaryLink>,
        fenced: Box<dyn FnOnce() + Send>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut last = String::new();
        loop {
            match self.try_record_forced(epoch).await {
                Ok(true) => break,
                Ok(false) => {}
                Err(NotNow::Led(_, newer)) => return primary.step_down(Some(newer)),
                Err(NotNow::Superseded(count)) => {
                    tracing::error!(%epoch, count, "a newer epoch was minted while this member was forced to lead");
                    return primary.step_down(None);
                }
                Err(e) if e.to_string() != last => {
                    tracing::warn!(error = %e, %epoch, "cannot record the forced epoch in etcd yet; will retry");
                    last = e.to_string();
                }
                Err(_) => {}
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = stop.changed() => return,
            }
        }
        tracing::warn!(%epoch, "the forced epoch is recorded in etcd: this member leads it as elected");
        fenced();
        self.lead(epoch, primary, stop).await
    }

    /// One attempt: whether the forced epoch is recorded now.
    async fn try_record_forced(&self, epoch: Epoch) -> Result<bool, NotNow> {
        let Some(lease) = self.lease() else {
            return Err(NotNow::Inconsistent("this member holds no etcd lease yet".into()));
        };
        let view = self.view().await.map_err(NotNow::Inconsistent)?;
        let me = Candidate {
            member: self.member,
            run: run_name(self.run),
            lease: lease.0,
            highest: epoch,
            prepared: Epoch::NONE,
        };
        let txn = rules::record_forced(&view, &me, epoch, &self.keys)?;
        let (compares, ops) = decree_etcd::election::txn(&txn);
        self.requests.fetch_add(1, Ordering::Relaxed);
        match self.etcd.txn(&compares, &ops, &[]).await {
            Ok(result) => Ok(result.succeeded),
            Err(e) => Err(NotNow::Inconsistent(e.to_string())),
        }
    }

    /// Records `backup` in sync for the epoch `record` leads, or this member alone (`None`:
    /// the backup out of sync): retried while etcd does not answer; `Err` when the leader
    /// key no longer holds this member's lease (with the newer leader's epoch, when one
    /// leads).
    async fn record_in_sync(
        &self,
        record: &LeaderRecord,
        backup: Option<BackupRun>,
    ) -> Result<(), Option<Epoch>> {
        // A leader holds a lease (it campaigned or recorded its epoch with it).
        let Some(lease) = self.lease() else { return Err(None) };
        let in_sync = backup.map(|b| InSync { member: b.member.get(), run: run_name(b.run) });
        let txn = rules::record_sync(&self.keys, record, lease.0, in_sync);
        let (compares, ops) = decree_etcd::election::txn(&txn);
        loop {
            self.requests.fetch_add(1, Ordering::Relaxed);
            match self.etcd.txn(&compares, &ops, &[]).await {
                Ok(result) if result.succeeded => {
                    *self.recorded.lock() = backup;
                    match backup {
                        Some(b) => {
                            tracing::info!(backup = b.member.get(), run = %run_name(b.run), "the backup is recorded in sync on etcd")
                        }
                        None => tracing::warn!("the backup is recorded out of sync on etcd"),
                    }
                    return Ok(());
                }
                Ok(_) => {
                    let newer =
                        self.view().await.ok().and_then(|v| v.leader.value).map(|l| Epoch::from_raw(l.epoch));
                    tracing::error!("the leader key no longer holds this member's lease: stepping down");
                    return Err(newer);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot record the backup in sync yet; will retry");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// The backup process this member, leading, last recorded in sync (a switchover hands
    /// the lead to it only).
    pub(crate) fn backup_in_sync(&self) -> Option<BackupRun> {
        *self.recorded.lock()
    }

    /// Hands the lead of `epoch` to `backup` (a switchover), once this member stopped
    /// acting and answered what was in flight: the sync record names the backup alone and
    /// the leader key goes, in one transaction guarded by this member's lease
    /// ([`rules::hand_over`]). The fence ends first: nothing is acknowledged after.
    pub(crate) async fn hand_over(&self, epoch: Epoch, backup: BackupRun) -> Result<(), String> {
        self.fence.end();
        let Some(lease) = self.lease() else { return Err("this member holds no etcd lease".into()) };
        let record = LeaderRecord { member: self.member.get(), run: run_name(self.run), epoch: epoch.raw() };
        let in_sync = InSync { member: backup.member.get(), run: run_name(backup.run) };
        let (compares, ops) =
            decree_etcd::election::txn(&rules::hand_over(&self.keys, &record, lease.0, in_sync));
        self.requests.fetch_add(1, Ordering::Relaxed);
        match self.etcd.txn(&compares, &ops, &[]).await {
            Ok(result) if result.succeeded => {
                tracing::warn!(%epoch, backup = backup.member.get(), "the lead is handed over to the backup in sync");
                Ok(())
            }
            Ok(_) => Err("the leader key no longer holds this member's lease".into()),
            Err(e) => Err(format!("etcd: {e}")),
        }
    }

    /// Pauses the pair's automatic failover (`paused`: the pause key written, naming this
    /// member) or resumes it (the key deleted): the operator's `decree pause` / `resume`.
    pub(crate) async fn set_paused(&self, paused: bool) -> Result<(), String> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let op = if paused {
            let at_unix_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            let pause = rules::Pause { by: self.member.get(), at_unix_ms };
            rules::Op::Put { key: self.keys.pause.clone(), value: rules::to_json(&pause), lease: None }
        } else {
            rules::Op::Delete(self.keys.pause.clone())
        };
        let (compares, ops) = decree_etcd::election::txn(&rules::Txn { compares: vec![], ops: vec![op] });
        self.etcd.txn(&compares, &ops, &[]).await.map(|_| ()).map_err(|e| format!("etcd: {e}"))
    }

    /// The pair's maintenance pause as etcd holds it now (`Ok(None)`: not paused), or why
    /// it cannot be told.
    pub(crate) async fn paused(&self) -> Result<Option<rules::Pause>, String> {
        self.operator_requests.fetch_add(1, Ordering::Relaxed);
        let got = self.etcd.get(self.keys.pause.clone()).await.map_err(|e| format!("etcd: {e}"))?;
        Ok(parse::<rules::Pause>(&self.keys.pause, got).map_err(|e| e.to_string())?.value)
    }

    /// Every pair under this member's prefix as etcd holds it, at most
    /// [`CLUSTER_KEYS_MAX`] keys read: JSON, with `truncated` when more were left.
    pub(crate) async fn cluster(&self) -> Result<serde_json::Value, String> {
        self.operator_requests.fetch_add(1, Ordering::Relaxed);
        cluster_of(&self.etcd, &self.config.prefix).await.map_err(|e| format!("etcd: {e}"))
    }

    /// Gives up this member's lease (at a clean stop): its leader key and registration go
    /// at once, so that the backup campaigns without waiting for the TTL.
    pub(crate) async fn resign(&self) {
        self.fence.end();
        self.tend_watchdog();
        let Some(lease) = self.lease() else { return };
        self.requests.fetch_add(1, Ordering::Relaxed);
        match self.etcd.revoke_lease(lease).await {
            Ok(()) => tracing::info!("the etcd lease is revoked"),
            Err(e) => tracing::warn!(error = %e, "cannot revoke the etcd lease: it lapses after its TTL"),
        }
    }
}
