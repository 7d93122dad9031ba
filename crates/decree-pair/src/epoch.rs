//! Epochs: the pair's fencing token, and the incarnation in the Xids of the primary that
//! minted it.
//!
//! An epoch is a `u64` whose low [`MEMBER_BITS`] bits name the member that minted it and
//! whose high bits count promotions. A promotion takes the highest epoch the member knows
//! of (seen from peers, or held in its log) and adds one to the count: so every epoch is
//! above all that came before it where it was minted, and two members promoting from the
//! same knowledge mint different epochs, the member bits breaking the tie. Epoch 0 means
//! "none yet": a member that was never promoted and never heard of a primary.

/// Bits of an epoch that name the member that minted it.
pub const MEMBER_BITS: u32 = 8;

/// The highest count an epoch can carry: 2^56 - 1 promotions, never reached.
pub const COUNT_MAX: u64 = u64::MAX >> MEMBER_BITS;

/// Which member of a pair a server is (1 to 255); both members share the node id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MemberId(u8);

impl MemberId {
    /// A member id, or `None` for 0 (reserved: epoch 0 is "no epoch").
    pub fn new(id: u8) -> Option<MemberId> {
        (id != 0).then_some(MemberId(id))
    }
    /// The id as configured.
    pub fn get(self) -> u8 {
        self.0
    }
}

/// The fencing token of a pair: ordered, minted only by promotion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Epoch(u64);

impl Epoch {
    /// No epoch seen yet.
    pub const NONE: Epoch = Epoch(0);

    /// The epoch of a raw value (as read from a log, a frame or an Xid's incarnation).
    pub fn from_raw(raw: u64) -> Epoch {
        Epoch(raw)
    }
    /// The raw value: what frames, the log and Xids carry.
    pub fn raw(self) -> u64 {
        self.0
    }
    /// How many promotions came before this one, this one included.
    pub fn count(self) -> u64 {
        self.0 >> MEMBER_BITS
    }
    /// The member that minted this epoch; `None` for [`Epoch::NONE`] or a raw value whose
    /// member bits are 0 (an incarnation of a server that is not in a pair).
    pub fn member(self) -> Option<MemberId> {
        MemberId::new((self.0 & ((1 << MEMBER_BITS) - 1)) as u8)
    }

    /// The epoch `member` mints when promoted, knowing of every epoch in `known`: one more
    /// promotion than the highest of them, with `member`'s id in the low bits.
    pub fn mint(member: MemberId, known: &[Epoch]) -> Epoch {
        let highest = known.iter().copied().max().unwrap_or(Epoch::NONE);
        let count = highest.count() + 1;
        assert!(count <= COUNT_MAX, "epoch count overflow: {highest:?}");
        let minted = Epoch((count << MEMBER_BITS) | u64::from(member.get()));
        assert!(known.iter().all(|&k| minted > k), "a minted epoch is above every known one");
        minted
    }
}

impl std::fmt::Display for Epoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.member() {
            Some(m) => write!(f, "{}.{}", self.count(), m.get()),
            None => write!(f, "{}", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(id: u8) -> MemberId {
        MemberId::new(id).unwrap()
    }

    #[test]
    fn member_zero_does_not_exist() {
        assert_eq!(MemberId::new(0), None);
        assert_eq!(Epoch::NONE.member(), None);
    }

    #[test]
    fn a_minted_epoch_is_above_everything_known_and_names_its_member() {
        let known =
            [Epoch::from_raw(0), Epoch::from_raw(7), Epoch::mint(m(2), &[]), Epoch::from_raw(3 << 8 | 1)];
        for member in [m(1), m(2), m(255)] {
            let e = Epoch::mint(member, &known);
            assert!(known.iter().all(|&k| e > k));
            assert_eq!(e.member(), Some(member));
            assert_eq!(e.count(), 4);
        }
        assert_eq!(Epoch::mint(m(1), &[]), Epoch::from_raw(1 << 8 | 1));
    }

    #[test]
    fn two_members_promoting_from_the_same_knowledge_never_mint_the_same_epoch() {
        for seen in [0u64, 1, 256, 257, 258, 1 << 20, (5 << 8) | 2] {
            let known = [Epoch::from_raw(seen)];
            let (a, b) = (Epoch::mint(m(1), &known), Epoch::mint(m(2), &known));
            assert_ne!(a, b);
            assert_eq!(a.count(), b.count(), "the same promotion count, told apart by the member");
            // Whoever hears of the other's epoch and promotes again goes above both.
            let again = Epoch::mint(m(1), &[a, b]);
            assert!(again > a && again > b);
        }
    }

    #[test]
    fn an_epoch_prints_as_count_and_member() {
        assert_eq!(Epoch::from_raw(3 << 8 | 2).to_string(), "3.2");
        assert_eq!(Epoch::NONE.to_string(), "0");
    }
}
