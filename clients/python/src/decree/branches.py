"""Branches: one database connection's part of a transaction, driven by the coordinator.

A branch adapter runs the statements of docs/protocol.md ("Branches in the databases") on
the application's own connection, so that the application's SQL on that connection is
the branch:

- :class:`PsycopgBranch`, for psycopg 3 (and any DB-API connection with the two-phase
  extension: ``tpc_begin``, ``tpc_prepare``, ``tpc_commit``, ``tpc_rollback``): decree's
  gid string is passed to ``tpc_begin``, which the driver uses unchanged as the
  PostgreSQL gid, so the branch is prepared by the driver's own ``PREPARE TRANSACTION``
  and recognised by the server's recovery. The connection must not be in autocommit mode.
- :class:`PyMySQLBranch`, for PyMySQL (MariaDB, MySQL), which has no two-phase extension:
  the adapter sends ``XA START/END/PREPARE/COMMIT/ROLLBACK`` with the xid in decree's
  form itself. The connection must be in autocommit mode (``autocommit=True``): with it
  off, MariaDB answers ``XAER_OUTSIDE`` instead of "unknown XID" to a commit by name.
  Its statements, and what their errors mean, are :class:`MySQLRules`', which the asyncio
  :class:`decree.AsyncMySQLBranch` (aiomysql) runs as well.

Each call ends in one of three ways, which the coordinator turns into the transaction's
outcome: it succeeded, it failed and the branch is rolled back (:class:`BranchFailed`), or
its answer was lost and the branch may be prepared or committed (:class:`BranchInDoubt`).
A branch the application ended itself is reported with :class:`BranchEnded`.
Phase two returns a :class:`PhaseTwo` instead: done, not done yet (the server finishes
it), or decided on its own (heuristic).

:class:`PsycopgRules` is the part of a psycopg branch that does no IO (the checks before
each call and what its errors mean); the blocking :class:`PsycopgBranch` and the asyncio
:class:`decree.AsyncPsycopgBranch` both make their driver's calls around it.
"""

from __future__ import annotations

import abc
import enum
import logging
import weakref
from dataclasses import dataclass
from typing import Any, Callable

from ._engine import Call, Steps, run_blocking
from .errors import UsageError
from .protocol import Heuristic, Xid

log = logging.getLogger("decree")


class BranchFailed(Exception):
    """The branch is rolled back (a failed statement, a "no" vote); nothing of it is prepared."""


class BranchInDoubt(Exception):
    """The answer was lost: the branch may be prepared (or, for a one-phase commit, committed)."""


class BranchEnded(Exception):
    """The branch is no longer open on its connection although nothing of the coordinator
    ended it: the application committed or rolled it back itself, and which way is not
    known. Raised by ``prepare`` or ``commit_one_phase`` before they touch the branch."""


class Step(enum.Enum):
    DONE = "done"
    PENDING = "pending"
    HEURISTIC = "heuristic"


@dataclass(frozen=True)
class PhaseTwo:
    """What one commit of a prepared branch did."""

    step: Step
    detail: str = ""
    heuristic: Heuristic | None = None


DONE = PhaseTwo(Step.DONE)


class _Adapter:
    """What an adapter is, blocking or asyncio: its connection, the name of the server's
    ``[[rm]]`` entry for its database (1 to 64 bytes), and the branch's Xid once started."""

    def __init__(self, connection: Any, rm: str) -> None:
        if not isinstance(rm, str) or not 1 <= len(rm.encode()) <= 64:
            raise UsageError(f"a resource manager name is 1 to 64 bytes, not {rm!r}")
        self.connection = connection
        self.rm = rm
        self.xid: Xid | None = None

    @property
    def holds_prepared(self) -> bool:
        """Whether the connection holds a prepared branch no other connection can finish."""
        return False


class BranchAdapter(_Adapter, abc.ABC):
    """One connection's branch; the coordinator calls start, then prepare and commit (or a
    one-phase commit), or rollback, from the thread that runs the transaction."""

    @abc.abstractmethod
    def start(self, xid: Xid) -> None:
        """Starts the branch ``xid`` on the connection (before the application's SQL)."""

    @abc.abstractmethod
    def prepare(self) -> None:
        """Phase one; BranchFailed or BranchInDoubt when the branch is not surely prepared."""

    @abc.abstractmethod
    def commit_one_phase(self) -> None:
        """Commits the branch, the transaction's only one, without preparing it."""

    @abc.abstractmethod
    def commit_prepared(self) -> PhaseTwo:
        """Phase two of a prepared branch."""

    @abc.abstractmethod
    def rollback(self) -> None:
        """Rolls the branch back in whatever state it is; raises when that cannot be confirmed."""

    def abandon(self) -> None:
        """Lets go of anything that would keep the server from finishing the branch
        (nothing by default); called before the branch is left to the server."""


def _connection_lost_pg(connection: Any) -> bool:
    return bool(getattr(connection, "closed", False) or getattr(connection, "broken", False))


class PsycopgRules:
    """The state of a PostgreSQL branch on a psycopg 3 connection, and what the connection's
    status and the driver's errors mean: the part of :class:`PsycopgBranch` and
    :class:`decree.AsyncPsycopgBranch` that does no IO (psycopg keeps the status, ``closed``,
    ``broken`` and ``autocommit`` on the connection object). The adapters make the driver's
    calls, blocking or awaited, and ask these methods before and after each."""

    connection: Any
    rm: str
    xid: Xid | None

    def __init__(self, connection: Any, rm: str) -> None:
        super().__init__(connection, rm)  # type: ignore[call-arg]  # the adapter's base class (_Adapter).
        self._state = "idle"
        self._begun = False

    def _status(self) -> int:
        return int(self.connection.info.transaction_status)

    def _gid(self, xid: Xid) -> str:
        """Checks that the connection can start a branch; the gid to begin it with."""
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
        return xid.pg_gid()

    def _started(self) -> None:
        """After ``tpc_begin``. psycopg sends BEGIN with it: from here on, no open transaction
        means that the application ended the branch (a driver that began lazily would not be
        blamed)."""
        from psycopg.pq import TransactionStatus

        self._state = "active"
        self._begun = self._status() == TransactionStatus.INTRANS

    def _refused_before(self) -> BranchFailed | None:
        """Before a prepare or a one-phase commit: BranchEnded when the transaction psycopg
        began is gone (a ``COMMIT`` or ``ROLLBACK`` the application sent itself, after which
        PREPARE TRANSACTION would only warn, and a one-phase commit would do nothing); the
        BranchFailed to raise when an earlier statement failed (PostgreSQL would answer
        PREPARE TRANSACTION with a silent ROLLBACK); ``None`` to go on."""
        from psycopg.pq import TransactionStatus

        status = self._status()
        if self._begun and self._state == "active" and status == TransactionStatus.IDLE:
            raise BranchEnded(
                f"{self.rm}: the connection has no transaction open although the branch began on it: "
                "the application committed or rolled it back itself"
            )
        if status == TransactionStatus.INERROR:
            return BranchFailed(f"{self.rm}: an earlier statement failed, the transaction is aborted")
        return None

    def _failed(self, e: Exception, statement: str, state: str) -> BranchFailed | BranchInDoubt:
        """What an error of ``statement`` (PREPARE TRANSACTION, COMMIT) means: a lost
        connection lost the answer (in doubt); anything else failed, leaving ``state``."""
        if _connection_lost_pg(self.connection):
            self._state = "in_doubt"
            return BranchInDoubt(f"{self.rm}: {statement} lost its answer: {e}")
        self._state = state
        return BranchFailed(f"{self.rm}: {statement} failed: {e}")

    def _phase_two_failed(self, e: Exception) -> PhaseTwo:
        """What an error of COMMIT PREPARED means: done when the gid is unknown (committed
        already), else not done yet (the server finishes it)."""
        if getattr(e, "sqlstate", None) == "42704":
            self._state = "idle"
            return PhaseTwo(Step.DONE, f"{self.rm}: already committed ({e})")
        return PhaseTwo(Step.PENDING, f"{self.rm}: COMMIT PREPARED failed: {e}")

    def _rollback_from(self) -> str | None:
        """The state a rollback starts from, or ``None`` when there is nothing to roll back
        (nothing begun, or PostgreSQL rolled the open transaction back with the session)."""
        state, self._state = self._state, "idle"
        if state == "idle" or state == "active" and _connection_lost_pg(self.connection):
            return None
        return state

    def _rolled_back_anyway(self, state: str, e: Exception) -> bool:
        """Whether an error of the rollback from ``state`` still leaves the branch rolled
        back (never prepared, or already rolled back); if not, the state is kept."""
        if getattr(e, "sqlstate", None) == "42704" or state == "active" and _connection_lost_pg(self.connection):
            return True
        self._state = state
        return False


class PsycopgBranch(PsycopgRules, BranchAdapter):
    """A PostgreSQL branch on a psycopg 3 connection, through the driver's TPC API."""

    def start(self, xid: Xid) -> None:
        self.connection.tpc_begin(self._gid(xid))
        self._started()

    def prepare(self) -> None:
        aborted = self._refused_before()
        if aborted is not None:
            raise aborted
        self._settled(self.connection.tpc_prepare, "PREPARE TRANSACTION", "failed")
        self._state = "prepared"

    def commit_one_phase(self) -> None:
        aborted = self._refused_before()
        if aborted is not None:
            self.rollback()
            raise aborted
        self._settled(self.connection.tpc_commit, "COMMIT", "idle")
        self._state = "idle"

    def _settled(self, call: Callable[[], object], statement: str, state: str) -> None:
        """Makes the driver's ``call`` of ``statement``; its error is what :meth:`_failed` says."""
        import psycopg

        try:
            call()
        except psycopg.Error as e:
            raise self._failed(e, statement, state) from e

    def commit_prepared(self) -> PhaseTwo:
        import psycopg

        try:
            self.connection.tpc_commit()
        except psycopg.Error as e:
            return self._phase_two_failed(e)
        self._state = "idle"
        return DONE

    def rollback(self) -> None:
        import psycopg

        state = self._rollback_from()
        if state is None:
            return
        try:
            self.connection.tpc_rollback()  # ROLLBACK, or ROLLBACK PREPARED once prepared.
        except psycopg.Error as e:
            if not self._rolled_back_anyway(state, e):
                raise


_CONNECTION_IDS: weakref.WeakKeyDictionary[Any, tuple[int, int]] = weakref.WeakKeyDictionary()
"""Per MariaDB connection (PyMySQL or aiomysql): its handshake thread id and its full
``CONNECTION_ID()``."""

_MYSQL_CONNECTION_LOST = frozenset({0, 2006, 2013, 2014, 2045, 2055})
_XAER_NOTA = 1397
_XAER_RMFAIL = 1399
_XA_RB = frozenset({1402, 1613, 1614})


def _mysql_code(e: BaseException) -> int:
    args = getattr(e, "args", ())
    return args[0] if args and isinstance(args[0], int) else 0


class MySQLRules:
    """A MariaDB/MySQL branch driven with ``XA`` statements the adapter sends itself: the
    whole of :class:`PyMySQLBranch` and :class:`decree.AsyncMySQLBranch` but the IO. Each
    call is an engine (:mod:`decree._engine`) that yields the statements to run and is sent
    their rows (or has the driver's error thrown in); the blocking adapter runs them with
    PyMySQL, the asyncio one awaits them with aiomysql, which raises PyMySQL's errors. What
    the errors mean (a lost connection, a branch the application ended, an XA name already
    gone), the branch's name carrying the connection id and its states are decided here.

    An adapter sets :attr:`_DRIVER` (its name in messages) and provides
    ``_query(sql) -> rows`` (blocking or a coroutine) and :meth:`_is_open`."""

    connection: Any
    rm: str
    xid: Xid | None
    _DRIVER = "PyMySQL"

    def __init__(self, connection: Any, rm: str) -> None:
        super().__init__(connection, rm)  # type: ignore[call-arg]  # the adapter's base class (_Adapter).
        self._state = "idle"
        self._name: Xid | None = None
        self._thread = 0
        self._x = ""

    def _is_open(self) -> bool:
        return bool(getattr(self.connection, "open", True))

    def _sql(self, sql: str) -> Call:
        return Call(self, "_query", (sql,))

    def _connection_id_steps(self) -> Steps[int]:
        """The connection's full ``CONNECTION_ID()``, which names its branches: read once
        per server connection, since the handshake's thread id (which tells when the driver
        reconnected) holds only its low 32 bits, and through a proxy not even those."""
        handshake = self.connection.thread_id()
        known = _CONNECTION_IDS.get(self.connection)
        if known is not None and known[0] == handshake:
            return known[1]
        rows = yield self._sql("SELECT CONNECTION_ID()")
        full = int(rows[0][0])
        _CONNECTION_IDS[self.connection] = (handshake, full)
        return full

    def _lost(self, e: BaseException) -> bool:
        import pymysql

        return isinstance(e, pymysql.err.InterfaceError) or _mysql_code(e) in _MYSQL_CONNECTION_LOST

    def _check_not_ended(self, e: BaseException) -> None:
        """BranchEnded when ``XA END`` found no XA transaction on the connection although
        the branch is still active here: the application sent ``XA END`` and ``XA COMMIT``
        or ``XA ROLLBACK`` itself (MariaDB refuses plain COMMIT and ROLLBACK in a branch).
        A connection the driver reconnected lost the branch with its old session instead."""
        gone = _mysql_code(e) == _XAER_RMFAIL and "NON-EXISTING" in str(e)
        if self._state != "active" or not gone or self.connection.thread_id() != self._thread:
            return
        self._state = "idle"
        raise BranchEnded(
            f"{self.rm}: the connection has no XA transaction although the branch began on it: "
            f"the application committed or rolled it back itself ({e})"
        ) from e

    def _start_steps(self, xid: Xid) -> Steps[None]:
        if not self._is_open():
            raise UsageError(f"{self.rm}: the {self._DRIVER} connection is closed; enlist an open one")
        if not self.connection.get_autocommit():
            raise UsageError(
                f"{self.rm}: open the {self._DRIVER} connection with autocommit=True; XA branches need it "
                "(MariaDB answers XAER_OUTSIDE to a commit by name otherwise)"
            )
        self.xid = xid
        self._name = xid.mariadb_name((yield from self._connection_id_steps()))
        self._thread = self.connection.thread_id()
        self._x = self._name.mysql_xid()
        yield self._sql(f"XA START {self._x}")
        self._state = "active"

    def _prepare_steps(self) -> Steps[None]:
        import pymysql

        try:
            yield self._sql(f"XA END {self._x}")
            self._state = "ended"
            yield self._sql(f"XA PREPARE {self._x}")
        except pymysql.err.Error as e:
            if self._lost(e):
                self._state = "in_doubt"
                raise BranchInDoubt(f"{self.rm}: XA PREPARE lost its answer: {e}") from e
            self._check_not_ended(e)
            self._state = "failed"
            raise BranchFailed(f"{self.rm}: XA END/PREPARE failed: {e}") from e
        self._state = "prepared"

    def _commit_one_phase_steps(self) -> Steps[None]:
        import pymysql

        try:
            yield self._sql(f"XA END {self._x}")
            self._state = "ended"
            yield self._sql(f"XA COMMIT {self._x} ONE PHASE")
        except pymysql.err.Error as e:
            if self._lost(e):
                self._state = "idle"
                raise BranchInDoubt(f"{self.rm}: XA COMMIT ONE PHASE lost its answer: {e}") from e
            self._check_not_ended(e)
            try:
                yield from self._rollback_steps()
            except Exception as e2:
                log.debug("%s: rollback after a failed commit: %s", self.rm, e2)
            raise BranchFailed(f"{self.rm}: XA COMMIT ONE PHASE failed: {e}") from e
        self._state = "idle"

    def _listed_steps(self) -> Steps[bool]:
        """Whether XA RECOVER (on this connection) still lists the branch."""
        assert self._name is not None
        rows = yield self._sql("XA RECOVER")
        return any(
            Xid.from_xa_recover(int(r[0]), int(r[1]), int(r[2]), bytes(r[3])) == self._name for r in rows
        )

    def _commit_prepared_steps(self) -> Steps[PhaseTwo]:
        import pymysql

        try:
            yield self._sql(f"XA COMMIT {self._x}")
        except pymysql.err.Error as e:
            code = _mysql_code(e)
            if code in _XA_RB:
                self._state = "idle"
                return PhaseTwo(Step.HEURISTIC, f"{self.rm}: rolled back on its own: {e}", Heuristic.ROLLED_BACK)
            if code == _XAER_NOTA:
                try:
                    listed = yield from self._listed_steps()
                except pymysql.err.Error as e2:
                    return PhaseTwo(Step.PENDING, f"{self.rm}: XA COMMIT: {e}; XA RECOVER failed: {e2}")
                if not listed:
                    self._state = "idle"
                    return PhaseTwo(Step.DONE, f"{self.rm}: already committed ({e})")
            return PhaseTwo(Step.PENDING, f"{self.rm}: XA COMMIT failed: {e}")
        self._state = "idle"
        return DONE

    def _rollback_steps(self) -> Steps[None]:
        import pymysql

        state, self._state = self._state, "idle"
        if state == "idle":
            return
        if state in ("active", "ended", "failed"):
            # Not prepared: XA ROLLBACK, or else closing the session rolls it back.
            try:
                if state == "active":
                    yield self._sql(f"XA END {self._x}")
                yield self._sql(f"XA ROLLBACK {self._x}")
            except pymysql.err.Error as e:
                log.debug("%s: rollback of a branch that was not prepared: %s; closing the connection", self.rm, e)
                yield from self._close_steps()
            return
        try:
            yield self._sql(f"XA ROLLBACK {self._x}")
        except pymysql.err.Error as e:
            if _mysql_code(e) in _XA_RB or _mysql_code(e) == _XAER_NOTA:
                return  # rolled back already (on its own connection, "unknown" means gone).
            self._state = state
            yield from self._close_steps()  # detaches a prepared branch so that the server can roll it back.
            raise

    @property
    def holds_prepared(self) -> bool:
        return self._state in ("prepared", "in_doubt", "ended")

    def _abandon_steps(self) -> Steps[None]:
        """Closes the connection of a prepared (or possibly prepared) branch, which stays
        attached to it (MariaDB lets no other connection finish it), so that the server can
        finish it by name. The server first waits until the connection named in the branch
        has let go of it (MariaDB lists the branch for others before it detaches it, and an
        XA COMMIT by name in between answers OK and commits nothing: docs/protocol.md)."""
        if not self.holds_prepared:
            return
        self._state = "idle"
        yield from self._close_steps()

    def _close_steps(self) -> Steps[None]:
        """Closes the connection (both drivers' ``close()`` is a plain call)."""
        try:
            yield Call(self.connection, "close")
        except Exception as e:
            log.debug("%s: closing the connection: %s", self.rm, e)


class PyMySQLBranch(MySQLRules, BranchAdapter):
    """A MariaDB/MySQL branch on a PyMySQL connection: the adapter sends the XA statements
    (:class:`MySQLRules`), blocking."""

    def _query(self, sql: str) -> Any:
        with self.connection.cursor() as cur:
            cur.execute(sql)
            return cur.fetchall()

    def start(self, xid: Xid) -> None:
        run_blocking(self._start_steps(xid))

    def prepare(self) -> None:
        run_blocking(self._prepare_steps())

    def commit_one_phase(self) -> None:
        run_blocking(self._commit_one_phase_steps())

    def commit_prepared(self) -> PhaseTwo:
        return run_blocking(self._commit_prepared_steps())

    def rollback(self) -> None:
        run_blocking(self._rollback_steps())

    def abandon(self) -> None:
        run_blocking(self._abandon_steps())


def adapter_for(connection: Any, rm: str) -> BranchAdapter:
    """The adapter of a driver's connection, recognised by its class (subclasses too):
    psycopg 3 or PyMySQL, or an adapter as is. Anything else, such as a psycopg
    ``AsyncConnection`` or an aiomysql connection (``tm.atransaction()`` drives them), is
    refused."""
    from .drivers import Driver, driver_of, refusal

    driver = driver_of(connection)
    if driver == Driver.BRANCH_ADAPTER:
        return connection  # type: ignore[no-any-return]
    if driver == Driver.PSYCOPG:
        return PsycopgBranch(connection, rm)
    if driver == Driver.PYMYSQL:
        return PyMySQLBranch(connection, rm)
    raise refusal(connection, "tm.transaction()")
