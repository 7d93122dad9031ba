"""A branch the application commits or rolls back itself inside the transaction, against a
real server and the real databases: the library cannot know which way it ended, so the
commit raises ``decree.BranchEndedByApplication`` (not ``RolledBack``, which says a retry
is safe), naming the branch, and rolls the other branches back. A branch enlisted with no
SQL yet is not mistaken for one: it commits normally."""

from __future__ import annotations

from typing import Any

import pytest

import decree
from bank import Bank
from conftest import Server, bank_fixture


bank = bank_fixture("pg-b", "maria")


def end_branch(bank: Bank, conn: Any, tx: decree.Transaction, number: int, how: str) -> None:
    """What an application might do by mistake: end the branch on ``conn`` itself. psycopg
    refuses ``commit()`` during a two-phase transaction, so the SQL is sent as text; MariaDB
    refuses COMMIT and ROLLBACK in an XA branch, so the application ends it with XA."""
    if type(conn).__module__.startswith("psycopg"):
        conn.execute("COMMIT" if how == "commit" else "ROLLBACK")
        return
    with conn.cursor() as cur:
        cur.execute("SELECT CONNECTION_ID()")
        name = tx.xid.branch(number).mariadb_name(int(cur.fetchone()[0])).mysql_xid()
        cur.execute(f"XA END {name}")
        cur.execute(f"XA COMMIT {name} ONE PHASE" if how == "commit" else f"XA ROLLBACK {name}")


def insert(bank: Bank, conn: Any, tid: int) -> None:
    sql = f"INSERT INTO {bank.prefix}_transfers VALUES (%s, 1)"
    if type(conn).__module__.startswith("psycopg"):
        conn.execute(sql, (tid,))
    else:
        with conn.cursor() as cur:
            cur.execute(sql, (tid,))


@pytest.mark.parametrize("how", ["commit", "rollback"])
@pytest.mark.parametrize("ended", ["a", "b"])
def test_a_branch_ended_by_the_application_is_reported_as_not_safe_to_retry(
    server: Server, bank: Bank, tm: decree.TransactionManager, how: str, ended: str
) -> None:
    a, b = bank.connect_a(), bank.connect_b()
    with pytest.raises(decree.BranchEndedByApplication) as raised:
        with tm.transaction() as tx:
            tx.enlist(a, "pg-a")
            tx.enlist(b, bank.rm_b)
            insert(bank, a, 1)
            insert(bank, b, 1)
            end_branch(bank, a if ended == "a" else b, tx, 0 if ended == "a" else 1, how)
    e = raised.value
    assert not isinstance(e, (decree.RolledBack, decree.OutcomeUnknown))
    assert (e.rm, e.branch, e.xid) == (("pg-a", 0) if ended == "a" else (bank.rm_b, 1)) + (tx.xid,)
    assert "not safe to retry" in str(e) and e.rm in str(e)
    snap = bank.snapshot(server.node)
    committed_by_app = {1} if how == "commit" else set()
    assert snap.in_a == (committed_by_app if ended == "a" else set())
    assert snap.in_b == (committed_by_app if ended == "b" else set())
    assert snap.prepared == []
    # Both connections serve the next transaction.
    bank.transfer(tm, a, b, tid=2)
    assert {2} <= bank.snapshot(server.node).in_a & bank.snapshot(server.node).in_b
    a.close(), b.close()


@pytest.mark.parametrize("how", ["commit", "rollback"])
def test_the_only_branch_ended_by_the_application_is_reported_too(
    server: Server, bank: Bank, tm: decree.TransactionManager, how: str
) -> None:
    b = bank.connect_b()
    with pytest.raises(decree.BranchEndedByApplication) as raised:
        with tm.transaction() as tx:
            tx.enlist(b, bank.rm_b)
            insert(bank, b, 3)
            end_branch(bank, b, tx, 0, how)
    assert (raised.value.rm, raised.value.branch) == (bank.rm_b, 0)
    assert bank.snapshot(server.node).in_b == ({3} if how == "commit" else set())
    b.close()


@pytest.mark.parametrize("empty", ["a", "b"])
def test_a_branch_enlisted_with_no_sql_yet_commits_normally(
    server: Server, bank: Bank, tm: decree.TransactionManager, empty: str
) -> None:
    a, b = bank.connect_a(), bank.connect_b()
    with tm.transaction() as tx:
        tx.enlist(a, "pg-a")
        tx.enlist(b, bank.rm_b)
        insert(bank, b if empty == "a" else a, 4)
    assert tx.report is not None and tx.report.kind == "two_phase"
    snap = bank.snapshot(server.node)
    assert (snap.in_a, snap.in_b) == ((set(), {4}) if empty == "a" else ({4}, set()))
    assert snap.prepared == []
    with tm.transaction() as tx:  # one branch, no SQL at all
        tx.enlist(b, bank.rm_b)
    assert tx.report is not None and tx.report.kind == "one_phase"
    a.close(), b.close()
