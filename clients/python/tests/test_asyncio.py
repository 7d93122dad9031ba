"""The asyncio API (``decree.aconnect``, ``tm.atransaction()``) against a real ``decree
serve`` and the test databases, through psycopg's ``AsyncConnection`` and aiomysql's
``Connection``: the cases of test_transactions.py (a transfer in two phases, one phase,
rollbacks on an exception, a failed prepare and a refused decision, concurrent tasks, the
decorator, Outcome), a Decide whose answer is lost (resolved with Outcome, never guessed)
or that cannot be sent (rolled back), cancellations and a branch the application ended,
each between two PostgreSQL databases and between PostgreSQL and MariaDB (``both_banks``);
the keep-alive, TCP and TLS; a MariaDB connection lost before the prepare and the
MariaDB branch's name; the refusal of a connection an API cannot drive, in both APIs; and
the guide's asyncio programs. Each test runs its own event loop with ``asyncio.run``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import sys
import time
import types
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import aiomysql
import psycopg
import pymysql
import pytest

import decree
from bank import Bank, prepared_branches
from conftest import IDLE_MS, REPO, Server, both_banks, mysql_kwargs, need, pg_kwargs
from decree import protocol as p
from decree.aio_connection import AsyncServerConnection
from decree.branches import DONE, BranchInDoubt
from decree.connection import NotSent
from test_guide import bank_server, schema  # noqa: F401  (fixtures)
from test_tls import tls_config, tls_server  # noqa: F401  (a fixture)

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], timeout: float = 120) -> T:
    """Runs ``coro`` on a new event loop, bounded so that a hang fails the test."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


class AppConnection(psycopg.Connection[Any]):
    """An application's own subclass of psycopg's connection (the sync API takes it)."""


class AppAsyncConnection(psycopg.AsyncConnection[Any]):
    """An application's own subclass of psycopg's async connection."""


@pytest.fixture(scope="module")
def server(tcp_server: Server) -> Server:
    """The module's server listens on TCP too."""
    return tcp_server


class AppMySQLConnection(aiomysql.Connection):  # type: ignore[misc]
    """An application's own subclass of aiomysql's connection."""


async def connect_maria(dsns: dict[str, str], *, autocommit: bool = True, cls: type[Any] | None = None) -> Any:
    """An aiomysql connection to the test MariaDB database (of class ``cls``, if given)."""
    kw = mysql_kwargs(dsns["maria"])
    kw["db"] = kw.pop("database")
    if cls is None:
        return await aiomysql.connect(**kw, autocommit=autocommit)
    conn = cls(**kw, autocommit=autocommit)
    await conn._connect()  # what aiomysql.connect does with its own class.
    return conn


async def connect_b(
    bank: Bank, cls: type[psycopg.AsyncConnection[Any]] = psycopg.AsyncConnection, mysql_cls: type[Any] | None = None
) -> Any:
    """An async connection to the bank's database B: psycopg's on pg-b, aiomysql's on maria."""
    if bank.maria:
        return await connect_maria(bank.dsns, cls=mysql_cls)
    return await cls.connect(bank.dsns["pg-b"])


async def connect_pair(
    bank: Bank, cls: type[psycopg.AsyncConnection[Any]] = psycopg.AsyncConnection, mysql_cls: type[Any] | None = None
) -> tuple[Any, Any]:
    return await cls.connect(bank.dsns["pg-a"]), await connect_b(bank, cls, mysql_cls)


def rm_of(b: Any) -> str:
    """The RM name of a connection to database B."""
    return "maria" if isinstance(b, aiomysql.Connection) else "pg-b"


async def execute(conn: Any, sql: str, args: tuple[Any, ...] | None = None) -> None:
    """``sql`` on an async psycopg or aiomysql connection."""
    if isinstance(conn, aiomysql.Connection):
        async with conn.cursor() as cur:
            await cur.execute(sql, args)
    else:
        await conn.execute(sql, args)


@contextlib.asynccontextmanager
async def pair_on(
    endpoint: str, bank: Bank, **settings: Any
) -> AsyncIterator[tuple[decree.AsyncTransactionManager, Any, Any]]:
    """A manager on ``endpoint`` (``settings`` go to ``decree.aconnect``) and async
    connections to the bank's two databases, closed at the end of the block before it."""
    async with decree.aconnect(endpoint, **settings) as tm:
        a, b = await connect_pair(bank)
        yield tm, a, b
        await close_all(a, b)


async def work(bank: Bank, a: Any, b: Any, tid: int, amount: int, src: int, dst: int) -> None:
    """The SQL of one transfer on two enlisted async connections."""
    p = bank.prefix
    await a.execute(f"UPDATE {p}_accounts SET balance = balance - %s WHERE id = %s", (amount, src))
    await a.execute(f"INSERT INTO {p}_transfers VALUES (%s, %s)", (tid, amount))
    await execute(b, f"UPDATE {p}_accounts SET balance = balance + %s WHERE id = %s", (amount, dst))
    await execute(b, f"INSERT INTO {p}_transfers VALUES (%s, %s)", (tid, amount))


async def transfer(
    tm: decree.AsyncTransactionManager, bank: Bank, a: Any, b: Any, tid: int, amount: int = 7
) -> decree.CommitReport:
    async with tm.atransaction() as tx:
        await tx_enlist_both(tx, a, b)
        await work(bank, a, b, tid, amount, tid % bank.accounts, (tid * 7 + 3) % bank.accounts)
    assert tx.report is not None
    return tx.report


async def close_all(*conns: Any) -> None:
    for c in conns:
        closed = c.close()  # aiomysql's close() is a plain call.
        if closed is not None:
            await closed


async def tx_enlist_both(tx: decree.AsyncTransaction, a: Any, b: Any) -> None:
    """Enlists the bank's two connections, ``a`` on pg-a and ``b`` on pg-b or maria, in that order."""
    await tx.enlist(a, "pg-a")
    await tx.enlist(b, rm_of(b))


# --- the cases of the synchronous API ---------------------------------------------------------


@both_banks
def test_a_transfer_commits_in_both_databases_and_tells_the_server(server: Server, bank: Bank) -> None:
    before = server.metrics()

    async def scenario() -> decree.CommitReport:
        async with pair_on(server.endpoint, bank, client_name="pytest-asyncio") as (tm, a, b):
            report = await transfer(tm, bank, a, b, tid=1)
            assert await tm.outcome(report.xid) == decree.Outcome.COMMITTED
        return report  # the manager's close sent the buffered Complete.

    report = run(scenario())
    assert report.kind == "two_phase" and report.phase_two_pending == () and not report.resolved_by_outcome
    assert report.xid.origin is not None and report.xid.origin.node == server.node
    assert bank.snapshot(server.node).violations(bank.total, {1}) == []
    after = server.metrics()
    assert after["decree_commits_total"] == before["decree_commits_total"] + 1
    assert after["decree_phase_two_commits_total"] == before["decree_phase_two_commits_total"], "the client committed"


@both_banks
def test_one_branch_commits_in_one_phase_and_sends_nothing(server: Server, bank: Bank) -> None:
    before = server.metrics()

    async def scenario() -> decree.AsyncTransaction:
        async with decree.aconnect(server.endpoint) as tm:
            b = await connect_b(bank)
            async with tm.atransaction() as tx:
                await tx.enlist(b, bank.rm_b)
                await execute(b, f"INSERT INTO {bank.prefix}_transfers VALUES (5, 0)")
            await close_all(b)
        return tx

    tx = run(scenario())
    assert tx.report is not None and tx.report.kind == "one_phase" and tx.state == "committed"
    snap = bank.snapshot(server.node)
    assert (snap.in_a, snap.in_b, snap.prepared) == (set(), {5}, [])
    assert server.metrics()["decree_commits_total"] == before["decree_commits_total"]


@both_banks
def test_an_exception_in_the_block_rolls_both_back_and_propagates(server: Server, bank: Bank) -> None:
    async def scenario() -> None:
        async with pair_on(server.endpoint, bank) as (tm, a, b):
            with pytest.raises(KeyError, match="application"):
                async with tm.atransaction() as tx:
                    await tx_enlist_both(tx, a, b)
                    await work(bank, a, b, 9, 5, 1, 2)
                    raise KeyError("application failure")
            assert tx.state == "rolled_back"
            snap = bank.snapshot(server.node)
            assert snap.violations(bank.total, set()) == [] and not snap.in_a and not snap.in_b
            # The connections are usable for the next transaction.
            await transfer(tm, bank, a, b, tid=10)

    run(scenario())
    assert bank.snapshot(server.node).violations(bank.total, {10}) == []


@both_banks
def test_a_branch_that_cannot_prepare_rolls_every_branch_back(server: Server, bank: Bank) -> None:
    async def scenario() -> decree.RolledBack:
        async with pair_on(server.endpoint, bank) as (tm, a, b):
            with pytest.raises(decree.RolledBack) as refused:
                async with tm.atransaction() as tx:
                    await tx.enlist(b, bank.rm_b)  # branch 0, prepared first.
                    await tx.enlist(a, "pg-a")
                    await work(bank, a, b, 11, 5, 1, 2)
                    try:
                        await a.execute(f"INSERT INTO {bank.prefix}_transfers VALUES (11, 5)")  # duplicate key
                    except psycopg.errors.UniqueViolation:
                        pass  # the application goes on; PostgreSQL has aborted branch 1.
        return refused.value

    error = run(scenario())
    assert error.rm == "pg-a" and error.branch == 1 and "aborted" in str(error) and error.rollback_errors == []
    snap = bank.snapshot(server.node)
    assert snap.violations(bank.total, set()) == [] and not snap.in_a and not snap.in_b


@both_banks
def test_a_decision_naming_an_unknown_rm_is_refused_and_rolled_back(server: Server, bank: Bank) -> None:
    async def scenario() -> decree.RolledBack:
        async with pair_on(server.endpoint, bank) as (tm, a, b):
            with pytest.raises(decree.RolledBack) as refused:
                async with tm.atransaction() as tx:
                    await tx.enlist(a, "pg-a")
                    await tx.enlist(b, "not-configured")
                    await work(bank, a, b, 12, 5, 1, 2)
        return refused.value

    cause = run(scenario()).cause
    assert isinstance(cause, decree.ServerError) and cause.code == decree.ErrorCode.UNKNOWN_RM
    assert "not-configured" in cause.server_message
    snap = bank.snapshot(server.node)
    assert snap.violations(bank.total, set()) == [] and not snap.in_a


@both_banks
def test_concurrent_tasks_share_one_manager_and_keep_the_total(server: Server, bank: Bank) -> None:
    tasks, per_task = 8, 15

    async def worker(tm: decree.AsyncTransactionManager, t: int) -> set[int]:
        a, b = await connect_pair(bank)
        done = set()
        try:
            for i in range(per_task):
                tid = 1000 + t * per_task + i
                await transfer(tm, bank, a, b, tid, amount=t + 1)
                done.add(tid)
        finally:
            await close_all(a, b)
        return done

    async def scenario() -> set[int]:
        async with decree.aconnect(server.endpoint) as tm:
            results = await asyncio.gather(*(worker(tm, t) for t in range(tasks)))
            assert len(tm._sessions) > 1, "the tasks ran their transactions side by side"
        return set().union(*results)

    acknowledged = run(scenario())
    assert len(acknowledged) == tasks * per_task
    snap = bank.snapshot(server.node)
    assert snap.violations(bank.total, acknowledged) == []
    assert snap.in_a == snap.in_b == acknowledged


@both_banks
def test_the_decorator_commits_on_return_and_rolls_back_on_raise(server: Server, bank: Bank) -> None:
    async def scenario() -> decree.Outcome:
        async with pair_on(server.endpoint, bank) as (tm, a, b):

            @tm.atransactional
            async def move(tx: decree.AsyncTransaction, tid: int, fail: bool) -> decree.Xid | None:
                await tx_enlist_both(tx, a, b)
                await work(bank, a, b, tid, 3, 4, 5)
                if fail:
                    raise ValueError("refused by the application")
                return tx.xid

            xid = await move(20, fail=False)
            with pytest.raises(ValueError):
                await move(21, fail=True)
            assert xid is not None
            answer = await tm.outcome(xid)
        return answer

    assert run(scenario()) == decree.Outcome.COMMITTED
    snap = bank.snapshot(server.node)
    assert snap.violations(bank.total, {20}) == [] and snap.in_a == {20}


def test_outcome_answers_rolled_back_for_a_closed_session_that_never_decided(server: Server) -> None:
    async def scenario() -> None:
        async with decree.aconnect(server.endpoint) as tm:
            other = await decree.aconnect(server.endpoint)
            tx = await other.atransaction()
            assert tx.xid is not None
            await tx.rollback()
            assert await tm.outcome(tx.xid) == decree.Outcome.IN_PROGRESS, "its session is still connected"
            await other.aclose()
            deadline = time.monotonic() + 10
            while await tm.outcome(tx.xid) == decree.Outcome.IN_PROGRESS and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert await tm.outcome(tx.xid) == decree.Outcome.ROLLED_BACK

    run(scenario())


@both_banks
def test_the_transaction_logs_through_logging(server: Server, bank: Bank, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> decree.CommitReport:
        async with pair_on(server.endpoint, bank) as (tm, a, b):
            report = await transfer(tm, bank, a, b, tid=30)
        return report

    with caplog.at_level(logging.DEBUG, logger="decree"):
        report = run(scenario())
    messages = [r.getMessage() for r in caplog.records if r.name == "decree"]
    assert any(str(report.xid) in m and "decided" in m for m in messages), messages
    assert prepared_branches(bank.dsns, server.node) == []


# --- endpoints, keep-alive, event loops ------------------------------------------------------


def test_a_transfer_over_tcp(server: Server, bank: Bank) -> None:
    async def scenario() -> decree.CommitReport:
        async with pair_on(f"tcp:127.0.0.1:{server.tcp_port}", bank) as (tm, a, b):
            report = await transfer(tm, bank, a, b, tid=40)
            assert await tm.outcome(report.xid) == decree.Outcome.COMMITTED
        return report

    assert run(scenario()).kind == "two_phase"
    assert bank.snapshot(server.node).violations(bank.total, {40}) == []


def test_a_transfer_over_mutual_tls(tls_server: Server, dsns: dict[str, str]) -> None:  # noqa: F811
    bank = Bank(dsns, "pg-b").create()

    async def scenario() -> decree.CommitReport:
        endpoint = f"tls:127.0.0.1:{tls_server.tcp_port}"
        async with decree.aconnect(endpoint, tls=tls_config(tls_server, "app-1")) as tm:
            await tm.ping()
            a, b = await connect_pair(bank)
            report = await transfer(tm, bank, a, b, tid=1)
            assert await tm.outcome(report.xid) == decree.Outcome.COMMITTED
            await close_all(a, b)
        with pytest.raises(decree.ServerError) as refused:
            await decree.aconnect(endpoint, tls=tls_config(tls_server, "app-2"))
        assert refused.value.code == decree.ErrorCode.NOT_ALLOWED
        return report

    try:
        assert run(scenario()).kind == "two_phase"
        assert bank.snapshot(tls_server.node).violations(bank.total, {1}) == []
    finally:
        bank.drop()


def test_sessions_are_kept_alive_through_a_pause_longer_than_the_idle_bound(idle_server: Server, bank: Bank) -> None:
    async def scenario() -> decree.AsyncTransaction:
        async with pair_on(idle_server.endpoint, bank) as (tm, a, b):
            async with tm.atransaction() as tx:
                await tx_enlist_both(tx, a, b)
                await work(bank, a, b, 1, 5, 1, 2)
                await asyncio.sleep(4 * IDLE_MS / 1000)  # the application awaits; its session stays idle.
            await asyncio.sleep(4 * IDLE_MS / 1000)  # the pooled session, idle as well.
            await tm.ping()
            assert tx.xid is not None and await tm.outcome(tx.xid) == decree.Outcome.COMMITTED
        return tx

    tx = run(scenario())
    assert tx.report is not None and tx.report.kind == "two_phase" and not tx.report.resolved_by_outcome
    metrics = idle_server.metrics()
    assert metrics["decree_sessions_idle_closed_total"] == 0, "no session was closed for idleness"
    assert metrics["decree_sessions_opened_total"] == 1, "one session served the whole test"
    assert bank.snapshot(idle_server.node).violations(bank.total, {1}) == []


def test_a_manager_belongs_to_the_event_loop_that_opened_it(server: Server) -> None:
    loop = asyncio.new_event_loop()
    try:
        tm = loop.run_until_complete(decree.aconnect(server.endpoint))
        with pytest.raises(decree.UsageError, match="belong to the event loop that opened them"):
            run(tm.ping())
        loop.run_until_complete(tm.ping())  # its own loop still uses it.
        loop.run_until_complete(tm.aclose())
        with pytest.raises(decree.UsageError, match="closed"):
            loop.run_until_complete(tm.ping())
    finally:
        loop.close()


@pytest.mark.parametrize("which", ["pg-a", "maria"])
def test_a_database_port_is_reported_as_not_a_decree_server(which: str, dsns: dict[str, str]) -> None:
    if which == "pg-a":
        kw = pg_kwargs(dsns["pg-a"])
        host, port, hint = kw.get("host", "127.0.0.1"), int(kw.get("port", 5432)), "PostgreSQL"
    else:
        kw_m = mysql_kwargs(dsns["maria"])
        host, port, hint = kw_m["host"], kw_m["port"], "MySQL or MariaDB"

    async def scenario() -> decree.ProtocolError:
        with pytest.raises(decree.ProtocolError, match="did not answer as a decree server") as refused:
            await decree.aconnect(f"tcp:{host}:{port}", connect_timeout=5, reply_timeout=5)
        return refused.value

    message = str(run(scenario()))
    assert hint in message and "bytes exceeds" not in message, message


# --- lost answers, sessions gone, cancellations -----------------------------------------------


class DecideProxy:
    """A Unix-socket proxy on the test's event loop in front of the server. Once armed, it
    loses the first ``Decide`` that passes (``hold="decide"``: the server never sees it) or
    its ``DecideOk`` (``hold="reply"``: the server decided), and closes both sides of that
    connection, as a broken link would. ``cut()`` closes every connection."""

    def __init__(self, upstream: Path, path: Path, hold: str = "reply") -> None:
        self.upstream, self.path, self.hold = upstream, path, hold
        self.armed = False
        self.lost = asyncio.Event()
        self._decide_id: int | None = None
        self._writers: list[asyncio.StreamWriter] = []

    @property
    def endpoint(self) -> str:
        return f"unix:{self.path}"

    async def start(self) -> asyncio.AbstractServer:
        return await asyncio.start_unix_server(self._serve, str(self.path))

    async def _serve(self, down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_unix_connection(str(self.upstream))
        self._writers += [down_w, up_w]
        pair = (down_w, up_w)
        await asyncio.gather(self._pump(down_r, up_w, True, pair), self._pump(up_r, down_w, False, pair))

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, to_server: bool,
                    pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter]) -> None:
        try:
            while True:
                head = await src.readexactly(4)
                frame = head + await src.readexactly(int.from_bytes(head, "big"))
                if not self._forward(frame, to_server):
                    break
                dst.write(frame)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        for w in pair:
            w.close()

    def _forward(self, frame: bytes, to_server: bool) -> bool:
        kind, request_id = frame[5], int.from_bytes(frame[6:14], "big")
        if to_server and self.armed and kind == 0x03 and self._decide_id is None:  # Decide
            self._decide_id = request_id
            if self.hold == "decide":
                return self._lose()
        if not to_server and self.armed and kind == 0x04 and request_id == self._decide_id:  # its DecideOk
            return self._lose()
        return True

    def _lose(self) -> bool:
        self.armed = False
        self.lost.set()
        return False

    def cut(self) -> None:
        for w in self._writers:
            w.close()


@both_banks
@pytest.mark.parametrize("hold", ["reply", "decide"])
def test_a_decide_whose_answer_is_lost_is_resolved_with_outcome(server: Server, bank: Bank, hold: str) -> None:
    """``reply``: the server decided and its answer is lost; ``decide``: the server never
    saw the Decide. The client asks ``Outcome`` on a new session and ends the transaction
    with the server's answer; the databases agree with it."""

    async def scenario() -> decree.CommitReport | decree.DecreeError:
        proxy = DecideProxy(server.socket, server.dir / f"proxy-{hold}.sock", hold)
        listener = await proxy.start()
        async with pair_on(proxy.endpoint, bank) as (tm, a, b):
            await transfer(tm, bank, a, b, tid=1)
            proxy.armed = True
            try:
                result: decree.CommitReport | decree.DecreeError = await transfer(tm, bank, a, b, tid=2)
            except decree.DecreeError as e:
                result = e
            assert proxy.lost.is_set(), "the proxy lost nothing"
            xid = result.xid if isinstance(result, decree.CommitReport) else getattr(result, "xid", None)
            assert xid is not None
            answer = await tm.outcome(xid)
            after = await transfer(tm, bank, a, b, tid=3)
            assert after.kind == "two_phase" and not after.resolved_by_outcome
        listener.close()
        expected = decree.Outcome.COMMITTED if hold == "reply" else decree.Outcome.ROLLED_BACK
        assert answer == expected
        return result

    result = run(scenario())
    if hold == "reply":
        assert isinstance(result, decree.CommitReport), result
        assert result.resolved_by_outcome and result.kind == "two_phase"
        acknowledged = {1, 2, 3}
    else:
        assert isinstance(result, decree.RolledBack), result
        assert "the server says the transaction is rolled back" in str(result)
        acknowledged = {1, 3}
    snap = bank.settled(server.node, acknowledged)
    assert snap.violations(bank.total, acknowledged) == []
    assert snap.in_a == snap.in_b == acknowledged, "the databases agree with the answer"


@both_banks
def test_a_decide_is_not_written_on_a_session_the_server_closed(server: Server, bank: Bank) -> None:
    """The session ends between the prepares and the Decide: the client sees it before it
    writes (docs/protocol.md, step 5), sends nothing and reports the transaction rolled
    back; the server agrees."""
    before = server.metrics()

    async def scenario() -> tuple[decree.RolledBack, decree.Outcome]:
        proxy = DecideProxy(server.socket, server.dir / "proxy-cut.sock")
        listener = await proxy.start()
        async with pair_on(proxy.endpoint, bank) as (tm, a, b):
            with pytest.raises(decree.RolledBack) as refused:
                async with tm.atransaction() as tx:
                    await tx_enlist_both(tx, a, b)
                    await work(bank, a, b, 7, 5, 1, 2)
                    proxy.cut()
                    await asyncio.sleep(0.2)  # the end of the stream arrives.
            assert tx.xid is not None
            deadline = time.monotonic() + 10
            while (answer := await tm.outcome(tx.xid)) == decree.Outcome.IN_PROGRESS and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        listener.close()
        return refused.value, answer

    error, answer = run(scenario())
    assert "the decision was not sent" in str(error) and isinstance(error.cause, decree.Unavailable)
    assert answer == decree.Outcome.ROLLED_BACK
    assert server.metrics()["decree_commits_total"] == before["decree_commits_total"], "nothing was decided"
    snap = bank.snapshot(server.node)
    assert snap.violations(bank.total, set()) == [] and not snap.in_a and not snap.in_b


class SlowBranch(decree.AsyncPsycopgBranch):
    """A psycopg branch whose phase two starts late, and says when it starts."""

    def __init__(self, connection: Any, rm: str, started: asyncio.Event) -> None:
        super().__init__(connection, rm)
        self.started = started

    async def commit_prepared(self) -> Any:
        self.started.set()
        await asyncio.sleep(0.3)
        return await super().commit_prepared()


@both_banks
def test_a_commit_cancelled_in_phase_two_runs_to_its_end(server: Server, bank: Bank) -> None:
    async def scenario() -> decree.AsyncTransaction:
        async with pair_on(server.endpoint, bank) as (tm, a, b):
            started = asyncio.Event()
            tx = tm.atransaction()

            async def commit() -> None:
                async with tx:
                    await tx.enlist(SlowBranch(a, "pg-a", started), "pg-a")
                    await tx.enlist(b, bank.rm_b)
                    await work(bank, a, b, 50, 5, 1, 2)

            task = asyncio.ensure_future(commit())
            await started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert tx.state == "committed", "the commit ran to its end before the cancellation"
            assert tx.xid is not None and await tm.outcome(tx.xid) == decree.Outcome.COMMITTED
        return tx

    tx = run(scenario())
    assert tx.report is not None and tx.report.kind == "two_phase"
    assert bank.snapshot(server.node).violations(bank.total, {50}) == []


@both_banks
def test_a_cancellation_inside_the_block_rolls_back(server: Server, bank: Bank) -> None:
    async def scenario() -> decree.AsyncTransaction:
        async with pair_on(server.endpoint, bank) as (tm, a, b):
            tx = tm.atransaction()
            working = asyncio.Event()

            async def body() -> None:
                async with tx:
                    await tx_enlist_both(tx, a, b)
                    await work(bank, a, b, 51, 5, 1, 2)
                    working.set()
                    await asyncio.sleep(30)

            task = asyncio.ensure_future(body())
            await working.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await transfer(tm, bank, a, b, tid=52)  # the connections and the manager go on.
        return tx

    assert run(scenario()).state == "rolled_back"
    snap = bank.snapshot(server.node)
    assert snap.violations(bank.total, {52}) == [] and snap.in_a == {52}


# --- connections an API cannot drive -----------------------------------------------------------


def test_the_synchronous_api_refuses_an_async_connection(server: Server, bank: Bank) -> None:
    """Issue 31: a psycopg AsyncConnection was accepted by ``tm.transaction()`` (its module
    is psycopg), its tpc_* coroutines were never awaited, the report said two-phase
    committed, and neither database changed. It is refused at enlist now; so are aiomysql's
    connections."""

    async def scenario() -> None:
        a, b = await connect_pair(bank)
        sub = await AppAsyncConnection.connect(bank.dsns["pg-a"])
        m = await connect_maria(bank.dsns)
        sub_m = await connect_maria(bank.dsns, cls=AppMySQLConnection)
        try:
            with decree.connect(server.endpoint) as tm:
                with tm.transaction() as tx:
                    with pytest.raises(decree.UsageError) as refused:
                        tx.enlist(a, "pg-a")
                    assert str(refused.value) == (
                        "psycopg.AsyncConnection is driven by tm.atransaction(), not tm.transaction()"
                    )
                    with pytest.raises(decree.UsageError, match=r"AppAsyncConnection \(a psycopg\.AsyncConnection\) "
                                       r"is driven by tm\.atransaction\(\)"):
                        tx.enlist(sub, "pg-a")
                    with pytest.raises(decree.UsageError, match="driven by tm.atransaction"):
                        tx.enlist(decree.AsyncPsycopgBranch(b, "pg-b"), "pg-b")
                    refusals = {
                        "aiomysql.connection.Connection is driven by tm.atransaction(), not tm.transaction()": m,
                        "test_asyncio.AppMySQLConnection (a aiomysql.connection.Connection) is driven by "
                        "tm.atransaction(), not tm.transaction()": sub_m,
                        "decree.aio_branches.AsyncMySQLBranch (a decree.AsyncBranchAdapter) is driven by "
                        "tm.atransaction(), not tm.transaction()": decree.AsyncMySQLBranch(m, "maria"),
                    }
                    for message, conn in refusals.items():
                        with pytest.raises(decree.UsageError) as refused:
                            tx.enlist(conn, "maria")
                        assert str(refused.value) == message
                assert tx.report is not None and tx.report.kind == "empty"
            for conn in (a, b, sub):
                assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE, "nothing was begun"
            for conn in (m, sub_m):  # XA START fails (XAER_RMFAIL) while a branch is open.
                for sql in ("XA START 'probe'", "XA END 'probe'", "XA ROLLBACK 'probe'"):
                    await execute(conn, sql)
        finally:
            await close_all(a, b, sub, m, sub_m)

    run(scenario())


def test_the_synchronous_api_takes_a_subclass_of_psycopg_connection(server: Server, bank: Bank) -> None:
    a, b = AppConnection.connect(bank.dsns["pg-a"]), AppConnection.connect(bank.dsns["pg-b"])
    try:
        with decree.connect(server.endpoint) as tm:
            report = bank.transfer(tm, a, b, tid=60)
        assert report.kind == "two_phase"
    finally:
        a.close()
        b.close()
    assert bank.snapshot(server.node).violations(bank.total, {60}) == []


@both_banks
def test_the_asyncio_api_takes_a_subclass_of_async_connection(server: Server, bank: Bank) -> None:
    async def scenario() -> decree.CommitReport:
        async with decree.aconnect(server.endpoint) as tm:
            a, b = await connect_pair(bank, AppAsyncConnection, AppMySQLConnection)
            report = await transfer(tm, bank, a, b, tid=61)
            await close_all(a, b)
            return report

    assert run(scenario()).kind == "two_phase"
    assert bank.snapshot(server.node).violations(bank.total, {61}) == []


def test_the_asyncio_api_refuses_what_it_cannot_drive(server: Server, bank: Bank) -> None:
    sync_a = psycopg.connect(bank.dsns["pg-a"])
    sub_a = AppConnection.connect(bank.dsns["pg-a"])
    maria = pymysql.connect(**mysql_kwargs(bank.dsns["maria"]), autocommit=True)

    async def scenario() -> None:
        async with decree.aconnect(server.endpoint) as tm:
            async with tm.atransaction() as tx:
                refusals = {
                    "psycopg.Connection is driven by tm.transaction(), not tm.atransaction()": sync_a,
                    "test_asyncio.AppConnection (a psycopg.Connection) is driven by tm.transaction(), "
                    "not tm.atransaction()": sub_a,
                    "pymysql.connections.Connection is driven by tm.transaction(), not tm.atransaction()": maria,
                    "decree.branches.PsycopgBranch (a decree.BranchAdapter) is driven by tm.transaction(), "
                    "not tm.atransaction()": decree.PsycopgBranch(sync_a, "pg-a"),
                    "cannot enlist a builtins.object in tm.atransaction(): pass a psycopg 3 AsyncConnection "
                    "or an aiomysql Connection, or a decree.AsyncBranchAdapter": object(),
                }
                for message, conn in refusals.items():
                    with pytest.raises(decree.UsageError) as refused:
                        await tx.enlist(conn, "pg-a")
                    assert str(refused.value) == message
            assert tx.report is not None and tx.report.kind == "empty"

    try:
        run(scenario())
        assert sync_a.info.transaction_status == psycopg.pq.TransactionStatus.IDLE, "nothing was begun"
    finally:
        for conn in (sync_a, sub_a, maria):
            conn.close()


def test_misuse_is_refused_before_anything_is_sent(server: Server, bank: Bank) -> None:
    async def scenario() -> None:
        a = await psycopg.AsyncConnection.connect(bank.dsns["pg-a"], autocommit=True)
        tm = await decree.aconnect(server.endpoint)
        async with tm.atransaction() as tx:
            with pytest.raises(decree.UsageError, match="autocommit"):
                await tx.enlist(a, "pg-a")
        await a.set_autocommit(False)
        await a.execute("SELECT 1")
        async with tm.atransaction() as tx:
            with pytest.raises(decree.UsageError, match="before its first statement"):
                await tx.enlist(a, "pg-a")
        with pytest.raises(decree.UsageError, match="the transaction is committed"):
            await tx.enlist(a, "pg-a")
        await a.rollback()
        closed = await psycopg.AsyncConnection.connect(bank.dsns["pg-a"])
        await closed.close()
        async with tm.atransaction() as tx:
            with pytest.raises(decree.UsageError, match="the psycopg connection is closed; enlist an open one"):
                await tx.enlist(closed, "pg-a")
        manual = await connect_maria(bank.dsns, autocommit=False)
        closed_m = await connect_maria(bank.dsns)
        closed_m.close()
        async with tm.atransaction() as tx:
            with pytest.raises(decree.UsageError, match="open the aiomysql connection with autocommit=True"):
                await tx.enlist(manual, "maria")
            with pytest.raises(decree.UsageError, match="the aiomysql connection is closed; enlist an open one"):
                await tx.enlist(closed_m, "maria")
        await execute(manual, "XA START 'probe'")  # nothing was begun on it.
        await execute(manual, "XA END 'probe'")
        await execute(manual, "XA ROLLBACK 'probe'")
        manual.close()
        await tm.aclose()
        with pytest.raises(decree.UsageError, match="closed"):
            await tm.atransaction()
        with pytest.raises(decree.UsageError, match="unix:/path"):
            decree.aconnect("http://localhost")
        with pytest.raises(decree.Unavailable, match="cannot connect"):
            await decree.aconnect(f"unix:{server.dir / 'no-such.sock'}")
        await a.close()

    run(scenario())


# --- protocol version 3 (docs/protocol.md, session rules 8 and 9, steps 3 and 5) -------------


async def attached(version: int) -> tuple[AsyncServerConnection, socket.socket]:
    """A session of ``version`` on one end of a socket pair; the test plays the server."""
    mine, theirs = socket.socketpair()
    theirs.settimeout(5)
    conn = AsyncServerConnection(decree.Endpoint.parse("unix:/nonexistent"), decree.Options(reply_timeout=2))
    transport, _ = await asyncio.get_running_loop().create_unix_connection(lambda: conn._stream, sock=mine)
    assert isinstance(transport, asyncio.Transport)
    conn._transport = transport
    conn.node, conn.incarnation, conn.session, conn.version = 7, 1, 1, version
    conn._stream.decoder.version = version
    return conn, theirs


def frames_from(sock: socket.socket) -> list[p.Frame]:
    decoder = p.FrameDecoder(version=3)
    decoder.feed(sock.recv(65536))
    out = []
    while (frame := decoder.next()) is not None:
        out.append(frame)
    return out


def test_one_phase_is_told_on_version_3_only() -> None:
    async def scenario() -> None:
        old, old_peer = await attached(2)
        assert await old.one_phase(old.next_xid()) is False
        new, new_peer = await attached(3)
        done = new.next_xid()
        new.complete(done)
        xid = new.next_xid()
        assert await new.one_phase(xid) is True
        frames = frames_from(new_peer)
        assert [type(f.message) for f in frames] == [p.Complete, p.OnePhase], "the completion goes first"
        assert frames[1].message == p.OnePhase(xid)
        old_peer.setblocking(False)
        with pytest.raises(BlockingIOError):
            old_peer.recv(100)  # the version-2 session sent nothing.
        for conn, peer in ((old, old_peer), (new, new_peer)):
            await conn.aclose()
            peer.close()

    run(scenario())


def test_a_one_phase_notice_the_socket_cannot_take_is_not_sent() -> None:
    async def scenario() -> None:
        conn, peer = await attached(3)
        peer.close()
        with pytest.raises(NotSent):
            await conn.one_phase(conn.next_xid())
        assert conn.broken

    run(scenario())


def test_a_decide_on_a_session_the_server_closed_is_not_written_but_completions_are() -> None:
    async def scenario() -> None:
        conn, peer = await attached(3)
        conn.complete(conn.next_xid())
        peer.shutdown(socket.SHUT_WR)  # the server closes the session and reads to the end (rule 9).
        await asyncio.sleep(0.05)
        assert not await conn.alive()
        with pytest.raises(NotSent):
            await conn.decide(conn.next_xid(), (p.Branch(0, "pg-a"), p.Branch(1, "pg-b")))
        await asyncio.sleep(0.05)
        frames = frames_from(peer)
        assert [type(f.message) for f in frames] == [p.Complete], "the completion, and no Decide"
        assert peer.recv(100) == b"", "then the client closed"
        peer.close()

    run(scenario())


def test_a_server_message_with_an_unknown_must_understand_field_breaks_the_session() -> None:
    async def scenario() -> None:
        conn, peer = await attached(3)
        pong = p.encode_frame(1, p.Pong(), (p.Field(0x8123, b"x"),))
        peer.sendall(pong)
        with pytest.raises(decree.ProtocolError, match="must-understand field 0x8123"):
            await conn.ping()
        assert conn.broken
        peer.close()

    run(scenario())


def test_a_one_phase_commit_is_remembered_committed_after_the_session_closes(server: Server, bank: Bank) -> None:
    """Without the OnePhase notice, the server would answer "rolled back" for it once its
    session closed (rule 6.5), although the database committed it."""

    async def scenario() -> tuple[decree.AsyncTransaction, decree.Outcome]:
        tm = await decree.aconnect(server.endpoint)
        if tm._pool[0].version < 3:
            await tm.aclose()
            need("protocol version 3 in decree serve", "rebuild target/release/decree")
        a = await psycopg.AsyncConnection.connect(bank.dsns["pg-a"])
        async with tm.atransaction() as tx:
            await tx.enlist(a, "pg-a")
            await a.execute(f"INSERT INTO {bank.prefix}_transfers VALUES (70, 0)")
        await tm.aclose()  # the Complete goes with the close.
        await a.close()
        assert tx.xid is not None
        async with decree.aconnect(server.endpoint) as other:
            deadline = time.monotonic() + 15
            while (answer := await other.outcome(tx.xid)) == decree.Outcome.IN_PROGRESS:
                assert time.monotonic() < deadline, "still in progress"
                await asyncio.sleep(0.05)
        return tx, answer

    tx, answer = run(scenario())
    assert tx.report is not None and tx.report.kind == "one_phase"
    assert answer == decree.Outcome.COMMITTED
    assert bank.snapshot(server.node).in_a == {70}


class CommitAnswerLost(decree.AsyncPsycopgBranch):
    """A branch whose one-phase commit happens in the database but whose answer is lost."""

    async def commit_one_phase(self) -> None:
        await super().commit_one_phase()
        raise BranchInDoubt(f"{self.rm}: COMMIT lost its answer (after the commit, by the test)")


async def final_outcome(tm: decree.AsyncTransactionManager, xid: p.Xid, timeout: float = 15.0) -> p.Outcome:
    """The server's answer once it is no longer "in progress" (its session's close seen)."""
    deadline = time.monotonic() + timeout
    while (answer := await tm.outcome(xid)) == p.Outcome.IN_PROGRESS and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return answer


async def needs_version_3(tm: decree.AsyncTransactionManager) -> None:
    """Skips the test (fails it under CI=true) when the server does not speak version 3."""
    version = tm._pool[0].version
    if version < 3:
        await tm.aclose()
        need("protocol version 3 in decree serve", f"it chose version {version}; rebuild target/release/decree")


def test_a_lost_one_phase_answer_is_unknown_and_the_server_says_so(server: Server, bank: Bank) -> None:
    async def scenario() -> tuple[decree.OutcomeUnknown, decree.AsyncTransaction, p.Outcome]:
        async with decree.aconnect(server.endpoint) as tm:
            await needs_version_3(tm)
            a = await psycopg.AsyncConnection.connect(bank.dsns["pg-a"])
            with pytest.raises(decree.OutcomeUnknown, match="one-phase: only the database knows;") as unknown:
                async with tm.atransaction() as tx:
                    await tx.enlist(CommitAnswerLost(a, "pg-a"), "pg-a")
                    await insert(bank, a, 3)
            assert tx.xid is not None
            # The session was closed, so the server answers unknown at once, not in progress.
            answer = await final_outcome(tm, tx.xid, timeout=5)
            await a.close()
            return unknown.value, tx, answer

    error, tx, answer = run(scenario())
    assert error.xid == tx.xid and tx.state == "unknown" and answer == p.Outcome.UNKNOWN
    assert bank.snapshot(server.node).in_a == {3}


def test_an_older_session_is_not_told_and_the_error_says_so(server: Server, bank: Bank) -> None:
    before = server.metrics()

    async def scenario() -> decree.OutcomeUnknown:
        endpoint = decree.Endpoint.parse(server.endpoint)
        async with decree.AsyncTransactionManager(endpoint, decree.Options(versions=(1, 2))) as old:
            a = await psycopg.AsyncConnection.connect(bank.dsns["pg-a"])
            async with old.atransaction() as tx:
                await tx.enlist(a, "pg-a")
                await insert(bank, a, 4)
            with pytest.raises(decree.OutcomeUnknown) as unknown:
                async with old.atransaction() as tx:
                    await tx.enlist(CommitAnswerLost(a, "pg-a"), "pg-a")
                    await insert(bank, a, 5)
            await a.close()
            return unknown.value

    error = run(scenario())
    assert "one-phase: only the database knows (the server speaks protocol version 2 and was not told of " \
        "this transaction)" in str(error)
    assert bank.snapshot(server.node).in_a == {4, 5}
    assert server.metrics()["decree_commits_total"] == before["decree_commits_total"]


def test_a_one_phase_notice_that_cannot_be_written_rolls_the_branch_back(server: Server, bank: Bank) -> None:
    async def scenario() -> tuple[decree.RolledBack, decree.AsyncTransaction, p.Outcome]:
        async with decree.aconnect(server.endpoint) as tm:
            await needs_version_3(tm)
            a = await psycopg.AsyncConnection.connect(bank.dsns["pg-a"])
            with pytest.raises(decree.RolledBack, match="OnePhase notice could not be written") as refused:
                async with tm.atransaction() as tx:
                    await tx.enlist(a, "pg-a")
                    await insert(bank, a, 6)
                    session = tx._session
                    assert session is not None and session._transport is not None
                    session._transport.get_extra_info("socket").shutdown(socket.SHUT_WR)  # writes fail now.
            assert tx.xid is not None
            answer = await final_outcome(tm, tx.xid)
            async with tm.atransaction() as again:  # the connection and the manager go on.
                await again.enlist(a, "pg-a")
                await insert(bank, a, 7)
            await a.close()
            return refused.value, tx, answer

    error, tx, answer = run(scenario())
    assert error.rm == "pg-a" and tx.state == "rolled_back"
    assert answer == p.Outcome.ROLLED_BACK, "the server never got OnePhase"
    assert bank.snapshot(server.node).in_a == {7}


# --- the guide's asyncio program --------------------------------------------------------------


def guide_asyncio_program(marker: str = "guide-asyncio") -> str:
    """The code block after ``<!-- marker:`` in docs/guide.md."""
    text = (REPO / "docs" / "guide.md").read_text()
    after = text[text.index(f"<!-- {marker}:"):]
    match = re.search(r"```python\n(.*?)\n```", after, re.S)
    assert match is not None, f"no python block after the {marker} marker"
    return match.group(1) + "\n"


class StandInFastAPI:
    """What the guide's program uses of FastAPI: its lifespan, ``app.state``, ``@app.post``."""

    def __init__(self, lifespan: Any) -> None:
        self.lifespan = lifespan
        self.state = types.SimpleNamespace()
        self.routes: dict[str, Any] = {}

    def post(self, path: str) -> Any:
        def register(fn: Any) -> Any:
            self.routes[path] = fn
            return fn

        return register


def test_the_guide_asyncio_program_moves_money(
    bank_server: Server, dsns: dict[str, str], schema: str, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    searched = {rm: f"{dsns[rm]} options='-c search_path={schema}'" for rm in ("pg-a", "pg-b")}
    for dsn in searched.values():
        with psycopg.connect(dsn, autocommit=True) as db:
            db.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL CHECK (balance >= 0))")
            db.execute("INSERT INTO accounts VALUES (1, 100)")
    monkeypatch.setitem(sys.modules, "fastapi", types.SimpleNamespace(FastAPI=StandInFastAPI))
    monkeypatch.setenv("DECREE", bank_server.endpoint)
    monkeypatch.setenv("BANK_A", searched["pg-a"])
    monkeypatch.setenv("BANK_B", searched["pg-b"])
    program: dict[str, Any] = {"__name__": "guide_asyncio"}
    exec(compile(guide_asyncio_program(), "docs/guide.md (asyncio)", "exec"), program)
    app = program["app"]

    async def scenario() -> dict[str, str]:
        async with app.lifespan(app):
            moved: dict[str, str] = await app.routes["/transfer"](30)
            with pytest.raises(psycopg.errors.CheckViolation):
                await app.routes["/transfer"](1000)  # more than account 1 holds: both roll back.
            assert isinstance(app.state.tm, decree.AsyncTransactionManager)
        return moved

    moved = run(scenario())
    assert moved["commit"] == "two_phase" and moved["xid"].startswith(f"decree:64637265:{bank_server.node:08x}")
    balances = []
    for dsn in searched.values():
        with psycopg.connect(dsn, autocommit=True) as db:
            row = db.execute("SELECT balance FROM accounts WHERE id = 1").fetchone()
            balances.append(row[0] if row else None)
    assert balances == [70, 130]
    assert prepared_branches(dsns, bank_server.node) == []


# --- a branch the application ended itself ------------------------------------------------------


async def insert(bank: Bank, conn: Any, tid: int) -> None:
    await execute(conn, f"INSERT INTO {bank.prefix}_transfers VALUES (%s, 1)", (tid,))


async def end_branch(conn: Any, tx: decree.AsyncTransaction, number: int, how: str) -> None:
    """What an application might do by mistake: end the branch on ``conn`` itself. psycopg
    refuses ``commit()`` during a two-phase transaction, so the SQL is sent as text; MariaDB
    refuses COMMIT and ROLLBACK in an XA branch, so the application ends it with XA."""
    if not isinstance(conn, aiomysql.Connection):
        await conn.execute("COMMIT" if how == "commit" else "ROLLBACK")
        return
    assert tx.xid is not None
    async with conn.cursor() as cur:
        await cur.execute("SELECT CONNECTION_ID()")
        name = tx.xid.branch(number).mariadb_name(int((await cur.fetchone())[0])).mysql_xid()
        await cur.execute(f"XA END {name}")
        await cur.execute(f"XA COMMIT {name} ONE PHASE" if how == "commit" else f"XA ROLLBACK {name}")


@both_banks
@pytest.mark.parametrize("how", ["commit", "rollback"])
@pytest.mark.parametrize("ended", ["a", "b"])
def test_a_branch_ended_by_the_application_is_reported_as_not_safe_to_retry(
    server: Server, bank: Bank, how: str, ended: str
) -> None:
    async def scenario() -> tuple[decree.BranchEndedByApplication, decree.AsyncTransaction]:
        async with pair_on(server.endpoint, bank) as (tm, a, b):
            with pytest.raises(decree.BranchEndedByApplication) as raised:
                async with tm.atransaction() as tx:
                    await tx_enlist_both(tx, a, b)
                    await insert(bank, a, 1)
                    await insert(bank, b, 1)
                    await end_branch(a if ended == "a" else b, tx, 0 if ended == "a" else 1, how)
            await transfer(tm, bank, a, b, tid=2)  # both connections serve the next transaction.
        return raised.value, tx

    e, tx = run(scenario())
    assert not isinstance(e, (decree.RolledBack, decree.OutcomeUnknown)) and tx.state == "failed"
    assert (e.rm, e.branch, e.xid) == (("pg-a", 0) if ended == "a" else (bank.rm_b, 1)) + (tx.xid,)
    assert "not safe to retry" in str(e) and str(e.rm) in str(e)
    snap = bank.snapshot(server.node)
    committed_by_app = {1} if how == "commit" else set()
    assert snap.in_a == (committed_by_app if ended == "a" else set()) | {2}
    assert snap.in_b == (committed_by_app if ended == "b" else set()) | {2}
    assert snap.prepared == []


@both_banks
@pytest.mark.parametrize("how", ["commit", "rollback"])
def test_the_only_branch_ended_by_the_application_is_reported_too(server: Server, bank: Bank, how: str) -> None:
    async def scenario() -> decree.BranchEndedByApplication:
        async with decree.aconnect(server.endpoint) as tm:
            b = await connect_b(bank)
            with pytest.raises(decree.BranchEndedByApplication) as raised:
                async with tm.atransaction() as tx:
                    await tx.enlist(b, bank.rm_b)
                    await insert(bank, b, 3)
                    await end_branch(b, tx, 0, how)
            await close_all(b)
            return raised.value

    e = run(scenario())
    assert (e.rm, e.branch) == (bank.rm_b, 0)
    assert bank.snapshot(server.node).in_b == ({3} if how == "commit" else set())


@both_banks
def test_a_branch_enlisted_with_no_sql_yet_commits_normally(server: Server, bank: Bank) -> None:
    async def scenario() -> tuple[decree.AsyncTransaction, decree.AsyncTransaction]:
        async with pair_on(server.endpoint, bank) as (tm, a, b):
            async with tm.atransaction() as two:
                await tx_enlist_both(two, a, b)
                await insert(bank, b, 4)
            async with tm.atransaction() as one:  # one branch, no SQL at all
                await one.enlist(b, bank.rm_b)
        return two, one

    two, one = run(scenario())
    assert two.report is not None and two.report.kind == "two_phase"
    assert one.report is not None and one.report.kind == "one_phase"
    snap = bank.snapshot(server.node)
    assert (snap.in_a, snap.in_b, snap.prepared) == (set(), {4}, [])


# --- MariaDB through aiomysql: what only its adapter does ---------------------------------------


@pytest.mark.parametrize("bank", ["maria"], indirect=True, ids=["pg-mariadb"])
def test_a_mariadb_connection_lost_before_the_prepare_rolls_every_branch_back(server: Server, bank: Bank) -> None:
    async def scenario() -> decree.RolledBack:
        async with pair_on(server.endpoint, bank) as (tm, a, m):
            killer = pymysql.connect(**mysql_kwargs(bank.dsns["maria"]), autocommit=True)
            with pytest.raises(decree.RolledBack) as refused:
                async with tm.atransaction() as tx:
                    await tx_enlist_both(tx, a, m)
                    await work(bank, a, m, 13, 5, 1, 2)
                    with killer.cursor() as cur:
                        cur.execute(f"KILL {m.server_thread_id[0]}")
                    await asyncio.sleep(0.2)
            killer.close()
        return refused.value

    error = run(scenario())
    assert error.rm == "maria" and error.branch == 1 and "did not prepare" in str(error), error
    snap = bank.settled(server.node, set())
    assert snap.violations(bank.total, set()) == [] and not snap.in_a and not snap.in_b


@pytest.mark.parametrize("bank", ["maria"], indirect=True, ids=["pg-mariadb"])
def test_a_mariadb_branch_is_named_with_the_connection_that_prepares_it(server: Server, bank: Bank) -> None:
    """The server waits for the connection named in a MariaDB branch before it finishes
    the branch by name (docs/protocol.md); the asyncio adapter writes the same name as
    PyMySQL's (test_transactions.py)."""

    async def scenario() -> tuple[list[decree.Xid], decree.Xid, int]:
        m = await connect_maria(bank.dsns)
        other = pymysql.connect(**mysql_kwargs(bank.dsns["maria"]), autocommit=True)
        try:
            async with m.cursor() as cur:
                await cur.execute("SELECT CONNECTION_ID()")
                connection_id = int((await cur.fetchone())[0])
            xid = decree.Xid.decree(0x00C0_0013, int(time.time()), 1, 1).branch(1)
            branch = decree.AsyncMySQLBranch(m, "maria")
            await branch.start(xid)
            await insert(bank, m, 7)
            await branch.prepare()
            with other.cursor() as cur:
                cur.execute("XA RECOVER")
                listed = [
                    decree.Xid.from_xa_recover(int(r[0]), int(r[1]), int(r[2]), bytes(r[3])) for r in cur.fetchall()
                ]
            assert await branch.commit_prepared() == DONE
        finally:
            other.close()
            m.close()
        return listed, xid, connection_id

    listed, xid, connection_id = run(scenario())
    assert xid.mariadb_name(connection_id) in listed, listed
    assert [n.from_mariadb_name() for n in listed if n.gtrid == xid.gtrid] == [(xid, connection_id)]
    assert bank.snapshot(server.node).in_b == {7}


def test_the_guide_asyncio_mariadb_program_pays_an_order(dsns: dict[str, str], schema: str) -> None:  # noqa: F811
    bank_a = f"{dsns['pg-a']} options='-c search_path={schema}'"
    with psycopg.connect(bank_a, autocommit=True) as db:
        db.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL CHECK (balance >= 0))")
        db.execute("INSERT INTO accounts VALUES (1, 100)")
    paid = f"paid_{schema}"
    maria = pymysql.connect(**mysql_kwargs(dsns["maria"]), autocommit=True)
    server = Server([("bank-a", "postgres", dsns["pg-a"]), ("orders", "mariadb", dsns["maria"])])
    try:
        with maria.cursor() as cur:
            cur.execute(f"CREATE TABLE {paid} (id int PRIMARY KEY, amount bigint NOT NULL) ENGINE=InnoDB")
        server.start()
        program: dict[str, Any] = {"__name__": "guide_asyncio_mariadb"}
        source = guide_asyncio_program("guide-asyncio-mariadb").replace("INTO paid ", f"INTO {paid} ")
        exec(compile(source, "docs/guide.md (aiomysql)", "exec"), program)
        orders = mysql_kwargs(dsns["maria"])
        orders["db"] = orders.pop("database")
        program["BANK_A"], program["ORDERS"] = bank_a, orders

        async def scenario() -> decree.CommitReport:
            async with decree.aconnect(server.endpoint) as tm:
                report: decree.CommitReport = await program["pay"](tm, 1, 30)
                with pytest.raises(psycopg.errors.CheckViolation):
                    await program["pay"](tm, 2, 1000)  # more than account 1 holds: both roll back.
            return report

        report = run(scenario())
        assert report.kind == "two_phase"
        with psycopg.connect(bank_a, autocommit=True) as db:
            assert db.execute("SELECT balance FROM accounts WHERE id = 1").fetchone() == (70,)
        with maria.cursor() as cur:
            cur.execute(f"SELECT id, amount FROM {paid}")
            assert cur.fetchall() == ((1, 30),)
        assert prepared_branches(dsns, server.node) == []
    finally:
        server.cleanup()
        with maria.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {paid}")
        maria.close()
