"""Branches for the asyncio API: database connections whose calls are coroutines.

The asynchronous twin of :mod:`decree.branches`, with the same three endings per call
(success, :class:`~decree.branches.BranchFailed`, :class:`~decree.branches.BranchInDoubt`)
and the same :class:`~decree.branches.PhaseTwo` answers, awaited:

- :class:`AsyncPsycopgBranch`, for psycopg 3's ``AsyncConnection``: decree's gid string
  goes to ``await conn.tpc_begin(gid)``, then ``tpc_prepare``, ``tpc_commit`` and
  ``tpc_rollback`` are awaited. The connection must not be in autocommit mode.

Write an :class:`AsyncBranchAdapter` for another asynchronous driver. A connection the
synchronous API drives (psycopg ``Connection``, PyMySQL) is refused here, by
:func:`async_adapter_for`, with a :class:`~decree.UsageError` that says so.
"""

from __future__ import annotations

import abc
import logging
from typing import Any

from .branches import DONE, BranchEnded, BranchFailed, BranchInDoubt, PhaseTwo, Step, _connection_lost_pg
from .errors import UsageError
from .protocol import Xid

log = logging.getLogger("decree")

__all__ = ["AsyncBranchAdapter", "AsyncPsycopgBranch", "async_adapter_for"]


class AsyncBranchAdapter(abc.ABC):
    """One asynchronous connection's branch; the coordinator awaits start, then prepare
    and commit (or a one-phase commit), or rollback, from the task that runs the
    transaction. The contract of each call is :class:`decree.BranchAdapter`'s."""

    def __init__(self, connection: Any, rm: str) -> None:
        if not isinstance(rm, str) or not 1 <= len(rm.encode()) <= 64:
            raise UsageError(f"a resource manager name is 1 to 64 bytes, not {rm!r}")
        self.connection = connection
        self.rm = rm
        self.xid: Xid | None = None

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

    @property
    def holds_prepared(self) -> bool:
        """Whether the connection holds a prepared branch no other connection can finish."""
        return False

    async def abandon(self) -> None:
        """Lets go of anything that would keep the server from finishing the branch."""


class AsyncPsycopgBranch(AsyncBranchAdapter):
    """A PostgreSQL branch on a psycopg 3 ``AsyncConnection``, through its TPC coroutines."""

    def __init__(self, connection: Any, rm: str) -> None:
        super().__init__(connection, rm)
        self._state = "idle"
        self._begun = False

    def _status(self) -> int:
        return int(self.connection.info.transaction_status)

    def _aborted(self) -> bool:
        from psycopg.pq import TransactionStatus

        return self._status() == TransactionStatus.INERROR

    async def start(self, xid: Xid) -> None:
        from psycopg.pq import TransactionStatus

        conn = self.connection
        if _connection_lost_pg(conn):
            why = "closed (its connection to the server was lost)" if getattr(conn, "broken", False) else "closed"
            raise UsageError(f"{self.rm}: the psycopg connection is {why}; enlist an open one")
        if conn.autocommit:
            raise UsageError(f"{self.rm}: a psycopg connection in a decree transaction must not be in autocommit mode")
        if self._status() != TransactionStatus.IDLE:
            raise UsageError(
                f"{self.rm}: the connection already has a transaction open; enlist it before its first "
                "statement (or commit or roll back first)"
            )
        self.xid = xid
        await self.connection.tpc_begin(xid.pg_gid())
        self._state = "active"
        # psycopg sends BEGIN with tpc_begin: from here on, no open transaction means that
        # the application ended the branch.
        self._begun = self._status() == TransactionStatus.INTRANS

    def _check_not_ended(self) -> None:
        """BranchEnded when the transaction psycopg began is gone: a ``COMMIT`` or
        ``ROLLBACK`` the application sent itself (as :class:`decree.PsycopgBranch`)."""
        from psycopg.pq import TransactionStatus

        if self._begun and self._state == "active" and self._status() == TransactionStatus.IDLE:
            raise BranchEnded(
                f"{self.rm}: the connection has no transaction open although the branch began on it: "
                "the application committed or rolled it back itself"
            )

    async def prepare(self) -> None:
        import psycopg

        self._check_not_ended()
        if self._aborted():
            # PostgreSQL would answer PREPARE TRANSACTION with a silent ROLLBACK.
            raise BranchFailed(f"{self.rm}: an earlier statement failed, the transaction is aborted")
        try:
            await self.connection.tpc_prepare()
        except psycopg.Error as e:
            if _connection_lost_pg(self.connection):
                self._state = "in_doubt"
                raise BranchInDoubt(f"{self.rm}: PREPARE TRANSACTION lost its answer: {e}") from e
            self._state = "failed"
            raise BranchFailed(f"{self.rm}: PREPARE TRANSACTION failed: {e}") from e
        self._state = "prepared"

    async def commit_one_phase(self) -> None:
        import psycopg

        self._check_not_ended()
        if self._aborted():
            await self.rollback()
            raise BranchFailed(f"{self.rm}: an earlier statement failed, the transaction is aborted")
        try:
            await self.connection.tpc_commit()
        except psycopg.Error as e:
            if _connection_lost_pg(self.connection):
                self._state = "in_doubt"
                raise BranchInDoubt(f"{self.rm}: COMMIT lost its answer: {e}") from e
            self._state = "idle"
            raise BranchFailed(f"{self.rm}: COMMIT failed: {e}") from e
        self._state = "idle"

    async def commit_prepared(self) -> PhaseTwo:
        import psycopg

        try:
            await self.connection.tpc_commit()
        except psycopg.Error as e:
            if getattr(e, "sqlstate", None) == "42704":
                self._state = "idle"
                return PhaseTwo(Step.DONE, f"{self.rm}: already committed ({e})")
            return PhaseTwo(Step.PENDING, f"{self.rm}: COMMIT PREPARED failed: {e}")
        self._state = "idle"
        return DONE

    async def rollback(self) -> None:
        import psycopg

        state, self._state = self._state, "idle"
        if state == "idle":
            return
        if state == "active" and _connection_lost_pg(self.connection):
            return  # PostgreSQL rolled the open transaction back with the session.
        try:
            await self.connection.tpc_rollback()  # ROLLBACK, or ROLLBACK PREPARED once prepared.
        except psycopg.Error as e:
            if getattr(e, "sqlstate", None) == "42704" or state == "active" and _connection_lost_pg(self.connection):
                return  # never prepared, or already rolled back.
            self._state = state
            raise


def async_adapter_for(connection: Any, rm: str) -> AsyncBranchAdapter:
    """The adapter of an asynchronous driver's connection, recognised by its class
    (subclasses too): a psycopg 3 ``AsyncConnection``, or an adapter as is. A connection
    of the synchronous API, or an unknown object, is refused."""
    from .drivers import Driver, driver_of, refusal

    driver = driver_of(connection)
    if driver == Driver.ASYNC_BRANCH_ADAPTER:
        return connection  # type: ignore[no-any-return]
    if driver == Driver.PSYCOPG_ASYNC:
        return AsyncPsycopgBranch(connection, rm)
    raise refusal(connection, "tm.atransaction()")
