//! Crash points: places inside the server where a test can make the process die, to prove
//! that a SIGKILL at exactly that moment loses nothing acknowledged and leaves nothing
//! half done (the pair kill loop, `decree-crashtest/tests/pair_kill_loop.rs`).
//!
//! The points are compiled in only with the `crash-points` feature (decree-cli's
//! `crash-points` feature forwards it; scripts/test.sh builds the tests' `decree` with it,
//! and the pair kill loop builds its own when run alone).
//! Without the feature [`pass`] is an empty inline function: the shipped binary has no
//! way to be told to die, and its commit path does not even read an atomic. The binary
//! under test differs from the shipped one by exactly these calls.
//!
//! A point is armed as `<name>:<nth>` (the process dies at the nth pass of that point,
//! counted from the arming) in one of two ways:
//! - `DECREE_CRASH_POINT=<name>:<nth>` in the environment, read once, at the first pass of
//!   any point (a single server, or a pair member that is primary from its start);
//! - the control request `crash-point <name>:<nth>` on a pair member's control socket
//!   (what the pair kill loop uses: the member that leads a cycle has served since its
//!   promotion, so counting must start when the cycle begins, not when the process did).
//!
//! At the nth pass the process writes one line to stderr, `CRASH-POINT <name> pass=<nth>
//! xid=<xid> origin=<incarnation>-<session>-<sequence>`, and SIGKILLs itself (no unwinding,
//! no destructor, no flush: what a kill -9 leaves).

use decree_core::Xid;

/// Where the server may be told to die.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CrashPoint {
    /// A pair's strict primary: the local write of a decision is durable, the backup has
    /// not confirmed it, no `DecideOk` has left (fired under the pending lock, so no
    /// confirmation can answer it meanwhile).
    DecideWritten,
    /// The decision is durable here and, on a strict primary, confirmed by the backup; it
    /// is visible as decided; its `DecideOk` has not been sent.
    DecideConfirmed,
    /// The server's own phase two (the recovery worker finishing a transaction whose
    /// client is gone, or committing a decided prepared branch it listed): one branch was
    /// just committed.
    PhaseTwo,
}

impl CrashPoint {
    /// Every point, in the order of the names below.
    #[cfg_attr(not(any(feature = "crash-points", test)), allow(dead_code))]
    const ALL: [CrashPoint; 3] =
        [CrashPoint::DecideWritten, CrashPoint::DecideConfirmed, CrashPoint::PhaseTwo];

    /// The point's name, as armed and as printed.
    #[cfg_attr(not(any(feature = "crash-points", test)), allow(dead_code))]
    fn name(self) -> &'static str {
        match self {
            CrashPoint::DecideWritten => "decide-written",
            CrashPoint::DecideConfirmed => "decide-confirmed",
            CrashPoint::PhaseTwo => "phase-two",
        }
    }
}

/// Parses `<name>:<nth>` (nth counted from 1).
#[cfg_attr(not(any(feature = "crash-points", test)), allow(dead_code))]
fn parse(spec: &str) -> Result<(CrashPoint, u64), String> {
    let names = || CrashPoint::ALL.map(CrashPoint::name).join(", ");
    let (name, nth) = spec.trim().split_once(':').ok_or_else(|| format!("{spec:?} is not <name>:<nth>"))?;
    let point = CrashPoint::ALL
        .into_iter()
        .find(|p| p.name() == name)
        .ok_or_else(|| format!("unknown crash point {name:?} (known: {})", names()))?;
    match nth.parse::<u64>() {
        Ok(n @ 1..) => Ok((point, n)),
        _ => Err(format!("{nth:?} is not a pass number (counted from 1)")),
    }
}

/// The process passes `point` while handling `xid`: dies here if that pass was armed.
#[inline(always)]
pub(crate) fn pass(point: CrashPoint, xid: &Xid) {
    #[cfg(feature = "crash-points")]
    armed::pass(point, xid);
    #[cfg(not(feature = "crash-points"))]
    let _ = (point, xid);
}

/// Arms `spec` (`<name>:<nth>`), replacing whatever was armed; returns what was armed.
#[cfg(feature = "crash-points")]
pub(crate) fn arm(spec: &str) -> Result<String, String> {
    armed::arm(spec)
}

#[cfg(feature = "crash-points")]
mod armed {
    use super::{parse, CrashPoint};
    use decree_core::Xid;
    use parking_lot::Mutex;
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Once;

    /// The armed point, its pass number and the passes counted so far.
    struct Armed {
        point: CrashPoint,
        nth: u64,
        passes: u64,
    }

    static ARMED: Mutex<Option<Armed>> = Mutex::new(None);
    /// Whether anything is armed: a pass reads this atomic and nothing else when not.
    static ANY: AtomicBool = AtomicBool::new(false);
    static FROM_ENV: Once = Once::new();

    /// The environment variable read once at the first pass.
    const ENV: &str = "DECREE_CRASH_POINT";

    pub(super) fn arm(spec: &str) -> Result<String, String> {
        let (point, nth) = parse(spec)?;
        *ARMED.lock() = Some(Armed { point, nth, passes: 0 });
        ANY.store(true, Ordering::SeqCst);
        Ok(format!("armed: crash point {} at pass {nth}", point.name()))
    }

    pub(super) fn pass(point: CrashPoint, xid: &Xid) {
        FROM_ENV.call_once(|| {
            if let Ok(spec) = std::env::var(ENV) {
                match arm(&spec) {
                    Ok(armed) => tracing::warn!("{ENV}: {armed}"),
                    Err(e) => tracing::error!("{ENV} ignored: {e}"),
                }
            }
        });
        if !ANY.load(Ordering::SeqCst) {
            return;
        }
        let mut armed = ARMED.lock();
        let Some(a) = armed.as_mut().filter(|a| a.point == point) else { return };
        a.passes += 1;
        if a.passes < a.nth {
            return;
        }
        let origin = xid.origin().map_or_else(
            || "none".to_string(),
            |o| format!("{}-{}-{}", o.incarnation, o.session, o.sequence),
        );
        let line = format!("CRASH-POINT {} pass={} xid={xid} origin={origin}\n", point.name(), a.nth);
        // One write of the whole line, then the kill: the lock stays held, so no other
        // thread passes a point meanwhile.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
        // SAFETY: kill(2) on this process's own id has no memory-safety precondition.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
        std::process::abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_point_and_refuses_the_rest() {
        for point in CrashPoint::ALL {
            assert_eq!(parse(&format!("{}:3", point.name())), Ok((point, 3)));
        }
        assert_eq!(parse(" phase-two:1\n"), Ok((CrashPoint::PhaseTwo, 1)));
        for bad in ["phase-two", "phase-two:0", "phase-two:x", "nowhere:1", ":1", ""] {
            assert!(parse(bad).is_err(), "{bad:?} parsed");
        }
    }
}
