//! The coordinator's own overhead: begin + commit in a loop over the volatile log and
//! dummy resource managers, on several threads. Not the benchmark (`decree bench` is);
//! a quick check of the hot path while developing it.
//!
//! Usage: `cargo run --release -p decree-core --example hot_loop -- [threads] [seconds] [rms] [engine]`
//! where engine is `volatile` (default) or any durable engine name (a temporary directory).

use decree_core::testing::DummyFactory;
use decree_core::{ResourceManager, RmFactory, TmConfig, TransactionManager, TxContext};
use decree_log::engine::volatile::VolatileLog;
use decree_log::{EngineKind, LogConfig, SyncPolicy};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let number = |i: usize, default: u64| raw.get(i).map(|s| s.parse::<u64>()).unwrap_or(Ok(default));
    let threads = number(0, 2)?;
    let seconds = number(1, 3)?;
    let rm_count = number(2, 2)?;
    let engine: EngineKind = raw.get(3).map(String::as_str).unwrap_or("volatile").parse()?;
    let dir = tempfile::tempdir()?;
    let factories: Vec<DummyFactory> =
        (0..rm_count).map(|i| DummyFactory::named(&format!("dummy-{i}"), 0)).collect();
    let log: Arc<dyn decree_log::Log> = match engine {
        EngineKind::Volatile => Arc::new(VolatileLog::new()),
        durable => Arc::from(decree_log::open(&LogConfig::new(dir.path(), durable, SyncPolicy::Immediate))?),
    };
    let arcs: Vec<Arc<dyn RmFactory>> = factories.iter().map(|f| f.arc()).collect();
    let tm = TransactionManager::embedded(log.clone(), TmConfig::default(), arcs)?;
    let stop = AtomicBool::new(false);
    let total = AtomicU64::new(0);
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let rms: Vec<Box<dyn ResourceManager>> =
                    factories.iter().map(|f| Box::new(f.connection()) as Box<dyn ResourceManager>).collect();
                let mut tx = TxContext::open(&tm, rms).expect("open");
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..16 {
                        tx.begin().expect("begin");
                        tx.commit().expect("commit");
                    }
                    n += 16;
                }
                tx.close().expect("close");
                total.fetch_add(n, Ordering::Relaxed);
            });
        }
        std::thread::sleep(Duration::from_secs(seconds));
        stop.store(true, Ordering::Relaxed);
    });
    let elapsed = started.elapsed().as_secs_f64();
    let n = total.load(Ordering::Relaxed);
    println!(
        "engine={engine} threads={threads} rms={rm_count} transactions={n} tps={:.0} appended={} flushes={}",
        n as f64 / elapsed,
        log.stats().records_appended,
        log.stats().flushes
    );
    Ok(())
}
