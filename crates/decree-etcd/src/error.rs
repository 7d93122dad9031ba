//! Errors that say which etcd, which operation, and what went wrong.

use std::time::Duration;

/// What failed, and against which cluster: "etcd at http://127.0.0.1:2379: lease grant
/// failed: ...". The election logs these and decides on [`EtcdError::cause`] (a lease etcd
/// no longer knows is not a network error: the member has lost it for good).
#[derive(Debug, thiserror::Error)]
#[error("etcd at {endpoints}: {operation} failed: {cause}")]
pub struct EtcdError {
    /// The endpoints the client was given, comma-separated.
    pub endpoints: String,
    pub operation: Operation,
    pub cause: Cause,
}

/// What etcd's refusal means, when it refused this client rather than failed to answer:
/// a configuration to fix (etcd's or the client's), which no retry alone will cure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The user or the password is wrong.
    BadCredentials,
    /// etcd has authentication on and the client gave no user.
    AuthRequired,
    /// The user's roles do not let it read or write the keys.
    PermissionDenied,
    /// etcd refused the client's certificate during the TLS handshake (not signed by the CA
    /// etcd trusts, expired, or without the client-auth usage).
    ClientCertificate,
    /// The client does not trust etcd's certificate (another CA, another name).
    ServerCertificate,
    /// An `http://` endpoint speaks TLS: the client sent plaintext to a TLS port.
    NotPlaintext,
}

impl EtcdError {
    /// What the refusal means, from the error alone, or `None` when etcd did not answer (an
    /// outage, a timeout) or closed the connection without a word: [`crate::Etcd::diagnose`]
    /// then tells a refused client certificate or a TLS port from an outage.
    pub fn refusal(&self) -> Option<Refusal> {
        let text = match &self.cause {
            Cause::Client(e) | Cause::Unreachable { last: e, .. } => chain(e).to_lowercase(),
            _ => return None,
        };
        let has = |needles: &[&str]| needles.iter().any(|n| text.contains(n));
        if has(&["authentication failed", "invalid user id or password"]) {
            Some(Refusal::BadCredentials)
        } else if has(&["user name is empty"]) {
            Some(Refusal::AuthRequired)
        } else if has(&["permission denied"]) {
            Some(Refusal::PermissionDenied)
        } else if has(&["invalid peer certificate"]) {
            Some(Refusal::ServerCertificate)
        } else {
            None
        }
    }
}

/// `e` and every error below it, as one line.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(inner) = cause {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        cause = inner.source();
    }
    text
}

/// The operation an [`EtcdError`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Connect,
    LeaseGrant,
    LeaseKeepAlive,
    LeaseRevoke,
    Transaction,
    Get,
    Watch,
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Operation::Connect => "connect",
            Operation::LeaseGrant => "lease grant",
            Operation::LeaseKeepAlive => "lease keepalive",
            Operation::LeaseRevoke => "lease revoke",
            Operation::Transaction => "transaction",
            Operation::Get => "get",
            Operation::Watch => "watch",
        })
    }
}

/// Why an operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Cause {
    /// The client library or the server said no (transport error, gRPC status).
    #[error("{}", chain(.0))]
    Client(#[from] etcd_client::Error),
    /// Every attempt of an idempotent request failed on a connection until the deadline: no
    /// member of the cluster could be reached.
    #[error("no member reachable within {timeout:?}; last error: {}", chain(last))]
    Unreachable { timeout: Duration, last: etcd_client::Error },
    /// No answer within the request timeout: the cluster is unreachable or has no quorum.
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
    /// etcd answered a keepalive with TTL 0: the lease expired or was revoked, and every key
    /// attached to it is gone.
    #[error("lease {0:x} has expired or was revoked")]
    LeaseGone(i64),
    /// etcd answered with an error of its own (a lease grant it refused).
    #[error("refused: {0}")]
    Refused(String),
    /// The server closed a stream (keepalive or watch).
    #[error("the server closed the stream")]
    StreamClosed,
    /// etcd cancelled a watch (for instance its start revision was compacted).
    #[error("watch cancelled by the server: {0}")]
    WatchCancelled(String),
    /// A TLS file could not be read.
    #[error("cannot read {path}: {error}")]
    TlsFile { path: String, error: std::io::Error },
    /// The configuration is unusable (no endpoints, a TTL of zero).
    #[error("{0}")]
    Invalid(String),
}
