//! Leases: granted, kept alive with the time each renewal was sent, revoked.

use std::time::Duration;

use etcd_client::{LeaseKeepAliveStream, LeaseKeeper};

use crate::boot_clock::BootInstant;
use crate::client::{connection_failed, token_refused, Etcd, Retry, RETRY_PAUSE};
use crate::error::{Cause, EtcdError, Operation};

/// An etcd lease's id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LeaseId(pub i64);

impl std::fmt::Display for LeaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // etcdctl shows lease ids in hex.
        write!(f, "{:x}", self.0)
    }
}

/// A granted lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    pub id: LeaseId,
    /// The TTL etcd granted (it may raise a TTL below its minimum).
    pub ttl: Duration,
}

/// One renewal's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeepAliveAnswer {
    /// When the keepalive was sent, taken before it left: etcd received it later, so the
    /// lease lives at least until `sent + ttl` on etcd's side (up to the rate of the two
    /// clocks, which the election's margin covers). A member's proof of its lease is
    /// measured from here, never from the answer's arrival, which may come late.
    pub sent: BootInstant,
    /// When the answer arrived (for the logs and the keepalive round-trip metric).
    pub answered: BootInstant,
    /// The TTL etcd set the lease to on receipt.
    pub ttl: Duration,
}

/// A lease's keepalive stream, one renewal at a time so that each answer belongs to the
/// request whose sent time it reports.
pub struct KeepAlive {
    etcd: Etcd,
    lease: LeaseId,
    stream: Option<(LeaseKeeper, LeaseKeepAliveStream)>,
}

impl Etcd {
    /// Grants a lease of `ttl`, rounded up to whole seconds (etcd's unit). A member's
    /// registration and its leader key live under it: they vanish when the member stops
    /// renewing, which is what lets the backup take over from a dead primary.
    pub async fn grant_lease(&self, ttl: Duration) -> Result<Lease, EtcdError> {
        let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        if secs == 0 {
            return Err(self.error(Operation::LeaseGrant, Cause::Invalid("a lease TTL of zero".into())));
        }
        let secs = i64::try_from(secs).map_err(|_| {
            self.error(Operation::LeaseGrant, Cause::Invalid(format!("TTL {ttl:?} too large")))
        })?;
        // Sent again after a connection failure: at worst a lease nobody renews, which expires.
        let answer = self
            .call(Operation::LeaseGrant, Retry::Yes, |mut c| async move { c.lease_grant(secs, None).await })
            .await?;
        if !answer.error().is_empty() {
            return Err(self.error(Operation::LeaseGrant, Cause::Refused(answer.error().to_string())));
        }
        Ok(Lease { id: LeaseId(answer.id()), ttl: Duration::from_secs(answer.ttl().max(0) as u64) })
    }

    /// A keepalive stream for `lease`; opened on the first [`KeepAlive::renew`].
    pub fn keep_alive(&self, lease: LeaseId) -> KeepAlive {
        KeepAlive { etcd: self.clone(), lease, stream: None }
    }

    /// Revokes a lease: etcd deletes every key attached to it at once. A primary stopping on
    /// SIGTERM revokes its lease so that its backup takes over now rather than after the
    /// TTL. A lease etcd no longer knows (expired, revoked) counts as revoked.
    pub async fn revoke_lease(&self, lease: LeaseId) -> Result<(), EtcdError> {
        match self
            .call(Operation::LeaseRevoke, Retry::Yes, |mut c| async move { c.lease_revoke(lease.0).await })
            .await
        {
            Ok(_) => Ok(()),
            Err(EtcdError { cause: Cause::Client(etcd_client::Error::GRpcStatus(status)), .. })
                if status.message().contains("lease not found") =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

impl KeepAlive {
    /// The lease this stream renews.
    pub fn lease(&self) -> LeaseId {
        self.lease
    }

    /// Sends one keepalive and waits (within the request timeout) for its answer. After a
    /// failure the stream is dropped and the next attempt opens a new one: an answer arriving
    /// late on the old stream must never be taken for the answer to a later request, whose
    /// sent time it would then wrongly vouch for. A connection failure is retried on a new
    /// stream until the deadline (a member of the cluster died; the others answer). A lease
    /// etcd no longer knows fails with [`Cause::LeaseGone`]: renewing it again is pointless.
    pub async fn renew(&mut self) -> Result<KeepAliveAnswer, EtcdError> {
        let timeout = self.etcd.request_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut renewed_token = false;
        loop {
            let generation = self.etcd.auth_generation();
            let renewing = async {
                if generation == 0 {
                    self.etcd.authenticate(0).await?;
                }
                self.renew_once().await
            };
            let cause = match tokio::time::timeout_at(deadline, renewing).await {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(cause)) => cause,
                Err(_) => Cause::TimedOut(timeout),
            };
            self.stream = None;
            let cause = match cause {
                // etcd no longer knows the token (it restarted): once more with a new one.
                Cause::Client(e) if token_refused(&e) && self.etcd.user().is_some() && !renewed_token => {
                    renewed_token = true;
                    match tokio::time::timeout_at(deadline, self.etcd.authenticate(generation)).await {
                        Ok(Ok(())) => continue,
                        Ok(Err(e)) => Cause::Client(e),
                        Err(_) => Cause::TimedOut(timeout),
                    }
                }
                Cause::Client(e) if connection_failed(&e) => {
                    if tokio::time::Instant::now() + RETRY_PAUSE < deadline {
                        tokio::time::sleep(RETRY_PAUSE).await;
                        continue;
                    }
                    Cause::Unreachable { timeout, last: e }
                }
                cause => cause,
            };
            return Err(self.etcd.error(Operation::LeaseKeepAlive, cause));
        }
    }

    /// One attempt: opens the stream if needed, sends one keepalive, reads one answer.
    async fn renew_once(&mut self) -> Result<KeepAliveAnswer, Cause> {
        if self.stream.is_none() {
            let mut client = self.etcd.client.clone();
            self.stream = Some(client.lease_keep_alive(self.lease.0).await?);
        }
        let Some((keeper, stream)) = self.stream.as_mut() else { unreachable!("opened above") };
        let sent = BootInstant::now();
        keeper.keep_alive().await?;
        let answer = stream.message().await?;
        let answered = BootInstant::now();
        match answer {
            None => Err(Cause::StreamClosed),
            Some(a) if a.ttl() <= 0 => Err(Cause::LeaseGone(self.lease.0)),
            Some(a) => Ok(KeepAliveAnswer { sent, answered, ttl: Duration::from_secs(a.ttl() as u64) }),
        }
    }
}
