//! The name a decree branch has on a MariaDB server: its Xid with the id of the connection
//! that prepared it appended to the bqual.
//!
//! Why: MariaDB 10.11 lists a prepared branch for other connections before it detaches the
//! InnoDB transaction from the closing connection that prepared it, and an `XA COMMIT` by
//! name in between answers OK and commits nothing (docs/measurements.md, "MariaDB commit by
//! name after the preparer is killed"). Whoever finishes a branch by name (a state server
//! after its client died, recovery after a crash, a retry on a new connection) must first
//! wait until that connection has let go of it, and so must know which connection it was,
//! in any process: the name says it.
//!
//! Only decree's branch Xids (decree's format id and gtrid, a two-byte branch number) carry
//! the id: on the server their bqual is the branch number then the `CONNECTION_ID()` of the
//! preparing connection, 2 + 8 bytes, big-endian. Any other Xid is used as it is. A decree
//! branch named without the id (by an older decree or client) is still recognised and
//! finished, without the wait. Pure: tested without a server.

use decree_core::Xid;

/// Bytes of the preparing connection's id at the end of a decree branch's bqual.
pub const PREPARER_BYTES: usize = 8;

/// Bytes of a decree branch number (the bqual of [`Xid::branch`]).
const BRANCH_BYTES: usize = 2;

/// A branch as `XA RECOVER` lists it, read back into decree's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listed {
    /// The branch as the coordinator knows it (decree's branch Xid, no connection id).
    pub xid: Xid,
    /// `CONNECTION_ID()` of the connection that prepared it, when the name carries it.
    pub preparer: Option<u64>,
}

/// The name of `xid` on the server when connection `connection_id` starts it.
pub fn on_server(xid: &Xid, connection_id: u64) -> Xid {
    if !is_decree_branch(xid) {
        return *xid;
    }
    let mut bqual = [0u8; BRANCH_BYTES + PREPARER_BYTES];
    bqual[..BRANCH_BYTES].copy_from_slice(xid.bqual());
    bqual[BRANCH_BYTES..].copy_from_slice(&connection_id.to_be_bytes());
    let name = Xid::new(xid.format_id(), xid.gtrid(), &bqual).expect("10 bytes fit a bqual");
    assert_eq!(parse(&name), Listed { xid: *xid, preparer: Some(connection_id) });
    name
}

/// Reads a listed name back: the coordinator's Xid and, if named, the preparing connection.
pub fn parse(name: &Xid) -> Listed {
    let bqual = name.bqual();
    if name.origin().is_none() || bqual.len() != BRANCH_BYTES + PREPARER_BYTES {
        return Listed { xid: *name, preparer: None };
    }
    let xid = Xid::new(name.format_id(), name.gtrid(), &bqual[..BRANCH_BYTES]).expect("a shorter bqual fits");
    let preparer = u64::from_be_bytes(bqual[BRANCH_BYTES..].try_into().expect("8 bytes"));
    Listed { xid, preparer: Some(preparer) }
}

fn is_decree_branch(xid: &Xid) -> bool {
    xid.origin().is_some() && xid.bqual().len() == BRANCH_BYTES
}

#[cfg(test)]
mod tests {
    use decree_core::Origin;

    use super::*;

    fn branch(number: u16) -> Xid {
        Xid::decree(Origin { node: 1, incarnation: 7, session: 42, sequence: 1 }).branch(number)
    }

    #[test]
    fn a_decree_branch_is_named_with_its_preparer_and_read_back() {
        let xid = branch(511);
        let name = on_server(&xid, 0x1234_5678_9abc);
        assert_eq!(name.gtrid(), xid.gtrid());
        assert_eq!(name.bqual(), &[0x01, 0xff, 0, 0, 0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc]);
        assert_eq!(parse(&name), Listed { xid, preparer: Some(0x1234_5678_9abc) });
        assert_ne!(on_server(&xid, 1), on_server(&xid, 2), "each preparer names its own branch");
    }

    #[test]
    fn a_name_without_the_preparer_is_still_decree_s_branch() {
        let xid = branch(3);
        assert_eq!(parse(&xid), Listed { xid, preparer: None }, "an older client's name");
    }

    #[test]
    fn other_xids_are_used_as_they_are() {
        let global = branch(1).global();
        let foreign = Xid::new(1, b"another manager", &[0, 1]).expect("valid");
        let ten_bytes = Xid::new(1, b"another manager", &[7; 10]).expect("valid");
        let long_gtrid = Xid::new(decree_core::DECREE_FORMAT_ID, &[5; 64], &[0, 1]).expect("valid");
        for xid in [global, foreign, ten_bytes, long_gtrid] {
            assert_eq!(on_server(&xid, 99), xid, "{xid}");
            assert_eq!(parse(&xid), Listed { xid, preparer: None }, "{xid}");
        }
    }
}
