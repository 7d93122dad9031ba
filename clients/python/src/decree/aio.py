"""The asyncio API: the same coordinator as :mod:`decree.tm`, for ``async`` applications
(FastAPI, Starlette, aiohttp) and psycopg 3's ``AsyncConnection``::

    tm = await decree.aconnect("unix:/run/decree/decree.sock")   # or: async with decree.aconnect(...) as tm
    async with tm.atransaction() as tx:
        await tx.enlist(ledger, "ledger")     # psycopg.AsyncConnection, autocommit off
        await tx.enlist(orders, "orders")
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
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

from . import protocol as p
from .aio_branches import AsyncBranchAdapter, async_adapter_for
from .aio_connection import AsyncServerConnection
from .branches import BranchEnded, BranchFailed, BranchInDoubt, PhaseTwo, Step
from .connection import Endpoint, NotSent, Options, TlsConfig
from .errors import (
    BranchEndedByApplication,
    DecreeError,
    HeuristicError,
    HeuristicReport,
    OutcomeUnknown,
    ProtocolError,
    RolledBack,
    ServerError,
    Unavailable,
    UsageError,
)
from .tm import _REFUSED_BEFORE_WRITING, CommitReport

log = logging.getLogger("decree")

T = TypeVar("T")
P = ParamSpec("P")

__all__ = ["AsyncTransaction", "AsyncTransactionManager", "aconnect"]


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
    options = Options(
        node_expected=node_expected, connect_timeout=connect_timeout, reply_timeout=reply_timeout, tls=tls
    )
    if client_name is not None:
        options = dataclasses.replace(options, client_name=client_name)
    endpoints = [Endpoint.parse(e.strip()) for e in endpoint.split(",")]
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


class AsyncTransactionManager:
    """Opens asyncio transactions; keeps a pool of server sessions of one event loop."""

    def __init__(
        self, endpoint: Endpoint | list[Endpoint], options: Options, *, outcome_timeout: float = 30.0
    ) -> None:
        self.endpoints = endpoint if isinstance(endpoint, list) else [endpoint]
        if not self.endpoints:
            raise UsageError("no endpoint to connect to")
        self._preferred = 0
        self.options = options
        self.outcome_timeout = outcome_timeout
        self._pool: list[AsyncServerConnection] = []
        self._sessions: weakref.WeakSet[AsyncServerConnection] = weakref.WeakSet()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
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

    @property
    def endpoint(self) -> Endpoint:
        """The endpoint that served last (of a pair's two, the primary)."""
        return self.endpoints[self._preferred % len(self.endpoints)]

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
        conn = await self._open_any()
        self._sessions.add(conn)
        if conn.idle_timeout_ms and self._keepalive is None and not self._closed:
            self._keepalive = asyncio.ensure_future(self._keep_alive(conn.idle_timeout_ms / 1000.0))
        return conn

    async def _open_any(self) -> AsyncServerConnection:
        """A session on the first endpoint that serves, starting with the one that served
        last (a pair's backup answers NotPrimary, an unreachable member fails to connect)."""
        failures = []
        for i in range(len(self.endpoints)):
            index = (self._preferred + i) % len(self.endpoints)
            try:
                conn = await AsyncServerConnection.open(self.endpoints[index], self.options)
            except ServerError as e:
                if e.code != p.ErrorCode.NOT_PRIMARY or len(self.endpoints) == 1:
                    raise
                failures.append(str(e))
                continue
            except Unavailable as e:
                if len(self.endpoints) == 1:
                    raise
                failures.append(str(e))
                continue
            self._preferred = index
            return conn
        raise Unavailable("no member of the pair serves: " + "; ".join(failures))

    async def _acquire(self) -> AsyncServerConnection:
        self._check_loop()
        while self._pool:
            conn = self._pool.pop()
            if await conn.alive():
                return conn
            await conn.aclose()
        return await self._open()

    async def _release(self, conn: AsyncServerConnection) -> None:
        if conn.broken or self._closed:
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
        conn = await self._acquire()
        try:
            return await conn.outcome(xid)
        finally:
            await self._release(conn)

    async def ping(self) -> None:
        conn = await self._acquire()
        try:
            await conn.ping()
        finally:
            await self._release(conn)

    async def _resolve(
        self, xid: p.Xid, cause: BaseException, release: Callable[[], Awaitable[bool]] | None = None
    ) -> p.Outcome:
        """The answer to a Decide whose reply was lost: Outcome on new connections, asked
        again while the server says in progress or cannot be reached, up to the deadline.
        On a first "unknown", ``release`` lets go of branches the server cannot reach."""
        deadline = time.monotonic() + self.outcome_timeout
        delay, last, released = 0.05, cause, False
        while True:
            try:
                answer = await self._ask_new_session(xid, cause)
                if answer == p.Outcome.UNKNOWN and not released and release is not None and await release():
                    released = True
                    log.info("%s: released the branches the server could not reach; asking again", xid)
                elif answer == p.Outcome.UNKNOWN and released and time.monotonic() + delay <= deadline:
                    pass  # the server may still finish the released branches.
                elif answer != p.Outcome.IN_PROGRESS:
                    return answer
            except (Unavailable, ProtocolError, ServerError) as e:
                log.info("%s: Outcome not answered yet: %s", xid, e)
                last = e
            if time.monotonic() + delay > deadline:
                raise OutcomeUnknown(
                    f"{xid}: the answer to Decide was lost ({cause}) and the server gave no final answer "
                    f"within {self.outcome_timeout} s (last: {last})",
                    xid=xid, cause=cause,
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _ask_new_session(self, xid: p.Xid, cause: BaseException) -> p.Outcome:
        conn = await self._open()
        try:
            answer = await conn.outcome(xid)
        finally:
            await self._release(conn)
        log.info("%s: the answer to Decide was lost (%s); Outcome says %s", xid, cause, answer.name)
        return answer


@dataclass
class _Enlisted:
    adapter: AsyncBranchAdapter
    number: int
    prepared: bool = False


class AsyncTransaction:
    """One global transaction of the asyncio API. Enlist connections, run SQL on them,
    then commit (or leave the ``async with`` block); an exception in the block rolls back
    and propagates."""

    def __init__(self, tm: AsyncTransactionManager) -> None:
        self.tm = tm
        self._session: AsyncServerConnection | None = None
        self.xid: p.Xid | None = None
        self._branches: list[_Enlisted] = []
        self.state = "new"
        self.report: CommitReport | None = None
        self.rollback_errors: list[BaseException] = []
        self._close_session = False

    async def begin(self) -> AsyncTransaction:
        """Takes a server session and mints the global Xid (nothing is sent)."""
        if self.state != "new":
            raise UsageError(f"begin: the transaction is {self.state.replace('_', ' ')}")
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
        ``AsyncConnection`` or an :class:`~decree.aio_branches.AsyncBranchAdapter`); ``rm``
        is the server's ``[[rm]]`` name of its database. Enlist before the connection's
        first statement. Returns the branch number (the same when enlisted again)."""
        self._check_active("enlist")
        for b in self._branches:
            if b.adapter.connection is connection or b.adapter is connection:
                return b.number
        if len(self._branches) >= p.BRANCHES_MAX:
            raise UsageError(f"a transaction has at most {p.BRANCHES_MAX} branches")
        adapter = async_adapter_for(connection, rm)
        number = len(self._branches)
        assert self.xid is not None
        await adapter.start(self.xid.branch(number))
        self._branches.append(_Enlisted(adapter, number))
        log.debug("%s: branch %d on %s", self.xid, number, adapter.rm)
        return number

    def _check_active(self, call: str) -> None:
        if self.state != "active":
            raise UsageError(f"{call}: the transaction is {self.state.replace('_', ' ')}")

    @property
    def _xid(self) -> p.Xid:
        assert self.xid is not None
        return self.xid

    # --- ending -----------------------------------------------------------------------------

    async def rollback(self) -> None:
        """Rolls every branch back; nothing is sent to the server (presumed abort)."""
        self._check_active("rollback")
        self.state = "rolling_back"
        await _run_to_end(self._rollback(), f"the rollback of {self.xid}")

    async def _rollback(self) -> None:
        try:
            await self._roll_back_all()
            self.state = "rolled_back"
        finally:
            await self._end()

    async def commit(self) -> CommitReport:
        """Commits; returns how, or raises RolledBack, OutcomeUnknown or HeuristicError."""
        self._check_active("commit")
        self.state = "committing"
        return await _run_to_end(self._commit(), f"the commit of {self.xid}")

    async def _commit(self) -> CommitReport:
        try:
            self.report = await self._commit_branches()
            self.state = "committed"
            return self.report
        except BaseException as e:
            self.state = _state_after(e)
            raise
        finally:
            await self._end()

    async def _commit_branches(self) -> CommitReport:
        if not self._branches:
            return CommitReport(self._xid, "empty")
        if len(self._branches) == 1:
            return await self._one_phase(self._branches[0])
        return await self._two_phase()

    async def _end(self) -> None:
        session, self._session = self._session, None
        if session is None:
            return
        if self._close_session:
            await session.aclose()
        else:
            await self.tm._release(session)

    async def _one_phase(self, b: _Enlisted) -> CommitReport:
        session = self._session
        assert session is not None
        told = await self._tell_one_phase(session, b)
        try:
            await b.adapter.commit_one_phase()
        except BranchEnded as e:
            self._close_session = self._close_session or told  # a told server then answers unknown.
            raise await self._ended_by_application(b, e) from e
        except BranchFailed as e:
            raise RolledBack(
                f"{self.xid}: the one-phase commit on {b.adapter.rm} failed: {e}",
                xid=self.xid, rm=b.adapter.rm, branch=b.number, cause=e,
            ) from e
        except BranchInDoubt as e:
            raise self._one_phase_unknown(session, told, b, e) from e
        if told:
            session.complete(self._xid)  # the server now remembers it committed (rule 8).
        log.debug("%s: committed in one phase on %s", self.xid, b.adapter.rm)
        return CommitReport(self._xid, "one_phase")

    async def _tell_one_phase(self, session: AsyncServerConnection, b: _Enlisted) -> bool:
        """OnePhase on a version-3 session (rule 8): the branch may commit only once the
        whole frame is written. Whether the server was told (older sessions are not)."""
        try:
            return await session.one_phase(self._xid)
        except NotSent as e:
            self._close_session = True
            errors = await self._roll_back_all()
            raise RolledBack(
                f"{self.xid}: the OnePhase notice could not be written ({e}); the branch on {b.adapter.rm} "
                "is rolled back",
                xid=self.xid, rm=b.adapter.rm, branch=b.number, cause=e, rollback_errors=errors,
            ) from e

    def _one_phase_unknown(
        self, session: AsyncServerConnection, told: bool, b: _Enlisted, cause: BranchInDoubt
    ) -> OutcomeUnknown:
        """The one-phase commit lost its answer: only the database knows. A told server
        answers unknown for the Xid once this session is closed (in progress before)."""
        why = "one-phase: only the database knows"
        if told:
            self._close_session = True
        else:
            why += f" (the server speaks protocol version {session.version} and was not told of this transaction)"
        return OutcomeUnknown(
            f"{self.xid}: {why}; the commit on {b.adapter.rm} lost its answer: {cause}", xid=self.xid, cause=cause
        )

    async def _prepare_all(self) -> None:
        for b in self._branches:
            try:
                await b.adapter.prepare()
                b.prepared = True
            except BranchEnded as e:
                raise await self._ended_by_application(b, e) from e
            except Exception as e:
                errors = await self._roll_back_all()
                raise RolledBack(
                    f"{self.xid}: branch {b.number} on {b.adapter.rm} did not prepare, every branch is "
                    f"rolled back: {e}",
                    xid=self.xid, rm=b.adapter.rm, branch=b.number, cause=e, rollback_errors=errors,
                ) from e

    async def _ended_by_application(self, b: _Enlisted, e: BranchEnded) -> BranchEndedByApplication:
        """Rolls the other branches back and says that ``b`` ended outside decree."""
        errors = await self._roll_back_all()
        return BranchEndedByApplication(
            f"{self.xid}: branch {b.number} on {b.adapter.rm} was committed or rolled back by the "
            f"application itself, which way is unknown, and every other branch is rolled back: the "
            f"transaction is not safe to retry; check {b.adapter.rm} first ({e})",
            xid=self.xid, rm=b.adapter.rm, branch=b.number, cause=e, rollback_errors=errors,
        )

    async def _two_phase(self) -> CommitReport:
        session = self._session
        assert session is not None
        await self._prepare_all()
        decision = tuple(p.Branch(b.number, b.adapter.rm) for b in self._branches)
        try:
            await session.decide(self._xid, decision)
        except NotSent as e:
            return await self._not_sent(e)
        except ServerError as e:
            return await self._refused(e)
        except (Unavailable, ProtocolError) as e:
            return await self._after_lost_reply(e)
        log.debug("%s: decided", self.xid)
        return await self._phase_two(send_complete=True)

    async def _not_sent(self, e: NotSent) -> CommitReport:
        """The Decide was never written whole: not a decision (docs/protocol.md step 5)."""
        self._close_session = True
        errors = await self._roll_back_all()
        raise RolledBack(
            f"{self.xid}: the decision was not sent ({e}); every branch is rolled back",
            xid=self.xid, cause=e, rollback_errors=errors,
        ) from e

    async def _refused(self, e: ServerError) -> CommitReport:
        if e.code == p.ErrorCode.LOG_FAILED:
            self._close_session = True
            await self._abandon_prepared()
            raise OutcomeUnknown(
                f"{self.xid}: the server's log failed while writing the decision; it may or may not "
                f"be durable, and no branch is touched until the server restarts: {e.server_message}",
                xid=self.xid, cause=e,
            ) from e
        if e.code in _REFUSED_BEFORE_WRITING:
            errors = await self._roll_back_all()
            raise RolledBack(
                f"{self.xid}: the server refused the decision, every branch is rolled back: {e}",
                xid=self.xid, cause=e, rollback_errors=errors,
            ) from e
        return await self._after_lost_reply(e)

    async def _release_attached(self) -> bool:
        # A branch attached to the connection that prepared it cannot be finished by the
        # server; "unknown" may be only that.
        held = [b for b in self._branches if b.adapter.holds_prepared]
        for b in held:
            await b.adapter.abandon()
        return bool(held)

    async def _after_lost_reply(self, cause: DecreeError) -> CommitReport:
        session = self._session
        assert session is not None
        # The old session must end for the server to answer; it is never used again.
        session.close_now(f"the answer to Decide was lost: {cause}")
        answer = await self.tm._resolve(self._xid, cause, self._release_attached)
        if answer == p.Outcome.COMMITTED:
            report = await self._phase_two(send_complete=False)
            return dataclasses.replace(report, resolved_by_outcome=True)
        if answer == p.Outcome.ROLLED_BACK:
            errors = await self._roll_back_all(quiet=True)
            raise RolledBack(
                f"{self.xid}: the answer to Decide was lost ({cause}); the server says the transaction is "
                "rolled back",
                xid=self.xid, cause=cause, rollback_errors=errors,
            ) from cause
        await self._abandon_prepared()
        if answer == p.Outcome.HEURISTIC:
            raise HeuristicError(
                f"{self.xid}: the answer to Decide was lost ({cause}); the server says a branch decided "
                "on its own: check the branches",
                xid=self.xid,
            ) from cause
        raise OutcomeUnknown(
            f"{self.xid}: the answer to Decide was lost ({cause}) and the server cannot prove the outcome; "
            "its branches are left to the server (or to `decree recover`)",
            xid=self.xid, cause=cause,
        ) from cause

    async def _commit_one(self, b: _Enlisted) -> PhaseTwo:
        try:
            return await b.adapter.commit_prepared()
        except Exception as e:  # an adapter bug must not hide that the decision is durable.
            return PhaseTwo(Step.PENDING, f"{b.adapter.rm}: {e!r}")

    async def _phase_two(self, *, send_complete: bool) -> CommitReport:
        pending: list[str] = []
        heuristics: list[HeuristicReport] = []
        for b in self._branches:
            result = await self._commit_one(b)
            if result.step == Step.PENDING:
                log.warning("%s: phase two of branch %d on %s not done, left to the server: %s",
                            self.xid, b.number, b.adapter.rm, result.detail)
                pending.append(b.adapter.rm)
                await b.adapter.abandon()
            elif result.step == Step.HEURISTIC:
                assert result.heuristic is not None
                log.error("%s: heuristic outcome on %s: %s", self.xid, b.adapter.rm, result.detail)
                heuristics.append(HeuristicReport(b.adapter.rm, b.number, result.heuristic, result.detail))
        combined = self._combined(heuristics)
        if pending:
            self._close_session = True  # the server finishes phase two once it is closed (rule 7).
        elif send_complete and self._session is not None:
            self._session.complete(self._xid, combined)
        if combined is not None and combined != p.Heuristic.COMMITTED:
            raise HeuristicError(
                f"{self.xid}: committed, but branches decided on their own: "
                + "; ".join(f"{h.rm} {h.outcome.name.lower()}: {h.detail}" for h in heuristics),
                xid=self.xid, reports=heuristics,
            )
        return CommitReport(self._xid, "two_phase", tuple(pending), tuple(heuristics))

    @staticmethod
    def _combined(heuristics: list[HeuristicReport]) -> p.Heuristic | None:
        combined: p.Heuristic | None = None
        for h in heuristics:
            combined = h.outcome.combine(combined)
        return combined

    async def _abandon_prepared(self) -> None:
        """Leaves the prepared branches to the server, touching none (outcome unknown)."""
        for b in self._branches:
            await b.adapter.abandon()

    async def _roll_back_all(self, quiet: bool = False) -> list[BaseException]:
        """Rolls back every branch; a rollback that cannot be confirmed closes the session, so
        that the server's presumed abort rolls the branch back."""
        errors: list[BaseException] = []
        for b in self._branches:
            try:
                await b.adapter.rollback()
            except Exception as e:
                errors.append(e)
                self._close_session = True
                (log.debug if quiet else log.warning)(
                    "%s: rollback of branch %d on %s not confirmed (%s); the server rolls it back once "
                    "this session is closed", self.xid, b.number, b.adapter.rm, e,
                )
        self.rollback_errors.extend(errors)
        return errors


def _state_after(e: BaseException) -> str:
    """The state of a transaction whose commit raised ``e``."""
    for kind, state in ((RolledBack, "rolled_back"), (OutcomeUnknown, "unknown"), (HeuristicError, "heuristic")):
        if isinstance(e, kind):
            return state
    return "failed"
