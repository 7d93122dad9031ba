//! The whole machine's CPU time, read from `/proc/stat`, so that a run on a host shared
//! with its databases can be judged by the CPU all of its processes used per transfer.
//!
//! On a small machine with the databases on it, throughput follows CPU time per transfer;
//! the application's own CPU (`getrusage`) misses the databases' share, and wall-clock tps
//! moves with whatever else the host does. Busy time counts user, nice, system, irq and
//! softirq (guest time is already inside user); idle, iowait and steal (time the
//! hypervisor gave to other guests) are not busy. Steal is kept apart because it explains
//! runs that are slow for reasons outside the machine.

use std::time::Duration;

/// CPU time the machine has spent since boot, summed over all CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HostCpu {
    /// Time spent running something (user, nice, system, irq, softirq).
    pub busy: Duration,
    /// Time the hypervisor ran other guests while this one wanted to run.
    pub steal: Duration,
}

impl HostCpu {
    /// The machine's counters now, or `None` where `/proc/stat` is not readable (not Linux).
    pub fn now() -> Option<HostCpu> {
        let text = std::fs::read_to_string("/proc/stat").ok()?;
        // SAFETY: sysconf only reads a configuration value.
        let ticks_per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        parse_proc_stat(&text, u64::try_from(ticks_per_s).ok()?)
    }

    /// The time used between `earlier` and `self`.
    pub fn since(&self, earlier: &HostCpu) -> HostCpu {
        HostCpu {
            busy: self.busy.saturating_sub(earlier.busy),
            steal: self.steal.saturating_sub(earlier.steal),
        }
    }
}

/// Reads the aggregate `cpu` line of `/proc/stat` (`user nice system idle iowait irq softirq
/// steal ...`, in clock ticks); `None` when it is missing or malformed.
pub fn parse_proc_stat(text: &str, ticks_per_s: u64) -> Option<HostCpu> {
    if ticks_per_s == 0 {
        return None;
    }
    let line = text.lines().find(|l| l.split_whitespace().next() == Some("cpu"))?;
    let fields: Vec<u64> = line.split_whitespace().skip(1).map(str::parse).collect::<Result<_, _>>().ok()?;
    let field = |i: usize| fields.get(i).copied();
    let busy = field(0)? + field(1)? + field(2)? + field(5)? + field(6)?;
    let steal = field(7).unwrap_or(0);
    let time = |ticks: u64| Duration::from_micros(ticks.saturating_mul(1_000_000) / ticks_per_s);
    Some(HostCpu { busy: time(busy), steal: time(steal) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_aggregate_line_gives_busy_and_steal_time() {
        let text = "cpu  300 5 100 9000 40 7 8 20 0 0\ncpu0 150 2 50 4500 20 3 4 10 0 0\nintr 1 2 3\n";
        let cpu = parse_proc_stat(text, 100).expect("parsed");
        // user + nice + system + irq + softirq = 420 ticks of 10 ms.
        assert_eq!(cpu.busy, Duration::from_millis(4200));
        assert_eq!(cpu.steal, Duration::from_millis(200));
        let later = parse_proc_stat("cpu  400 5 150 9100 40 7 8 25 0 0\n", 100).expect("parsed");
        assert_eq!(
            later.since(&cpu),
            HostCpu { busy: Duration::from_millis(1500), steal: Duration::from_millis(50) }
        );
    }

    #[test]
    fn a_malformed_or_missing_line_is_none() {
        assert_eq!(parse_proc_stat("intr 1 2\n", 100), None);
        assert_eq!(parse_proc_stat("cpu 1 2 x 4 5 6 7 8\n", 100), None);
        assert_eq!(parse_proc_stat("cpu 1 2 3\n", 100), None);
        assert_eq!(parse_proc_stat("cpu 1 2 3 4 5 6 7 8\n", 0), None);
    }

    #[test]
    fn this_machine_reports_time_that_only_grows() {
        let Some(first) = HostCpu::now() else { return };
        let spin = std::time::Instant::now();
        while spin.elapsed() < Duration::from_millis(30) {
            std::hint::black_box(0u64);
        }
        let second = HostCpu::now().expect("readable twice");
        assert!(second.busy >= first.busy && second.steal >= first.steal, "{first:?} then {second:?}");
        assert!(second.busy > first.busy, "30 ms of spinning shows as busy time: {first:?} then {second:?}");
    }
}
