//! The optional watchdog of a member elected on etcd (issue 34, as Patroni uses Linux's
//! softdog): the primary keeps the device fed only while it leads and its lease provably
//! lives, so that a process that hangs or is paused past its lease, and so can neither
//! feed the device nor fence itself, gets its machine reset. A primary that is running and
//! sees its lease lapse has already fenced itself: it disarms the device (the "magic
//! close", a `V` before closing) instead of letting it reset a machine that does no harm.

use parking_lot::Mutex;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// What the watchdog does at one look at the member (pure: tested without a device).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tend {
    /// Open the device (which arms it), then feed it.
    Arm,
    /// Feed the open device.
    Feed,
    /// Write the magic `V` and close: the device stops counting.
    Disarm,
    /// Nothing: the device is closed and this member does not lead.
    Rest,
}

/// The watchdog's step: `open`, whether the device is open (armed); `keep`, whether this
/// member leads with its lease provably alive.
pub(crate) fn tend(open: bool, keep: bool) -> Tend {
    match (open, keep) {
        (false, true) => Tend::Arm,
        (true, true) => Tend::Feed,
        (true, false) => Tend::Disarm,
        (false, false) => Tend::Rest,
    }
}

/// The device (a path such as `/dev/watchdog`) and what was done with it.
pub(crate) struct Watchdog {
    path: PathBuf,
    device: Mutex<Option<File>>,
    /// Feeds written, for `decree status`.
    pub(crate) feeds: AtomicU64,
    /// Times the device was armed (opened).
    pub(crate) armed: AtomicU64,
}

impl Watchdog {
    /// The watchdog at `path`, checked to exist (a member configured with a watchdog that
    /// is not there must not run without it: the error says how to get one).
    pub(crate) fn new(path: &Path) -> Result<Watchdog, String> {
        if !path.exists() {
            return Err(format!(
                "[pair.etcd] watchdog {} does not exist: load the softdog module (modprobe softdog) \
                 or a hardware watchdog's driver, or remove the setting",
                path.display()
            ));
        }
        Ok(Watchdog {
            path: path.to_path_buf(),
            device: Mutex::new(None),
            feeds: AtomicU64::new(0),
            armed: AtomicU64::new(0),
        })
    }

    /// Where the device is.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the device is open (armed) now.
    pub(crate) fn is_armed(&self) -> bool {
        self.device.lock().is_some()
    }

    /// One look: feeds the device while `keep` (leading, lease provably alive), arming it
    /// first; disarms it once not. A device that cannot be opened or written is logged and
    /// tried again at the next look (an unfed watchdog resets the machine: that is its job).
    pub(crate) fn tend(&self, keep: bool) {
        let mut device = self.device.lock();
        match tend(device.is_some(), keep) {
            Tend::Rest => {}
            Tend::Arm => match std::fs::OpenOptions::new().append(true).open(&self.path) {
                Ok(file) => {
                    self.armed.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(path = %self.path.display(), "watchdog armed: this member leads");
                    *device = Some(file);
                    self.feed(&mut device);
                }
                Err(e) => {
                    tracing::error!(path = %self.path.display(), error = %e, "cannot open the watchdog")
                }
            },
            Tend::Feed => self.feed(&mut device),
            Tend::Disarm => {
                if let Some(mut file) = device.take() {
                    match file.write_all(b"V") {
                        Ok(()) => {
                            tracing::info!(path = %self.path.display(), "watchdog disarmed: this member no longer leads")
                        }
                        Err(e) => {
                            tracing::error!(path = %self.path.display(), error = %e, "cannot disarm the watchdog")
                        }
                    }
                }
            }
        }
    }

    fn feed(&self, device: &mut Option<File>) {
        let Some(file) = device.as_mut() else { return };
        match file.write_all(b"1") {
            Ok(()) => {
                self.feeds.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => tracing::error!(path = %self.path.display(), error = %e, "cannot feed the watchdog"),
        }
    }
}

impl Drop for Watchdog {
    /// A member that steps down or stops drops its election: the device is disarmed (a
    /// close without the magic `V` leaves it counting). A process killed outright never
    /// gets here, and the machine is reset: a primary that dies while armed is not proven
    /// to have stopped acting, which is what the watchdog is for.
    fn drop(&mut self) {
        self.tend(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_is_fed_only_while_this_member_leads_with_its_lease_alive() {
        assert_eq!(tend(false, true), Tend::Arm);
        assert_eq!(tend(true, true), Tend::Feed);
        assert_eq!(tend(true, false), Tend::Disarm);
        assert_eq!(tend(false, false), Tend::Rest);
    }

    #[test]
    fn a_file_standing_for_the_device_sees_feeds_then_the_magic_close() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("watchdog");
        assert!(Watchdog::new(&path).err().is_some_and(|e| e.contains("does not exist")));
        std::fs::write(&path, b"").unwrap();
        let dog = Watchdog::new(&path).unwrap();
        dog.tend(false);
        assert!(!dog.is_armed());
        dog.tend(true);
        dog.tend(true);
        assert!(dog.is_armed());
        dog.tend(false);
        assert!(!dog.is_armed());
        assert_eq!(std::fs::read(&path).unwrap(), b"11V");
        assert_eq!((dog.feeds.load(Ordering::Relaxed), dog.armed.load(Ordering::Relaxed)), (2, 1));
        dog.tend(true);
        drop(dog);
        assert_eq!(std::fs::read(&path).unwrap(), b"11V1V", "dropped while armed: disarmed");
    }
}
