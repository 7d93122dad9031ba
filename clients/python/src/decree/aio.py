"""The asyncio API: the same coordinator as :mod:`decree.tm`, for ``async`` applications
(FastAPI, Starlette, aiohttp), psycopg 3's ``AsyncConnection`` and aiomysql's ``Connection``::

    tm = await decree.aconnect("unix:/run/decree/decree.sock")   # or: async with decree.aconnect(...) as tm
    async with tm.atransaction() as tx:
        await tx.enlist(ledger, "ledger")     # psycopg.AsyncConnection, autocommit off
        await tx.enlist(orders, "orders")     # aiomysql.Connection, autocommit=True
        await ledger.execute("UPDATE ...")
        await orders.execute("INSERT ...")
    # committed here; an exception inside the block rolls both back and propagates

The algorithm is docs/protocol.md's "What a client does", as in the synchronous API: one
branch commits in one phase (on a version-3 session only once ``OnePhase`` is written, and
``Complete`` follows); two or more are prepared, decided on the server (``Decide``, after a
check that the session is still there: a decision that could not be written rolls back),
committed and completed; a lost answer to ``Decide`` is resolved with ``Outcome`` on a new
connection, never guessed. It ends with the same exceptions (``RolledBack``,
``OutcomeUnknown``, ``HeuristicError``, ...) and reports (:class:`decree.CommitReport`).

An :class:`AsyncTransactionManager` keeps a pool of asyncio sessions to the server, one per
running transaction, so the tasks of one event loop share it. Its sessions belong to the
event loop that opened the first of them: using the manager from another loop raises
:class:`decree.UsageError` (make one manager per loop, e.g. in the application's lifespan).
Database connections of the synchronous API (psycopg ``Connection``, PyMySQL) are refused
with a :class:`decree.UsageError` that says so; ``tm.transaction()`` drives those.

A commit or rollback, once begun, is not interrupted by a cancellation of its task (a
client that went away, a timeout): it runs to its end, then ``asyncio.CancelledError`` is
raised, chained to the transaction's own exception if it had one, and ``tx.state`` and
``tx.report`` say how it ended.

The coordinator's rules are :mod:`decree._rules`', the same code as the synchronous API's;
this module awaits their calls (:func:`_run`) and keeps the pool, the keep-alive task, the
event loop check and the cancellation shield.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, Concatenate, ParamSpec, TypeVar

from . import protocol as p
from ._engine import run_awaited as _run
from ._rules import CommitReport, ManagerRules, Steps, TransactionRules, settings
from .aio_branches import async_adapter_for
from .aio_connection import AsyncServerConnection
from .connection import Endpoint, Options, TlsConfig
from .errors import UsageError

log = logging.getLogger("decree")

T = TypeVar("T")
P = ParamSpec("P")

__all__ = ["AsyncTransaction", "AsyncTransactionManager", "aconnect"]


class _LoopClock:
    """The engine's clock on the event loop: the monotonic clock, and a sleep that lets
    the loop run."""

    monotonic = staticmethod(time.monotonic)
    sleep = staticmethod(asyncio.sleep)


def aconnect(
    endpoint: str,
    *,
    tls: TlsConfig | None = None,
    node_expected: int = 0,
    client_name: str | None = None,
    connect_timeout: float = 5.0,
    reply_timeout: float | None = 30.0,
    outcome_timeout: float = 30.0,
) -> AsyncTransactionManager:
    """An asyncio transaction manager on the state server at ``endpoint`` (``unix:/path``,
    ``tcp:host:port`` or ``tls:host:port``; a comma-separated list names a pair's two
    members). Await it (``tm = await decree.aconnect(...)``) or enter it (``async with
    decree.aconnect(...) as tm:``): either opens one session at once, so that a wrong
    address or a refused certificate fails there."""
    endpoints, options = settings(endpoint, tls, node_expected, client_name, connect_timeout, reply_timeout)
    return AsyncTransactionManager(endpoints, options, outcome_timeout=outcome_timeout)


async def _run_to_end(work: Coroutine[Any, Any, T], what: str) -> T:
    """Runs ``work`` to its end even when the calling task is cancelled meanwhile; the
    cancellation is raised afterwards, chained to ``work``'s exception if it raised."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                break
            cancelled = True
        except BaseException:
            break
    if cancelled:
        error = None if task.cancelled() else task.exception()
        log.info("%s finished after its task was cancelled (%s)", what, error or "no error")
        raise asyncio.CancelledError(f"cancelled during {what}") from error
    return task.result()


class AsyncTransactionManager(ManagerRules[AsyncServerConnection]):
    """Opens asyncio transactions; keeps a pool of server sessions of one event loop."""

    _connection = AsyncServerConnection

    def __init__(
        self, endpoint: Endpoint | list[Endpoint], options: Options, *, outcome_timeout: float = 30.0
    ) -> None:
        super().__init__(endpoint, options, outcome_timeout)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._keepalive: asyncio.Task[None] | None = None

    # --- opening and closing ----------------------------------------------------------------

    async def open(self) -> AsyncTransactionManager:
        """Opens one session (a wrong address fails here) and pools it."""
        await self._release(await self._acquire())
        return self

    def __await__(self) -> Generator[Any, None, AsyncTransactionManager]:
        return self.open().__await__()

    async def __aenter__(self) -> AsyncTransactionManager:
        if self._loop is None:
            await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Closes the pooled sessions (buffered completions are sent first) and stops the
        keep-alive. Sessions held by running transactions close when those end."""
        self._closed = True
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
        pool, self._pool = self._pool, []
        await asyncio.gather(*(conn.aclose() for conn in pool))

    # --- sessions ---------------------------------------------------------------------------

    def _check_loop(self) -> None:
        if self._closed:
            raise UsageError("this AsyncTransactionManager is closed")
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise UsageError(
                "this AsyncTransactionManager's sessions belong to the event loop that opened them; "
                "make one manager per event loop"
            )

    async def _open(self) -> AsyncServerConnection:
        conn: AsyncServerConnection = await _run(self._open_any_steps())
        self._sessions.add(conn)
        if conn.idle_timeout_ms and self._keepalive is None and not self._closed:
            self._keepalive = asyncio.ensure_future(self._keep_alive(conn.idle_timeout_ms / 1000.0))
        return conn

    async def _acquire(self) -> AsyncServerConnection:
        self._check_loop()
        while self._pool:
            conn = self._pool.pop()
            if await conn.alive():
                return conn
            await conn.aclose()
        return await self._open()

    async def _release(self, conn: AsyncServerConnection) -> None:
        if not self._pools(conn):
            await conn.aclose()
            return
        self._pool.append(conn)

    async def _keep_alive(self, idle: float) -> None:
        # Every sixth of the server's idle bound, ping each session nobody is using that has
        # sent nothing for a third of it (docs/protocol.md, "Timeouts").
        while not self._closed:
            await asyncio.sleep(idle / 6)
            for conn in list(self._sessions):
                await conn.ping_if_idle(idle / 3)

    # --- transactions -----------------------------------------------------------------------

    def atransaction(self) -> AsyncTransaction:
        """A transaction, begun when entered (``async with tm.atransaction() as tx:``) or
        awaited (``tx = await tm.atransaction()``); nothing is sent yet."""
        return AsyncTransaction(self)

    def atransactional(
        self, fn: Callable[Concatenate[AsyncTransaction, P], Awaitable[T]]
    ) -> Callable[P, Coroutine[Any, Any, T]]:
        """Decorator: runs ``await fn(tx, *args, **kwargs)`` in a transaction, committed when
        it returns and rolled back when it raises. The decorated coroutine function takes
        ``fn``'s parameters after ``tx``, with their types."""

        @functools.wraps(fn)
        async def run(*args: P.args, **kwargs: P.kwargs) -> T:
            async with self.atransaction() as tx:
                return await fn(tx, *args, **kwargs)

        return run

    async def outcome(self, xid: p.Xid) -> p.Outcome:
        """Asks the server what became of ``xid`` (docs/protocol.md, session rule 6)."""
        return await self._using(await self._acquire(), lambda conn: conn.outcome(xid))

    async def ping(self) -> None:
        await self._using(await self._acquire(), AsyncServerConnection.ping)

    async def _ask_outcome(self, xid: p.Xid) -> p.Outcome:
        """Outcome on a new session (the engine's question after a lost answer to Decide)."""
        return await self._using(await self._open(), lambda conn: conn.outcome(xid))

    async def _using(
        self, conn: AsyncServerConnection, request: Callable[[AsyncServerConnection], Awaitable[T]]
    ) -> T:
        """``request`` on ``conn``, which goes back to the pool after (or is closed, if broken)."""
        try:
            return await request(conn)
        finally:
            await self._release(conn)


class AsyncTransaction(TransactionRules):
    """One global transaction of the asyncio API. Enlist connections, run SQL on them,
    then commit (or leave the ``async with`` block); an exception in the block rolls back
    and propagates. What the commit decides is :class:`decree._rules.TransactionRules`';
    this class does the IO."""

    _clock = _LoopClock

    def __init__(self, tm: AsyncTransactionManager) -> None:
        super().__init__()
        self.tm: AsyncTransactionManager = tm
        self._session: AsyncServerConnection | None = None
        self.xid: p.Xid | None = None

    async def begin(self) -> AsyncTransaction:
        """Takes a server session and mints the global Xid (nothing is sent)."""
        if self.state != "new":
            raise self._state_error("begin")
        self._session = await self.tm._acquire()
        self.xid = self._session.next_xid()
        self.state = "active"
        log.debug("%s: begun (asyncio)", self.xid)
        return self

    def __await__(self) -> Generator[Any, None, AsyncTransaction]:
        return self.begin().__await__()

    async def __aenter__(self) -> AsyncTransaction:
        return await self.begin()

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self.state != "active":
            return
        if exc is None:
            await self.commit()
        else:
            await self.rollback()

    # --- enlisting --------------------------------------------------------------------------

    async def enlist(self, connection: Any, rm: str) -> int:
        """Makes ``connection``'s work a branch of this transaction (a psycopg 3
        ``AsyncConnection``, an aiomysql ``Connection`` opened with ``autocommit=True``, or
        an :class:`~decree.aio_branches.AsyncBranchAdapter`); ``rm``
        is the server's ``[[rm]]`` name of its database. Enlist before the connection's
        first statement. Returns the branch number (the same when enlisted again)."""
        self._check_active("enlist")
        number = self._enlisted(connection)
        if number is not None:
            return number
        adapter = async_adapter_for(connection, rm)
        await adapter.start(self._next_branch_xid())
        return self._add(adapter)

    # --- ending -----------------------------------------------------------------------------

    async def rollback(self) -> None:
        """Rolls every branch back; nothing is sent to the server (presumed abort)."""
        self._check_active("rollback")
        self.state = "rolling_back"
        await _run_to_end(self._ending(self._rollback_steps()), f"the rollback of {self.xid}")

    async def commit(self) -> CommitReport:
        """Commits; returns how, or raises RolledBack, OutcomeUnknown or HeuristicError."""
        self._check_active("commit")
        self.state = "committing"
        return await _run_to_end(self._ending(self._commit_steps()), f"the commit of {self.xid}")

    async def _ending(self, steps: Steps[T]) -> T:
        """Runs the engine that ends the transaction, then lets go of the session."""
        try:
            return await _run(steps)
        finally:
            await self._end()

    async def _end(self) -> None:
        session, self._session = self._session, None
        if session is None:
            return
        if self._close_session:
            await session.aclose()
        else:
            await self.tm._release(session)
