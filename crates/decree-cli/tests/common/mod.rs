//! Helpers shared by the `decree` binary's integration tests: children that never outlive
//! a failed test, and free loopback ports.

#![allow(dead_code)] // each test binary uses its own subset

use std::process::Child;

/// A child killed and reaped when the test ends, so that a failed assertion leaves no
/// server running.
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub use decree_server::testing::ports::free_port;
