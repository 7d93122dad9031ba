//! The branch calls (commit, rollback, forget) this process made on resource managers,
//! counted by the epoch of the branch's Xid against the epoch it led when it called: the
//! evidence that a deposed primary touched no branch of a newer epoch (issue 33's split
//! brain), which `decree status` and the metrics show. Counted for the process's life: a
//! member that steps down and rejoins as the backup (`run_with`) keeps its counts.

use decree_core::Xid;
use std::sync::atomic::{AtomicU64, Ordering};

/// How a branch's Xid relates to the epoch of the process that calls its resource manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum XidEpoch {
    /// Minted by the epoch this process leads.
    Own,
    /// Minted by an earlier epoch (or incarnation) of this node: recovery's usual work.
    Earlier,
    /// Minted by a newer epoch than the one this process leads: never to be touched (the
    /// new primary's transactions, which an old primary treats as never issued).
    Newer,
    /// Not this node's (another coordinator's), or not a decree Xid at all.
    Foreign,
}

impl XidEpoch {
    /// Every relation, in the order the counts are kept and shown.
    pub(crate) const ALL: [XidEpoch; 4] =
        [XidEpoch::Own, XidEpoch::Earlier, XidEpoch::Newer, XidEpoch::Foreign];

    /// The relation of `xid` to incarnation `led` of node `node` (pure: tested without IO).
    pub(crate) fn of(xid: &Xid, node: u32, led: u64) -> XidEpoch {
        match xid.origin().filter(|o| o.node == node) {
            None => XidEpoch::Foreign,
            Some(o) if o.incarnation == led => XidEpoch::Own,
            Some(o) if o.incarnation < led => XidEpoch::Earlier,
            Some(_) => XidEpoch::Newer,
        }
    }

    /// The name the status and the metrics give it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            XidEpoch::Own => "own",
            XidEpoch::Earlier => "earlier",
            XidEpoch::Newer => "newer",
            XidEpoch::Foreign => "foreign",
        }
    }
}

static CALLS: [AtomicU64; 4] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];

/// Counts one branch call on `xid` by a process leading incarnation `led` of `node`.
pub(crate) fn count(xid: &Xid, node: u32, led: u64) {
    let relation = XidEpoch::of(xid, node, led);
    if relation == XidEpoch::Newer {
        tracing::error!(%xid, led, "a branch of a newer epoch is being touched: the split-brain rule is broken");
    }
    CALLS[relation as usize].fetch_add(1, Ordering::Relaxed);
}

/// The counts so far, by relation (in [`XidEpoch::ALL`]'s order).
pub(crate) fn counts() -> [(XidEpoch, u64); 4] {
    XidEpoch::ALL.map(|r| (r, CALLS[r as usize].load(Ordering::Relaxed)))
}

/// The counts as a JSON object, for `decree status`.
pub(crate) fn json() -> serde_json::Value {
    serde_json::Value::Object(counts().iter().map(|(r, n)| (r.name().to_string(), (*n).into())).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use decree_core::Origin;

    fn xid(node: u32, incarnation: u64) -> Xid {
        Xid::decree(Origin { node, incarnation, session: 1, sequence: 1 }).branch(0)
    }

    #[test]
    fn a_branch_is_own_earlier_newer_or_foreign_by_its_xids_node_and_incarnation() {
        let led = (3 << 8) | 2;
        assert_eq!(XidEpoch::of(&xid(7, led), 7, led), XidEpoch::Own);
        assert_eq!(XidEpoch::of(&xid(7, (2 << 8) | 1), 7, led), XidEpoch::Earlier);
        assert_eq!(XidEpoch::of(&xid(7, (4 << 8) | 1), 7, led), XidEpoch::Newer);
        assert_eq!(XidEpoch::of(&xid(8, (4 << 8) | 1), 7, led), XidEpoch::Foreign);
    }
}
