"""The rules of a PostgreSQL branch on a psycopg 3 connection (decree.branches.PsycopgRules),
which the blocking PsycopgBranch and the asyncio AsyncPsycopgBranch share, checked without
a database: a stand-in connection has the status psycopg keeps on its object and answers
the two-phase calls as scripted; each case runs through both adapters and must end the
same in both."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import psycopg
import psycopg.errors
import pytest
from psycopg.pq import TransactionStatus

import decree
from decree import protocol as p
from decree.branches import DONE, BranchEnded, BranchFailed, BranchInDoubt, PhaseTwo, Step

XID = p.Xid.decree(7, 1, 5, 1).branch(0)
UNKNOWN_GID = psycopg.errors.UndefinedObject("prepared transaction does not exist")


class Info:
    def __init__(self) -> None:
        self.transaction_status = TransactionStatus.IDLE


class Stand:
    """What the rules read of a psycopg connection, and its two-phase calls: each does
    what ``effects`` says (an exception to raise, or a status to move to, or a status
    and ``lose`` to close the connection on the way)."""

    def __init__(self, *, autocommit: bool = False, **effects: Any) -> None:
        self.info = Info()
        self.autocommit = autocommit
        self.closed = False
        self.broken = False
        self.effects = effects
        self.calls: list[str] = []

    def _do(self, name: str, status: TransactionStatus) -> None:
        self.calls.append(name)
        effect = self.effects.get(name)
        if effect == "lose":
            self.closed = self.broken = True
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        if isinstance(effect, BaseException):
            raise effect
        self.info.transaction_status = status

    def tpc_begin(self, gid: str) -> None:
        assert gid == XID.pg_gid()
        self._do("tpc_begin", TransactionStatus.INTRANS)

    def tpc_prepare(self) -> None:
        self._do("tpc_prepare", TransactionStatus.IDLE)

    def tpc_commit(self) -> None:
        self._do("tpc_commit", TransactionStatus.IDLE)

    def tpc_rollback(self) -> None:
        self._do("tpc_rollback", TransactionStatus.IDLE)


class AsyncStand(Stand):
    """The same, with the calls as coroutines (psycopg's AsyncConnection)."""

    async def tpc_begin(self, gid: str) -> None:  # type: ignore[override]
        super().tpc_begin(gid)

    async def tpc_prepare(self) -> None:  # type: ignore[override]
        super().tpc_prepare()

    async def tpc_commit(self) -> None:  # type: ignore[override]
        super().tpc_commit()

    async def tpc_rollback(self) -> None:  # type: ignore[override]
        super().tpc_rollback()


class Both:
    """One branch through either adapter, called the blocking way."""

    def __init__(self, api: str, **effects: Any) -> None:
        self.api = api
        if api == "sync":
            self.conn: Stand = Stand(**effects)
            self.branch: Any = decree.PsycopgBranch(self.conn, "pg-a")
        else:
            self.conn = AsyncStand(**effects)
            self.branch = decree.AsyncPsycopgBranch(self.conn, "pg-a")

    def __getattr__(self, method: str) -> Any:
        def call(*args: Any) -> Any:
            result = getattr(self.branch, method)(*args)
            return asyncio.run(result) if self.api == "async" else result

        return call

    @property
    def state(self) -> str:
        return str(self.branch._state)


APIS = pytest.mark.parametrize("api", ["sync", "async"])


@APIS
def test_a_branch_begins_on_an_idle_connection_and_prepares_and_commits(api: str) -> None:
    b = Both(api)
    b.start(XID)
    assert b.branch.xid == XID and b.state == "active" and b.branch._begun
    b.prepare()
    assert b.state == "prepared"
    assert b.commit_prepared() is DONE and b.state == "idle"
    assert b.conn.calls == ["tpc_begin", "tpc_prepare", "tpc_commit"]


@APIS
@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ({"closed": True}, "the psycopg connection is closed; enlist an open one"),
        ({"closed": True, "broken": True}, "is closed (its connection to the server was lost)"),
        ({"autocommit": True}, "must not be in autocommit mode"),
        ({"status": TransactionStatus.INTRANS}, "already has a transaction open; enlist it before its first"),
    ],
)
def test_a_connection_that_cannot_start_a_branch_is_refused_before_any_call(
    api: str, setup: dict[str, Any], message: str
) -> None:
    b = Both(api)
    b.conn.closed = setup.get("closed", False)
    b.conn.broken = setup.get("broken", False)
    b.conn.autocommit = setup.get("autocommit", False)
    b.conn.info.transaction_status = setup.get("status", TransactionStatus.IDLE)
    with pytest.raises(decree.UsageError, match=re.escape(message)):
        b.start(XID)
    assert b.conn.calls == [] and b.branch.xid is None


@APIS
def test_a_driver_that_begins_lazily_is_not_taken_for_an_ended_branch(api: str) -> None:
    b = Both(api)
    b.start(XID)
    b.branch._begun = False  # as if tpc_begin had sent no BEGIN: the status stays idle.
    b.conn.info.transaction_status = TransactionStatus.IDLE
    b.prepare()
    assert b.state == "prepared"


@APIS
@pytest.mark.parametrize("method", ["prepare", "commit_one_phase"])
def test_a_branch_the_application_committed_itself_is_reported_ended(api: str, method: str) -> None:
    b = Both(api)
    b.start(XID)
    b.conn.info.transaction_status = TransactionStatus.IDLE  # the application sent COMMIT.
    with pytest.raises(BranchEnded, match="the application committed or rolled it back itself"):
        getattr(b, method)()
    assert b.conn.calls == ["tpc_begin"]


@APIS
@pytest.mark.parametrize(
    ("method", "calls"),
    [
        ("prepare", ["tpc_begin"]),  # PostgreSQL would answer PREPARE TRANSACTION with a silent ROLLBACK.
        ("commit_one_phase", ["tpc_begin", "tpc_rollback"]),  # rolled back instead of committed.
    ],
)
def test_an_aborted_transaction_is_neither_prepared_nor_committed(api: str, method: str, calls: list[str]) -> None:
    b = Both(api)
    b.start(XID)
    b.conn.info.transaction_status = TransactionStatus.INERROR
    with pytest.raises(BranchFailed, match="an earlier statement failed, the transaction is aborted"):
        getattr(b, method)()
    assert b.conn.calls == calls


@APIS
@pytest.mark.parametrize(
    ("method", "call", "statement", "failed_state"),
    [("prepare", "tpc_prepare", "PREPARE TRANSACTION", "failed"), ("commit_one_phase", "tpc_commit", "COMMIT", "idle")],
)
def test_an_error_is_in_doubt_when_the_connection_was_lost_and_failed_otherwise(
    api: str, method: str, call: str, statement: str, failed_state: str
) -> None:
    lost = Both(api, **{call: "lose"})
    lost.start(XID)
    with pytest.raises(BranchInDoubt, match=f"pg-a: {statement} lost its answer"):
        getattr(lost, method)()
    assert lost.state == "in_doubt"
    failed = Both(api, **{call: psycopg.errors.SerializationFailure("could not serialize")})
    failed.start(XID)
    with pytest.raises(BranchFailed, match=f"pg-a: {statement} failed: could not serialize"):
        getattr(failed, method)()
    assert failed.state == failed_state


@APIS
def test_phase_two_of_an_unknown_gid_is_done_and_any_other_error_pending(api: str) -> None:
    done = Both(api, tpc_commit=UNKNOWN_GID)
    done.start(XID)
    done.prepare()
    result = done.commit_prepared()
    assert result.step == Step.DONE and "already committed" in result.detail and done.state == "idle"
    pending = Both(api, tpc_commit="lose")
    pending.start(XID)
    pending.prepare()
    result = pending.commit_prepared()
    assert isinstance(result, PhaseTwo) and result.step == Step.PENDING and pending.state == "prepared"
    assert "COMMIT PREPARED failed" in result.detail


@APIS
def test_a_rollback_of_nothing_or_of_a_lost_open_transaction_makes_no_call(api: str) -> None:
    idle = Both(api)
    idle.rollback()
    assert idle.conn.calls == []
    lost = Both(api)
    lost.start(XID)
    lost.conn.closed = True
    lost.rollback()
    assert lost.conn.calls == ["tpc_begin"] and lost.state == "idle", "PostgreSQL rolled it back with the session"


@APIS
def test_a_rollback_of_a_gid_already_gone_counts_as_done(api: str) -> None:
    b = Both(api, tpc_rollback=UNKNOWN_GID)
    b.start(XID)
    b.prepare()
    b.rollback()
    assert b.state == "idle"


@APIS
def test_a_rollback_that_fails_keeps_the_state_and_raises(api: str) -> None:
    b = Both(api, tpc_rollback=psycopg.errors.AdminShutdown("terminating"))
    b.start(XID)
    b.prepare()
    with pytest.raises(psycopg.errors.AdminShutdown):
        b.rollback()
    assert b.state == "prepared", "the branch may still be prepared: the coordinator leaves it to the server"


@pytest.mark.parametrize("rm", ["", "x" * 65, 7])
@pytest.mark.parametrize("cls", [decree.PsycopgBranch, decree.AsyncPsycopgBranch])
def test_a_resource_manager_name_is_1_to_64_bytes_in_both_apis(rm: Any, cls: Any) -> None:
    with pytest.raises(decree.UsageError, match="a resource manager name is 1 to 64 bytes"):
        cls(Stand(), rm)
    assert not cls(Stand(), "x" * 64).holds_prepared
