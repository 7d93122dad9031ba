//! decree-etcd against the real 3-member test cluster (scripts/test-etcd.sh): transactions,
//! leases and their keepalives, revocation, watches. Skipped when DECREE_TEST_ETCD is unset.

mod common;

use std::time::Duration;

use decree_etcd::{BootInstant, Cause, Compare, Op, WatchEvent};

fn put(key: &str, value: &str) -> Op {
    Op::Put { key: key.into(), value: value.into(), lease: None }
}

#[tokio::test]
async fn create_if_absent_succeeds_once() {
    let Some(etcd) = common::connect().await else { return };
    let key = common::prefix("create") + "leader";
    let take = |value: &str| {
        (vec![Compare::Absent(key.clone().into())], vec![put(&key, value)], vec![Op::Get(key.clone().into())])
    };

    let (when, then, otherwise) = take("a");
    let first = etcd.txn(&when, &then, &otherwise).await.unwrap();
    assert!(first.succeeded, "the key was absent: {first:?}");
    assert!(first.reads.is_empty(), "the branch that ran reads nothing: {first:?}");

    let (when, then, otherwise) = take("b");
    let second = etcd.txn(&when, &then, &otherwise).await.unwrap();
    assert!(!second.succeeded, "the key exists now: {second:?}");
    let held = second.reads[0].as_ref().expect("the otherwise branch read the key");
    assert_eq!(held.value, b"a", "the second transaction wrote nothing");
    let got = etcd.get(key.clone()).await.unwrap();
    let entry = got.entry.expect("the key is there");
    assert_eq!(
        (entry.value.as_slice(), entry.mod_revision, entry.lease),
        (&b"a"[..], held.mod_revision, None)
    );
    assert!(got.revision >= entry.mod_revision);
    assert_eq!(etcd.get(key + "-other").await.unwrap().entry, None);
}

#[tokio::test]
async fn compares_on_value_and_lease() {
    let Some(etcd) = common::connect().await else { return };
    let prefix = common::prefix("compares");
    let (leader, record) = (format!("{prefix}leader"), format!("{prefix}sync"));
    let lease = etcd.grant_lease(Duration::from_secs(30)).await.unwrap();
    let other = etcd.grant_lease(Duration::from_secs(30)).await.unwrap();
    let held = Op::Put { key: leader.clone().into(), value: b"m1".to_vec(), lease: Some(lease.id) };
    assert!(
        etcd.txn(&[Compare::Absent(leader.clone().into())], &[held, put(&record, "e1")], &[])
            .await
            .unwrap()
            .succeeded
    );
    assert_eq!(etcd.get(leader.clone()).await.unwrap().entry.unwrap().lease, Some(lease.id));

    // A write to the sync record guarded by the leader key's lease: the holder's succeeds.
    let guard = |id| {
        vec![
            Compare::LeaseIs(leader.clone().into(), id),
            Compare::ValueIs(record.clone().into(), b"e1".to_vec()),
        ]
    };
    assert!(!etcd.txn(&guard(other.id), &[put(&record, "e2")], &[]).await.unwrap().succeeded);
    assert_eq!(etcd.get(record.clone()).await.unwrap().entry.unwrap().value, b"e1");
    assert!(etcd.txn(&guard(lease.id), &[put(&record, "e2")], &[]).await.unwrap().succeeded);
    // The record no longer holds e1: the same guarded write fails now.
    assert!(!etcd.txn(&guard(lease.id), &[put(&record, "e3")], &[]).await.unwrap().succeeded);
    // Delete in a transaction.
    assert!(etcd.txn(&[], &[Op::Delete(record.clone().into())], &[]).await.unwrap().succeeded);
    assert_eq!(etcd.get(record).await.unwrap().entry, None);
    etcd.revoke_lease(lease.id).await.unwrap();
    etcd.revoke_lease(other.id).await.unwrap();
}

#[tokio::test]
async fn keepalive_reports_its_sent_time_and_ttl() {
    let Some(etcd) = common::connect().await else { return };
    let lease = etcd.grant_lease(Duration::from_secs(5)).await.unwrap();
    assert_eq!(lease.ttl, Duration::from_secs(5));
    let mut keepalive = etcd.keep_alive(lease.id);
    let mut previous: Option<BootInstant> = None;
    for _ in 0..5 {
        let before = BootInstant::now();
        let answer = keepalive.renew().await.unwrap();
        let after = BootInstant::now();
        assert!(
            before <= answer.sent && answer.sent <= answer.answered && answer.answered <= after,
            "{answer:?}"
        );
        assert_eq!(answer.ttl, Duration::from_secs(5));
        if let Some(p) = previous {
            assert!(answer.sent > p, "each renewal is sent after the previous one's answer");
        }
        previous = Some(answer.sent);
        eprintln!("keepalive round trip {:?}", answer.answered.saturating_duration_since(answer.sent));
    }
    etcd.revoke_lease(lease.id).await.unwrap();
    let gone = keepalive.renew().await.expect_err("a revoked lease cannot be renewed");
    assert!(matches!(gone.cause, Cause::LeaseGone(id) if id == lease.id.0), "{gone}");
}

#[tokio::test]
async fn a_lease_not_kept_alive_expires_with_its_keys() {
    let Some(etcd) = common::connect().await else { return };
    let prefix = common::prefix("expiry");
    let key = format!("{prefix}leader");
    let ttl = Duration::from_secs(2);
    let lease = etcd.grant_lease(ttl).await.unwrap();
    let held = Op::Put { key: key.clone().into(), value: b"m1".to_vec(), lease: Some(lease.id) };
    assert!(etcd.txn(&[Compare::Absent(key.clone().into())], &[held], &[]).await.unwrap().succeeded);
    let mut keepalive = etcd.keep_alive(lease.id);
    let last = keepalive.renew().await.unwrap();
    assert!(etcd.get(key.clone()).await.unwrap().entry.is_some(), "renewed a moment ago");

    // Keepalives stop: the key goes within a generous bound (the time is reported, not asserted).
    let bound = ttl * 10;
    loop {
        if etcd.get(key.clone()).await.unwrap().entry.is_none() {
            break;
        }
        assert!(last.sent.elapsed() < bound, "the key outlived its lease by far: {:?}", last.sent.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("a {ttl:?} lease's key was gone {:?} after the last keepalive was sent", last.sent.elapsed());
    let gone = keepalive.renew().await.expect_err("an expired lease cannot be renewed");
    assert!(matches!(gone.cause, Cause::LeaseGone(_)), "{gone}");
}

#[tokio::test]
async fn revoking_deletes_at_once_and_the_watch_sees_it() {
    let Some(etcd) = common::connect().await else { return };
    let prefix = common::prefix("revoke");
    let key = format!("{prefix}leader");
    let lease = etcd.grant_lease(Duration::from_secs(60)).await.unwrap();
    let start = etcd.get(key.clone()).await.unwrap().revision + 1;
    let mut watch = etcd.watch_prefix(prefix.clone(), Some(start)).await.unwrap();
    let held = Op::Put { key: key.clone().into(), value: b"m1".to_vec(), lease: Some(lease.id) };
    assert!(etcd.txn(&[], &[held], &[]).await.unwrap().succeeded);
    put_outside(&etcd, &prefix).await;

    etcd.revoke_lease(lease.id).await.unwrap();
    assert_eq!(etcd.get(key.clone()).await.unwrap().entry, None, "revoking deletes the lease's keys at once");
    etcd.revoke_lease(lease.id).await.expect("revoking a lease etcd no longer knows counts as revoked");

    let events = next_events(&mut watch).await;
    assert!(
        matches!(&events[..], [WatchEvent::Put(e)] if e.key == key.as_bytes() && e.lease == Some(lease.id)),
        "{events:?}"
    );
    let events = next_events(&mut watch).await;
    assert!(matches!(&events[..], [WatchEvent::Delete { key: k, .. }] if k == key.as_bytes()), "{events:?}");
}

/// Writes a key just outside the watched prefix, which the watch must not report.
async fn put_outside(etcd: &decree_etcd::Etcd, prefix: &str) {
    let outside = format!("{}-outside", prefix.trim_end_matches('/'));
    assert!(etcd.txn(&[], &[put(&outside, "x")], &[]).await.unwrap().succeeded);
}

async fn next_events(watch: &mut decree_etcd::PrefixWatch) -> Vec<WatchEvent> {
    tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .expect("a watch event within 10 s")
        .unwrap()
}

#[tokio::test]
async fn streams_outlive_the_request_timeout() {
    let Some(endpoints) = common::endpoints() else { return };
    let mut config = decree_etcd::EtcdConfig::new(endpoints);
    config.request_timeout = Duration::from_millis(500);
    let etcd = decree_etcd::Etcd::connect(&config).await.unwrap();
    let prefix = common::prefix("quiet");
    let mut watch = etcd.watch_prefix(prefix.clone(), None).await.unwrap();
    let lease = etcd.grant_lease(Duration::from_secs(10)).await.unwrap();
    let mut keepalive = etcd.keep_alive(lease.id);
    keepalive.renew().await.unwrap();
    // A backup watches the leader key for as long as its primary lives, and a lease is
    // renewed every third of its TTL: both streams stay quiet far longer than a request.
    tokio::time::sleep(config.request_timeout * 3).await;
    keepalive.renew().await.expect("a keepalive after a quiet spell");
    assert!(etcd.txn(&[], &[put(&format!("{prefix}k"), "v")], &[]).await.unwrap().succeeded);
    let events = next_events(&mut watch).await;
    assert!(matches!(&events[..], [WatchEvent::Put(e)] if e.value == b"v"), "{events:?}");
    etcd.revoke_lease(lease.id).await.unwrap();
}
