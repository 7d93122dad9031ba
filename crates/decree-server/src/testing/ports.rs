//! Loopback ports for the servers tests start, kill and start again on the same port.

use std::sync::Mutex;

/// Where the search starts when the kernel's ephemeral range is the default one
/// (32768-60999): above the ports scripts/test-etcd.sh (22379) and the private MariaDB of
/// mariadb_restart.rs (23506) take.
const LOW: u16 = 24_000;

/// A search gives up after this many ports taken in a row.
const TRIES_MAX: u32 = 2_000;

/// A loopback port free a moment ago, never handed out before in this test process, and
/// below Linux's ephemeral range when that range leaves room: a server killed and started
/// again on its port finds it taken when one end of an open connection got it as its own
/// port meanwhile (CI saw an etcd member fail so, "bind: address already in use"), and the
/// kernel may give the same ephemeral port to two binds in a row (a pair kill loop once got
/// one port for both members' links).
pub fn free_port() -> u16 {
    static NEXT: Mutex<Option<u32>> = Mutex::new(None);
    let high = ephemeral_low().unwrap_or(32_768);
    if high <= LOW + 1_000 {
        return any_free_port();
    }
    let span = u32::from(high - LOW);
    let mut next = NEXT.lock().unwrap_or_else(|e| e.into_inner());
    // Each process starts at its own offset: two test binaries run one after the other,
    // and a port the last one's server left in TIME_WAIT is better not tried first.
    let mut offset = next.unwrap_or_else(|| std::process::id().wrapping_mul(7_919) % span);
    for _ in 0..TRIES_MAX {
        let port = LOW + (offset % span) as u16;
        offset += 1;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            *next = Some(offset);
            return port;
        }
    }
    panic!("no free loopback port in {LOW}..{high} after {TRIES_MAX} tries");
}

/// The first port of the kernel's ephemeral range, from /proc.
fn ephemeral_low() -> Option<u16> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    range.split_whitespace().next()?.parse().ok()
}

/// A port the kernel picks, where no range below the ephemeral one is left: unique in this
/// process all the same.
fn any_free_port() -> u16 {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_and_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..200).map(|_| free_port()).collect();
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ports.len(), "a port was handed out twice: {ports:?}");
        if let Some(low) = ephemeral_low().filter(|&l| l > LOW + 1_000) {
            assert!(ports.iter().all(|&p| (LOW..low).contains(&p)), "{ports:?} not in {LOW}..{low}");
        }
    }
}
