"""Transactions against a real ``decree serve`` and the real test databases: transfers
between two PostgreSQL databases and between PostgreSQL and MariaDB, alone and from
concurrent threads; one-phase commits that send the server no decision; rollbacks on an
exception, on a failed prepare and on a decision the server refuses; Outcome answers."""

from __future__ import annotations

import logging
import threading
import time

import psycopg
import pytest

import decree
from bank import Bank, prepared_branches
from conftest import Server, bank_fixture


bank = bank_fixture("pg-b", "maria")


def test_a_transfer_commits_in_both_databases_and_tells_the_server(
    server: Server, bank: Bank, tm: decree.TransactionManager
) -> None:
    before = server.metrics()
    a, b = bank.connect_a(), bank.connect_b()
    report = bank.transfer(tm, a, b, tid=1)
    assert report.kind == "two_phase" and report.phase_two_pending == () and not report.resolved_by_outcome
    assert report.xid.origin is not None and report.xid.origin.node == server.node
    snap = bank.snapshot(server.node)
    assert snap.violations(bank.total, {1}) == []
    assert tm.outcome(report.xid) == decree.Outcome.COMMITTED
    tm.close()  # sends the buffered Complete with the session's close.
    after = server.metrics()
    assert after["decree_commits_total"] == before["decree_commits_total"] + 1
    assert after["decree_phase_two_commits_total"] == before["decree_phase_two_commits_total"], "the client committed"
    a.close(), b.close()


def test_one_branch_commits_in_one_phase_without_a_decision(
    server: Server, bank: Bank, tm: decree.TransactionManager
) -> None:
    before = server.metrics()
    a = bank.connect_a()
    with tm.transaction() as tx:
        tx.enlist(a, "pg-a")
        a.execute(f"INSERT INTO {bank.prefix}_transfers VALUES (5, 0)")
    assert tx.report is not None and tx.report.kind == "one_phase"
    assert bank.snapshot(server.node).in_a == {5}
    assert server.metrics()["decree_commits_total"] == before["decree_commits_total"]  # OnePhase only.
    a.close()


def test_an_exception_in_the_block_rolls_both_back_and_propagates(
    server: Server, bank: Bank, tm: decree.TransactionManager
) -> None:
    a, b = bank.connect_a(), bank.connect_b()
    with pytest.raises(KeyError, match="application"):
        with tm.transaction() as tx:
            tx.enlist(a, "pg-a")
            tx.enlist(b, bank.rm_b)
            bank.work(a, b, 9, 5, 1, 2)
            raise KeyError("application failure")
    assert tx.state == "rolled_back"
    snap = bank.snapshot(server.node)
    assert snap.violations(bank.total, set()) == [] and not snap.in_a and not snap.in_b
    # The connections are usable for the next transaction.
    bank.transfer(tm, a, b, tid=10)
    assert bank.snapshot(server.node).violations(bank.total, {10}) == []
    a.close(), b.close()


def test_a_branch_that_cannot_prepare_rolls_every_branch_back(
    server: Server, bank: Bank, tm: decree.TransactionManager
) -> None:
    a, b = bank.connect_a(), bank.connect_b()
    with pytest.raises(decree.RolledBack) as refused:
        with tm.transaction() as tx:
            tx.enlist(b, bank.rm_b)
            tx.enlist(a, "pg-a")
            bank.work(a, b, 11, 5, 1, 2)
            try:
                a.execute(f"INSERT INTO {bank.prefix}_transfers VALUES (11, 5)")  # duplicate key
            except psycopg.errors.UniqueViolation:
                pass  # the application goes on; PostgreSQL has aborted branch 1.
    assert refused.value.rm == "pg-a" and refused.value.branch == 1
    assert "aborted" in str(refused.value)
    snap = bank.snapshot(server.node)
    assert snap.violations(bank.total, set()) == [] and not snap.in_a and not snap.in_b
    a.close(), b.close()


def test_a_decision_naming_an_unknown_rm_is_refused_and_rolled_back(
    server: Server, bank: Bank, tm: decree.TransactionManager
) -> None:
    a, b = bank.connect_a(), bank.connect_b()
    with pytest.raises(decree.RolledBack) as refused:
        with tm.transaction() as tx:
            tx.enlist(a, "pg-a")
            tx.enlist(b, "not-configured")
            bank.work(a, b, 12, 5, 1, 2)
    cause = refused.value.cause
    assert isinstance(cause, decree.ServerError) and cause.code == decree.ErrorCode.UNKNOWN_RM
    assert "not-configured" in cause.server_message
    snap = bank.snapshot(server.node)
    assert snap.violations(bank.total, set()) == [] and not snap.in_a
    a.close(), b.close()


def test_concurrent_threads_keep_the_total_and_leave_nothing_prepared(
    server: Server, bank: Bank, tm: decree.TransactionManager
) -> None:
    threads, per_thread = 8, 25
    acknowledged: set[int] = set()
    failures: list[BaseException] = []
    lock = threading.Lock()

    def worker(t: int) -> None:
        a, b = bank.connect_a(), bank.connect_b()
        try:
            for i in range(per_thread):
                tid = 1000 + t * per_thread + i
                bank.transfer(tm, a, b, tid, amount=t + 1)
                with lock:
                    acknowledged.add(tid)
        except BaseException as e:  # reported below; a thread's exception is otherwise lost.
            failures.append(e)
        finally:
            a.close(), b.close()

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    assert failures == []
    assert len(acknowledged) == threads * per_thread
    snap = bank.snapshot(server.node)
    assert snap.violations(bank.total, acknowledged) == []
    assert snap.in_a == snap.in_b == acknowledged


def test_the_decorator_commits_on_return_and_rolls_back_on_raise(
    server: Server, bank: Bank, tm: decree.TransactionManager
) -> None:
    a, b = bank.connect_a(), bank.connect_b()

    @tm.transactional
    def move(tx: decree.Transaction, tid: int, fail: bool) -> decree.Xid:
        tx.enlist(a, "pg-a")
        tx.enlist(b, bank.rm_b)
        bank.work(a, b, tid, 3, 4, 5)
        if fail:
            raise ValueError("refused by the application")
        return tx.xid

    xid = move(20, fail=False)
    with pytest.raises(ValueError):
        move(21, fail=True)
    snap = bank.snapshot(server.node)
    assert snap.violations(bank.total, {20}) == [] and snap.in_a == {20}
    assert tm.outcome(xid) == decree.Outcome.COMMITTED
    a.close(), b.close()


def test_outcome_answers_rolled_back_for_a_closed_session_that_never_decided(
    server: Server, tm: decree.TransactionManager
) -> None:
    other = decree.connect(server.endpoint)
    tx = other.transaction()
    xid = tx.xid
    tx.rollback()
    assert tm.outcome(xid) == decree.Outcome.IN_PROGRESS, "its session is still connected"
    other.close()
    deadline = time.monotonic() + 10
    while tm.outcome(xid) == decree.Outcome.IN_PROGRESS and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tm.outcome(xid) == decree.Outcome.ROLLED_BACK


def test_misuse_is_refused_before_anything_is_sent(server: Server, bank: Bank, tm: decree.TransactionManager) -> None:
    a = bank.connect_a()
    a.autocommit = True
    with tm.transaction() as tx:
        with pytest.raises(decree.UsageError, match="autocommit"):
            tx.enlist(a, "pg-a")
    a.autocommit = False
    a.execute("SELECT 1")
    with tm.transaction() as tx:
        with pytest.raises(decree.UsageError, match="before its first statement"):
            tx.enlist(a, "pg-a")
    a.rollback()
    with pytest.raises(decree.UsageError, match="psycopg 3 or PyMySQL"):
        tm.transaction().enlist(object(), "pg-a")
    with pytest.raises(decree.UsageError, match="unix:/path"):
        decree.connect("http://localhost")
    with pytest.raises(decree.Unavailable, match="cannot connect"):
        decree.connect(f"unix:{server.dir / 'no-such.sock'}")
    a.close()


def test_the_transaction_logs_through_logging(
    server: Server, bank: Bank, tm: decree.TransactionManager, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = bank.connect_a(), bank.connect_b()
    with caplog.at_level(logging.DEBUG, logger="decree"):
        report = bank.transfer(tm, a, b, tid=30)
    messages = [r.getMessage() for r in caplog.records if r.name == "decree"]
    assert any(str(report.xid) in m and "decided" in m for m in messages), messages
    assert prepared_branches(bank.dsns, server.node) == []
    a.close(), b.close()


def test_a_mariadb_branch_is_named_with_the_connection_that_prepares_it(dsns: dict[str, str]) -> None:
    """The server waits for the connection named in a MariaDB branch before it finishes
    the branch by name (docs/protocol.md); the adapter must write that name."""
    import pymysql

    from conftest import mysql_kwargs
    from decree.branches import DONE, PyMySQLBranch

    table = f"py_named_{int(time.time() * 1000) & 0xFFFFFFF:x}"
    conn = pymysql.connect(**mysql_kwargs(dsns["maria"]), autocommit=True)
    other = pymysql.connect(**mysql_kwargs(dsns["maria"]), autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY) ENGINE=InnoDB")
            cur.execute("SELECT CONNECTION_ID()")
            connection_id = int(cur.fetchone()[0])
        xid = decree.Xid.decree(0x00C0_0012, int(time.time()), 1, 1).branch(1)
        branch = PyMySQLBranch(conn, "maria")
        branch.start(xid)
        with conn.cursor() as cur:
            cur.execute(f"INSERT INTO {table} VALUES (1)")
        branch.prepare()
        with other.cursor() as cur:
            cur.execute("XA RECOVER")
            listed = [
                decree.Xid.from_xa_recover(int(r[0]), int(r[1]), int(r[2]), bytes(r[3])) for r in cur.fetchall()
            ]
        assert xid.mariadb_name(connection_id) in listed, listed
        assert [n.from_mariadb_name() for n in listed if n.gtrid == xid.gtrid] == [(xid, connection_id)]
        assert branch.commit_prepared() == DONE
        with other.cursor() as cur:
            cur.execute(f"SELECT COUNT(*) FROM {table}")
            assert cur.fetchone()[0] == 1
            cur.execute(f"DROP TABLE {table}")
    finally:
        conn.close()
        other.close()
