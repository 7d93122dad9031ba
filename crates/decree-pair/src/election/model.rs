//! A model of etcd for the election's tests and the pair's simulator: linearizable
//! transactions over keys with modification revisions, and leases that expire on a virtual
//! clock (nanoseconds). Only what the election uses: compare a revision or a key's lease,
//! put (under a lease) and delete.

use super::{Compare, LeaseId, Op, Txn};
use std::collections::BTreeMap;

/// One key's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The value.
    pub value: String,
    /// The revision of its last write.
    pub mod_revision: i64,
    /// The lease it was put under.
    pub lease: Option<LeaseId>,
}

/// An etcd cluster seen as one linearizable store.
#[derive(Debug, Default, Clone)]
pub struct Etcd {
    keys: BTreeMap<String, Entry>,
    revision: i64,
    /// Lease id to its expiry (virtual nanoseconds).
    leases: BTreeMap<LeaseId, u64>,
    next_lease: LeaseId,
}

impl Etcd {
    /// Grants a lease of `ttl` nanoseconds at `now`.
    pub fn grant(&mut self, now: u64, ttl: u64) -> LeaseId {
        self.expire(now);
        self.next_lease += 1;
        self.leases.insert(self.next_lease, now + ttl);
        self.next_lease
    }

    /// Renews `lease` at `now` for `ttl`; false when it expired already.
    pub fn keep_alive(&mut self, lease: LeaseId, now: u64, ttl: u64) -> bool {
        self.expire(now);
        match self.leases.get_mut(&lease) {
            Some(expiry) => {
                *expiry = now + ttl;
                true
            }
            None => false,
        }
    }

    /// Revokes `lease`: its keys go at once.
    pub fn revoke(&mut self, lease: LeaseId) {
        self.leases.remove(&lease);
        self.drop_keys_of_dead_leases();
    }

    /// Applies `txn` at `now` if every compare holds; whether it did.
    pub fn txn(&mut self, now: u64, txn: &Txn) -> bool {
        self.expire(now);
        let holds = txn.compares.iter().all(|c| match c {
            Compare::ModRevision(key, revision) => {
                self.keys.get(key).map_or(0, |e| e.mod_revision) == *revision
            }
            Compare::Lease(key, lease) => self.keys.get(key).is_some_and(|e| e.lease == Some(*lease)),
        });
        // etcd refuses a whole transaction that puts under a lease it does not hold.
        let leases_live = txn.ops.iter().all(|op| match op {
            Op::Put { lease: Some(l), .. } => self.leases.contains_key(l),
            _ => true,
        });
        if !holds || !leases_live {
            return false;
        }
        self.revision += 1;
        for op in &txn.ops {
            match op {
                Op::Put { key, value, lease } => {
                    let entry = Entry { value: value.clone(), mod_revision: self.revision, lease: *lease };
                    self.keys.insert(key.clone(), entry);
                }
                Op::Delete(key) => {
                    self.keys.remove(key);
                }
            }
        }
        true
    }

    /// The key's entry at `now`.
    pub fn get(&mut self, now: u64, key: &str) -> Option<Entry> {
        self.expire(now);
        self.keys.get(key).cloned()
    }

    fn expire(&mut self, now: u64) {
        let before = self.leases.len();
        self.leases.retain(|_, expiry| *expiry > now);
        if self.leases.len() != before {
            self.drop_keys_of_dead_leases();
        }
    }

    fn drop_keys_of_dead_leases(&mut self) {
        let leases = &self.leases;
        let dead: Vec<String> = self
            .keys
            .iter()
            .filter(|(_, e)| e.lease.is_some_and(|l| !leases.contains_key(&l)))
            .map(|(k, _)| k.clone())
            .collect();
        if !dead.is_empty() {
            self.revision += 1;
        }
        for key in dead {
            self.keys.remove(&key);
        }
    }
}
