//! Where a run's threads run: on every CPU the machine has (the default: the benchmark, the
//! server and a pair's two members share them, as on one machine), or split: the
//! benchmark's clients and the server they talk to (a single server, or a pair's primary)
//! on CPU 0 and a pair's backup on CPU 1, as if the backup had a machine of its own (its
//! disk is still the same one). A split run of a single server leaves CPU 1 idle, so that
//! the single server and the pair's primary get the same CPU.
//!
//! Threads inherit the CPU set of the thread that creates them: pinning the thread that
//! starts a run (or a member) before it starts places every thread of it, including those
//! its runtime and its log start later.

use crate::error::BenchError;
use std::str::FromStr;

/// How a run's threads are placed on the CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuPlacement {
    /// Every thread may run on every CPU.
    #[default]
    Shared,
    /// The clients and the single server or primary on CPU 0, a pair's backup on CPU 1.
    Split,
}

impl FromStr for CpuPlacement {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "shared" => Ok(CpuPlacement::Shared),
            "split" => Ok(CpuPlacement::Split),
            other => Err(format!("cpus {other:?}: shared or split")),
        }
    }
}

impl CpuPlacement {
    /// The name `--cpus` takes.
    pub fn name(self) -> &'static str {
        match self {
            CpuPlacement::Shared => "shared",
            CpuPlacement::Split => "split",
        }
    }

    /// Places the calling thread (and so every thread it starts) for a run: on CPU 0 when
    /// split, until the guard drops.
    pub fn for_run(self) -> Result<Option<Pinned>, BenchError> {
        match self {
            CpuPlacement::Shared => Ok(None),
            CpuPlacement::Split => pin_current_thread(0).map(Some),
        }
    }

    /// Places the calling thread for starting a pair's backup: on CPU 1 when split.
    pub fn for_backup(self) -> Result<Option<Pinned>, BenchError> {
        match self {
            CpuPlacement::Shared => Ok(None),
            CpuPlacement::Split => pin_current_thread(1).map(Some),
        }
    }
}

/// The calling thread runs on one CPU until this drops; then on the CPUs it had before.
pub struct Pinned {
    previous: libc::cpu_set_t,
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: a CPU set read by sched_getaffinity, of its own size.
        let restored =
            unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.previous) };
        assert_eq!(restored, 0, "a CPU set this thread had is refused: {}", std::io::Error::last_os_error());
    }
}

/// The CPUs the calling thread may run on now (a container may allow others than 0 and 1).
pub fn cpus_of_this_thread() -> Vec<usize> {
    // SAFETY: a zeroed CPU set is valid, and the call gets one of its own size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect()
    }
}

/// Pins the calling thread to `cpu`, which it must be allowed to use.
fn pin_current_thread(cpu: usize) -> Result<Pinned, BenchError> {
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: zeroed CPU sets are valid; each call gets a set of its own size.
    unsafe {
        let mut previous: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size, &mut previous) != 0 {
            let e = std::io::Error::last_os_error();
            return Err(BenchError::Option(format!("--cpus split: cannot read this thread's CPUs: {e}")));
        }
        // Checked by the kernel against the CPUs the process may use, not against this
        // thread's current set (a backup is started from a thread pinned to CPU 0).
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut one);
        if libc::sched_setaffinity(0, size, &one) != 0 {
            let e = std::io::Error::last_os_error();
            return Err(BenchError::Option(format!(
                "--cpus split needs CPUs 0 and 1; this process may not run on CPU {cpu}: {e}"
            )));
        }
        Ok(Pinned { previous })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_run_pins_its_threads_and_a_backup_inside_it_then_restores_both() {
        let before = cpus_of_this_thread();
        assert!(!before.is_empty(), "a running thread runs somewhere");
        if !(before.contains(&0) && before.contains(&1)) {
            let e = CpuPlacement::Split.for_run().and_then(|_| CpuPlacement::Split.for_backup());
            assert!(e.is_err(), "a machine without CPUs 0 and 1 is refused, not half pinned");
            return;
        }
        {
            let _run = CpuPlacement::Split.for_run().unwrap();
            assert_eq!(cpus_of_this_thread(), [0]);
            let started = std::thread::spawn(cpus_of_this_thread).join().unwrap();
            assert_eq!(started, [0], "threads started in a run inherit its CPU");
            {
                let _backup = CpuPlacement::Split.for_backup().unwrap();
                assert_eq!(std::thread::spawn(cpus_of_this_thread).join().unwrap(), [1]);
            }
            assert_eq!(cpus_of_this_thread(), [0], "back on the run's CPU after the backup started");
        }
        assert_eq!(cpus_of_this_thread(), before);
        assert!(CpuPlacement::Shared.for_run().unwrap().is_none());
        assert_eq!("split".parse(), Ok(CpuPlacement::Split));
        assert!("both".parse::<CpuPlacement>().is_err());
    }
}
