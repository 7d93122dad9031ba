//! The pure rules of a client over several pairs ([`crate::Pairs`]), kept apart from any IO
//! so that they are tested as tables: how the pair list is written, in which order the
//! pairs are tried for a new session, and which pair answers for an Xid.
//!
//! Every pair is independent (its own node id, its own log), so a transaction lives on the
//! pair whose node id its Xid carries, and only that pair can answer for it: an Xid whose
//! node id no known pair has is refused by name, never sent to a pair that would answer
//! "unknown" (or worse, be asked about a stranger's transaction).

use crate::Endpoint;
use decree_core::{StoreError, Xid};

/// Parses a pair list: pairs separated by `;`, the members of one pair by `,`
/// (`tcp:a1:7411,tcp:a2:7411;tcp:b1:7411,tcp:b2:7411`). A single pair (no `;`) is the
/// endpoint list [`crate::RemoteDecisions::connect`] takes. Refuses an empty list, an
/// empty pair and a member named twice (in one pair or in two).
pub fn parse_pairs(spec: &str) -> Result<Vec<Vec<Endpoint>>, StoreError> {
    let mut pairs = Vec::new();
    for (index, pair) in spec.split(';').enumerate() {
        if pair.trim().is_empty() {
            return Err(StoreError::Unreachable(format!(
                "pair {} of {spec:?} names no member (pairs are separated by `;`, members by `,`)",
                index + 1
            )));
        }
        let members =
            pair.split(',').map(|e| e.trim().parse::<Endpoint>()).collect::<Result<Vec<Endpoint>, _>>()?;
        pairs.push(members);
    }
    check_pairs(&pairs)?;
    Ok(pairs)
}

/// Checks a pair list given as values: at least one pair, each with at least one member,
/// and no member named twice (a member in two pairs would make its node id ambiguous).
pub fn check_pairs(pairs: &[Vec<Endpoint>]) -> Result<(), StoreError> {
    if pairs.is_empty() {
        return Err(StoreError::Unreachable("no pair to connect to: the pair list is empty".into()));
    }
    let mut seen: Vec<(&Endpoint, usize)> = Vec::new();
    for (index, members) in pairs.iter().enumerate() {
        if members.is_empty() {
            return Err(StoreError::Unreachable(format!("pair {} names no member", index + 1)));
        }
        for member in members {
            if let Some((_, first)) = seen.iter().find(|(m, _)| *m == member) {
                let where_ = if *first == index {
                    format!("twice in pair {}", index + 1)
                } else {
                    format!("in pair {} and in pair {}", first + 1, index + 1)
                };
                return Err(StoreError::Unreachable(format!(
                    "member {member} is named {where_}: each member belongs to one pair, once"
                )));
            }
            seen.push((member, index));
        }
    }
    Ok(())
}

/// The pairs to try for a new session, each once: first the pairs not marked `down`, in a
/// rotation that starts one further at each `turn` (round robin over the pairs that serve,
/// so that a down pair's share is spread evenly, not handed to its neighbour), then the
/// down ones (a pair that failed a moment ago is tried last, not skipped: it may be the
/// only one left).
pub fn session_order(turn: usize, down: &[bool]) -> Vec<usize> {
    let rotate = |set: Vec<usize>| -> Vec<usize> {
        let n = set.len().max(1);
        (0..set.len()).map(|i| set[(turn + i) % n]).collect()
    };
    let live = rotate((0..down.len()).filter(|&i| !down[i]).collect());
    let dead = rotate((0..down.len()).filter(|&i| down[i]).collect());
    live.into_iter().chain(dead).collect()
}

/// Why no pair answers for an Xid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteError {
    /// Not an Xid decree minted: it names no node.
    NotDecree,
    /// No pair has the Xid's node id; `unlearned` pairs (indexes) have not been reached yet,
    /// so their node ids are not known.
    UnknownNode {
        /// The Xid's node id.
        node: u32,
        /// The node ids known, by pair index.
        known: Vec<(usize, u32)>,
        /// Pairs never reached, whose node id is unknown.
        unlearned: Vec<usize>,
    },
}

impl std::fmt::Display for RouteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RouteError::NotDecree => {
                write!(f, "not a decree Xid: it names no node, so no pair answers for it")
            }
            RouteError::UnknownNode { node, known, unlearned } => {
                let known: Vec<String> =
                    known.iter().map(|(i, n)| format!("pair {} has node {n}", i + 1)).collect();
                write!(f, "no pair has node id {node} ({})", known.join(", "))?;
                if !unlearned.is_empty() {
                    let names: Vec<String> = unlearned.iter().map(|i| format!("pair {}", i + 1)).collect();
                    write!(f, "; not reached yet, node id unknown: {}", names.join(", "))?;
                }
                Ok(())
            }
        }
    }
}

/// The pair that answers for `xid`: the one whose node id (`nodes[i]`, `None` while pair
/// `i` was never reached) is the Xid's. Node ids are distinct ([`crate::Pairs`] refuses a
/// pair whose node id another has), so at most one matches.
pub fn pair_of_xid(nodes: &[Option<u32>], xid: &Xid) -> Result<usize, RouteError> {
    let origin = xid.origin().ok_or(RouteError::NotDecree)?;
    if let Some(index) = nodes.iter().position(|n| *n == Some(origin.node)) {
        return Ok(index);
    }
    Err(RouteError::UnknownNode {
        node: origin.node,
        known: nodes.iter().enumerate().filter_map(|(i, n)| n.map(|n| (i, n))).collect(),
        unlearned: nodes.iter().enumerate().filter(|(_, n)| n.is_none()).map(|(i, _)| i).collect(),
    })
}

/// Whether pair `index` may take node id `node`: no other pair has it. Returns the other
/// pair's index when one does.
pub fn node_taken(nodes: &[Option<u32>], index: usize, node: u32) -> Option<usize> {
    nodes.iter().enumerate().position(|(i, n)| i != index && *n == Some(node))
}

#[cfg(test)]
mod tests {
    use super::*;
    use decree_core::Origin;

    fn tcp(a: &str) -> Endpoint {
        Endpoint::Tcp(a.into())
    }

    fn xid(node: u32) -> Xid {
        Xid::decree(Origin { node, incarnation: 1, session: 1, sequence: 1 })
    }

    #[test]
    fn a_pair_list_parses_into_pairs_of_members() {
        let pairs = parse_pairs("tcp:a1:1,tcp:a2:1;tcp:b1:1, tcp:b2:1").unwrap();
        assert_eq!(pairs, vec![vec![tcp("a1:1"), tcp("a2:1")], vec![tcp("b1:1"), tcp("b2:1")]]);
        // One pair, one server: the single-pair syntax is a pair list of one.
        assert_eq!(parse_pairs("unix:/r/a.sock").unwrap(), vec![vec![Endpoint::Unix("/r/a.sock".into())]]);
        assert_eq!(parse_pairs("tcp:a:1;tcp:b:1").unwrap(), vec![vec![tcp("a:1")], vec![tcp("b:1")]]);
    }

    #[test]
    fn bad_pair_lists_are_refused_by_name() {
        let cases = [
            ("", "pair 1"),
            (" ", "pair 1"),
            ("tcp:a:1;", "pair 2"),
            ("tcp:a:1;;tcp:b:1", "pair 2"),
            ("tcp:a:1,tcp:a:1", "twice in pair 1"),
            ("tcp:a:1,tcp:a2:1;tcp:b:1,tcp:a2:1", "in pair 1 and in pair 2"),
            ("tcp:a:1,;tcp:b:1", "must start with"),
            ("tcp:a;tcp:b:1", "needs tcp:host:port"),
        ];
        for (spec, why) in cases {
            match parse_pairs(spec) {
                Err(StoreError::Unreachable(e)) => assert!(e.contains(why), "{spec:?}: {e}"),
                other => panic!("{spec:?} must be refused, got {other:?}"),
            }
        }
        assert!(check_pairs(&[]).unwrap_err().to_string().contains("empty"));
        assert!(check_pairs(&[vec![tcp("a:1")], vec![]]).unwrap_err().to_string().contains("pair 2"));
    }

    #[test]
    fn sessions_go_round_robin_and_down_pairs_come_last() {
        let all_up = [false, false, false];
        let orders: Vec<Vec<usize>> = (0..4).map(|turn| session_order(turn, &all_up)).collect();
        assert_eq!(orders, vec![vec![0, 1, 2], vec![1, 2, 0], vec![2, 0, 1], vec![0, 1, 2]]);
        // Pair 2 (index 1) down: the others alternate first, pair 2 is the last resort.
        let firsts: Vec<usize> = (0..4).map(|turn| session_order(turn, &[false, true, false])[0]).collect();
        assert_eq!(firsts, vec![0, 2, 0, 2]);
        assert_eq!(session_order(0, &[false, true, false]), vec![0, 2, 1]);
        assert_eq!(session_order(1, &[false, true, false]), vec![2, 0, 1]);
        // All down: all tried anyway, in rotation.
        assert_eq!(session_order(5, &[true, true]), vec![1, 0]);
        assert_eq!(session_order(7, &[false]), vec![0]);
        assert!(session_order(0, &[]).is_empty());
        // Every pair appears exactly once, whatever the turn and the marks.
        for turn in 0..6 {
            for mask in 0..8u8 {
                let down: Vec<bool> = (0..3).map(|i| mask & (1 << i) != 0).collect();
                let mut order = session_order(turn, &down);
                order.sort_unstable();
                assert_eq!(order, vec![0, 1, 2], "turn {turn} down {down:?}");
            }
        }
    }

    #[test]
    fn an_xid_goes_to_the_pair_with_its_node_id_and_no_other() {
        let nodes = [Some(11), None, Some(33)];
        assert_eq!(pair_of_xid(&nodes, &xid(11)), Ok(0));
        assert_eq!(pair_of_xid(&nodes, &xid(33)), Ok(2));
        let err = pair_of_xid(&nodes, &xid(22)).unwrap_err();
        assert_eq!(
            err,
            RouteError::UnknownNode { node: 22, known: vec![(0, 11), (2, 33)], unlearned: vec![1] }
        );
        let text = err.to_string();
        assert!(text.contains("no pair has node id 22"), "{text}");
        assert!(text.contains("pair 1 has node 11") && text.contains("pair 3 has node 33"), "{text}");
        assert!(text.contains("not reached yet, node id unknown: pair 2"), "{text}");
        let foreign = Xid::new(7, b"g", b"").unwrap();
        assert_eq!(pair_of_xid(&nodes, &foreign), Err(RouteError::NotDecree));
        assert!(matches!(pair_of_xid(&[], &xid(1)), Err(RouteError::UnknownNode { .. })));
    }

    #[test]
    fn a_node_id_belongs_to_one_pair() {
        let nodes = [Some(11), None, Some(33)];
        assert_eq!(node_taken(&nodes, 1, 11), Some(0));
        assert_eq!(node_taken(&nodes, 1, 22), None);
        // A pair meeting its own node id again (a reconnection) is no conflict.
        assert_eq!(node_taken(&nodes, 0, 11), None);
    }
}
