//! A monotonic clock that keeps counting while the machine is suspended.

use std::ops::Add;
use std::time::Duration;

/// A point on `CLOCK_BOOTTIME`: monotonic, and unlike `std::time::Instant`
/// (`CLOCK_MONOTONIC` on Linux) it counts the time the machine spent suspended. A member's
/// lease is measured from when its last keepalive was sent; on a clock that stopped during a
/// suspension (a paused VM, a laptop lid) the member would believe its lease alive long after
/// etcd let it expire. Linux only, as decree's servers are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BootInstant(Duration);

impl BootInstant {
    /// Now, read with `clock_gettime(CLOCK_BOOTTIME)`.
    pub fn now() -> BootInstant {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid, writable timespec; CLOCK_BOOTTIME exists on every Linux
        // since 2.6.39, so the call cannot fail short of a broken kernel.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
        assert_eq!(rc, 0, "clock_gettime(CLOCK_BOOTTIME) failed: {}", std::io::Error::last_os_error());
        BootInstant(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
    }

    /// The time since boot this instant stands for (for logs and tests).
    pub fn since_boot(self) -> Duration {
        self.0
    }

    /// The time from `earlier` to this instant, zero when `earlier` is later.
    pub fn saturating_duration_since(self, earlier: BootInstant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// The time elapsed since this instant.
    pub fn elapsed(self) -> Duration {
        BootInstant::now().saturating_duration_since(self)
    }
}

impl Add<Duration> for BootInstant {
    type Output = BootInstant;

    fn add(self, d: Duration) -> BootInstant {
        BootInstant(self.0 + d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_clock_moves_forward_and_orders() {
        let a = BootInstant::now();
        std::thread::sleep(Duration::from_millis(5));
        let b = BootInstant::now();
        assert!(b > a);
        assert!(b.saturating_duration_since(a) >= Duration::from_millis(5));
        assert_eq!(a.saturating_duration_since(b), Duration::ZERO);
        assert_eq!((a + Duration::from_secs(1)).saturating_duration_since(a), Duration::from_secs(1));
        // CLOCK_BOOTTIME is never behind CLOCK_MONOTONIC (it adds the suspended time).
        let mut mono = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: a valid, writable timespec.
        assert_eq!(unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut mono) }, 0);
        let mono = Duration::new(mono.tv_sec as u64, mono.tv_nsec as u32);
        assert!(BootInstant::now().since_boot() >= mono);
    }
}
