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

/// A loopback port free a moment ago, never handed out before in this test process: the
/// kernel may give the same ephemeral port to two binds in a row once the first is closed
/// (a pair kill loop got one port for both members' links).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}
