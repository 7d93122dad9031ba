"""The rules of a MariaDB branch (decree.branches.MySQLRules), which the blocking
PyMySQLBranch and the asyncio AsyncMySQLBranch share, checked without a database for the
answers a real server gives rarely (a lost answer, a branch rolled back on its own, an XA
name already gone): a stand-in connection answers each statement as scripted and records
what it was sent; each case runs through both adapters and must end the same in both.
test_asyncio_mariadb.py and test_transactions.py run the adapters against MariaDB."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pymysql
import pytest

import decree
from decree.branches import DONE, BranchFailed, BranchInDoubt, Step

XID = decree.Xid.decree(0x00C0_0014, 1_700_000_000, 1, 1).branch(1)
CONNECTION_ID = 4_294_967_301  # more than the handshake's 32 bits.
NAME = XID.mariadb_name(CONNECTION_ID)
X = NAME.mysql_xid()
Script = dict[str, Any]
"""Statement -> rows to answer, or an exception to raise."""


class Stand:
    """What both stand-in connections share: the script, the statements sent, closing."""

    def __init__(self, script: Script) -> None:
        self.script = dict(script)
        self.sent: list[str] = []
        self.is_closed = False

    def answer(self, sql: str) -> Any:
        self.sent.append(sql)
        found = self.script.get(sql, ())
        if isinstance(found, BaseException):
            raise found
        return found

    def thread_id(self) -> int:
        return CONNECTION_ID & 0xFFFFFFFF

    def get_autocommit(self) -> bool:
        return True

    def close(self) -> None:
        self.is_closed = True


class SyncCursor:
    def __init__(self, conn: SyncStand) -> None:
        self.conn, self.rows = conn, ()

    def __enter__(self) -> SyncCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def execute(self, sql: str) -> None:
        self.rows = self.conn.answer(sql)

    def fetchall(self) -> Any:
        return self.rows


class SyncStand(Stand):
    """PyMySQL's connection as the adapter uses it."""

    @property
    def open(self) -> bool:
        return not self.is_closed

    def cursor(self) -> SyncCursor:
        return SyncCursor(self)


class AsyncCursor(SyncCursor):
    async def __aenter__(self) -> AsyncCursor:
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass

    async def execute(self, sql: str) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        super().execute(sql)

    async def fetchall(self) -> Any:
        return self.rows


class AsyncStand(Stand):
    """aiomysql's connection as the adapter uses it."""

    @property
    def closed(self) -> bool:
        return self.is_closed

    def cursor(self) -> AsyncCursor:
        return AsyncCursor(self)  # type: ignore[arg-type]


def both(script: Script, case: Callable[[Any], Any]) -> list[tuple[Any, list[str], str, bool]]:
    """Runs ``case(adapter)`` (a list of steps: each a method name, or a callable) on each
    adapter with the script; per adapter, what each step returned or raised, the
    statements sent, the adapter's state and whether the connection was closed."""
    out = []
    for stand, adapter_cls in ((SyncStand, decree.PyMySQLBranch), (AsyncStand, decree.AsyncMySQLBranch)):
        conn = stand({"SELECT CONNECTION_ID()": ((CONNECTION_ID,),), **script})
        adapter = adapter_cls(conn, "maria")
        results = []
        for step in case(adapter):
            try:
                result = step()
                if asyncio.iscoroutine(result):
                    result = asyncio.run(result)
            except Exception as e:
                result = (type(e).__name__, str(e))
            results.append(result)
        out.append((results, conn.sent, adapter._state, conn.is_closed))
    assert out[0] == out[1], "the two adapters ended differently"
    return out


def error(code: int, message: str) -> pymysql.err.Error:
    return pymysql.err.OperationalError(code, message)


def started(a: Any) -> list[Callable[[], Any]]:
    return [lambda: a.start(XID)]


def test_a_two_phase_branch_sends_the_xa_statements_with_the_connection_id() -> None:
    [(results, sent, state, closed), _] = both({}, lambda a: [*started(a), a.prepare, a.commit_prepared])
    assert results == [None, None, DONE] and state == "idle" and not closed
    assert sent == ["SELECT CONNECTION_ID()", f"XA START {X}", f"XA END {X}", f"XA PREPARE {X}", f"XA COMMIT {X}"]


def test_a_lost_prepare_is_in_doubt_and_abandoning_it_closes_the_connection() -> None:
    lost = error(2013, "Lost connection to MySQL server during query")
    [(results, sent, state, closed), _] = both(
        {f"XA PREPARE {X}": lost}, lambda a: [*started(a), a.prepare, lambda: a.holds_prepared, a.abandon]
    )
    assert results[1][0] == BranchInDoubt.__name__ and results[2] is True
    assert state == "idle" and closed


def test_a_commit_whose_name_is_gone_is_done_unless_xa_recover_still_lists_it() -> None:
    nota = error(1397, "XAER_NOTA: Unknown XID")
    [(results, _, _, _), _] = both({f"XA COMMIT {X}": nota}, lambda a: [*started(a), a.prepare, a.commit_prepared])
    assert results[2].step == Step.DONE
    listed = ((NAME.format_id, len(NAME.gtrid), len(NAME.bqual), NAME.gtrid + NAME.bqual),)
    [(results, _, _, _), _] = both(
        {f"XA COMMIT {X}": nota, "XA RECOVER": listed}, lambda a: [*started(a), a.prepare, a.commit_prepared]
    )
    assert results[2].step == Step.PENDING


def test_a_branch_rolled_back_on_its_own_is_a_heuristic() -> None:
    rb = error(1614, "XA_RBDEADLOCK")
    [(results, _, state, _), _] = both({f"XA COMMIT {X}": rb}, lambda a: [*started(a), a.prepare, a.commit_prepared])
    assert results[2].step == Step.HEURISTIC and results[2].heuristic == decree.Heuristic.ROLLED_BACK
    assert state == "idle"


def test_a_failed_one_phase_commit_rolls_back_and_fails() -> None:
    refused = error(1213, "Deadlock found")
    [(results, sent, state, _), _] = both(
        {f"XA COMMIT {X} ONE PHASE": refused}, lambda a: [*started(a), a.commit_one_phase]
    )
    assert results[1][0] == BranchFailed.__name__ and state == "idle"
    assert sent[-1] == f"XA ROLLBACK {X}"


@pytest.mark.parametrize("code,raises", [(1397, False), (1614, False), (1399, True)])
def test_a_rollback_of_a_prepared_branch(code: int, raises: bool) -> None:
    [(results, _, state, closed), _] = both(
        {f"XA ROLLBACK {X}": error(code, "refused")}, lambda a: [*started(a), a.prepare, a.rollback]
    )
    if raises:
        assert results[2][0] == "OperationalError" and state == "prepared" and closed
    else:
        assert results[2] is None and state == "idle" and not closed
