//! The connection, transactions and reads.

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Certificate, Client, CompareOp, ConnectOptions, Identity, TlsOptions, TxnOpResponse};

use crate::error::{Cause, EtcdError, Operation};
use crate::lease::LeaseId;

/// Where and how to reach etcd (what `[pair.etcd]` in decree.toml will hold).
#[derive(Clone, Debug)]
pub struct EtcdConfig {
    /// `http://host:port` or, with [`EtcdConfig::tls`], `https://host:port`; every member of
    /// the cluster, so that the client goes on when one is down.
    pub endpoints: Vec<String>,
    /// User and password, when etcd has authentication on.
    pub user: Option<(String, String)>,
    /// Mutual TLS, required by decree beyond loopback like every other listener.
    pub tls: Option<TlsPaths>,
    /// The deadline of every request (and of each keepalive's answer): a member must learn
    /// in bounded time that etcd does not answer, since it fences itself by its lease.
    pub request_timeout: Duration,
    /// The deadline of a TCP (and TLS) connection to one endpoint.
    pub connect_timeout: Duration,
}

impl EtcdConfig {
    /// A configuration with plaintext, no authentication, a 2 s request timeout and a 1 s
    /// connection timeout.
    pub fn new(endpoints: impl IntoIterator<Item = impl Into<String>>) -> EtcdConfig {
        EtcdConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            user: None,
            tls: None,
            request_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(1),
        }
    }
}

/// PEM files for mutual TLS with etcd.
#[derive(Clone, Debug)]
pub struct TlsPaths {
    /// The CA that signed etcd's server certificates.
    pub ca: PathBuf,
    /// This member's client certificate and its private key.
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A connection to an etcd cluster; cheap to clone (clones share the connections).
#[derive(Clone)]
pub struct Etcd {
    pub(crate) client: Client,
    pub(crate) endpoints: String,
    pub(crate) request_timeout: Duration,
    /// The endpoints and TLS files, for [`Etcd::diagnose`]'s look below gRPC.
    pub(crate) endpoint_list: Arc<Vec<String>>,
    pub(crate) tls: Option<TlsPaths>,
    /// The user and password, kept to authenticate again: etcd's tokens expire (a simple
    /// token after 5 idle minutes, every token when etcd restarts), and the client library
    /// never renews the token it got at connection.
    auth: Option<Arc<Auth>>,
}

/// The credentials and the token's generation (bumped at each authentication, so that
/// requests refused together authenticate once).
struct Auth {
    user: String,
    password: String,
    generation: AtomicU64,
    authenticating: tokio::sync::Mutex<()>,
}

/// One condition of a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Compare {
    /// The key does not exist (version 0): the leader key is created only if absent.
    Absent(Vec<u8>),
    /// The key exists and is attached to this lease: a write to the sync record requires the
    /// leader key held under the writer's lease.
    LeaseIs(Vec<u8>, LeaseId),
    /// The key holds exactly this value: the counter and the sync record are rewritten only
    /// if they still hold what was read.
    ValueIs(Vec<u8>, Vec<u8>),
    /// The key's last write was at this revision (0: the key is absent): nothing wrote it
    /// since it was read, which the election's `campaign` asks of every key it read.
    ModRevisionIs(Vec<u8>, i64),
}

/// One operation of a transaction's branch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Writes a key, attached to a lease (the leader key, a registration) or not (the sync
    /// record and the epoch counter must outlive the member that wrote them).
    Put { key: Vec<u8>, value: Vec<u8>, lease: Option<LeaseId> },
    /// Deletes a key (a stale leader key after a forced promotion).
    Delete(Vec<u8>),
    /// Reads a key: a failed transaction says what the keys held instead, in one round trip.
    Get(Vec<u8>),
}

/// A key as etcd holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    /// The revision of the key's last write: a watch started after it sees every later change.
    pub mod_revision: i64,
    /// The lease the key is attached to, if any.
    pub lease: Option<LeaseId>,
}

/// What [`Etcd::get`] read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Got {
    /// The key, or `None` when absent.
    pub entry: Option<Entry>,
    /// The store's revision when it was read: [`Etcd::watch_prefix`] from `revision + 1`
    /// misses nothing that happened after the read.
    pub revision: i64,
}

/// What a transaction did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnResult {
    /// Every compare held, and the `then` branch ran (else the `otherwise` branch did).
    pub succeeded: bool,
    /// One element per [`Op::Get`] of the branch that ran, in order: the key, or `None`.
    pub reads: Vec<Option<Entry>>,
}

impl Entry {
    pub(crate) fn from_kv(kv: &etcd_client::KeyValue) -> Entry {
        Entry {
            key: kv.key().to_vec(),
            value: kv.value().to_vec(),
            mod_revision: kv.mod_revision(),
            lease: (kv.lease() != 0).then_some(LeaseId(kv.lease())),
        }
    }
}

impl Etcd {
    /// Connects to the cluster. Connections are made on demand and the user authenticates
    /// at the first request: this fails on a bad configuration (no endpoints, an unreadable
    /// TLS file), not because etcd is down or refuses the credentials at this moment; a
    /// member must be able to start while etcd is away.
    pub async fn connect(config: &EtcdConfig) -> Result<Etcd, EtcdError> {
        let endpoints = config.endpoints.join(",");
        let fail = |cause| EtcdError { endpoints: endpoints.clone(), operation: Operation::Connect, cause };
        if config.endpoints.is_empty() {
            return Err(fail(Cause::Invalid("no endpoints configured".into())));
        }
        let mut options = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout)
            .with_timeout(config.request_timeout)
            // Dead connections are noticed between requests, not by the next request.
            .with_keep_alive(Duration::from_secs(1), config.request_timeout)
            // A member cut off from the cluster's leader refuses at once instead of
            // answering reads from a minority or letting a request hang.
            .with_require_leader(true);
        if let Some(tls) = &config.tls {
            options = options.with_tls(tls_options(tls).map_err(fail)?);
        }
        let connecting = Client::connect(&config.endpoints, Some(options));
        let client = match tokio::time::timeout(config.request_timeout, connecting).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => return Err(fail(Cause::Client(e))),
            Err(_) => return Err(fail(Cause::TimedOut(config.request_timeout))),
        };
        let auth = config.user.as_ref().map(|(user, password)| {
            Arc::new(Auth {
                user: user.clone(),
                password: password.clone(),
                generation: AtomicU64::new(0),
                authenticating: tokio::sync::Mutex::new(()),
            })
        });
        Ok(Etcd {
            client,
            endpoints,
            request_timeout: config.request_timeout,
            endpoint_list: Arc::new(config.endpoints.clone()),
            tls: config.tls.clone(),
            auth,
        })
    }

    /// The token's generation now (0: never authenticated), taken before a request so that
    /// a refusal for its token renews that token only once.
    pub(crate) fn auth_generation(&self) -> u64 {
        self.auth.as_ref().map_or(u64::MAX, |a| a.generation.load(Ordering::SeqCst))
    }

    /// Authenticates (again) when the token of `generation` is still the current one: at the
    /// first request, and when etcd refused a token (expired, or etcd restarted). The stale
    /// token is dropped first: etcd refuses even an authentication that carries one.
    pub(crate) async fn authenticate(&self, generation: u64) -> Result<(), etcd_client::Error> {
        let Some(auth) = &self.auth else { return Ok(()) };
        let _one = auth.authenticating.lock().await;
        if auth.generation.load(Ordering::SeqCst) != generation {
            return Ok(());
        }
        let mut client = self.client.clone();
        client.remove_client_auth();
        // Generation 0 until it succeeds: the next request authenticates first, whatever
        // the generation it was refused in (a failure here, etcd down or refusing the
        // password, must not leave the client without a token for good).
        auth.generation.store(0, Ordering::SeqCst);
        client.set_client_auth(auth.user.clone(), auth.password.clone()).await?;
        auth.generation.store(generation.max(1) + 1, Ordering::SeqCst);
        Ok(())
    }

    /// The user this client authenticates as, if any.
    pub fn user(&self) -> Option<&str> {
        self.auth.as_ref().map(|a| a.user.as_str())
    }

    /// The endpoints, comma-separated, as errors name them.
    pub fn endpoints(&self) -> &str {
        &self.endpoints
    }

    /// Runs one etcd request under the request timeout, naming the operation in its error.
    /// A request that never left (no connection could be made to the member the client
    /// picked) is sent again until the deadline, and so is an idempotent one (`Retry::Yes`)
    /// whose connection failed under it: the client meets a dead member's connection before
    /// it stops using it, and one member down must change nothing for the pair. A
    /// transaction lost with its connection is not sent again: it may have been applied, and
    /// its compares would fail the second time, turning success into an apparent failure.
    pub(crate) async fn call<T, F>(
        &self,
        operation: Operation,
        retry: Retry,
        mut request: impl FnMut(Client) -> F,
    ) -> Result<T, EtcdError>
    where
        F: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = tokio::time::Instant::now() + self.request_timeout;
        let mut renewed_token = false;
        loop {
            let generation = self.auth_generation();
            let attempt = tokio::time::timeout_at(deadline, async {
                if generation == 0 {
                    self.authenticate(0).await?;
                }
                request(self.client.clone()).await
            })
            .await;
            match attempt {
                Ok(Ok(answer)) => return Ok(answer),
                // Refused before it was applied (etcd checks the token first): sent again,
                // once, with a new token.
                Ok(Err(e)) if token_refused(&e) && self.auth.is_some() && !renewed_token => {
                    renewed_token = true;
                    let renewing = tokio::time::timeout_at(deadline, self.authenticate(generation));
                    match renewing.await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => return Err(self.error(operation, Cause::Client(e))),
                        Err(_) => return Err(self.error(operation, Cause::TimedOut(self.request_timeout))),
                    }
                }
                Ok(Err(e)) if never_sent(&e) || (retry == Retry::Yes && connection_failed(&e)) => {
                    if tokio::time::Instant::now() + RETRY_PAUSE >= deadline {
                        let cause = Cause::Unreachable { timeout: self.request_timeout, last: e };
                        return Err(self.error(operation, cause));
                    }
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Ok(Err(e)) => return Err(self.error(operation, Cause::Client(e))),
                Err(_) => return Err(self.error(operation, Cause::TimedOut(self.request_timeout))),
            }
        }
    }

    pub(crate) fn error(&self, operation: Operation, cause: Cause) -> EtcdError {
        EtcdError { endpoints: self.endpoints.clone(), operation, cause }
    }

    /// Reads one key with its mod revision: a member reads the leader key, the sync record
    /// and the counter before its transactions, and watches from the revision read.
    pub async fn get(&self, key: impl Into<Vec<u8>>) -> Result<Got, EtcdError> {
        let key = key.into();
        let answer = self
            .call(Operation::Get, Retry::Yes, |mut c| {
                let key = key.clone();
                async move { c.get(key, None).await }
            })
            .await?;
        let revision = answer.header().map_or(0, |h| h.revision());
        Ok(Got { entry: answer.kvs().first().map(Entry::from_kv), revision })
    }

    /// Reads every key under `prefix`, at most `limit` of them (`decree status --etcd`
    /// lists every pair under the members' prefix): the entries, and whether more were left.
    pub async fn get_prefix(
        &self,
        prefix: impl Into<Vec<u8>>,
        limit: i64,
    ) -> Result<(Vec<Entry>, bool), EtcdError> {
        let prefix = prefix.into();
        let answer = self
            .call(Operation::Get, Retry::Yes, |mut c| {
                let prefix = prefix.clone();
                async move {
                    c.get(prefix, Some(etcd_client::GetOptions::new().with_prefix().with_limit(limit))).await
                }
            })
            .await?;
        Ok((answer.kvs().iter().map(Entry::from_kv).collect(), answer.more()))
    }

    /// One transaction: if every compare holds, the `then` operations, else the `otherwise`
    /// ones, atomically. Taking the lead and every write to the sync record are one of these,
    /// so that no interleaving of two members' writes can break the election's rules. It is
    /// sent once: after an error it may or may not have been applied, and the caller reads
    /// the keys back to know.
    pub async fn txn(
        &self,
        compares: &[Compare],
        then: &[Op],
        otherwise: &[Op],
    ) -> Result<TxnResult, EtcdError> {
        let txn = etcd_client::Txn::new()
            .when(compares.iter().map(to_compare).collect::<Vec<_>>())
            .and_then(then.iter().map(to_txn_op).collect::<Vec<_>>())
            .or_else(otherwise.iter().map(to_txn_op).collect::<Vec<_>>());
        let answer = self
            .call(Operation::Transaction, Retry::No, |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await?;
        let reads = answer
            .op_responses()
            .into_iter()
            .filter_map(|r| match r {
                TxnOpResponse::Get(got) => Some(got.kvs().first().map(Entry::from_kv)),
                _ => None,
            })
            .collect();
        Ok(TxnResult { succeeded: answer.succeeded(), reads })
    }
}

/// Whether [`Etcd::call`] may send a request again after a connection failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Retry {
    /// The request is idempotent.
    Yes,
    No,
}

/// The pause between two attempts of an idempotent request.
pub(crate) const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// True when `e` says a connection failed (refused, reset, closed), not that etcd refused the
/// request: sending it again, on another connection, may succeed.
pub(crate) fn connection_failed(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) => true,
        // A keepalive sent on a stream whose connection ended.
        etcd_client::Error::LeaseKeepAliveError(_) => true,
        // tonic reports a request lost with its connection as UNKNOWN "transport error".
        etcd_client::Error::GRpcStatus(status) => {
            status.code() == tonic::Code::Unavailable || status.message() == "transport error"
        }
        _ => false,
    }
}

/// True when etcd refused the request's token (expired, unknown after a restart of etcd,
/// issued before a change of users or roles, or absent), or refused permission, which is
/// what a request sent without a token while another renewed it gets when etcd takes the
/// client certificate's common name for the user: the request was not applied (etcd checks
/// before applying), and is sent again, once, with a new token.
pub(crate) fn token_refused(e: &etcd_client::Error) -> bool {
    let etcd_client::Error::GRpcStatus(status) = e else { return false };
    let message = status.message();
    ["invalid auth token", "revision of auth store is old", "user name is empty", "permission denied"]
        .iter()
        .any(|m| message.contains(m))
}

/// True when `e` says no connection could be made (tonic's `ConnectError` in the chain): the
/// request never reached etcd, so even a transaction may be sent again.
pub(crate) fn never_sent(e: &etcd_client::Error) -> bool {
    let etcd_client::Error::GRpcStatus(status) = e else { return false };
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(status);
    while let Some(err) = cause {
        if err.is::<tonic::ConnectError>() {
            return true;
        }
        cause = err.source();
    }
    false
}

fn tls_options(paths: &TlsPaths) -> Result<TlsOptions, Cause> {
    let read = |path: &PathBuf| {
        std::fs::read(path).map_err(|error| Cause::TlsFile { path: path.display().to_string(), error })
    };
    let (ca, cert, key) = (read(&paths.ca)?, read(&paths.cert)?, read(&paths.key)?);
    Ok(TlsOptions::new().ca_certificate(Certificate::from_pem(ca)).identity(Identity::from_pem(cert, key)))
}

fn to_compare(compare: &Compare) -> etcd_client::Compare {
    match compare {
        Compare::Absent(key) => etcd_client::Compare::version(key.clone(), CompareOp::Equal, 0),
        Compare::LeaseIs(key, lease) => etcd_client::Compare::lease(key.clone(), CompareOp::Equal, lease.0),
        Compare::ValueIs(key, value) => {
            etcd_client::Compare::value(key.clone(), CompareOp::Equal, value.clone())
        }
        Compare::ModRevisionIs(key, revision) => {
            etcd_client::Compare::mod_revision(key.clone(), CompareOp::Equal, *revision)
        }
    }
}

fn to_txn_op(op: &Op) -> etcd_client::TxnOp {
    match op {
        Op::Put { key, value, lease } => {
            let options = lease.map(|l| etcd_client::PutOptions::new().with_lease(l.0));
            etcd_client::TxnOp::put(key.clone(), value.clone(), options)
        }
        Op::Delete(key) => etcd_client::TxnOp::delete(key.clone(), None),
        Op::Get(key) => etcd_client::TxnOp::get(key.clone(), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn connect_names_a_missing_tls_file_and_refuses_no_endpoints() {
        let mut config = EtcdConfig::new(["https://127.0.0.1:1"]);
        let missing = PathBuf::from("/nonexistent/decree-etcd-ca.pem");
        config.tls = Some(TlsPaths { ca: missing.clone(), cert: missing.clone(), key: missing });
        let Err(e) = Etcd::connect(&config).await else { panic!("connected with a missing CA file") };
        assert!(matches!(e.cause, Cause::TlsFile { .. }), "{e}");
        assert!(
            e.to_string().starts_with(
                "etcd at https://127.0.0.1:1: connect failed: cannot read /nonexistent/decree-etcd-ca.pem: "
            ),
            "{e}"
        );

        let Err(e) = Etcd::connect(&EtcdConfig::new(Vec::<String>::new())).await else {
            panic!("connected to nothing")
        };
        assert!(matches!(e.cause, Cause::Invalid(_)), "{e}");
    }

    #[test]
    fn a_refused_token_is_renewed_and_refusals_name_what_to_fix() {
        let status = |code, message: &str| etcd_client::Error::GRpcStatus(tonic::Status::new(code, message));
        let error = |e| EtcdError {
            endpoints: "https://127.0.0.1:1".into(),
            operation: Operation::Transaction,
            cause: Cause::Client(e),
        };
        let expired = status(tonic::Code::Unauthenticated, "etcdserver: invalid auth token");
        assert!(token_refused(&expired) && error(expired).refusal().is_none());
        let old = status(tonic::Code::FailedPrecondition, "etcdserver: revision of auth store is old");
        assert!(token_refused(&old));
        let cases = [
            (
                tonic::Code::InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password",
                crate::Refusal::BadCredentials,
            ),
            (
                tonic::Code::PermissionDenied,
                "etcdserver: permission denied",
                crate::Refusal::PermissionDenied,
            ),
            (tonic::Code::InvalidArgument, "etcdserver: user name is empty", crate::Refusal::AuthRequired),
        ];
        for (code, message, refusal) in cases {
            let e = status(code, message);
            assert_eq!(token_refused(&e), refusal != crate::Refusal::BadCredentials, "{message}");
            assert_eq!(error(e).refusal(), Some(refusal), "{message}");
        }
        let down = status(tonic::Code::Unavailable, "tcp connect error");
        assert_eq!(error(down).refusal(), None);
        let alert = rustls::Error::AlertReceived(rustls::AlertDescription::BadCertificate);
        assert_eq!(crate::diagnose::refusal(&alert), Some(crate::Refusal::ClientCertificate));
    }

    #[test]
    fn a_refused_connection_is_never_sent_and_a_refusal_is_not_a_connection_failure() {
        let refused = tonic::Status::from_error(Box::new(tonic::ConnectError(Box::new(
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        ))));
        let refused = etcd_client::Error::GRpcStatus(refused);
        assert!(never_sent(&refused) && connection_failed(&refused), "{refused}");
        let lost = etcd_client::Error::GRpcStatus(tonic::Status::unknown("transport error"));
        assert!(!never_sent(&lost) && connection_failed(&lost), "{lost}");
        let refusal =
            etcd_client::Error::GRpcStatus(tonic::Status::failed_precondition("etcdserver: no leader"));
        assert!(!never_sent(&refusal) && !connection_failed(&refusal), "{refusal}");
    }
}
