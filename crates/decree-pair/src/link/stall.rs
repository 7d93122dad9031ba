//! The stall rule of both ends of the link (issue 32, defect 6): an end that waits for
//! its peer and has heard nothing for `link_stall_ms` ends the link, and the normal
//! reconnect, `Hello` and catch-up follow. Pure: the runtime (`decree serve`'s tokio loops)
//! and the simulator tell it when frames are heard and what the link waits for, each on
//! its own monotonic clock, and ask it when the link stalls.
//!
//! What an end waits for is said by the link's own state:
//! - the primary ([`super::leader::LeaderLink::awaits_backup`]): the backup's `Hello`, the
//!   acknowledgement of a batch sent, or that of the live set's last batch (the catch-up
//!   unconfirmed, even with no batch in flight: an empty live set's `CaughtUp` whose
//!   acknowledgement was lost);
//! - the backup ([`super::follower::Follower::awaits_primary`]): the primary's `Hello`, or
//!   its `CaughtUp` while the backup owes no acknowledgement (a `CaughtUp` lost within a
//!   connection left the backup not caught up beside a strict primary, for good).
//!
//! TCP loses no frame within a connection, and its keepalive and `TCP_USER_TIMEOUT`
//! (`super::tune`) end a connection whose peer vanished; the rule covers what they do not:
//! a frame lost or reordered by a middlebox or a bug, and a peer process that stopped
//! answering on a live machine. Liveness only: no decision counts on it.

use std::time::Duration;

/// How long a link end waits for its peer with nothing heard before it ends the link, by
/// default (`pair.link_stall_ms`).
pub const LINK_STALL_DEFAULT: Duration = Duration::from_secs(5);

/// One link end's count of silence, on the runtime's monotonic clock (`now` is a duration
/// from any origin the runtime keeps for the link).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StallWatch {
    stall: Duration,
    /// Since when the peer has been silent while the link waits for it.
    quiet_since: Duration,
    /// The link waited for its peer at the last look.
    waiting: bool,
}

impl StallWatch {
    /// A link just opened at `now`: it waits for the peer's `Hello`.
    pub fn new(stall: Duration, now: Duration) -> StallWatch {
        assert!(!stall.is_zero(), "a link stall bound of zero would end every link");
        StallWatch { stall, quiet_since: now, waiting: true }
    }

    /// A frame of the peer was heard at `now`.
    pub fn heard(&mut self, now: Duration) {
        self.quiet_since = self.quiet_since.max(now);
    }

    /// What the link waits for now (after a step): a wait that begins counts from `now`,
    /// so that a link idle for an hour and then sending a batch is not stalled at once.
    pub fn waits(&mut self, waiting: bool, now: Duration) {
        if waiting && !self.waiting {
            self.quiet_since = self.quiet_since.max(now);
        }
        self.waiting = waiting;
    }

    /// When the link stalls unless its peer is heard first, if it waits for it.
    pub fn deadline(&self) -> Option<Duration> {
        self.waiting.then(|| self.quiet_since + self.stall)
    }

    /// Whether the link has stalled at `now`: it waits for its peer and has heard nothing
    /// for the bound.
    pub fn stalled(&self, now: Duration) -> bool {
        self.deadline().is_some_and(|deadline| now >= deadline)
    }

    /// The link's end when it stalled, naming who was silent and how long.
    pub fn end(&self, peer: &str) -> super::LinkEnd {
        super::LinkEnd::Closed(format!(
            "the {peer} answered nothing for {} ms while the link waited for it (a half-open \
             connection, a stopped process or a lost frame)",
            self.stall.as_millis()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::StallWatch;
    use std::time::Duration;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_link_that_waits_stalls_after_the_bound_of_silence_and_each_frame_restarts_it() {
        let mut watch = StallWatch::new(ms(5000), ms(100));
        assert_eq!(watch.deadline(), Some(ms(5100)), "a new link waits for the hello");
        assert!(!watch.stalled(ms(5099)));
        watch.heard(ms(3000));
        assert!(!watch.stalled(ms(7999)) && watch.stalled(ms(8000)));
        watch.heard(ms(2000));
        assert_eq!(watch.deadline(), Some(ms(8000)), "a frame heard late moves nothing back");
    }

    #[test]
    fn a_link_that_waits_for_nothing_never_stalls_and_a_new_wait_counts_from_its_start() {
        let mut watch = StallWatch::new(ms(5000), ms(0));
        watch.heard(ms(10));
        watch.waits(false, ms(10));
        assert_eq!(watch.deadline(), None);
        assert!(!watch.stalled(ms(3_600_000)), "an idle link is not stalled");
        watch.waits(true, ms(3_600_000));
        assert!(!watch.stalled(ms(3_600_001)), "the wait began now, not at the last frame");
        assert!(watch.stalled(ms(3_605_000)));
        watch.waits(true, ms(3_604_000));
        assert!(watch.stalled(ms(3_605_000)), "a wait that goes on keeps its start");
    }
}
