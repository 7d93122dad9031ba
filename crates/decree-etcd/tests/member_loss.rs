//! decree-etcd while members of the test cluster die: one member killed changes nothing;
//! all killed, every call fails in bounded time with an error naming the endpoints, and
//! works again once they are back. Its own test binary: killing the whole cluster must not
//! fail the other tests, which run in parallel within a binary. Skipped when
//! DECREE_TEST_ETCD is unset.

mod common;

use std::time::{Duration, Instant};

use decree_etcd::{Cause, Compare, Etcd, Op};

/// Restarts every member when dropped, so that a failed assertion leaves the cluster whole
/// for the tests that come after.
struct RestartOnDrop(&'static [&'static str]);

impl Drop for RestartOnDrop {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let mut args = vec!["restart"];
            args.extend_from_slice(self.0);
            let _ = std::process::Command::new(common::script()).args(&args).status();
        }
    }
}

/// A lease with its key, a transaction, a read, a keepalive and a watch: what the pair does.
async fn everything_works(etcd: &Etcd, prefix: &str) {
    let key = format!("{prefix}leader");
    let lease = etcd.grant_lease(Duration::from_secs(10)).await.unwrap();
    let mut watch = etcd.watch_prefix(prefix.to_string(), None).await.unwrap();
    let held = Op::Put { key: key.clone().into(), value: b"m".to_vec(), lease: Some(lease.id) };
    assert!(etcd.txn(&[Compare::Absent(key.clone().into())], &[held], &[]).await.unwrap().succeeded);
    assert_eq!(etcd.get(key.clone()).await.unwrap().entry.unwrap().lease, Some(lease.id));
    let answer = etcd.keep_alive(lease.id).renew().await.unwrap();
    assert!(answer.sent <= answer.answered);
    let events =
        tokio::time::timeout(Duration::from_secs(10), watch.next()).await.expect("a watch event").unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    etcd.revoke_lease(lease.id).await.unwrap();
    assert_eq!(etcd.get(key).await.unwrap().entry, None);
}

/// Retries `everything_works` until the cluster answers again (the client reconnects with
/// backoff), within a generous bound; reports how long it took.
async fn works_again(etcd: &Etcd, prefix: &str) {
    let started = Instant::now();
    let key = format!("{prefix}probe");
    while let Err(e) = etcd.get(key.clone()).await {
        assert!(started.elapsed() < Duration::from_secs(60), "etcd still unreachable after a restart: {e}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("the client reached etcd again {:?} after the restart", started.elapsed());
    everything_works(etcd, prefix).await;
}

#[tokio::test]
async fn one_member_down_changes_nothing_all_down_fails_clearly() {
    let Some(etcd) = common::connect().await else { return };
    let endpoints = common::endpoints().unwrap();
    let _guard = RestartOnDrop(&["etcd0", "etcd1", "etcd2"]);
    everything_works(&etcd, &common::prefix("all-up")).await;

    // The first endpoint's member, the one the client most likely talks to.
    common::members(&["kill", "etcd0"]);
    everything_works(&etcd, &common::prefix("one-down")).await;
    common::members(&["restart", "etcd0"]);
    works_again(&etcd, &common::prefix("one-back")).await;

    let lease = etcd.grant_lease(Duration::from_secs(30)).await.unwrap();
    let mut keepalive = etcd.keep_alive(lease.id);
    keepalive.renew().await.unwrap();
    common::members(&["kill", "etcd0", "etcd1", "etcd2"]);
    let key = common::prefix("all-down") + "leader";
    let started = Instant::now();
    let errors = [
        etcd.get(key.clone()).await.expect_err("get with every member down"),
        etcd.txn(&[Compare::Absent(key.clone().into())], &[Op::Delete(key.clone().into())], &[])
            .await
            .expect_err("txn"),
        etcd.grant_lease(Duration::from_secs(5)).await.expect_err("lease grant"),
        keepalive.renew().await.expect_err("keepalive"),
    ];
    eprintln!("four calls failed in {:?} with every member down", started.elapsed());
    for (error, operation) in errors.iter().zip(["get", "transaction", "lease grant", "lease keepalive"]) {
        let message = error.to_string();
        eprintln!("{message}");
        assert!(
            message.starts_with(&format!("etcd at {}: {operation} failed: ", endpoints.join(","))),
            "{message}"
        );
        assert!(
            !matches!(error.cause, Cause::LeaseGone(_)),
            "an unreachable etcd is not a lost lease: {message}"
        );
    }

    common::members(&["restart", "etcd0", "etcd1", "etcd2"]);
    works_again(&etcd, &common::prefix("all-back")).await;
    // The lease survived the restart (its TTL is 30 s): the keepalive stream reopens.
    let answer = keepalive.renew().await.expect("the keepalive reopens its stream after a failure");
    assert!(answer.sent <= answer.answered);
    etcd.revoke_lease(lease.id).await.unwrap();
}
