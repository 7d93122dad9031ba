//! Decide round trips per second through a real server and the real client.
//!
//! `cargo run --release -p decree-server --example decide_bench -- <volatile|journal> <unix|tcp>
//! <threads> <seconds> [rate]`: starts a server in this process on a temporary directory, then
//! `threads` client threads each open a session and decide (and complete) in a closed loop.
//! With `rate` (decides per second over all threads), each thread paces itself to its share
//! (an open-loop load, for the latency at a given throughput). Prints the rate and the
//! latency percentiles of decide.

use decree_client::RemoteDecisions;
use decree_core::{BranchRecord, Decision, DecisionStore, Origin, Xid};
use decree_log::EngineKind;
use decree_server::ServerConfig;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let engine: EngineKind = args.get(1).map(|s| s.as_str()).unwrap_or("volatile").parse().expect("engine");
    let transport = args.get(2).cloned().unwrap_or_else(|| "unix".into());
    let threads: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1);
    let seconds: u64 = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(3);
    let rate: Option<f64> = args.get(5).and_then(|s| s.parse().ok());
    let interval = rate.map(|r| Duration::from_secs_f64(threads as f64 / r));
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = ServerConfig::new(dir.path().join("log"), engine);
    config.unix = Some(dir.path().join("bench.sock"));
    config.tcp = Some("127.0.0.1:0".parse().expect("addr"));
    // The decisions name pg-a and pg-b: dummy stand-ins, since the server refuses decisions
    // naming resource managers it could not finish.
    let rms = vec![
        decree_core::testing::DummyFactory::named("pg-a", 0).arc(),
        decree_core::testing::DummyFactory::named("pg-b", 0).arc(),
    ];
    let server = decree_server::start(config, rms).expect("server");
    let endpoint = match transport.as_str() {
        "tcp" => format!("tcp:{}", server.tcp_addr().expect("tcp")),
        _ => format!("unix:{}", server.unix_path().expect("unix").display()),
    };
    let store = Arc::new(RemoteDecisions::connect(&endpoint).expect("connect"));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let store = store.clone();
            std::thread::spawn(move || {
                let session = store.open_session().expect("session");
                let mut latencies = Vec::with_capacity(1 << 20);
                let mut sequence = 0;
                let mut next = Instant::now();
                while Instant::now() < deadline {
                    if let Some(interval) = interval {
                        next += interval;
                        let now = Instant::now();
                        if next > now {
                            std::thread::sleep(next - now);
                        }
                    }
                    sequence += 1;
                    let origin =
                        Origin { node: store.node(), incarnation: store.incarnation(), session, sequence };
                    let xid = Xid::decree(origin);
                    let branches = vec![
                        BranchRecord { rm: "pg-a".into(), branch: 0 },
                        BranchRecord { rm: "pg-b".into(), branch: 1 },
                    ];
                    let started = Instant::now();
                    store.decide(&Decision { xid, branches }).expect("decide");
                    latencies.push(started.elapsed().as_nanos() as u64);
                    store.complete(&xid).expect("complete");
                }
                store.close_session(session);
                latencies
            })
        })
        .collect();
    let started = Instant::now();
    let mut all: Vec<u64> = workers.into_iter().flat_map(|w| w.join().expect("worker")).collect();
    let elapsed = started.elapsed().as_secs_f64();
    all.sort_unstable();
    let pct = |p: f64| all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1))).copied();
    println!(
        "engine={} transport={transport} threads={threads} decides={} rate={:.0}/s p50={:.1}us p99={:.1}us",
        engine.name(),
        all.len(),
        all.len() as f64 / elapsed,
        pct(0.5).unwrap_or(0) as f64 / 1e3,
        pct(0.99).unwrap_or(0) as f64 / 1e3,
    );
    server.shutdown().expect("shutdown");
}
