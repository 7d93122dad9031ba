//! The election's rules (`decree_pair::election`, tested there against a model of etcd)
//! carried out on the real 3-member test cluster: the same transactions, through
//! `decree_etcd::election::txn`. Skipped when DECREE_TEST_ETCD is unset.

mod common;

use std::time::Duration;

use decree_etcd::{election, Etcd};
use decree_pair::election::{
    campaign, from_json, record_sync, Candidate, InSync, Keys, Leader, NotNow, Pause, Read, SyncRecord, View,
};
use decree_pair::{Epoch, MemberId};

/// What a member reads of its pair's keys (three reads: the transaction's compares catch
/// any write in between).
async fn view(etcd: &Etcd, keys: &Keys) -> View {
    async fn read<T>(etcd: &Etcd, key: &str, parse: impl Fn(&str) -> T) -> Read<T> {
        match etcd.get(key.to_string()).await.unwrap().entry {
            Some(e) => Read {
                value: Some(parse(std::str::from_utf8(&e.value).unwrap())),
                mod_revision: e.mod_revision,
            },
            None => Read::absent(),
        }
    }
    View {
        leader: read(etcd, &keys.leader, |t| from_json::<Leader>(&keys.leader, t).unwrap()).await,
        sync: read(etcd, &keys.sync, |t| from_json::<SyncRecord>(&keys.sync, t).unwrap()).await,
        counter: read(etcd, &keys.epoch, |t| t.parse().unwrap()).await,
        pause: read(etcd, &keys.pause, |t| from_json::<Pause>(&keys.pause, t).unwrap()).await,
    }
}

async fn candidate(etcd: &Etcd, id: u8, run: &str) -> Candidate {
    let lease = etcd.grant_lease(Duration::from_secs(30)).await.unwrap();
    Candidate {
        member: MemberId::new(id).unwrap(),
        run: run.into(),
        lease: lease.id.0,
        highest: Epoch::NONE,
        prepared: Epoch::NONE,
    }
}

/// Sends `txn` as the election built it; whether every compare held.
async fn send(etcd: &Etcd, txn: &decree_pair::election::Txn) -> bool {
    let (compares, ops) = election::txn(txn);
    etcd.txn(&compares, &ops, &[]).await.unwrap().succeeded
}

#[tokio::test]
async fn the_elections_transactions_hold_on_real_etcd() {
    let Some(etcd) = common::connect().await else { return };
    let prefix = common::prefix("election");
    let keys = Keys::new(&prefix, "orders");
    let a = candidate(&etcd, 1, "run-a").await;
    let b = candidate(&etcd, 2, "run-b").await;

    // Two fresh members campaign from the same view of a new pair: one leads.
    let seen = view(&etcd, &keys).await;
    let (txn_a, epoch_a) = campaign(&seen, &a, &keys).unwrap();
    let (txn_b, _) = campaign(&seen, &b, &keys).unwrap();
    assert!(send(&etcd, &txn_a).await, "the keys were as read");
    assert!(!send(&etcd, &txn_b).await, "the second campaign finds the keys moved");
    assert_eq!(epoch_a.to_string(), "1.1");
    let now = view(&etcd, &keys).await;
    assert_eq!(campaign(&now, &b, &keys), Err(NotNow::Led(1, epoch_a)));
    let leader = now.leader.value.unwrap();
    assert_eq!(etcd.get(keys.leader.clone()).await.unwrap().entry.unwrap().lease.map(|l| l.0), Some(a.lease));

    // Not recorded in sync, B may not take over when A's lease goes.
    etcd.revoke_lease(decree_etcd::LeaseId(a.lease)).await.unwrap();
    assert_eq!(campaign(&view(&etcd, &keys).await, &b, &keys), Err(NotNow::OutOfSync(epoch_a)));

    // A leads again (the same process: still named), records B in sync, and goes.
    let a = Candidate { lease: etcd.grant_lease(Duration::from_secs(30)).await.unwrap().id.0, ..a };
    let (txn, epoch) = campaign(&view(&etcd, &keys).await, &a, &keys).unwrap();
    assert!(send(&etcd, &txn).await);
    assert_eq!(epoch.to_string(), "2.1");
    let leads = Leader { epoch: epoch.raw(), ..leader };
    let in_sync = InSync { member: 2, run: "run-b".into() };
    assert!(send(&etcd, &record_sync(&keys, &leads, a.lease, Some(in_sync))).await);
    etcd.revoke_lease(decree_etcd::LeaseId(a.lease)).await.unwrap();

    // B takes over with a higher epoch; A's late write of the sync record is refused.
    let (txn, epoch_b) = campaign(&view(&etcd, &keys).await, &b, &keys).unwrap();
    assert!(send(&etcd, &txn).await);
    assert_eq!(epoch_b.to_string(), "3.2");
    assert!(
        !send(&etcd, &record_sync(&keys, &leads, a.lease, None)).await,
        "A no longer holds the leader key"
    );
    let record = view(&etcd, &keys).await.sync.value.unwrap();
    assert_eq!(
        record,
        SyncRecord {
            epoch: epoch_b.raw(),
            members: vec![InSync { member: 2, run: "run-b".into() }],
            since: Some(b.highest.raw())
        }
    );
    etcd.revoke_lease(decree_etcd::LeaseId(b.lease)).await.unwrap();
}
