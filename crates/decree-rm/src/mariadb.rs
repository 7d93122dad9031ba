//! MariaDB (and MySQL) as a resource manager, through the XA statements.
//!
//! One [`MariaDbRm`] is one connection: the application runs its SQL on
//! [`MariaDbRm::client`] (or on a [`MariaDbHandle`] while the coordinator owns the
//! [`MariaDbRm`]) between `start` and `prepare`. The statements, and why:
//!
//! - `start` → `XA START X'<gtrid>',X'<bqual>',<formatID>`: hex literals, because decree's
//!   gtrids are binary (they hold the node id, incarnation and session as integers). A
//!   decree branch's bqual on the server also names the connection ([`crate::xa_name`]).
//! - `end` sends nothing: `XA END <xid>` goes out in the same round trip as the branch's
//!   next statement (`prepare`, `commit(one_phase)` or `rollback`), since the coordinator
//!   always ends a branch right before one of those. SQL run after `end` and before that
//!   statement would still belong to the branch (a misuse XA forbids anyway).
//! - `prepare` → `XA PREPARE <xid>`. MariaDB has no read-only vote: the branch always
//!   votes commit. (A read-only branch prepared and then committed from *another*
//!   connection answers `XA_RBROLLBACK`, which is the same outcome for a branch that
//!   changed nothing.)
//! - `commit(one_phase)` → `XA COMMIT <xid> ONE PHASE`; `commit` → `XA COMMIT <xid>`;
//!   `rollback` → `XA ROLLBACK <xid>` (after `XA END` when the branch is still active).
//! - `recover` → `XA RECOVER`: rows of `formatID, gtrid_length, bqual_length, data` where
//!   `data` is gtrid and bqual concatenated as raw bytes. The list covers the whole server
//!   (XA ids have no database), includes other transaction managers' branches (callers
//!   filter by [`Xid::origin`]) and is bounded by the server's own limits. Names are read
//!   back into the coordinator's Xids.
//!
//! A detail the coordinator must know (checked on MariaDB 10.11): a prepared branch stays
//! attached to the connection that prepared it until that connection commits or rolls it
//! back, or disconnects. While it is attached, `XA COMMIT` from another connection answers
//! `XAER_NOTA` ("unknown XID") although `XA RECOVER` lists the branch. A `XAER_NOTA` for a
//! branch that `XA RECOVER` still lists is therefore reported as [`RmError::Unavailable`]
//! (retry later), never as [`RmError::UnknownXid`], which would mean "already finished".
//! Closing the preparing connection (`close`, or dropping the value) detaches the branch,
//! after which any connection can finish it; a failed `commit` or `rollback` on the
//! preparing connection closes it for that reason, so that the coordinator's retries on
//! other connections can succeed.
//!
//! But not at once: the server lists the branch for other sessions before it detaches the
//! InnoDB transaction from the closing thread, and an `XA COMMIT` by name in between
//! answers OK while committing nothing (probes that closed or killed the preparer and
//! committed by name at once lost commits this way, docs/measurements.md, "MariaDB commit
//! by name during a disconnect" and "... after the preparer is killed"; the InnoDB
//! transaction stays prepared and unlisted until the server restarts). So a decree branch
//! is named on the server with the id of the connection that prepares it
//! ([`crate::xa_name`]), and `XA COMMIT`/`XA ROLLBACK` by name, from any connection of any
//! process, first reads that id back from `XA RECOVER` and waits until no InnoDB
//! transaction is tied to that connection any more (`XaConnection::wait_detached`).

use std::time::{Duration, Instant};

use decree_core::{ResourceManager, RmError, RmFactory, Vote, Xid};
use mysql::prelude::Queryable;
use mysql::{Conn, Opts, OptsBuilder};
use parking_lot::MappedMutexGuard;

use crate::branch::BranchState;
use crate::detached;
use crate::shared::{BranchConnection, SharedHandle, SharedRm};
use crate::xa_name;

/// Connect timeout used when the DSN gives none, so that an unreachable host fails fast.
const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);

/// `XAER_NOTA`: the server does not know (or will not hand out) this Xid.
const ER_XAER_NOTA: u16 = 1397;
/// `ER_SPECIFIC_ACCESS_DENIED_ERROR`: a privilege (here PROCESS) is missing.
const ER_SPECIFIC_ACCESS_DENIED: u16 = 1227;
/// Pause before each `INNODB_TRX` check: longer than the 100 ms the server keeps that
/// table's snapshot while it is being read, so that the snapshot is younger than the
/// `XA RECOVER` listing read before the pause.
const TRX_SNAPSHOT_PAUSE: Duration = Duration::from_millis(150);
/// Longest wait for a closing connection to let go of the branch it prepared before a
/// by-name `XA COMMIT`/`XA ROLLBACK` gives up with "unavailable" (the caller retries
/// later); a closing connection lets go within milliseconds.
const DETACH_WAIT_MAX: Duration = Duration::from_secs(2);
/// Most other listed branches whose preparers one look at `INNODB_TRX` checks too.
const DETACH_BATCH_MAX: usize = 256;

/// The statement (or step) that failed, for messages and for the error mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XaOp {
    /// Opening the connection.
    Connect,
    /// `XA START`.
    Start,
    /// `XA END`.
    End,
    /// `XA PREPARE`.
    Prepare,
    /// `XA COMMIT ... ONE PHASE`.
    CommitOnePhase,
    /// `XA COMMIT`.
    Commit,
    /// `XA ROLLBACK`.
    Rollback,
    /// `XA RECOVER`.
    Recover,
}

impl XaOp {
    fn as_str(self) -> &'static str {
        match self {
            XaOp::Connect => "connect",
            XaOp::Start => "XA START",
            XaOp::End => "XA END",
            XaOp::Prepare => "XA PREPARE",
            XaOp::CommitOnePhase => "XA COMMIT ONE PHASE",
            XaOp::Commit => "XA COMMIT",
            XaOp::Rollback => "XA ROLLBACK",
            XaOp::Recover => "XA RECOVER",
        }
    }
}

/// Maps a server error (`code` = MySQL error number) or, with `code = None`, a client-side
/// failure (IO, protocol) to the coordinator's error kinds. Pure, so it is unit-tested.
pub fn classify_error(rm: &str, op: XaOp, code: Option<u16>, message: &str) -> RmError {
    let what = op.as_str();
    let Some(code) = code else {
        return RmError::Unavailable(format!("{rm}: {what} failed: {message}"));
    };
    let text = format!("{rm}: {what} failed: error {code}: {message}");
    match code {
        ER_XAER_NOTA => RmError::UnknownXid(text),
        // XA_RBROLLBACK, XA_RBTIMEOUT, XA_RBDEADLOCK: the branch was rolled back.
        1402 | 1613 | 1614 => RmError::RolledBack(text),
        // XAER_INVAL, XAER_RMFAIL (wrong state), XAER_OUTSIDE, XAER_DUPID.
        1398 | 1399 | 1400 | 1440 => RmError::Protocol(text),
        // Too many connections, access denied, unknown database, shutdown, killed.
        1040 | 1045 | 1049 | 1053 | 1927 => RmError::Unavailable(text),
        _ => match op {
            // A failed prepare or one-phase commit leaves nothing prepared.
            XaOp::Prepare | XaOp::CommitOnePhase | XaOp::End => RmError::RolledBack(text),
            _ => RmError::Unavailable(text),
        },
    }
}

fn map_error(rm: &str, op: XaOp, err: &mysql::Error) -> RmError {
    match err {
        mysql::Error::MySqlError(e) => classify_error(rm, op, Some(e.code), &e.message),
        mysql::Error::UrlError(e) => RmError::Protocol(format!("{rm}: invalid MariaDB DSN: {e}")),
        mysql::Error::FromValueError(_) | mysql::Error::FromRowError(_) => {
            RmError::Protocol(format!("{rm}: {}: unexpected result: {err}", op.as_str()))
        }
        other => classify_error(rm, op, None, &other.to_string()),
    }
}

/// True when the failure says nothing about the server's state but the connection's.
fn is_connection_error(err: &mysql::Error) -> bool {
    !matches!(
        err,
        mysql::Error::MySqlError(_)
            | mysql::Error::UrlError(_)
            | mysql::Error::FromValueError(_)
            | mysql::Error::FromRowError(_)
    )
}

/// Runs one or more statements and reports the first error of any of them.
///
/// `Queryable::query_drop` is not enough: it reports only the first statement's error and
/// drops the later result sets unread, so with `XA END x; XA PREPARE x` a failed
/// prepare would look like a success.
pub fn run_checked(conn: &mut Conn, sql: &str) -> mysql::Result<()> {
    let mut result = conn.query_iter(sql)?;
    while let Some(set) = result.iter() {
        for row in set {
            row?;
        }
    }
    Ok(())
}

/// The SQL form of an Xid: `X'<gtrid hex>',X'<bqual hex>',<formatID>`.
pub fn xid_sql(xid: &Xid) -> Result<String, RmError> {
    if xid.format_id() < 0 {
        return Err(RmError::Protocol(format!("{xid}: MariaDB accepts only non-negative XA format ids")));
    }
    Ok(format!("X'{}',X'{}',{}", hex::encode(xid.gtrid()), hex::encode(xid.bqual()), xid.format_id()))
}

/// Builds an Xid from one `XA RECOVER` row.
pub fn xid_from_recover_row(
    format_id: i64,
    gtrid_length: i64,
    bqual_length: i64,
    data: &[u8],
) -> Result<Xid, String> {
    let format_id = i32::try_from(format_id).map_err(|_| format!("formatID {format_id} out of range"))?;
    let (Ok(g), Ok(b)) = (usize::try_from(gtrid_length), usize::try_from(bqual_length)) else {
        return Err(format!("negative lengths {gtrid_length}/{bqual_length}"));
    };
    if data.len() != g + b {
        return Err(format!("data is {} bytes, lengths say {g}+{b}", data.len()));
    }
    Xid::new(format_id, &data[..g], &data[g..]).map_err(|e| e.to_string())
}

/// The connection options of a DSN, connecting exactly as it says: by default the driver
/// would switch a TCP connection to 127.0.0.1 over to the server's Unix socket, a login as
/// `user@localhost` that a user granted for `127.0.0.1` only is refused (silently for the
/// driver, which falls back to TCP, but logged by MariaDB as "Access denied" for every
/// connection). A DSN that says `prefer_socket=true` keeps the switch.
fn parse_dsn(rm: &str, dsn: &str) -> Result<Opts, RmError> {
    let opts =
        Opts::from_url(dsn).map_err(|e| RmError::Protocol(format!("{rm}: invalid MariaDB DSN: {e}")))?;
    let mut builder = OptsBuilder::from_opts(opts.clone());
    if !dsn.contains("prefer_socket=") {
        builder = builder.prefer_socket(false);
    }
    if opts.get_tcp_connect_timeout().is_none() {
        builder = builder.tcp_connect_timeout(Some(CONNECT_TIMEOUT_DEFAULT));
    }
    Ok(builder.into())
}

/// MariaDB's error for a refused login (ER_ACCESS_DENIED_ERROR).
const ACCESS_DENIED: u16 = 1045;

/// Resource managers whose refused login was logged already: once is enough to name the
/// fix, and a retry loop would repeat it for every attempt.
static LOGIN_REFUSED_LOGGED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Logs a refused login of `name` once per resource manager, naming the fix.
fn note_refused_login(name: &str, address: &str, e: &mysql::Error) {
    let mysql::Error::MySqlError(server) = e else { return };
    if server.code != ACCESS_DENIED {
        return;
    }
    let mut logged = LOGIN_REFUSED_LOGGED.lock().unwrap_or_else(|p| p.into_inner());
    if logged.iter().any(|n| n == name) {
        return;
    }
    logged.push(name.to_string());
    tracing::error!(
        rm = name,
        address,
        error = %server.message,
        "MariaDB refused the login of resource manager {name:?}: grant the DSN's user for the host decree \
         connects from (the server sees it as in the message, e.g. 'user'@'127.0.0.1' for a TCP DSN, \
         'user'@'localhost' for a socket), or fix the DSN's user or password (logged once)"
    );
}

/// The server address for messages: host, port, database and user, never the password.
fn describe(opts: &Opts) -> String {
    match opts.get_socket() {
        Some(socket) if opts.get_ip_or_hostname() == "localhost" => format!(
            "MariaDB socket {socket} db={} user={}",
            opts.get_db_name().unwrap_or("(none)"),
            opts.get_user().unwrap_or("(default)")
        ),
        _ => format!(
            "MariaDB {}:{} db={} user={}",
            opts.get_ip_or_hostname(),
            opts.get_tcp_port(),
            opts.get_db_name().unwrap_or("(none)"),
            opts.get_user().unwrap_or("(default)")
        ),
    }
}

/// Opens a connection and reads its full `CONNECTION_ID()`, which names the branches it
/// prepares ([`xa_name`]): the handshake carries only the low 32 bits, and through a proxy
/// not even those of the server's own connection.
fn open_conn(name: &str, address: &str, opts: &Opts) -> Result<(Conn, u64), RmError> {
    let fail = |e: mysql::Error| RmError::Unavailable(format!("{name}: cannot connect to {address}: {e}"));
    let mut conn = Conn::new(opts.clone()).map_err(|e| {
        note_refused_login(name, address, &e);
        fail(e)
    })?;
    let id: Option<u64> = conn.query_first("SELECT CONNECTION_ID()").map_err(fail)?;
    let id =
        id.ok_or_else(|| RmError::Protocol(format!("{name}: SELECT CONNECTION_ID() returned no row")))?;
    Ok((conn, id))
}

/// The connection and its branch state, shared by a [`MariaDbRm`] and its
/// [`MariaDbHandle`]s.
pub struct XaConnection {
    name: String,
    address: String,
    opts: Opts,
    conn: Option<Conn>,
    /// `CONNECTION_ID()` of `conn`.
    connection_id: u64,
    state: BranchState,
    /// The server's name ([`xa_name::on_server`]) of the branch `state` holds, set by `start`.
    held_name: Option<Xid>,
}

impl XaConnection {
    fn connect_new(name: String, opts: Opts) -> Result<XaConnection, RmError> {
        let address = describe(&opts);
        let (conn, connection_id) = open_conn(&name, &address, &opts)?;
        Ok(XaConnection {
            name,
            address,
            opts,
            conn: Some(conn),
            connection_id,
            state: BranchState::Idle,
            held_name: None,
        })
    }

    fn ensure_connected(&mut self) -> Result<&mut Conn, RmError> {
        if self.conn.is_none() {
            self.state.lose_open_branch();
            let (conn, connection_id) = open_conn(&self.name, &self.address, &self.opts)?;
            self.conn = Some(conn);
            self.connection_id = connection_id;
        }
        match self.conn.as_mut() {
            Some(conn) => Ok(conn),
            None => Err(RmError::Unavailable(format!("{}: not connected to {}", self.name, self.address))),
        }
    }

    /// Runs statements (several allowed, one round trip); drops the connection when it
    /// failed, so that the next call reconnects.
    fn run(&mut self, op: XaOp, sql: &str) -> Result<(), RmError> {
        let Some(conn) = self.conn.as_mut() else {
            return Err(RmError::Unavailable(format!(
                "{}: {}: connection to {} is closed",
                self.name,
                op.as_str(),
                self.address
            )));
        };
        match run_checked(conn, sql) {
            Ok(()) => Ok(()),
            Err(e) => {
                if is_connection_error(&e) {
                    self.drop_connection();
                }
                Err(map_error(&self.name, op, &e))
            }
        }
    }

    /// Rolls back whatever non-prepared work the connection holds by closing it: the
    /// server rolls back active and idle XA branches of a closed session, and detaches a
    /// prepared one, which any connection can then finish by name (after
    /// [`Self::wait_detached`]).
    fn drop_connection(&mut self) {
        self.conn = None;
    }

    /// The server's name of `xid`, which this connection started.
    fn held_name(&self, xid: &Xid) -> Xid {
        let name = self.held_name.expect("a branch this connection holds was started here");
        assert_eq!(xa_name::parse(&name).xid, *xid, "the held name is the held branch's");
        name
    }

    /// `XA RECOVER`: the names of the server's prepared branches, as listed.
    fn names_on_server(&mut self) -> Result<Vec<Xid>, RmError> {
        self.ensure_connected()?;
        let Some(conn) = self.conn.as_mut() else {
            return Err(RmError::Unavailable(format!("{}: not connected to {}", self.name, self.address)));
        };
        let rows: Vec<(i64, i64, i64, Vec<u8>)> = match conn.query("XA RECOVER") {
            Ok(rows) => rows,
            Err(e) => {
                if is_connection_error(&e) {
                    self.drop_connection();
                }
                return Err(map_error(&self.name, XaOp::Recover, &e));
            }
        };
        let mut names = Vec::with_capacity(rows.len());
        for (format_id, gtrid_length, bqual_length, data) in rows {
            match xid_from_recover_row(format_id, gtrid_length, bqual_length, &data) {
                Ok(name) => names.push(name),
                Err(e) => tracing::warn!(rm = %self.name, "skipping an XA RECOVER row: {e}"),
            }
        }
        Ok(names)
    }

    /// Waits until connection `preparer` no longer holds the branch named `name`, which
    /// `listed` (an `XA RECOVER` read just before) showed prepared: until `INNODB_TRX`, read
    /// at least [`TRX_SNAPSHOT_PAUSE`] after that listing, ties no transaction to
    /// `preparer`. That closes the race of [`xa_name`] whatever process prepared the
    /// branch, and holds across a MariaDB restart (a detached branch's transaction is tied
    /// to no connection, even when a new one has the old id). The same look clears every
    /// other listed branch whose preparer it shows gone ([`detached`]). Without the
    /// PROCESS privilege the table cannot be read and the first pause is the only margin.
    /// Gives up with `Unavailable` (the caller retries later) as soon as a look finds the
    /// branch held by a connection still in the process list (attached to a live
    /// connection), or after [`DETACH_WAIT_MAX`].
    fn wait_detached(&mut self, name: &Xid, preparer: u64, listed: &[Xid]) -> Result<(), RmError> {
        if detached::is_known(&self.address, name) {
            return Ok(());
        }
        let mut watched: Vec<(Xid, u64)> = vec![(*name, preparer)];
        watched.extend(
            listed
                .iter()
                .filter(|n| *n != name && !detached::is_known(&self.address, n))
                .filter_map(|n| xa_name::parse(n).preparer.map(|p| (*n, p)))
                .take(DETACH_BATCH_MAX),
        );
        let deadline = Instant::now() + DETACH_WAIT_MAX;
        loop {
            std::thread::sleep(TRX_SNAPSHOT_PAUSE);
            let Some(holding) = self.connections_in_transactions(&watched, name)? else {
                tracing::debug!(rm = %self.name, "no PROCESS privilege: cannot check INNODB_TRX");
                return Ok(());
            };
            for (other, id) in &watched {
                if !holding.contains(id) {
                    detached::remember(&self.address, other);
                }
            }
            if !holding.contains(&preparer) {
                return Ok(());
            }
            // Still held: by a live connection (its owner will finish the branch, or let
            // go of it when it closes), or by one the server is still closing.
            let open = self.connection_is_open(preparer, name)?;
            if open || Instant::now() >= deadline {
                return Err(RmError::Unavailable(format!(
                    "{}: branch {} is prepared but still attached to connection {preparer}{}; \
                     MariaDB lets only that connection finish it until it disconnects, and \
                     finishing it by name before it lets go could lose the commit",
                    self.name,
                    xa_name::parse(name).xid,
                    if open { ", which is open" } else { ", which the server is still closing" }
                )));
            }
        }
    }

    /// Whether connection `id` is in the process list (a connection of another user is
    /// visible only with the PROCESS privilege, and counts as closing without it).
    fn connection_is_open(&mut self, id: u64, name: &Xid) -> Result<bool, RmError> {
        let sql = format!("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = {id}");
        let answer: mysql::Result<Option<u64>> = self.ensure_connected()?.query_first(sql);
        let what = format!(
            "checking whether connection {id}, which holds branch {}, is open",
            xa_name::parse(name).xid
        );
        answer.map(|n| n.unwrap_or(0) > 0).map_err(|e| self.check_failed(&what, e))
    }

    /// Which of the `watched` connections `INNODB_TRX` ties a transaction to; `None` when a
    /// missing privilege (PROCESS) hides the table. Any other failure is `Unavailable`,
    /// naming the branch `name` waited for.
    fn connections_in_transactions(
        &mut self,
        watched: &[(Xid, u64)],
        name: &Xid,
    ) -> Result<Option<Vec<u64>>, RmError> {
        let ids: Vec<String> = watched.iter().map(|(_, id)| id.to_string()).collect();
        let sql = format!(
            "SELECT DISTINCT trx_mysql_thread_id FROM information_schema.INNODB_TRX \
             WHERE trx_mysql_thread_id IN ({})",
            ids.join(",")
        );
        let answer: mysql::Result<Vec<u64>> = self.ensure_connected()?.query(sql);
        match answer {
            Ok(ids) => Ok(Some(ids)),
            Err(mysql::Error::MySqlError(e)) if e.code == ER_SPECIFIC_ACCESS_DENIED => Ok(None),
            Err(e) => {
                let what = format!(
                    "checking that branch {} is no longer held by the connection that prepared it",
                    xa_name::parse(name).xid
                );
                Err(self.check_failed(&what, e))
            }
        }
    }

    /// A failed detach check (`what`): drops a broken connection so that the next call
    /// reconnects, and says "unavailable, retry".
    fn check_failed(&mut self, what: &str, e: mysql::Error) -> RmError {
        if is_connection_error(&e) {
            self.drop_connection();
        }
        RmError::Unavailable(format!("{}: {what}: {e}", self.name))
    }

    /// Finishes a branch by name (`XA COMMIT`/`XA ROLLBACK`): finds its name in `XA
    /// RECOVER` (absent: `UnknownXid`, nothing left to finish), waits until its preparing
    /// connection has let go of it, then runs the statement, telling "unknown" from
    /// "prepared but attached to another live connection".
    fn finish_by_name(&mut self, op: XaOp, xid: &Xid) -> Result<(), RmError> {
        let listed = match self.names_on_server() {
            // The connection died while idle (the client notices only on use): the
            // listing is the same from any connection, so a new one asks again.
            Err(RmError::Unavailable(_)) if self.conn.is_none() => self.names_on_server()?,
            other => other?,
        };
        let names: Vec<Xid> = listed.iter().filter(|n| xa_name::parse(n).xid == *xid).copied().collect();
        if names.is_empty() {
            return Err(RmError::UnknownXid(format!(
                "{}: {}: XAER_NOTA: branch {xid} is not prepared on {} (XA RECOVER does not list it)",
                self.name,
                op.as_str(),
                self.address
            )));
        }
        for name in &names {
            if let Some(preparer) = xa_name::parse(name).preparer {
                self.wait_detached(name, preparer, &listed)?;
            }
            self.finish_named(op, name)?;
        }
        Ok(())
    }

    /// Runs `XA COMMIT`/`XA ROLLBACK` of the branch named `name` on the server.
    fn finish_named(&mut self, op: XaOp, name: &Xid) -> Result<(), RmError> {
        let sql = match op {
            XaOp::Commit => format!("XA COMMIT {}", xid_sql(name)?),
            _ => format!("XA ROLLBACK {}", xid_sql(name)?),
        };
        match self.run(op, &sql) {
            Err(RmError::UnknownXid(message)) => {
                if self.names_on_server()?.contains(name) {
                    Err(RmError::Unavailable(format!(
                        "{}: branch {} is prepared but still attached to another open \
                         connection; MariaDB lets only that connection finish it until it \
                         disconnects ({message})",
                        self.name,
                        xa_name::parse(name).xid
                    )))
                } else {
                    detached::forget(&self.address, name);
                    Err(RmError::UnknownXid(message))
                }
            }
            Ok(()) => {
                detached::forget(&self.address, name);
                Ok(())
            }
            other => other,
        }
    }

    /// After phase two on the preparing connection: on success the branch is gone; on
    /// failure the connection is closed so that the branch detaches and the coordinator's
    /// retries, on other connections, can finish it (MariaDB refuses them while it is
    /// attached). Either way this connection is free for the next branch.
    fn release_prepared(&mut self, result: &Result<(), RmError>) {
        if result.is_err() {
            self.drop_connection();
        }
        self.state = BranchState::Idle;
    }

    fn require_open_branch(&mut self, xid: &Xid, what: &str) -> Result<(), RmError> {
        self.state.check_open(&self.name, xid, what)
    }
}

impl Drop for XaConnection {
    fn drop(&mut self) {
        // Closing the connection detaches a prepared branch; see `drop_connection`.
        self.drop_connection();
    }
}

impl BranchConnection for XaConnection {
    const DB_SYSTEM: &'static str = "mariadb";
    type Client = Conn;

    fn address(&self) -> &str {
        &self.address
    }

    /// Connects when needed; fails when the connection was lost while a branch was open,
    /// because the server has then rolled that work back.
    fn client_for_application(&mut self) -> Result<&mut Conn, RmError> {
        let connected = self.conn.is_some();
        self.state.check_usable(connected, &self.name, &self.address)?;
        self.ensure_connected()
    }

    fn client_mut(&mut self) -> Option<&mut Conn> {
        self.conn.as_mut()
    }

    fn open_rm(&mut self) -> Result<(), RmError> {
        self.ensure_connected().map(|_| ())
    }

    fn close(&mut self) -> Result<(), RmError> {
        // The server rolls back open branches and detaches prepared ones.
        self.drop_connection();
        self.state = BranchState::Idle;
        Ok(())
    }

    fn start(&mut self, xid: &Xid) -> Result<(), RmError> {
        self.state.check_can_start(&self.name, xid)?;
        self.ensure_connected()?;
        let name = xa_name::on_server(xid, self.connection_id);
        self.run(XaOp::Start, &format!("XA START {}", xid_sql(&name)?))?;
        self.state = BranchState::Active(*xid);
        self.held_name = Some(name);
        Ok(())
    }

    fn end(&mut self, xid: &Xid) -> Result<(), RmError> {
        // Deferred: `XA END` travels with the branch's next statement (prepare, one-phase
        // commit or rollback), which saves the coordinator a round trip per branch.
        self.require_open_branch(xid, "XA END")
    }

    fn prepare(&mut self, xid: &Xid) -> Result<Vote, RmError> {
        self.require_open_branch(xid, "XA PREPARE")?;
        let x = xid_sql(&self.held_name(xid))?;
        let sql = match self.state {
            BranchState::Active(_) => format!("XA END {x}; XA PREPARE {x}"),
            _ => format!("XA PREPARE {x}"),
        };
        match self.run(XaOp::Prepare, &sql) {
            Ok(()) => {
                self.state = BranchState::Prepared(*xid);
                Ok(Vote::Commit)
            }
            Err(RmError::Unavailable(m)) if self.conn.is_none() => {
                // Perhaps prepared on the lost connection: its name says which connection
                // that was, so its rollback by name waits for the detach as for any other.
                self.state = BranchState::InDoubt(*xid);
                Err(RmError::Unavailable(format!("{m} (branch {xid} may be prepared)")))
            }
            Err(e) => {
                // Nothing is prepared; closing the session rolls the branch back.
                self.drop_connection();
                self.state = BranchState::Idle;
                Err(e)
            }
        }
    }

    fn commit(&mut self, xid: &Xid, one_phase: bool) -> Result<(), RmError> {
        if one_phase {
            self.require_open_branch(xid, "XA COMMIT ONE PHASE")?;
            let x = xid_sql(&self.held_name(xid))?;
            let sql = match self.state {
                BranchState::Active(_) => format!("XA END {x}; XA COMMIT {x} ONE PHASE"),
                _ => format!("XA COMMIT {x} ONE PHASE"),
            };
            let result = self.run(XaOp::CommitOnePhase, &sql);
            self.state = BranchState::Idle;
            return match result {
                Ok(()) => Ok(()),
                Err(RmError::Unavailable(m)) if self.conn.is_none() => Err(RmError::Unavailable(format!(
                    "{m} (the outcome of the one-phase commit of {xid} is unknown)"
                ))),
                Err(e) => {
                    self.drop_connection();
                    Err(e)
                }
            };
        }
        match self.state {
            BranchState::Prepared(x) if x == *xid => {
                let result = self.run(XaOp::Commit, &format!("XA COMMIT {}", xid_sql(&self.held_name(xid))?));
                self.release_prepared(&result);
                result
            }
            BranchState::Active(x) | BranchState::Ended(x) | BranchState::Prepared(x) => {
                Err(RmError::Protocol(format!(
                    "{}: XA COMMIT {xid}: this connection holds branch {x}{}",
                    self.name,
                    if x == *xid { ", which was never prepared" } else { "" }
                )))
            }
            BranchState::Lost(x) if x == *xid => self.state.check_open(&self.name, xid, "XA COMMIT"),
            BranchState::Idle | BranchState::InDoubt(_) | BranchState::Lost(_) => {
                let result = self.finish_by_name(XaOp::Commit, xid);
                if self.state.xid() == Some(*xid) {
                    self.state = BranchState::Idle;
                }
                result
            }
        }
    }

    fn rollback(&mut self, xid: &Xid) -> Result<(), RmError> {
        match self.state {
            BranchState::Active(held) | BranchState::Ended(held) if held == *xid => {
                let x = xid_sql(&self.held_name(xid))?;
                let sql = match self.state {
                    BranchState::Active(_) => format!("XA END {x}; XA ROLLBACK {x}"),
                    _ => format!("XA ROLLBACK {x}"),
                };
                if self.run(XaOp::Rollback, &sql).is_err() {
                    // Not prepared: closing the session is a rollback too (for instance
                    // after XA_RBDEADLOCK left the branch rollback-only).
                    self.drop_connection();
                }
                self.state = BranchState::Idle;
                Ok(())
            }
            BranchState::Prepared(held) if held == *xid => {
                let x = xid_sql(&self.held_name(xid))?;
                let result = self.run(XaOp::Rollback, &format!("XA ROLLBACK {x}"));
                self.release_prepared(&result);
                result
            }
            BranchState::Active(held) | BranchState::Ended(held) | BranchState::Prepared(held) => {
                Err(RmError::Protocol(format!(
                    "{}: XA ROLLBACK {xid}: this connection holds branch {held}",
                    self.name
                )))
            }
            BranchState::Lost(held) if held == *xid => {
                // The server rolled it back when the connection died.
                self.state = BranchState::Idle;
                Ok(())
            }
            BranchState::Idle | BranchState::InDoubt(_) | BranchState::Lost(_) => {
                let in_doubt = self.state == BranchState::InDoubt(*xid);
                let result = self.finish_by_name(XaOp::Rollback, xid);
                if self.state.xid() == Some(*xid) {
                    self.state = BranchState::Idle;
                }
                match result {
                    // The prepare whose answer was lost did not happen: the branch died
                    // with its connection, which is a rollback.
                    Err(RmError::UnknownXid(_)) if in_doubt => Ok(()),
                    other => other,
                }
            }
        }
    }

    /// The listed branches as the coordinator knows them ([`xa_name::parse`]).
    fn recover(&mut self) -> Result<Vec<Xid>, RmError> {
        Ok(self.names_on_server()?.iter().map(|name| xa_name::parse(name).xid).collect())
    }
}

/// The application's view of a [`MariaDbRm`]'s connection; derefs to the database client.
///
/// It holds the connection's lock: drop it before calling the coordinator (`commit`,
/// `rollback`), which then uses the same connection and refuses to wait for it.
pub type MariaDbClient<'a> = MappedMutexGuard<'a, Conn>;

/// One MariaDB connection taking part in two-phase commit (see [`SharedRm`]).
pub type MariaDbRm = SharedRm<XaConnection>;

/// A second owner of a [`MariaDbRm`]'s connection (see [`SharedHandle`]).
pub type MariaDbHandle = SharedHandle<XaConnection>;

impl SharedRm<XaConnection> {
    /// Connects to the server named by `dsn` (`mysql://user:password@host:port/db`).
    pub fn connect(name: &str, dsn: &str) -> Result<MariaDbRm, RmError> {
        MariaDbRm::with_opts(name.to_string(), parse_dsn(name, dsn)?)
    }

    fn with_opts(name: String, opts: Opts) -> Result<MariaDbRm, RmError> {
        Ok(SharedRm::new(name.clone(), XaConnection::connect_new(name, opts)?))
    }
}

/// Opens [`MariaDbRm`] connections to one server, for sessions, recovery and retries.
#[derive(Clone)]
pub struct MariaDbFactory {
    name: String,
    address: String,
    opts: Opts,
}

impl MariaDbFactory {
    /// Checks the DSN now (no connection yet), so that a typo fails at configuration time.
    pub fn new(name: &str, dsn: &str) -> Result<MariaDbFactory, RmError> {
        let opts = parse_dsn(name, dsn)?;
        Ok(MariaDbFactory { name: name.to_string(), address: describe(&opts), opts })
    }

    /// The server address, without the password.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// A new connection as the concrete type, for applications that need
    /// [`MariaDbRm::client`].
    pub fn connect_mariadb(&self) -> Result<MariaDbRm, RmError> {
        MariaDbRm::with_opts(self.name.clone(), self.opts.clone())
    }
}

impl RmFactory for MariaDbFactory {
    fn name(&self) -> &str {
        &self.name
    }

    fn connect(&self) -> Result<Box<dyn ResourceManager>, RmError> {
        Ok(Box::new(self.connect_mariadb()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xids_print_as_hex_literals_and_recover_rows_parse_back() {
        let xid = Xid::new(0x6463_7265, &[0, 1, 0xff, b'\''], &[0, 2]).expect("valid xid");
        assert_eq!(xid_sql(&xid).expect("format id is positive"), "X'0001ff27',X'0002',1684238949");
        let parsed = xid_from_recover_row(0x6463_7265, 4, 2, &[0, 1, 0xff, b'\'', 0, 2]).expect("row parses");
        assert_eq!(parsed, xid);
        assert!(xid_from_recover_row(1, 4, 2, &[0, 1]).is_err(), "short data refused");
        assert!(xid_from_recover_row(1 << 40, 1, 0, b"a").is_err(), "format id out of range refused");
        let negative = Xid::new(-1, b"g", b"").expect("valid xid");
        assert!(matches!(xid_sql(&negative), Err(RmError::Protocol(_))));
    }

    #[test]
    fn errors_map_to_the_coordinator_kinds() {
        let nota = classify_error("m", XaOp::Commit, Some(1397), "XAER_NOTA: Unknown XID");
        assert!(matches!(nota, RmError::UnknownXid(ref t) if t.starts_with("m: ")), "{nota:?}");
        for code in [1402, 1613, 1614] {
            let rb = classify_error("m", XaOp::Commit, Some(code), "XA_RB");
            assert!(matches!(rb, RmError::RolledBack(_)), "{code}: {rb:?}");
        }
        let state = classify_error("m", XaOp::Start, Some(1399), "XAER_RMFAIL");
        assert!(matches!(state, RmError::Protocol(_)), "{state:?}");
        let io = classify_error("m", XaOp::Commit, None, "broken pipe");
        assert!(matches!(io, RmError::Unavailable(_)), "{io:?}");
        let prepare_failed = classify_error("m", XaOp::Prepare, Some(1401), "XAER_RMERR");
        assert!(matches!(prepare_failed, RmError::RolledBack(_)), "{prepare_failed:?}");
    }

    #[test]
    fn an_error_in_a_later_statement_is_not_lost() {
        // Needs the server of scripts/test-dbs.sh; tests/mariadb.rs fails in CI without it.
        let Ok(dsn) = std::env::var("DECREE_TEST_MARIADB") else {
            eprintln!("skipped: DECREE_TEST_MARIADB is not set (run scripts/test-dbs.sh start)");
            return;
        };
        let mut conn = Conn::new(Opts::from_url(&dsn).expect("valid DSN")).expect("connect");
        run_checked(&mut conn, "SELECT 1; DO 2").expect("two good statements");
        let err = run_checked(&mut conn, "SELECT 1; SELECT * FROM decree_no_such_table; DO 3")
            .expect_err("the second statement fails");
        assert!(matches!(err, mysql::Error::MySqlError(ref e) if e.code == 1146), "{err:?}");
        run_checked(&mut conn, "DO 4").expect("the connection is still usable");
    }

    #[test]
    fn dsn_errors_name_the_rm_and_addresses_hide_passwords() {
        let err = MariaDbFactory::new("orders", "postgres://x").err().expect("wrong scheme refused");
        assert!(matches!(err, RmError::Protocol(ref m) if m.contains("orders")), "{err:?}");
        let factory =
            MariaDbFactory::new("orders", "mysql://u:secret@10.1.2.3:3307/shop").expect("valid DSN");
        assert_eq!(factory.address(), "MariaDB 10.1.2.3:3307 db=shop user=u");
        assert!(!factory.address().contains("secret"));
    }
}
