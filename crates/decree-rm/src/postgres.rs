//! PostgreSQL as a resource manager, through `PREPARE TRANSACTION`.
//!
//! One [`PgRm`] is one connection: the application runs its SQL on [`PgRm::client`] (or on
//! a [`PgHandle`] while the coordinator owns the [`PgRm`]) between `start` and `prepare`,
//! so its work is the branch. The statements, and why:
//!
//! - `start` → `BEGIN READ WRITE`, queued, not sent: PostgreSQL has no XA association, a
//!   branch is simply the open transaction of this connection, and the `BEGIN` goes out in
//!   one write with the application's first statement (or with the prepare), so a branch
//!   costs no round trip of its own. Its answer is taken at the next coordinator call.
//!   Should it fail while the session lives (a cancel, out of memory), the statements after
//!   it would run on their own and commit at once; so every connection opens with
//!   `default_transaction_read_only = on` (a startup option), where such a statement cannot
//!   write, and the failed `BEGIN` makes the branch vote no. While the application uses the
//!   connection outside a branch, the RM queues `SET default_transaction_read_only = off`
//!   ahead of its statements; the next `start` sets it back on and waits for that answer
//!   before it queues the `BEGIN`. `end` does nothing.
//! - `prepare` → `SELECT txid_current_if_assigned() IS NULL; PREPARE TRANSACTION '<gid>'`
//!   in one round trip. The SELECT catches a transaction that an earlier statement
//!   aborted: PostgreSQL answers `PREPARE TRANSACTION` (and `COMMIT`) in an aborted
//!   transaction with a silent ROLLBACK, not an error, so without it a failed branch would
//!   vote yes; when the SELECT fails the server skips the PREPARE. When it says no
//!   transaction id was assigned, the branch wrote nothing: the empty prepared transaction
//!   is committed at once (`COMMIT PREPARED`) and the vote is read-only (leave phase two).
//!   A lost answer leaves the branch in doubt (it may be prepared): rolling it back then
//!   means `ROLLBACK PREPARED`, where "does not exist" is success. The SELECT is not free:
//!   it lowers the throughput of prepared transactions measurably, as the other statements
//!   that fail in an aborted transaction (`SELECT 1`, `SET LOCAL`) do too
//!   (docs/measurements.md, "PostgreSQL prepare-time check"); it stays, because the
//!   `postgres` client does not expose the command tag that would reveal the ROLLBACK.
//! - `commit(one_phase)` → `SELECT 1; COMMIT` in one round trip, for the same reason: the
//!   SELECT fails in an aborted transaction, so a silent rollback is reported as one.
//! - `commit` → `COMMIT PREPARED '<gid>'` and `rollback` of a prepared branch →
//!   `ROLLBACK PREPARED '<gid>'`: a prepared transaction no longer belongs to the session
//!   that prepared it, so any connection to the same database may finish it (recovery
//!   does). `rollback` of a branch still open on this connection → `ROLLBACK`.
//! - `recover` → `SELECT gid FROM pg_prepared_xacts WHERE database = current_database()`:
//!   the view lists the whole cluster, so it is filtered to this connection's database,
//!   and only gids in decree's form (`decree:<format>:<gtrid>:<bqual>`, see
//!   [`Xid::to_gid`]) are returned; the server bounds the list by
//!   `max_prepared_transactions`.
//!
//! `start`, `prepare` and the two-phase `commit` also come split in two
//! ([`ResourceManager::send`] and [`ResourceManager::receive`]): the statement above is sent
//! and its answer taken later, so that a session keeps both databases working at once from
//! its own thread. That is why the connection is a [`crate::pg_client::Client`] (blocking,
//! over tokio-postgres, with the `postgres` crate's method names for the application)
//! rather than a `postgres::Client`, which has no way to send without waiting. Each entry
//! point first takes any answer left unreceived, so the branch state and the answers stay
//! in step.
//!
//! The gid is [`Xid::to_gid`]: at most 200 bytes, hex only, so quoting cannot go wrong.
//! A server with `max_prepared_transactions = 0` (the default) refuses every prepare; the
//! error says how to fix it.

use std::str::FromStr;
use std::time::Duration;

use decree_core::{BranchAnswer, BranchCall, ResourceManager, RmError, RmFactory, Vote, Xid};
use parking_lot::MappedMutexGuard;
use tokio_postgres::config::Host;
use tokio_postgres::{Config, SimpleQueryMessage};

use crate::branch::{sql_literal, BranchState};
use crate::pg_client::{Client, Sent};
use crate::shared::{BranchConnection, SharedHandle, SharedRm};

/// Connect timeout used when the DSN gives none, so that an unreachable host fails fast.
const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// Startup option of every connection: outside a transaction block nothing can be
/// written, so the statements after a failed queued `BEGIN` change nothing.
const READ_ONLY_OPTION: &str = "-c default_transaction_read_only=on";
/// The statement `start` queues.
const BEGIN_SQL: &str = "BEGIN READ WRITE";

/// The statement (or step) that failed, for messages and for the error mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PgOp {
    /// Opening the connection.
    Connect,
    /// `BEGIN`.
    Begin,
    /// `PREPARE TRANSACTION` and the read-only check before it.
    Prepare,
    /// `COMMIT` of the open transaction (one-phase commit or read-only branch).
    CommitOnePhase,
    /// `COMMIT PREPARED`.
    CommitPrepared,
    /// `ROLLBACK` of the open transaction.
    Rollback,
    /// `ROLLBACK PREPARED`.
    RollbackPrepared,
    /// The `pg_prepared_xacts` query.
    Recover,
}

impl PgOp {
    /// The statement a split-phase call sends.
    fn of(call: BranchCall) -> PgOp {
        match call {
            BranchCall::Start => PgOp::Begin,
            BranchCall::Prepare => PgOp::Prepare,
            BranchCall::Commit => PgOp::CommitPrepared,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            PgOp::Connect => "connect",
            PgOp::Begin => "BEGIN",
            PgOp::Prepare => "PREPARE TRANSACTION",
            PgOp::CommitOnePhase => "COMMIT",
            PgOp::CommitPrepared => "COMMIT PREPARED",
            PgOp::Rollback => "ROLLBACK",
            PgOp::RollbackPrepared => "ROLLBACK PREPARED",
            PgOp::Recover => "recover (pg_prepared_xacts)",
        }
    }
}

/// Maps a PostgreSQL failure to the coordinator's error kinds.
///
/// `sqlstate` is `None` when the failure is not the server's answer (IO, closed connection).
/// Pure, so the mapping is tested without a server in each of its states.
pub fn classify_error(rm: &str, op: PgOp, sqlstate: Option<&str>, message: &str) -> RmError {
    let what = op.as_str();
    let Some(code) = sqlstate else {
        return RmError::Unavailable(format!("{rm}: {what} failed: {message}"));
    };
    let connection_gone = code.starts_with("08") // connection exception
        || matches!(code, "57P01" | "57P02" | "57P03" | "53300"); // shutdown, starting, too many
    if connection_gone {
        return RmError::Unavailable(format!("{rm}: {what} failed: SQLSTATE {code}: {message}"));
    }
    if code == "42704" && message.contains("prepared transaction") {
        return RmError::UnknownXid(format!("{rm}: {message}"));
    }
    if code == "55000" && message.contains("prepared transactions are disabled") {
        return RmError::RolledBack(format!(
            "{rm}: prepared transactions are disabled on this PostgreSQL server \
             (max_prepared_transactions = 0): set max_prepared_transactions > 0 in \
             postgresql.conf and restart"
        ));
    }
    match op {
        // A failed prepare or commit aborts the open transaction: the branch is rolled back.
        PgOp::Prepare | PgOp::CommitOnePhase => {
            RmError::RolledBack(format!("{rm}: {what} failed: SQLSTATE {code}: {message}"))
        }
        PgOp::CommitPrepared | PgOp::RollbackPrepared | PgOp::Rollback | PgOp::Begin => {
            // 25001: inside a transaction block; 42501: prepared by another user.
            if code == "25001" || code == "42501" {
                RmError::Protocol(format!("{rm}: {what} failed: SQLSTATE {code}: {message}"))
            } else {
                RmError::Unavailable(format!("{rm}: {what} failed: SQLSTATE {code}: {message}"))
            }
        }
        PgOp::Connect | PgOp::Recover => {
            RmError::Unavailable(format!("{rm}: {what} failed: SQLSTATE {code}: {message}"))
        }
    }
}

fn map_error(rm: &str, op: PgOp, err: &tokio_postgres::Error) -> RmError {
    match err.as_db_error() {
        Some(db) => classify_error(rm, op, Some(db.code().code()), db.message()),
        None => classify_error(rm, op, None, &err.to_string()),
    }
}

/// Parses a DSN (`host=... port=... user=... dbname=...` or a `postgresql://` URL).
fn parse_dsn(rm: &str, dsn: &str) -> Result<Config, RmError> {
    let mut config =
        Config::from_str(dsn).map_err(|e| RmError::Protocol(format!("{rm}: invalid PostgreSQL DSN: {e}")))?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT_DEFAULT);
    }
    // Appended, so that it wins over a setting of the same name in the DSN's options.
    let options = match config.get_options() {
        Some(theirs) if !theirs.trim().is_empty() => format!("{theirs} {READ_ONLY_OPTION}"),
        _ => READ_ONLY_OPTION.to_string(),
    };
    config.options(&options);
    Ok(config)
}

/// The server address for messages: hosts, ports, database and user, never the password.
fn describe(config: &Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .map(|h| match h {
            Host::Tcp(name) => name.clone(),
            Host::Unix(path) => path.display().to_string(),
        })
        .collect();
    let ports: Vec<String> = config.get_ports().iter().map(u16::to_string).collect();
    format!(
        "PostgreSQL host={} port={} dbname={} user={}",
        if hosts.is_empty() { "(default)".to_string() } else { hosts.join(",") },
        if ports.is_empty() { "5432".to_string() } else { ports.join(",") },
        config.get_dbname().unwrap_or("(default)"),
        config.get_user().unwrap_or("(default)"),
    )
}

fn open_client(name: &str, address: &str, config: &Config) -> Result<Client, RmError> {
    Client::connect(config)
        .map_err(|e| RmError::Unavailable(format!("{name}: cannot connect to {address}: {e}")))
}

/// The connection and its branch state, shared by a [`PgRm`] and its [`PgHandle`]s.
pub struct PgConnection {
    name: String,
    address: String,
    config: Config,
    client: Option<Client>,
    state: BranchState,
    /// The split-phase call whose answer is still to be received.
    in_flight: Option<InFlight>,
    /// The queued `BEGIN` of the open branch, until its answer is taken.
    begin: Option<Sent>,
    /// The branch whose queued `BEGIN` failed while the session lived, and why: its
    /// prepare votes no and its rollback has nothing to do.
    begin_failed: Option<(Xid, RmError)>,
    /// Whether the session's `default_transaction_read_only` is on (it is at connect).
    read_only_default: bool,
    /// A queued `SET default_transaction_read_only = off`, until its answer is taken.
    read_write_set: Option<Sent>,
    /// What `start` queues ([`BEGIN_SQL`]; a fault test may make it fail).
    begin_sql: String,
}

/// A split-phase call between `send` and `receive`.
struct InFlight {
    call: BranchCall,
    xid: Xid,
    request: Request,
}

/// What `send` did with a split-phase call.
enum Request {
    /// Refused before any statement (wrong branch state, no connection): the answer.
    Refused(RmError),
    /// The statement could not be sent: its failure, handled like an answer.
    Failed(RmError),
    /// The statement is on its way.
    Sent(Sent),
    /// `start`'s `BEGIN` is queued: the call itself is done, its answer comes later.
    Queued,
}

impl PgConnection {
    fn connect_new(name: String, config: Config) -> Result<PgConnection, RmError> {
        let address = describe(&config);
        let client = open_client(&name, &address, &config)?;
        Ok(PgConnection {
            name,
            address,
            config,
            client: Some(client),
            state: BranchState::Idle,
            in_flight: None,
            begin: None,
            begin_failed: None,
            read_only_default: true,
            read_write_set: None,
            begin_sql: BEGIN_SQL.to_string(),
        })
    }

    fn connected(&self) -> bool {
        self.client.as_ref().is_some_and(|c| !c.is_closed())
    }

    fn ensure_connected(&mut self) -> Result<&mut Client, RmError> {
        if !self.connected() {
            self.client = None;
            self.state.lose_open_branch();
            let client = open_client(&self.name, &self.address, &self.config)?;
            // A new session: read-only by default again, nothing queued on it.
            (self.begin, self.read_write_set, self.read_only_default) = (None, None, true);
            self.client = Some(client);
        }
        match self.client.as_mut() {
            Some(client) => Ok(client),
            None => Err(RmError::Unavailable(format!("{}: not connected to {}", self.name, self.address))),
        }
    }

    /// Runs `sql` with the simple query protocol (one round trip, several statements
    /// allowed). On an IO failure the connection is dropped so the next call reconnects.
    fn run(&mut self, op: PgOp, sql: &str) -> Result<Vec<SimpleQueryMessage>, RmError> {
        self.settle_in_flight();
        let client = self.live_client(op)?;
        let answer = client.simple_query(sql);
        self.answered(op, answer)
    }

    /// Sends `sql` like [`PgConnection::run`] without waiting for its answer.
    fn send_statement(&mut self, op: PgOp, sql: String) -> Request {
        match self.live_client(op) {
            Ok(client) => Request::Sent(client.send(sql)),
            Err(e) => Request::Failed(e),
        }
    }

    /// The answer to a statement [`PgConnection::send_statement`] sent.
    fn receive_statement(&mut self, op: PgOp, sent: Sent) -> Result<Vec<SimpleQueryMessage>, RmError> {
        let client = self.live_client(op)?;
        let answer = client.receive(sent);
        self.answered(op, answer)
    }

    /// The client, or an error when the connection is closed (it is then forgotten).
    fn live_client(&mut self, op: PgOp) -> Result<&mut Client, RmError> {
        if !self.connected() {
            self.client = None;
            return Err(RmError::Unavailable(format!(
                "{}: {}: connection to {} is closed",
                self.name,
                op.as_str(),
                self.address
            )));
        }
        match self.client.as_mut() {
            Some(client) => Ok(client),
            None => Err(RmError::Unavailable(format!("{}: not connected to {}", self.name, self.address))),
        }
    }

    /// Maps a statement's answer; after an IO failure the connection is dropped so the
    /// next call reconnects.
    fn answered(
        &mut self,
        op: PgOp,
        answer: Result<Vec<SimpleQueryMessage>, tokio_postgres::Error>,
    ) -> Result<Vec<SimpleQueryMessage>, RmError> {
        answer.map_err(|e| {
            let mapped = map_error(&self.name, op, &e);
            if e.as_db_error().is_none() || !self.connected() {
                self.client = None;
            }
            mapped
        })
    }

    /// The first half of `start`, `prepare` and a two-phase `commit`, which are this plus
    /// [`PgConnection::receive_in_flight`]: checks the branch state and the connection,
    /// then sends the call's statement; the outcome waits in `in_flight`.
    fn send_call(&mut self, call: BranchCall, xid: &Xid) {
        self.settle_in_flight();
        let checked = match call {
            BranchCall::Start => {
                self.state.check_can_start(&self.name, xid).and_then(|()| self.ensure_connected().map(drop))
            }
            BranchCall::Prepare => self.require_open_branch(xid, "prepare"),
            // `COMMIT PREPARED` may run on any connection: reconnect if this one was lost.
            BranchCall::Commit => self
                .require_no_open_branch(xid, "COMMIT PREPARED")
                .and_then(|()| self.ensure_connected().map(drop)),
        };
        let request = match checked {
            Err(e) => Request::Refused(e),
            Ok(()) => match call {
                BranchCall::Start => self.queue_begin(xid),
                BranchCall::Prepare => self.send_statement(PgOp::Prepare, prepare_sql(xid)),
                BranchCall::Commit => self.send_statement(PgOp::CommitPrepared, commit_prepared_sql(xid)),
            },
        };
        self.in_flight = Some(InFlight { call, xid: *xid, request });
    }

    /// `start` once the branch state and connection are checked: makes sure the session
    /// writes nothing outside a transaction block, then queues the `BEGIN` (see the module
    /// documentation).
    fn queue_begin(&mut self, xid: &Xid) -> Request {
        self.begin_failed = None;
        if !self.read_only_default {
            // Waited for: only a confirmed read-only default makes the queued BEGIN safe.
            if let Err(e) = self.run(PgOp::Begin, "SET default_transaction_read_only = on") {
                return Request::Failed(e);
            }
            self.read_only_default = true;
        }
        let sql = self.begin_sql.clone();
        match self.live_client(PgOp::Begin) {
            Ok(client) => {
                self.begin = Some(client.queue(sql));
                self.state = BranchState::Active(*xid);
                Request::Queued
            }
            Err(e) => Request::Failed(e),
        }
    }

    /// Takes the answer of a split-phase call nobody received (its caller failed between
    /// the halves) and finishes the call, so that the branch state is right and the next
    /// statement's answer is its own; then the answers of the queued `BEGIN` and `SET`.
    /// Every entry point calls it first.
    fn settle_in_flight(&mut self) {
        if self.in_flight.is_some() {
            let answer = self.receive_in_flight();
            tracing::debug!(rm = %self.name, ?answer, "settled a split-phase call nobody received");
        }
        if let Some(sent) = self.begin.take() {
            self.settle_begin(sent);
        }
        if let Some(sent) = self.read_write_set.take() {
            if let Ok(client) = self.live_client(PgOp::Begin) {
                if let Err(e) = client.receive(sent) {
                    // Still read-only then: the application's writes outside a branch fail
                    // and say so; the next start sets it on anyway.
                    tracing::debug!(rm = %self.name, "SET default_transaction_read_only = off failed: {e}");
                    self.read_only_default = true;
                }
            }
        }
    }

    /// Takes the queued `BEGIN`'s answer. A failure on a live session leaves no transaction
    /// open: the branch's statements ran read-only on their own and changed nothing, so the
    /// branch can only vote no.
    fn settle_begin(&mut self, sent: Sent) {
        let answer = match self.live_client(PgOp::Begin) {
            Ok(client) => client.receive(sent),
            Err(_) => {
                self.state.lose_open_branch();
                return;
            }
        };
        let Err(e) = self.answered(PgOp::Begin, answer) else { return };
        if !self.connected() {
            self.state.lose_open_branch();
            return;
        }
        let Some(xid) = self.state.xid() else { return };
        tracing::warn!(rm = %self.name, %xid, "BEGIN failed: {e}");
        self.state = BranchState::Idle;
        self.begin_failed = Some((
            xid,
            RmError::RolledBack(format!(
                "{}: BEGIN of branch {xid} failed ({e}): its statements ran outside a transaction, \
                 read-only, and changed nothing",
                self.name
            )),
        ));
    }

    /// Waits for the split-phase call's answer and finishes the call as its blocking form
    /// would.
    fn receive_in_flight(&mut self) -> BranchAnswer {
        let Some(InFlight { call, xid, request }) = self.in_flight.take() else {
            return BranchAnswer::Ack(Err(RmError::Protocol(format!(
                "{}: receive without a split-phase call in flight",
                self.name
            ))));
        };
        let result = match request {
            Request::Refused(e) => return refused(call, e),
            Request::Queued => return BranchAnswer::Ack(Ok(())),
            Request::Failed(e) => Err(e),
            Request::Sent(sent) => self.receive_statement(PgOp::of(call), sent),
        };
        match call {
            // `start` sends nothing (its BEGIN is queued, `Request::Queued` answered above):
            // only a failure of `queue_begin` comes here.
            BranchCall::Start => BranchAnswer::Ack(result.map(drop)),
            BranchCall::Prepare => BranchAnswer::Vote(self.prepared(&xid, result)),
            BranchCall::Commit => {
                // As `run_anywhere`: a connection found dead gets one retry on a new one.
                let result = match result {
                    Err(RmError::Unavailable(_)) if self.client.is_none() => match self.ensure_connected() {
                        Ok(_) => self.run(PgOp::CommitPrepared, &commit_prepared_sql(&xid)),
                        Err(e) => Err(e),
                    },
                    other => other,
                };
                BranchAnswer::Ack(self.committed_prepared(&xid, result))
            }
        }
    }

    /// Finishes `prepare` once the prepare statement has answered.
    fn prepared(
        &mut self,
        xid: &Xid,
        result: Result<Vec<SimpleQueryMessage>, RmError>,
    ) -> Result<Vote, RmError> {
        let read_only = match result {
            Ok(messages) => first_value_is_true(&messages),
            Err(RmError::Unavailable(m)) => {
                // The answer was lost: the branch may be prepared.
                self.state = BranchState::InDoubt(*xid);
                return Err(RmError::Unavailable(format!("{m} (branch {xid} may be prepared)")));
            }
            Err(e) => {
                self.discard_open_transaction();
                self.state = BranchState::Idle;
                return Err(e);
            }
        };
        // The prepared transaction is detached from this session now.
        self.state = BranchState::Idle;
        if read_only {
            // Nothing was written: finish the empty prepared transaction at once and leave
            // phase two. Should that fail, vote commit instead so that phase two (with its
            // retries) finishes it like any other branch.
            return match self.run_anywhere(PgOp::CommitPrepared, &commit_prepared_sql(xid)) {
                Ok(_) => Ok(Vote::ReadOnly),
                Err(e) => {
                    tracing::debug!(rm = %self.name, %xid, "empty branch stays prepared: {e}");
                    Ok(Vote::Commit)
                }
            };
        }
        Ok(Vote::Commit)
    }

    /// Finishes a two-phase `commit` once `COMMIT PREPARED` has answered.
    fn committed_prepared(
        &mut self,
        xid: &Xid,
        result: Result<Vec<SimpleQueryMessage>, RmError>,
    ) -> Result<(), RmError> {
        result?;
        if self.state.xid() == Some(*xid) {
            self.state = BranchState::Idle;
        }
        Ok(())
    }

    /// Runs a statement that names its branch (`COMMIT PREPARED`, `ROLLBACK PREPARED`) or
    /// none (recover), so any connection will do: when the connection turns out to be
    /// dead (the server ended it while it sat idle, which the client only notices on
    /// use), it retries once on a new one.
    fn run_anywhere(&mut self, op: PgOp, sql: &str) -> Result<Vec<SimpleQueryMessage>, RmError> {
        self.ensure_connected()?;
        match self.run(op, sql) {
            Err(RmError::Unavailable(_)) if self.client.is_none() => {
                self.ensure_connected()?;
                self.run(op, sql)
            }
            other => other,
        }
    }

    /// Ends an aborted transaction after a failed statement; failures are irrelevant since
    /// a lost connection rolls back too.
    fn discard_open_transaction(&mut self) {
        if let Some(client) = self.client.as_mut() {
            if client.batch_execute("ROLLBACK").is_err() {
                self.client = None;
            }
        }
    }

    /// Checks that `xid` is the branch open on this connection; a branch whose `BEGIN`
    /// failed gets that failure until it is rolled back.
    fn require_open_branch(&mut self, xid: &Xid, what: &str) -> Result<(), RmError> {
        match &self.begin_failed {
            Some((failed, e)) if failed == xid => Err(e.clone()),
            _ => self.state.check_open(&self.name, xid, what),
        }
    }

    /// Checks that the connection holds no open branch, as `COMMIT PREPARED` and `ROLLBACK
    /// PREPARED` cannot run inside a transaction block.
    fn require_no_open_branch(&self, xid: &Xid, what: &str) -> Result<(), RmError> {
        match self.state {
            BranchState::Active(x) | BranchState::Ended(x) => Err(RmError::Protocol(format!(
                "{}: {what} {xid}: branch {x} is open on this connection{}",
                self.name,
                if x == *xid { " and was never prepared" } else { "" }
            ))),
            _ => Ok(()),
        }
    }
}

/// The prepare statement: the read-only check and `PREPARE TRANSACTION` in one round trip,
/// the second skipped by the server when the first fails (an aborted transaction fails
/// every statement but ROLLBACK).
fn prepare_sql(xid: &Xid) -> String {
    format!("SELECT txid_current_if_assigned() IS NULL; PREPARE TRANSACTION {}", sql_literal(&xid.to_gid()))
}

fn commit_prepared_sql(xid: &Xid) -> String {
    format!("COMMIT PREPARED {}", sql_literal(&xid.to_gid()))
}

/// A refused split-phase call as the answer its caller expects.
fn refused(call: BranchCall, e: RmError) -> BranchAnswer {
    match call {
        BranchCall::Prepare => BranchAnswer::Vote(Err(e)),
        BranchCall::Start | BranchCall::Commit => BranchAnswer::Ack(Err(e)),
    }
}

/// True when the read-only check says no transaction id was assigned.
fn first_value_is_true(messages: &[SimpleQueryMessage]) -> bool {
    messages.iter().any(|m| matches!(m, SimpleQueryMessage::Row(row) if row.get(0) == Some("t")))
}

impl BranchConnection for PgConnection {
    const DB_SYSTEM: &'static str = "postgresql";
    type Client = Client;

    fn address(&self) -> &str {
        &self.address
    }

    /// Connects when needed; fails when the connection was lost while a branch was open,
    /// because the server has then rolled that work back.
    fn client_for_application(&mut self) -> Result<&mut Client, RmError> {
        // The queued BEGIN stays queued (it goes out with this statement); its answer is
        // only looked at if it already came back.
        let begin = self.begin.take();
        self.settle_in_flight();
        if let Some(mut sent) = begin {
            let answered = self.client.as_mut().is_some_and(|client| client.is_answered(&mut sent));
            if answered {
                self.settle_begin(sent);
            } else {
                self.begin = Some(sent);
            }
        }
        if let Some((_, e)) = &self.begin_failed {
            return Err(e.clone());
        }
        let connected = self.connected();
        self.state.check_usable(connected, &self.name, &self.address)?;
        self.ensure_connected()?;
        let in_branch = matches!(self.state, BranchState::Active(_) | BranchState::Ended(_));
        if !in_branch && self.read_only_default {
            // Outside a branch the application writes as on any connection.
            if let Some(client) = self.client.as_mut() {
                self.read_write_set = Some(client.queue("SET default_transaction_read_only = off".into()));
                self.read_only_default = false;
            }
        }
        self.live_client(PgOp::Connect)
    }

    fn client_mut(&mut self) -> Option<&mut Client> {
        self.client.as_mut()
    }

    fn open_rm(&mut self) -> Result<(), RmError> {
        self.ensure_connected().map(|_| ())
    }

    fn close(&mut self) -> Result<(), RmError> {
        self.in_flight = None;
        (self.begin, self.begin_failed, self.read_write_set) = (None, None, None);
        // Dropping the client terminates the session; the server rolls back open work.
        self.client = None;
        self.state = BranchState::Idle;
        Ok(())
    }

    fn start(&mut self, xid: &Xid) -> Result<(), RmError> {
        self.send_call(BranchCall::Start, xid);
        self.receive_in_flight().into_ack()
    }

    fn end(&mut self, xid: &Xid) -> Result<(), RmError> {
        self.settle_in_flight();
        self.require_open_branch(xid, "end")?;
        self.state = BranchState::Ended(*xid);
        Ok(())
    }

    fn prepare(&mut self, xid: &Xid) -> Result<Vote, RmError> {
        self.send_call(BranchCall::Prepare, xid);
        self.receive_in_flight().into_vote()
    }

    fn commit(&mut self, xid: &Xid, one_phase: bool) -> Result<(), RmError> {
        self.settle_in_flight();
        if one_phase {
            self.require_open_branch(xid, "one-phase commit")?;
            let result = self.run(PgOp::CommitOnePhase, "SELECT 1; COMMIT");
            self.state = BranchState::Idle;
            return match result {
                Ok(_) => Ok(()),
                Err(RmError::Unavailable(m)) => Err(RmError::Unavailable(format!(
                    "{m} (the outcome of the one-phase commit of {xid} is unknown)"
                ))),
                Err(e) => {
                    self.discard_open_transaction();
                    Err(e)
                }
            };
        }
        self.send_call(BranchCall::Commit, xid);
        self.receive_in_flight().into_ack()
    }

    fn send(&mut self, call: BranchCall, xid: &Xid) -> bool {
        self.send_call(call, xid);
        true
    }

    fn receive(&mut self) -> BranchAnswer {
        self.receive_in_flight()
    }

    fn rollback(&mut self, xid: &Xid) -> Result<(), RmError> {
        self.settle_in_flight();
        if self.begin_failed.as_ref().is_some_and(|(failed, _)| failed == xid) {
            // No transaction was ever open on the server.
            self.begin_failed = None;
            return Ok(());
        }
        match self.state {
            BranchState::Active(x) | BranchState::Ended(x) if x == *xid => {
                // A lost connection rolls the transaction back as well, so only a server
                // error here is worth reporting.
                let result = self.run(PgOp::Rollback, "ROLLBACK");
                self.state = BranchState::Idle;
                return match result {
                    Err(RmError::Unavailable(_)) | Ok(_) => Ok(()),
                    Err(e) => Err(e),
                };
            }
            BranchState::Lost(x) if x == *xid => {
                // The server rolled it back when the connection died.
                self.state = BranchState::Idle;
                return Ok(());
            }
            _ => self.require_no_open_branch(xid, "ROLLBACK PREPARED")?,
        }
        let in_doubt = self.state == BranchState::InDoubt(*xid);
        let sql = format!("ROLLBACK PREPARED {}", sql_literal(&xid.to_gid()));
        let result = self.run_anywhere(PgOp::RollbackPrepared, &sql);
        if self.state.xid() == Some(*xid) {
            self.state = BranchState::Idle;
        }
        match result {
            // The prepare whose answer was lost did not happen: the work died with the
            // connection, which is a rollback.
            Err(RmError::UnknownXid(_)) if in_doubt => Ok(()),
            other => other.map(|_| ()),
        }
    }

    fn recover(&mut self) -> Result<Vec<Xid>, RmError> {
        let messages = self.run_anywhere(
            PgOp::Recover,
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() \
             AND gid LIKE 'decree:%' ORDER BY prepared",
        )?;
        let mut xids = Vec::new();
        for message in &messages {
            if let SimpleQueryMessage::Row(row) = message {
                let Some(gid) = row.get(0) else { continue };
                match Xid::from_gid(gid) {
                    Ok(xid) => xids.push(xid),
                    Err(e) => tracing::debug!(rm = %self.name, gid, "skipping a prepared gid: {e}"),
                }
            }
        }
        Ok(xids)
    }
}

/// The application's view of a [`PgRm`]'s connection; derefs to the database client.
///
/// It holds the connection's lock: drop it before calling the coordinator (`commit`,
/// `rollback`), which then uses the same connection and refuses to wait for it.
pub type PgClient<'a> = MappedMutexGuard<'a, Client>;

/// One PostgreSQL connection taking part in two-phase commit (see [`SharedRm`]).
pub type PgRm = SharedRm<PgConnection>;

/// A second owner of a [`PgRm`]'s connection (see [`SharedHandle`]).
pub type PgHandle = SharedHandle<PgConnection>;

impl SharedRm<PgConnection> {
    /// Connects to the database named by `dsn`; `name` identifies the RM in errors.
    pub fn connect(name: &str, dsn: &str) -> Result<PgRm, RmError> {
        PgRm::with_config(name.to_string(), parse_dsn(name, dsn)?)
    }

    fn with_config(name: String, config: Config) -> Result<PgRm, RmError> {
        Ok(SharedRm::new(name.clone(), PgConnection::connect_new(name, config)?))
    }

    /// Fault injection for tests: makes `start` queue `sql` instead of `BEGIN READ WRITE`
    /// (a statement the server rejects plays a `BEGIN` that fails on a live session).
    #[doc(hidden)]
    pub fn inject_begin_statement(&self, sql: &str) -> Result<(), RmError> {
        let mut connection = self.conn("inject_begin_statement")?;
        connection.begin_sql = sql.to_string();
        Ok(())
    }
}

/// Opens [`PgRm`] connections to one database, for sessions, recovery and retries.
#[derive(Clone)]
pub struct PgFactory {
    name: String,
    address: String,
    config: Config,
}

impl PgFactory {
    /// Checks the DSN now (no connection yet), so that a typo fails at configuration time.
    pub fn new(name: &str, dsn: &str) -> Result<PgFactory, RmError> {
        let config = parse_dsn(name, dsn)?;
        Ok(PgFactory { name: name.to_string(), address: describe(&config), config })
    }

    /// The server address, without the password.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// A new connection as the concrete type, for applications that need
    /// [`PgRm::client`].
    pub fn connect_pg(&self) -> Result<PgRm, RmError> {
        PgRm::with_config(self.name.clone(), self.config.clone())
    }
}

impl RmFactory for PgFactory {
    fn name(&self) -> &str {
        &self.name
    }

    fn connect(&self) -> Result<Box<dyn ResourceManager>, RmError> {
        Ok(Box::new(self.connect_pg()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disabled_prepared_transactions_say_how_to_fix_it() {
        let err = classify_error("pg-a", PgOp::Prepare, Some("55000"), "prepared transactions are disabled");
        let RmError::RolledBack(message) = err else { panic!("expected RolledBack, got {err:?}") };
        assert!(message.contains("pg-a"), "{message}");
        assert!(
            message.contains("set max_prepared_transactions > 0 in postgresql.conf and restart"),
            "{message}"
        );
    }

    #[test]
    fn errors_map_to_the_coordinator_kinds() {
        let unknown = classify_error(
            "a",
            PgOp::CommitPrepared,
            Some("42704"),
            "prepared transaction with identifier \"decree:1::\" does not exist",
        );
        assert!(matches!(unknown, RmError::UnknownXid(_)), "{unknown:?}");
        let io = classify_error("a", PgOp::CommitPrepared, None, "connection closed");
        assert!(matches!(io, RmError::Unavailable(ref m) if m.starts_with("a: ")), "{io:?}");
        let shutdown = classify_error("a", PgOp::Prepare, Some("57P01"), "terminating connection");
        assert!(matches!(shutdown, RmError::Unavailable(_)), "{shutdown:?}");
        let serialization = classify_error("a", PgOp::CommitOnePhase, Some("40001"), "could not serialize");
        assert!(matches!(serialization, RmError::RolledBack(_)), "{serialization:?}");
        let in_block = classify_error("a", PgOp::CommitPrepared, Some("25001"), "inside a block");
        assert!(matches!(in_block, RmError::Protocol(_)), "{in_block:?}");
        // PostgreSQL 15 answers 55000 for a prepared transaction another session is finishing.
        let busy55000 = classify_error(
            "a",
            PgOp::CommitPrepared,
            Some("55000"),
            "prepared transaction with identifier \"decree:x\" is busy",
        );
        assert!(matches!(busy55000, RmError::Unavailable(_)), "{busy55000:?}");
        let busy = classify_error("a", PgOp::CommitPrepared, Some("55006"), "is busy");
        assert!(matches!(busy, RmError::Unavailable(_)), "{busy:?}");
    }

    #[test]
    fn dsn_errors_name_the_rm_and_addresses_hide_passwords() {
        let err = PgFactory::new("ledger", "host=127.0.0.1 port=notaport").err().expect("bad port refused");
        assert!(matches!(err, RmError::Protocol(ref m) if m.contains("ledger")), "{err:?}");
        let factory = PgFactory::new("ledger", "host=10.1.2.3 port=6000 user=u password=secret dbname=d")
            .expect("valid DSN");
        assert_eq!(factory.address(), "PostgreSQL host=10.1.2.3 port=6000 dbname=d user=u");
        assert!(!factory.address().contains("secret"));
    }
}
