//! A pair member's self-fence under an election on etcd (issue 33): it acknowledges a
//! decision, answers `Outcome` and calls a resource manager only while its lease is
//! provably alive. The election's keepalive moves the fence's end forward
//! ([`Fence::renewed`], judged by decree-pair's `election::lease_alive`); every act checks
//! [`Fence::alive`] just before it, on `CLOCK_BOOTTIME` (a paused process or a suspended
//! machine does not stop it). An answer
//! held by a closed fence waits ([`Fence::reopened`]) until a keepalive succeeds again
//! (the same epoch goes on: etcd was unreachable) or the member steps down (another
//! leads: the connection closes unanswered and the client asks the new primary).
//!
//! Without an election (a single server, or a pair promoted by command) a server has no
//! fence: the operator's promotion is the only fence there (docs/replication.md).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio::sync::Notify;

/// Nanoseconds on `CLOCK_BOOTTIME`: monotonic, counting time suspended.
pub(crate) fn boot_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_BOOTTIME exists on every Linux
    // since 2.6.39.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_BOOTTIME): {}", std::io::Error::last_os_error());
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Until when this member may act, and whether it stepped down.
#[derive(Debug)]
pub struct Fence {
    /// Boot-clock nanoseconds when the last answered keepalive was sent.
    sent_ns: AtomicU64,
    /// The lease's TTL etcd answered, and the margin taken off it, in nanoseconds.
    ttl_ns: AtomicU64,
    margin_ns: AtomicU64,
    ended: AtomicBool,
    changed: Notify,
}

// Without the `etcd` feature no election makes or moves a fence (its tests still run).
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
impl Fence {
    /// A closed fence, opened by the first [`Fence::renewed`].
    pub fn closed() -> Fence {
        Fence {
            sent_ns: AtomicU64::new(0),
            ttl_ns: AtomicU64::new(0),
            margin_ns: AtomicU64::new(0),
            ended: AtomicBool::new(false),
            changed: Notify::new(),
        }
    }

    /// Whether this member may act now.
    pub fn alive(&self) -> bool {
        self.alive_at(boot_ns())
    }

    /// How long ago (boot clock) the last answered keepalive was sent: what the lease's
    /// life is counted from (`None` before the first answer).
    pub fn keepalive_age(&self) -> Option<std::time::Duration> {
        let sent = self.sent_ns.load(Ordering::SeqCst);
        (self.ttl_ns.load(Ordering::SeqCst) > 0)
            .then(|| std::time::Duration::from_nanos(boot_ns().saturating_sub(sent)))
    }

    /// Whether this member may act at boot-clock time `now_ns`.
    /// The rule is decree-pair's `election::lease_alive`, which the simulator runs too.
    pub fn alive_at(&self, now_ns: u64) -> bool {
        let (sent, ttl) = (self.sent_ns.load(Ordering::SeqCst), self.ttl_ns.load(Ordering::SeqCst));
        let margin = self.margin_ns.load(Ordering::SeqCst);
        !self.ended.load(Ordering::SeqCst)
            && ttl > 0
            && decree_pair::election::lease_alive(sent, ttl, margin, now_ns)
    }

    /// A keepalive sent at `sent_ns` was answered with a TTL of `ttl_ns`, judged with
    /// `margin_ns` off (the send time never moves back: answers may come out of order).
    pub fn renewed(&self, sent_ns: u64, ttl_ns: u64, margin_ns: u64) {
        self.ttl_ns.store(ttl_ns, Ordering::SeqCst);
        self.margin_ns.store(margin_ns, Ordering::SeqCst);
        self.sent_ns.fetch_max(sent_ns, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    /// The member steps down (another member leads, or the lease is gone for good): the
    /// fence never opens again.
    pub fn end(&self) {
        self.ended.store(true, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    /// Whether the member stepped down.
    pub fn ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }

    /// Waits until the fence is open (true) or the member steps down (false).
    pub async fn reopened(&self) -> bool {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.ended() {
                return false;
            }
            if self.alive() {
                return true;
            }
            // A keepalive wakes it; the timer only bounds a missed wake-up.
            let _ = tokio::time::timeout(std::time::Duration::from_millis(100), changed).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_fence_opens_until_its_end_and_never_after_it_ended() {
        let fence = Fence::closed();
        assert!(!fence.alive_at(0), "closed until the first keepalive");
        fence.renewed(100, 1_000, 100);
        assert!(fence.alive_at(999) && !fence.alive_at(1_000), "alive strictly before sent + ttl - margin");
        fence.renewed(50, 1_000, 100);
        assert!(fence.alive_at(999), "a late keepalive answer moves nothing back");
        fence.end();
        assert!(!fence.alive_at(500) && fence.ended(), "ended: closed for good");
        fence.renewed(u64::MAX / 2, 1_000, 0);
        assert!(!fence.alive_at(u64::MAX / 2), "no keepalive opens an ended fence");
    }

    #[tokio::test]
    async fn an_answer_held_by_the_fence_goes_when_a_keepalive_comes_and_never_after_the_end() {
        let fence = std::sync::Arc::new(Fence::closed());
        let waiting = tokio::spawn({
            let fence = fence.clone();
            async move { fence.reopened().await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "held while closed");
        fence.renewed(boot_ns(), 60_000_000_000, 0);
        assert!(waiting.await.unwrap(), "released by the keepalive");

        let fence = std::sync::Arc::new(Fence::closed());
        let waiting = tokio::spawn({
            let fence = fence.clone();
            async move { fence.reopened().await }
        });
        fence.end();
        assert!(!waiting.await.unwrap(), "a member that stepped down answers nothing");
    }
}
