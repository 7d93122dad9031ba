//! `--replicas 2`: the run's decisions go to a primary + backup pair of state servers
//! (issue 18, docs/replication.md) instead of a single server, so that the pair's cost is
//! measured next to a single server in the same invocation.
//!
//! The pair is started the way an operator starts a new one: two members in this process
//! (`decree_server::start` with a `[pair]` section, each on its own runtime), each with
//! its own log in a subdirectory of the run's directory (`m1`, `m2`), their links on free
//! loopback ports, their client sockets in the run's private directory; both start as
//! backups. Member 1 is then promoted with force (a new pair's first promotion must be)
//! and [`Promotion`] times it as the issue defines it: from sending `promote` to the first
//! decision the promoted member acknowledges, one decide through a fresh client. At that
//! moment member 1 still leads alone (its backup is catching up), so the benchmark then
//! waits until its status says `strict`, from which point every `DecideOk` waits for the
//! backup's durable acknowledgement, and times that too. The probe's decision is
//! completed, so that the server's counters hold exactly one decision and one completion
//! more than the run's commits ([`PROBE_DECISIONS`]). The run's clients use member 1's
//! socket; member 2 answers clients `NotPrimary` throughout.

use crate::client::Replicas;
use crate::cpus::CpuPlacement;
use crate::remote::client_error;
use crate::BenchError;
use decree_client::{ClientOptions, Endpoint, RemoteDecisions};
use decree_core::{BranchRecord, Decision, DecisionStore, Origin, RmFactory, Xid};
use decree_server::testing::TestCa;
use decree_server::{PairConfig, PairTlsConfig, ServerConfig, ServerError, ServerHandle};
use serde::Serialize;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the promotion, the first decision and the catch-up may take in all before the
/// run is given up.
const PROMOTION_WAIT: Duration = Duration::from_secs(30);

/// Between two attempts to reach the promoted member or to read its status.
const POLL: Duration = Duration::from_micros(200);

/// Decisions the promotion's probe adds to the primary's counters (one, completed).
pub const PROBE_DECISIONS: u64 = 1;

/// The `[pair.tls]` of members 1 and 2: a throwaway CA of the pair and a certificate for
/// each (`decree-member-1`, `decree-member-2`) naming the other as its peer.
fn member_certificates(dir: &Path) -> [PairTlsConfig; 2] {
    let ca = TestCa::new("decree-bench pair CA");
    let ca_file = ca.write_ca(&dir.join("pair-ca.pem"));
    let names = ["decree-member-1", "decree-member-2"];
    let files = names.map(|name| ca.member(dir, name));
    [0, 1].map(|own| PairTlsConfig {
        cert: files[own].cert.clone(),
        key: files[own].key.clone(),
        ca: ca_file.clone(),
        peer_name: names[1 - own].to_string(),
    })
}

/// What promoting member 1 of a new pair took, each figure from sending `promote`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Promotion {
    /// Until the control socket answered that member 1 leads, in ms.
    pub answered_ms: f64,
    /// Until the first decision acknowledged by the promoted member, in ms: the issue's
    /// promotion time.
    pub first_decision_ms: f64,
    /// Until its status said `strict` (its backup caught up), in ms.
    pub strict_ms: f64,
}

/// A started pair whose member 1 leads strictly, ready for the run.
pub struct StartedPair {
    /// Member 1, the primary (stop it first).
    pub primary: ServerHandle,
    /// Member 2, its backup.
    pub backup: ServerHandle,
    /// The primary's client endpoint (`unix:/path`).
    pub endpoint: String,
    /// The primary's metrics endpoint (bound at promotion, so chosen beforehand).
    pub metrics: SocketAddr,
    /// What the promotion took.
    pub promotion: Promotion,
}

/// Starts a pair from `base` (the single server's configuration: engine, RPO, limits) with
/// the logs under `base.log_dir` and the client sockets in `socket_dir`, its backup
/// acknowledging and its link secured as `replicas` says (TLS with throwaway member
/// certificates, written in `socket_dir`) and its threads placed as `cpus` says, promotes
/// member 1 and waits until it is strict.
pub fn start(
    base: &ServerConfig,
    socket_dir: &Path,
    factories: Vec<Arc<dyn RmFactory>>,
    replicas: Replicas,
    cpus: CpuPlacement,
) -> Result<StartedPair, BenchError> {
    let [link_1, link_2, metrics] = free_ports()?;
    let sockets = [socket_dir.join("decree.sock"), socket_dir.join("backup.sock")];
    let link_tls = replicas.link_tls.then(|| member_certificates(socket_dir));
    let secret = socket_dir.join("pair.secret");
    decree_server::testing::write_pair_secret(&secret)
        .map_err(|e| BenchError::io("cannot write the pair's secret", &secret, e))?;
    let member = |id: u8, link: u16, peer_link: u16| -> Result<ServerConfig, BenchError> {
        let (own, peer) = (id as usize - 1, 2 - id as usize);
        let dir = base.log_dir.join(format!("m{id}"));
        std::fs::create_dir_all(&dir)
            .map_err(|e| BenchError::io("cannot create a member's log dir", &dir, e))?;
        let mut config = base.clone();
        config.log_dir = dir;
        (config.unix, config.tcp) = (Some(sockets[own].clone()), None);
        config.metrics = (id == 1).then(|| SocketAddr::from(([127, 0, 0, 1], metrics)));
        config.pair = Some(PairConfig {
            member: id,
            link: SocketAddr::from(([127, 0, 0, 1], link)),
            peer_link: SocketAddr::from(([127, 0, 0, 1], peer_link)),
            peer_clients: Some(format!("unix:{}", sockets[peer].display())),
            ack: replicas.ack,
            tls: link_tls.as_ref().map(|tls| tls[own].clone()),
            secret_file: link_tls.is_none().then(|| secret.clone()),
            busy_poll_us: if replicas.busy_poll { crate::client::BUSY_POLL_US } else { 0 },
            link_stall_ms: decree_server::config::LINK_STALL_MS_DEFAULT,
            etcd: None,
        });
        Ok(config)
    };
    let (config_1, config_2) = (member(1, link_1, link_2)?, member(2, link_2, link_1)?);
    let control_dir = config_1.log_dir.clone();
    let backup = {
        // Every thread of the backup inherits this placement (its own CPU when split).
        let _placed = cpus.for_backup()?;
        start_member(config_2, factories.clone())?
    };
    let primary = start_member(config_1, factories.clone())?;
    let endpoint = format!("unix:{}", sockets[0].display());
    let branches: Vec<String> = factories.iter().map(|f| f.name().to_string()).collect();
    let promotion = promote(&control_dir, &endpoint, &branches)?;
    Ok(StartedPair {
        primary,
        backup,
        endpoint,
        metrics: SocketAddr::from(([127, 0, 0, 1], metrics)),
        promotion,
    })
}

fn start_member(
    config: ServerConfig,
    factories: Vec<Arc<dyn RmFactory>>,
) -> Result<ServerHandle, BenchError> {
    let context = format!("starting pair member {}", config.pair.as_ref().map_or(0, |p| p.member));
    let engine = config.engine.clone();
    decree_server::start(config, factories).map_err(|e| match e {
        ServerError::Log(source) => BenchError::EngineUnavailable { engine, source },
        other => client_error(&context, other),
    })
}

/// Three distinct free loopback ports: the two links and the primary's metrics (held open
/// together while they are picked, so that none is picked twice).
fn free_ports() -> Result<[u16; 3], BenchError> {
    let bind = || {
        TcpListener::bind("127.0.0.1:0")
            .and_then(|l| Ok((l.local_addr()?.port(), l)))
            .map_err(|e| client_error("picking a free loopback port", e))
    };
    let held = [bind()?, bind()?, bind()?];
    Ok(held.map(|(port, _)| port))
}

/// Promotes the member whose log is in `dir` with force and times it (see [`Promotion`]).
fn promote(dir: &Path, endpoint: &str, branches: &[String]) -> Result<Promotion, BenchError> {
    let start = Instant::now();
    let ms = |at: Instant| at.saturating_duration_since(start).as_secs_f64() * 1e3;
    let answer = decree_server::control_request(dir, "promote --force")
        .map_err(|e| client_error("promoting pair member 1", e))?;
    if !answer.starts_with("promoted") {
        return Err(client_error("promoting pair member 1", answer));
    }
    let answered = Instant::now();
    probe(endpoint, branches, start)?;
    let first_decision = Instant::now();
    wait_strict(dir, start)?;
    Ok(Promotion {
        answered_ms: ms(answered),
        first_decision_ms: ms(first_decision),
        strict_ms: ms(Instant::now()),
    })
}

/// One decision through a fresh client of the promoted member, retried from connecting
/// until it is acknowledged (its listener is bound only after the promotion's answer);
/// then completed.
fn probe(endpoint: &str, branches: &[String], start: Instant) -> Result<(), BenchError> {
    let context = format!("deciding once through the promoted member at {endpoint}");
    let endpoint: Endpoint = endpoint.parse().map_err(|e| client_error(&context, e))?;
    let store = loop {
        match RemoteDecisions::connect_with(endpoint.clone(), ClientOptions::default()) {
            Ok(store) => break store,
            Err(e) if start.elapsed() >= PROMOTION_WAIT => return Err(client_error(&context, e)),
            Err(_) => std::thread::sleep(POLL),
        }
    };
    let session = store.open_session().map_err(|e| client_error(&context, e))?;
    let origin = Origin { node: store.node(), incarnation: store.incarnation(), session, sequence: 1 };
    let branches =
        (0u16..).zip(branches).map(|(branch, rm)| BranchRecord { rm: rm.clone(), branch }).collect();
    let decision = Decision { xid: Xid::decree(origin), branches };
    store.decide(&decision).map_err(|e| client_error(&context, e))?;
    store.complete(&decision.xid).map_err(|e| client_error(&context, e))?;
    store.close_session(session);
    Ok(())
}

/// Waits until the member whose log is in `dir` says it is strict.
fn wait_strict(dir: &Path, start: Instant) -> Result<(), BenchError> {
    loop {
        let status = decree_server::control_request(dir, "status")
            .map_err(|e| client_error("reading pair member 1's status", e))?;
        if is_strict(&status) {
            return Ok(());
        }
        if start.elapsed() >= PROMOTION_WAIT {
            return Err(client_error(
                "waiting until pair member 1 is strict",
                format!("still not after {PROMOTION_WAIT:?}: {status}"),
            ));
        }
        std::thread::sleep(POLL);
    }
}

/// Whether a `status` answer (one JSON line) says the member leads strictly.
fn is_strict(status: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(status)
        .is_ok_and(|v| v["role"] == "primary" && v["strict"] == true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_is_read_from_the_status_line() {
        assert!(is_strict(r#"{"role":"primary","member":1,"epoch":"1.1","caught_up":true,"strict":true}"#));
        assert!(!is_strict(r#"{"role":"primary","member":1,"epoch":"1.1","caught_up":true,"strict":false}"#));
        assert!(!is_strict(r#"{"role":"backup","strict":true}"#));
        assert!(!is_strict(r#"{"role":"changing"}"#) && !is_strict("refused: x"));
    }

    #[test]
    fn free_ports_are_distinct() {
        let [a, b, c] = free_ports().expect("ports");
        assert!(a != b && b != c && a != c);
    }
}
