//! The election's transactions (`decree_pair::election`, pure) in this client's terms, so
//! that the rules tested against the model of etcd are the ones sent to etcd.

use crate::{Compare, LeaseId, Op};
use decree_pair::election;

/// The compares and operations of `txn`, for [`crate::Etcd::txn`].
pub fn txn(txn: &election::Txn) -> (Vec<Compare>, Vec<Op>) {
    let compares = txn
        .compares
        .iter()
        .map(|c| match c {
            election::Compare::ModRevision(key, revision) => {
                Compare::ModRevisionIs(key.clone().into(), *revision)
            }
            election::Compare::Lease(key, lease) => Compare::LeaseIs(key.clone().into(), LeaseId(*lease)),
        })
        .collect();
    let ops = txn
        .ops
        .iter()
        .map(|op| match op {
            election::Op::Put { key, value, lease } => {
                Op::Put { key: key.clone().into(), value: value.clone().into(), lease: lease.map(LeaseId) }
            }
            election::Op::Delete(key) => Op::Delete(key.clone().into()),
        })
        .collect();
    (compares, ops)
}
