"""The coordinator: transactions over the application's database connections.

::

    tm = decree.connect("unix:/run/decree/decree.sock")
    with tm.transaction() as tx:
        tx.enlist(pg_a, "pg-a")        # psycopg 3 connection, autocommit off
        tx.enlist(maria, "orders")     # PyMySQL connection, autocommit on
        ... SQL on both ...
    # committed here; an exception inside the block rolls both back and propagates

The protocol is docs/protocol.md's "What a client does": one branch commits in one phase
(on a version-3 session only once ``OnePhase`` is written, and ``Complete`` follows); two
or more are prepared, the decision is sent (``Decide``, after a check that the session is
still there: a decision that could not be written rolls back), every branch is committed
and the server is told (``Complete``). A lost
answer to ``Decide`` is resolved with ``Outcome`` on a new connection, never guessed. A
branch that phase two cannot commit is left to the server, which commits it once this
client's session is closed (the client closes it at once), and reported in
:attr:`CommitReport.phase_two_pending`.

Each transaction holds one server session (connection) from a pool for its duration, so
threads may share one :class:`TransactionManager`; a broken session is dropped and the
next transaction connects again.

What the commit decides is written once, for this API and the asyncio one, in
:mod:`decree._rules`; this module carries its calls out with blocking IO (:func:`_run`)
and keeps the pool, the keep-alive thread and what ``os.fork()`` needs.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
import weakref
from typing import Any, Callable, Concatenate, ParamSpec, TypeVar

from . import protocol as p
from ._rules import CommitReport as CommitReport
from ._engine import run_blocking as _run
from ._rules import ManagerRules, TransactionRules, settings
from .branches import adapter_for
from .connection import Endpoint, Options, ServerConnection, TlsConfig
from .errors import UsageError

log = logging.getLogger("decree")

T = TypeVar("T")
P = ParamSpec("P")


def connect(
    endpoint: str,
    *,
    tls: TlsConfig | None = None,
    node_expected: int = 0,
    client_name: str | None = None,
    connect_timeout: float = 5.0,
    reply_timeout: float | None = 30.0,
    outcome_timeout: float = 30.0,
) -> TransactionManager:
    """A transaction manager on the state server at ``endpoint`` (``unix:/path``,
    ``tcp:host:port`` or ``tls:host:port``; a comma-separated list names the two members
    of a pair, and whichever serves is used). Opens one session at once, so that a wrong
    address or a refused certificate fails here."""
    endpoints, options = settings(endpoint, tls, node_expected, client_name, connect_timeout, reply_timeout)
    tm = TransactionManager(endpoints, options, outcome_timeout=outcome_timeout)
    tm._release(tm._acquire())
    return tm


_MANAGERS: weakref.WeakSet[Any] = weakref.WeakSet()
"""The live managers (anything with an ``_after_fork()``: a TransactionManager, a manager of
several pairs), for the child of ``os.fork()``; weakly, so that none is kept alive."""


def _after_fork_in_child() -> None:
    for manager in list(_MANAGERS):
        manager._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class TransactionManager(ManagerRules[ServerConnection]):
    """Opens transactions; keeps a pool of server sessions, one per running transaction.

    A manager created before ``os.fork()`` (a pre-fork web server imports the application
    first) serves the child too: the child drops the sessions it inherited without writing
    to them, and opens one of its own on first use, so that parent and child never mint
    the same Xid. A transaction begun before the fork belongs to the parent."""

    _connection = ServerConnection

    def __init__(
        self, endpoint: Endpoint | list[Endpoint], options: Options, *, outcome_timeout: float = 30.0
    ) -> None:
        super().__init__(endpoint, options, outcome_timeout)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._keepalive: threading.Thread | None = None
        self._generation = 0
        """How many forks this process is away from the manager's creation."""
        _MANAGERS.add(self)

    # --- sessions ---------------------------------------------------------------------------

    def _open(self) -> ServerConnection:
        conn: ServerConnection = _run(self._open_any_steps())
        with self._lock:
            self._sessions.add(conn)
            if conn.idle_timeout_ms and self._keepalive is None:
                self._keepalive = threading.Thread(
                    target=self._keep_alive, args=(conn.idle_timeout_ms / 1000.0,), name="decree-keepalive", daemon=True
                )
                self._keepalive.start()
        return conn

    def _acquire(self) -> ServerConnection:
        if self._closed:
            raise UsageError("this TransactionManager is closed")
        while True:
            with self._lock:
                conn = self._pool.pop() if self._pool else None
            if conn is None:
                return self._open()
            if conn.alive():
                return conn
            conn.close()

    def _release(self, conn: ServerConnection) -> None:
        if not self._pools(conn):
            conn.close()
            return
        with self._lock:
            self._pool.append(conn)

    def _keep_alive(self, idle: float) -> None:
        # Every sixth of the server's idle bound, ping each session nobody is using that has
        # sent nothing for a third of it (docs/protocol.md, "Timeouts").
        while not self._stop.wait(idle / 6):
            for conn in list(self._sessions):
                conn.ping_if_idle(idle / 3)

    def _after_fork(self) -> None:
        """In the child of ``os.fork()``: the inherited sessions are the parent's, so they
        are dropped unwritten (their buffered completions too), locks another thread held
        are made anew, and the keep-alive thread, which the child does not have, starts
        again with the child's first session. Transactions begun before stop working."""
        self._generation += 1
        self._lock = threading.Lock()
        self._stop = threading.Event()
        if self._closed:
            self._stop.set()
        self._keepalive = None
        inherited = list(self._sessions) + self._pool
        self._sessions = weakref.WeakSet()
        self._pool = []
        for conn in inherited:
            conn.drop_after_fork()

    def close(self) -> None:
        """Closes the pooled sessions (buffered completions are sent first)."""
        self._closed = True
        self._stop.set()
        with self._lock:
            pool, self._pool = self._pool, []
        for conn in pool:
            conn.close()

    def __enter__(self) -> TransactionManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- transactions -----------------------------------------------------------------------

    def transaction(self) -> Transaction:
        """Begins a transaction (nothing is sent yet); use it as a context manager."""
        return Transaction(self, self._acquire())

    def transactional(self, fn: Callable[Concatenate[Transaction, P], T]) -> Callable[P, T]:
        """Decorator: runs ``fn(tx, *args, **kwargs)`` in a transaction, committed when it
        returns and rolled back when it raises. The decorated function takes ``fn``'s
        parameters after ``tx``, with their types."""

        @functools.wraps(fn)
        def run(*args: P.args, **kwargs: P.kwargs) -> T:
            with self.transaction() as tx:
                return fn(tx, *args, **kwargs)

        return run

    def outcome(self, xid: p.Xid) -> p.Outcome:
        """Asks the server what became of ``xid`` (docs/protocol.md, session rule 6)."""
        return self._using(self._acquire(), lambda conn: conn.outcome(xid))

    def ping(self) -> None:
        self._using(self._acquire(), ServerConnection.ping)

    def _ask_outcome(self, xid: p.Xid) -> p.Outcome:
        """Outcome on a new session (the engine's question after a lost answer to Decide)."""
        return self._using(self._open(), lambda conn: conn.outcome(xid))

    def _using(self, conn: ServerConnection, request: Callable[[ServerConnection], T]) -> T:
        """``request`` on ``conn``, which goes back to the pool after (or is closed, if broken)."""
        try:
            return request(conn)
        finally:
            self._release(conn)


class Transaction(TransactionRules):
    """One global transaction. Enlist connections, run SQL on them, then commit (or leave
    the ``with`` block); an exception in the block rolls back and propagates. What the
    commit decides is :class:`decree._rules.TransactionRules`'; this class does the IO."""

    xid: p.Xid
    _clock = time

    def __init__(self, tm: TransactionManager, session: ServerConnection) -> None:
        super().__init__()
        self.tm: TransactionManager = tm
        self._session: ServerConnection | None = session
        self.xid = session.next_xid()
        self.state = "active"
        self._generation = tm._generation
        log.debug("%s: begun", self.xid)

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self.state != "active":
            return
        if exc is None:
            self.commit()
        else:
            self.rollback()

    # --- enlisting --------------------------------------------------------------------------

    def enlist(self, connection: Any, rm: str) -> int:
        """Makes ``connection``'s work a branch of this transaction; ``rm`` is the name of the
        server's ``[[rm]]`` entry for its database. Enlist before the connection's first
        statement. Returns the branch number (the same when enlisted again)."""
        self._check_active("enlist")
        number = self._enlisted(connection)
        if number is not None:
            return number
        adapter = adapter_for(connection, rm)
        adapter.start(self._next_branch_xid())
        return self._add(adapter)

    def _check_active(self, call: str) -> None:
        if self._generation != self.tm._generation:
            raise UsageError(
                f"{call}: transaction {self.xid} was begun before os.fork(), in the parent process; the "
                "child cannot use it (its server session and database connections are the parent's): "
                "begin a new transaction in the child"
            )
        super()._check_active(call)

    # --- ending -----------------------------------------------------------------------------

    def rollback(self) -> None:
        """Rolls every branch back; nothing is sent to the server (presumed abort)."""
        self._check_active("rollback")
        try:
            _run(self._rollback_steps())
        finally:
            self._end()

    def commit(self) -> CommitReport:
        """Commits; returns how, or raises RolledBack, OutcomeUnknown or HeuristicError."""
        self._check_active("commit")
        self.state = "committing"
        try:
            return _run(self._commit_steps())
        finally:
            self._end()

    def _end(self) -> None:
        session, self._session = self._session, None
        if session is None:
            return
        if self._close_session:
            session.close()
        else:
            self.tm._release(session)
