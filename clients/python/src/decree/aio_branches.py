"""Branches for the asyncio API: database connections whose calls are coroutines.

The asynchronous twin of :mod:`decree.branches`, with the same three endings per call
(success, :class:`~decree.branches.BranchFailed`, :class:`~decree.branches.BranchInDoubt`)
and the same :class:`~decree.branches.PhaseTwo` answers, awaited:

- :class:`AsyncPsycopgBranch`, for psycopg 3's ``AsyncConnection``: decree's gid string
  goes to ``await conn.tpc_begin(gid)``, then ``tpc_prepare``, ``tpc_commit`` and
  ``tpc_rollback`` are awaited. The connection must not be in autocommit mode. What its
  status and errors mean is :class:`~decree.branches.PsycopgRules`', the same code as
  :class:`decree.PsycopgBranch`'s; this class only awaits the driver's calls.
- :class:`AsyncMySQLBranch`, for aiomysql's ``Connection`` (MariaDB, MySQL; opened with
  ``autocommit=True``): the adapter sends ``XA START/END/PREPARE/COMMIT/ROLLBACK`` itself,
  awaited. Its statements and what their errors mean are
  :class:`~decree.branches.MySQLRules`', the same code as :class:`decree.PyMySQLBranch`'s
  (aiomysql raises PyMySQL's errors); this class only awaits the queries.

Write an :class:`AsyncBranchAdapter` for another asynchronous driver. A connection the
synchronous API drives (psycopg ``Connection``, PyMySQL ``Connection``) is refused here, by
:func:`async_adapter_for`, with a :class:`~decree.UsageError` that says so.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ._engine import run_awaited
from .branches import DONE, MySQLRules, PhaseTwo, PsycopgRules, _Adapter
from .protocol import Xid

log = logging.getLogger("decree")

__all__ = ["AsyncBranchAdapter", "AsyncMySQLBranch", "AsyncPsycopgBranch", "async_adapter_for"]


class AsyncBranchAdapter(_Adapter, abc.ABC):
    """One asynchronous connection's branch; the coordinator awaits start, then prepare
    and commit (or a one-phase commit), or rollback, from the task that runs the
    transaction. The contract of each call is :class:`decree.BranchAdapter`'s."""

    @abc.abstractmethod
    async def start(self, xid: Xid) -> None:
        """Starts the branch ``xid`` on the connection (before the application's SQL)."""

    @abc.abstractmethod
    async def prepare(self) -> None:
        """Phase one; BranchFailed or BranchInDoubt when the branch is not surely prepared."""

    @abc.abstractmethod
    async def commit_one_phase(self) -> None:
        """Commits the branch, the transaction's only one, without preparing it."""

    @abc.abstractmethod
    async def commit_prepared(self) -> PhaseTwo:
        """Phase two of a prepared branch."""

    @abc.abstractmethod
    async def rollback(self) -> None:
        """Rolls the branch back in whatever state it is; raises when that cannot be confirmed."""

    async def abandon(self) -> None:
        """Lets go of anything that would keep the server from finishing the branch."""


class AsyncPsycopgBranch(PsycopgRules, AsyncBranchAdapter):
    """A PostgreSQL branch on a psycopg 3 ``AsyncConnection``, through its TPC coroutines;
    what the connection's status and the driver's errors mean is
    :class:`decree.branches.PsycopgRules`', as for :class:`decree.PsycopgBranch`."""

    async def start(self, xid: Xid) -> None:
        await self.connection.tpc_begin(self._gid(xid))
        self._started()

    async def prepare(self) -> None:
        aborted = self._refused_before()
        if aborted is not None:
            raise aborted
        await self._settled(self.connection.tpc_prepare, "PREPARE TRANSACTION", "failed")
        self._state = "prepared"

    async def commit_one_phase(self) -> None:
        aborted = self._refused_before()
        if aborted is not None:
            await self.rollback()
            raise aborted
        await self._settled(self.connection.tpc_commit, "COMMIT", "idle")
        self._state = "idle"

    async def _settled(self, call: Callable[[], Awaitable[object]], statement: str, state: str) -> None:
        """Awaits the driver's ``call`` of ``statement``; its error is what :meth:`_failed` says."""
        import psycopg

        try:
            await call()
        except psycopg.Error as e:
            raise self._failed(e, statement, state) from e

    async def commit_prepared(self) -> PhaseTwo:
        import psycopg

        try:
            await self.connection.tpc_commit()
        except psycopg.Error as e:
            return self._phase_two_failed(e)
        self._state = "idle"
        return DONE

    async def rollback(self) -> None:
        import psycopg

        state = self._rollback_from()
        if state is None:
            return
        try:
            await self.connection.tpc_rollback()  # ROLLBACK, or ROLLBACK PREPARED once prepared.
        except psycopg.Error as e:
            if not self._rolled_back_anyway(state, e):
                raise


class AsyncMySQLBranch(MySQLRules, AsyncBranchAdapter):
    """A MariaDB/MySQL branch on an aiomysql ``Connection``: the adapter sends the XA
    statements of :class:`decree.branches.MySQLRules`, as :class:`decree.PyMySQLBranch`
    does, and awaits them. Open the connection with ``autocommit=True``."""

    _DRIVER = "aiomysql"

    def _is_open(self) -> bool:
        return not self.connection.closed

    async def _query(self, sql: str) -> Any:
        async with self.connection.cursor() as cur:
            await cur.execute(sql)
            return await cur.fetchall()

    async def start(self, xid: Xid) -> None:
        await run_awaited(self._start_steps(xid))

    async def prepare(self) -> None:
        await run_awaited(self._prepare_steps())

    async def commit_one_phase(self) -> None:
        await run_awaited(self._commit_one_phase_steps())

    async def commit_prepared(self) -> PhaseTwo:
        return await run_awaited(self._commit_prepared_steps())

    async def rollback(self) -> None:
        await run_awaited(self._rollback_steps())

    async def abandon(self) -> None:
        await run_awaited(self._abandon_steps())


def async_adapter_for(connection: Any, rm: str) -> AsyncBranchAdapter:
    """The adapter of an asynchronous driver's connection, recognised by its class
    (subclasses too): a psycopg 3 ``AsyncConnection``, an aiomysql ``Connection``, or an
    adapter as is. A connection of the synchronous API, or an unknown object, is refused."""
    from .drivers import Driver, driver_of, refusal

    driver = driver_of(connection)
    if driver == Driver.ASYNC_BRANCH_ADAPTER:
        return connection  # type: ignore[no-any-return]
    if driver == Driver.PSYCOPG_ASYNC:
        return AsyncPsycopgBranch(connection, rm)
    if driver == Driver.AIOMYSQL:
        return AsyncMySQLBranch(connection, rm)
    raise refusal(connection, "tm.atransaction()")
