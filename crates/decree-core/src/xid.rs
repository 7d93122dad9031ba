//! XA transaction identifiers.
//!
//! An [`Xid`] is a format id, a global transaction id (gtrid) and a branch qualifier
//! (bqual), each of the last two at most 64 bytes, as in the X/Open XA specification.
//! decree's own Xids use [`DECREE_FORMAT_ID`] and a gtrid that says who minted them (node
//! id), in which life of that node's log (incarnation), for which session, and a sequence
//! number, so that recovery can tell its own branches apart and know whether the process
//! that prepared them is gone.

use std::fmt;

/// The format id of Xids minted by decree ("dcre" in ASCII).
pub const DECREE_FORMAT_ID: i32 = 0x6463_7265;

/// The longest gtrid or bqual allowed by XA.
pub const PART_BYTES_MAX: usize = 64;

/// Longest binary form of an Xid ([`Xid::encode`]): format id (4), the two lengths (1
/// each), a gtrid and a bqual of [`PART_BYTES_MAX`] bytes each.
pub const XID_ENCODED_BYTES_MAX: usize = 4 + 1 + 1 + 2 * PART_BYTES_MAX;

/// Bytes of a decree gtrid: node id (4), incarnation (8), session (8), sequence (8).
pub const DECREE_GTRID_BYTES: usize = 28;

/// Prefix of the string form, so that decree's branches are recognisable in any RM.
pub const GID_PREFIX: &str = "decree:";

/// Why bytes or a string are not a valid Xid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum XidError {
    /// A part is longer than XA allows.
    #[error("{part} is {len} bytes, XA allows at most 64")]
    TooLong {
        /// Which part: "gtrid" or "bqual".
        part: &'static str,
        /// Its length in bytes.
        len: usize,
    },
    /// The string form could not be parsed.
    #[error("not a decree Xid string: {0}")]
    Malformed(String),
}

/// An XA transaction identifier.
///
/// Invariant: bytes past `gtrid_len` and `bqual_len` are zero, so that the derived
/// equality compares exactly the XA parts; hashing reads only the used bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Xid {
    format_id: i32,
    gtrid_len: u8,
    bqual_len: u8,
    gtrid: [u8; PART_BYTES_MAX],
    bqual: [u8; PART_BYTES_MAX],
}

/// What a decree gtrid says about the transaction's origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Origin {
    /// The coordinator node that minted the Xid.
    pub node: u32,
    /// The life of that node's log in which it was minted.
    pub incarnation: u64,
    /// The session (thread or client connection) that owns the transaction.
    pub session: u64,
    /// A sequence number unique within the session.
    pub sequence: u64,
}

impl Xid {
    /// Builds an Xid from its parts.
    pub fn new(format_id: i32, gtrid: &[u8], bqual: &[u8]) -> Result<Self, XidError> {
        if gtrid.len() > PART_BYTES_MAX {
            return Err(XidError::TooLong { part: "gtrid", len: gtrid.len() });
        }
        if bqual.len() > PART_BYTES_MAX {
            return Err(XidError::TooLong { part: "bqual", len: bqual.len() });
        }
        let mut xid = Xid {
            format_id,
            gtrid_len: gtrid.len() as u8,
            bqual_len: bqual.len() as u8,
            gtrid: [0; PART_BYTES_MAX],
            bqual: [0; PART_BYTES_MAX],
        };
        xid.gtrid[..gtrid.len()].copy_from_slice(gtrid);
        xid.bqual[..bqual.len()].copy_from_slice(bqual);
        Ok(xid)
    }

    /// A decree global Xid (empty bqual) for the given origin.
    pub fn decree(origin: Origin) -> Self {
        let mut g = [0u8; DECREE_GTRID_BYTES];
        g[0..4].copy_from_slice(&origin.node.to_be_bytes());
        g[4..12].copy_from_slice(&origin.incarnation.to_be_bytes());
        g[12..20].copy_from_slice(&origin.session.to_be_bytes());
        g[20..28].copy_from_slice(&origin.sequence.to_be_bytes());
        Xid::new(DECREE_FORMAT_ID, &g, &[]).expect("decree gtrid fits")
    }

    /// The same global transaction with the bqual of branch number `branch`.
    pub fn branch(&self, branch: u16) -> Self {
        let mut x = *self;
        if x.bqual_len > 2 {
            x.bqual = [0; PART_BYTES_MAX];
        }
        x.bqual_len = 2;
        x.bqual[..2].copy_from_slice(&branch.to_be_bytes());
        x
    }

    /// The same global transaction without a branch qualifier.
    pub fn global(&self) -> Self {
        let mut x = *self;
        x.bqual_len = 0;
        x.bqual = [0; PART_BYTES_MAX];
        x
    }

    /// The format id.
    pub fn format_id(&self) -> i32 {
        self.format_id
    }
    /// The global transaction id.
    pub fn gtrid(&self) -> &[u8] {
        &self.gtrid[..self.gtrid_len as usize]
    }
    /// The branch qualifier.
    pub fn bqual(&self) -> &[u8] {
        &self.bqual[..self.bqual_len as usize]
    }

    /// The origin when this is a decree Xid, `None` for any other transaction manager's.
    pub fn origin(&self) -> Option<Origin> {
        if self.format_id != DECREE_FORMAT_ID || self.gtrid_len as usize != DECREE_GTRID_BYTES {
            return None;
        }
        let g = self.gtrid();
        Some(Origin {
            node: u32::from_be_bytes(g[0..4].try_into().unwrap()),
            incarnation: u64::from_be_bytes(g[4..12].try_into().unwrap()),
            session: u64::from_be_bytes(g[12..20].try_into().unwrap()),
            sequence: u64::from_be_bytes(g[20..28].try_into().unwrap()),
        })
    }

    /// The branch number of a decree branch Xid.
    pub fn branch_number(&self) -> Option<u16> {
        (self.bqual_len == 2).then(|| u16::from_be_bytes([self.bqual[0], self.bqual[1]]))
    }

    /// A 64-bit key for the log, equal for all branches of one global transaction.
    pub fn log_key(&self) -> u64 {
        match self.origin() {
            Some(o) => (o.session << 40) ^ o.sequence ^ (o.incarnation << 20) ^ ((o.node as u64) << 56),
            None => {
                let mut h: u64 = 0xcbf2_9ce4_8422_2325;
                for &b in self.gtrid() {
                    h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
                }
                h ^ self.format_id as u64
            }
        }
    }

    /// Appends the binary form: format id (4, BE), gtrid len (1), bqual len (1), gtrid, bqual.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.format_id.to_be_bytes());
        out.push(self.gtrid_len);
        out.push(self.bqual_len);
        out.extend_from_slice(self.gtrid());
        out.extend_from_slice(self.bqual());
    }

    /// Decodes the binary form; returns the Xid and the bytes consumed.
    pub fn decode(buf: &[u8]) -> Result<(Self, usize), XidError> {
        if buf.len() < 6 {
            return Err(XidError::Malformed("binary Xid shorter than 6 bytes".into()));
        }
        let format_id = i32::from_be_bytes(buf[0..4].try_into().unwrap());
        let (g, b) = (buf[4] as usize, buf[5] as usize);
        if buf.len() < 6 + g + b {
            return Err(XidError::Malformed("binary Xid truncated".into()));
        }
        Ok((Xid::new(format_id, &buf[6..6 + g], &buf[6 + g..6 + g + b])?, 6 + g + b))
    }

    /// The string form used as a PostgreSQL gid: `decree:<format hex>:<gtrid hex>:<bqual hex>`.
    pub fn to_gid(&self) -> String {
        format!(
            "{GID_PREFIX}{:08x}:{}:{}",
            self.format_id as u32,
            hex::encode(self.gtrid()),
            hex::encode(self.bqual())
        )
    }

    /// Parses the string form; `None` for strings that are not decree gids.
    pub fn from_gid(s: &str) -> Result<Self, XidError> {
        let rest = s.strip_prefix(GID_PREFIX).ok_or_else(|| XidError::Malformed(s.into()))?;
        let mut parts = rest.split(':');
        let (Some(f), Some(g), Some(b), None) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(XidError::Malformed(s.into()));
        };
        let format_id = u32::from_str_radix(f, 16).map_err(|_| XidError::Malformed(s.into()))? as i32;
        let g = hex::decode(g).map_err(|_| XidError::Malformed(s.into()))?;
        let b = hex::decode(b).map_err(|_| XidError::Malformed(s.into()))?;
        Xid::new(format_id, &g, &b)
    }
}

impl std::hash::Hash for Xid {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_i32(self.format_id);
        state.write(self.gtrid());
        state.write_u8(0xff);
        state.write(self.bqual());
    }
}

/// Ordered by format id, then gtrid, then bqual (the parts `Eq` compares): ordered maps of
/// Xids iterate the same way in every run, which a seeded simulation needs to replay.
impl Ord for Xid {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.format_id, self.gtrid(), self.bqual()).cmp(&(other.format_id, other.gtrid(), other.bqual()))
    }
}

impl PartialOrd for Xid {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Xid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_gid())
    }
}

impl fmt::Debug for Xid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Xid({})", self.to_gid())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xids_order_by_their_parts_and_equal_ones_compare_equal() {
        let at = |sequence| Xid::decree(Origin { node: 7, incarnation: 3, session: 11, sequence });
        assert!(at(1) < at(2) && at(2) < at(256));
        assert_eq!(at(5).cmp(&at(5)), std::cmp::Ordering::Equal);
        assert!(at(5) < at(5).branch(0), "a global Xid sorts before its branches");
        assert!(at(5).branch(0) < at(5).branch(1));
    }

    #[test]
    fn decree_xid_round_trips_through_every_form() {
        let origin = Origin { node: 7, incarnation: 3, session: 11, sequence: 99 };
        let x = Xid::decree(origin).branch(2);
        assert_eq!(x.origin(), Some(origin));
        assert_eq!(x.branch_number(), Some(2));
        assert_eq!(Xid::from_gid(&x.to_gid()).unwrap(), x);
        let mut buf = Vec::new();
        x.encode(&mut buf);
        assert_eq!(Xid::decode(&buf).unwrap(), (x, buf.len()));
        assert_eq!(x.global().log_key(), x.log_key());
        assert!(x.to_gid().len() <= 200, "PostgreSQL gids are at most 200 bytes");
    }

    #[test]
    fn branch_of_a_long_bqual_equals_a_fresh_branch() {
        let long = Xid::new(1, b"g", b"a-long-qualifier").unwrap();
        assert_eq!(long.branch(3), Xid::new(1, b"g", &3u16.to_be_bytes()).unwrap());
    }

    #[test]
    fn foreign_xids_have_no_origin_and_long_parts_are_refused() {
        let x = Xid::new(1, b"other-tm", b"b1").unwrap();
        assert_eq!(x.origin(), None);
        assert!(matches!(Xid::new(1, &[0; 65], b""), Err(XidError::TooLong { part: "gtrid", .. })));
        assert!(Xid::from_gid("pgbench-1").is_err());
    }
}
