//! Background machinery shared by the slots and file engines.
//!
//! - [`WritePool`]: a few threads that perform the durable writes of `append_with`, so that
//!   callers on async runtime threads never block on disk IO. Each worker drains a batch
//!   from one bounded queue, writes it and syncs once for the whole batch.
//! - [`Flusher`]: a thread that calls a tick at a fixed interval, for `rpo = N ms`.
//! - [`FailStop`]: the latch that stops a log after its first failed sync. A sync is never
//!   retried: after a failed fsync the kernel may have dropped the dirty pages, so a later
//!   "successful" sync proves nothing.
//! - [`join_unless_current`]: how every engine and the outcome memory join their threads
//!   when dropped, since the drop may run on one of them.
//!
//! Invariants: a queue never holds more than its `queue_max` jobs; dropping a pool runs
//! every job already queued before its threads exit, so no callback is ever lost.

use crate::LogError;
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The fail-stop latch: once set, every operation of the log returns the first error.
#[derive(Debug, Default)]
pub(crate) struct FailStop {
    failed: AtomicBool,
    error: Mutex<Option<LogError>>,
}

impl FailStop {
    /// Ok while no sync has failed; the first sync error afterwards.
    pub(crate) fn check(&self) -> Result<(), LogError> {
        if !self.failed.load(Ordering::Acquire) {
            return Ok(());
        }
        Err(self.error.lock().clone().unwrap_or_else(|| LogError::SyncFailed {
            path: Default::default(),
            message: "an earlier sync failed".into(),
        }))
    }

    /// Latches a failed sync of `path` and returns the error every later call will get.
    pub(crate) fn fail(&self, path: &Path, err: &std::io::Error) -> LogError {
        let mut first = self.error.lock();
        if first.is_none() {
            tracing::error!(path = %path.display(), error = %err, "log sync failed; the log is stopped (fail-stop)");
            *first = Some(LogError::SyncFailed { path: path.to_path_buf(), message: err.to_string() });
        }
        self.failed.store(true, Ordering::Release);
        first.clone().expect("the first error was just stored")
    }
}

struct PoolState<J> {
    queue: VecDeque<J>,
    stopping: bool,
}

struct PoolShared<J> {
    state: Mutex<PoolState<J>>,
    ready: Condvar,
    queue_max: usize,
}

/// A small pool of threads running a batch handler over submitted jobs.
pub(crate) struct WritePool<J: Send + 'static> {
    shared: Arc<PoolShared<J>>,
    threads: Vec<JoinHandle<()>>,
}

impl<J: Send + 'static> WritePool<J> {
    /// Starts `threads` workers that each hand at most `batch_max` jobs at a time to `handler`.
    pub(crate) fn start(
        name: &str,
        threads: usize,
        batch_max: usize,
        queue_max: usize,
        handler: impl Fn(Vec<J>) + Send + Sync + 'static,
    ) -> std::io::Result<Self> {
        assert!(threads > 0 && batch_max > 0 && queue_max > 0);
        let shared = Arc::new(PoolShared {
            state: Mutex::new(PoolState { queue: VecDeque::new(), stopping: false }),
            ready: Condvar::new(),
            queue_max,
        });
        let handler = Arc::new(handler);
        let mut pool = WritePool { shared: shared.clone(), threads: Vec::with_capacity(threads) };
        for index in 0..threads {
            let shared = shared.clone();
            let handler = handler.clone();
            let thread = std::thread::Builder::new()
                .name(format!("{name}-{index}"))
                .spawn(move || worker_loop(&shared, batch_max, &*handler))?;
            // On a spawn error `pool` is dropped, which stops the threads already started.
            pool.threads.push(thread);
        }
        Ok(pool)
    }

    /// Queues a job; gives it back when the queue already holds `queue_max` jobs.
    pub(crate) fn submit(&self, job: J) -> Result<(), J> {
        let mut state = self.shared.state.lock();
        if state.stopping || state.queue.len() >= self.shared.queue_max {
            return Err(job);
        }
        state.queue.push_back(job);
        drop(state);
        self.shared.ready.notify_one();
        Ok(())
    }

    /// The queue limit, for error messages.
    pub(crate) fn queue_max(&self) -> usize {
        self.shared.queue_max
    }
}

fn worker_loop<J>(shared: &PoolShared<J>, batch_max: usize, handler: &dyn Fn(Vec<J>)) {
    loop {
        let mut state = shared.state.lock();
        while state.queue.is_empty() && !state.stopping {
            shared.ready.wait(&mut state);
        }
        if state.queue.is_empty() {
            return; // stopping, and every queued job has run
        }
        let n = state.queue.len().min(batch_max);
        let batch: Vec<J> = state.queue.drain(..n).collect();
        drop(state);
        handler(batch);
    }
}

/// Joins `thread` and says whether it panicked, unless it is the calling thread, which
/// cannot join itself. That happens when a log (or its outcome memory) is dropped by a
/// callback running on one of its own threads: a state server's decision callback holds
/// the server's state, which owns the log, and can be its last holder. The thread has been
/// told to stop by then, and ends on its own once the callback returns to its loop (a
/// pool's worker first runs what is still queued, so no callback is lost).
pub(crate) fn join_unless_current(thread: JoinHandle<()>) -> bool {
    if thread.thread().id() == std::thread::current().id() {
        return false;
    }
    thread.join().is_err()
}

impl<J: Send + 'static> Drop for WritePool<J> {
    fn drop(&mut self) {
        self.shared.state.lock().stopping = true;
        self.shared.ready.notify_all();
        for thread in self.threads.drain(..) {
            if join_unless_current(thread) {
                tracing::error!("a log write worker panicked");
            }
        }
    }
}

/// A thread calling `tick` every `interval` until dropped.
pub(crate) struct Flusher {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Flusher {
    /// Starts the thread; the first tick comes one interval after the start.
    pub(crate) fn start(
        name: &str,
        interval: Duration,
        tick: impl Fn() + Send + 'static,
    ) -> std::io::Result<Self> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let stop_thread = stop.clone();
        let thread = std::thread::Builder::new().name(name.to_string()).spawn(move || loop {
            let (flag, wake) = &*stop_thread;
            let mut stopped = flag.lock();
            if *stopped {
                return;
            }
            wake.wait_for(&mut stopped, interval);
            if *stopped {
                return;
            }
            drop(stopped);
            tick();
        })?;
        Ok(Flusher { stop, thread: Some(thread) })
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        if let Some(thread) = self.thread.take() {
            if join_unless_current(thread) {
                tracing::error!("the log flusher thread panicked");
            }
        }
    }
}
