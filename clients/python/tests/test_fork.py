"""A TransactionManager created before ``os.fork()`` (a pre-fork web server imports the
application first): the child must not touch the parent's sessions. It drops them without
writing a byte (a buffered Complete stays the parent's, a TLS session gets no
close_notify), opens a session of its own on first use, so that parent and child never
mint the same Xid, restarts the keep-alive, and refuses a transaction begun before the
fork. Under load, every Xid is unique and every transfer lands once."""

from __future__ import annotations

import faulthandler
import json
import os
import select
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import decree
from bank import Bank
from conftest import IDLE_MS, Server
from decree.connection import Options, ServerConnection
from test_tls import tls_config, tls_server  # noqa: F401 (a fixture)

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")


class Child:
    """A forked child that runs ``fn`` and reports its JSON result (or its exception)."""

    def __init__(self, fn: Callable[[], Any], timeout: float = 120.0) -> None:
        self.timeout = timeout
        self._r, w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(self._r)
            self._run(fn, w)
        os.close(w)

    @staticmethod
    def _run(fn: Callable[[], Any], w: int) -> None:
        # A child that hangs prints where it is, every thread, when the parent gives up on it.
        # (Not dump_traceback_later: its watchdog's lock may be held by the parent's
        # watchdog thread at the fork, and the child would hang on it.)
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        try:
            out = {"ok": fn()}
        except BaseException as e:
            out = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
        try:
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)

    def result(self) -> Any:
        timeout = self.timeout
        deadline = time.monotonic() + timeout
        data = b""
        while True:
            ready, _, _ = select.select([self._r], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.kill(self.pid, signal.SIGUSR1)
                time.sleep(1.0)
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
                pytest.fail(f"child {self.pid} did not finish within {timeout} s")
            chunk = os.read(self._r, 65536)
            if not chunk:
                break
            data += chunk
        os.close(self._r)
        os.waitpid(self.pid, 0)
        out = json.loads(data)
        assert "error" not in out, f"child failed: {out.get('trace')}"
        return out["ok"]


def session_of(tm: decree.TransactionManager) -> int:
    """The server session a new transaction of ``tm`` would use (read from its Xid)."""
    tx = tm.transaction()
    tx.rollback()
    assert tx.xid.origin is not None
    return tx.xid.origin.session


def test_the_child_writes_nothing_into_the_parents_session() -> None:
    """No server: a pooled session with a buffered Complete on one end of a socket pair.
    The child closes the manager (which flushes completions) and even asks for a new
    session; not one byte may reach the parent's peer."""
    tm = decree.TransactionManager(decree.Endpoint.parse("unix:/nonexistent/decree.sock"), Options(reply_timeout=1.0))
    conn = ServerConnection(tm.endpoint, tm.options)
    mine, theirs = socket.socketpair()
    conn._sock = mine
    conn._reply_timeout(mine)
    conn.node, conn.incarnation, conn.session = 7, 1, 1
    conn.complete(conn.next_xid())
    tm._sessions.add(conn)
    tm._release(conn)

    def child() -> str:
        try:
            tm.ping()  # a new session: the endpoint does not exist.
        except decree.Unavailable as e:
            tm.close()
            return str(e)
        return "pinged"

    assert "cannot connect" in Child(child, timeout=20).result()
    theirs.settimeout(0.3)
    with pytest.raises(socket.timeout):
        data = theirs.recv(100)
        pytest.fail(f"the child wrote into the parent's session: {data!r}")
    conn.flush()  # the parent's session is intact and still holds its Complete.
    assert len(theirs.recv(100)) > 0
    conn.close_now("test over"), theirs.close()


def test_a_transaction_begun_before_the_fork_is_refused_in_the_child(tm: decree.TransactionManager) -> None:
    parent_session = session_of(tm)
    tx = tm.transaction()

    def child() -> dict[str, Any]:
        try:
            tx.commit()
            refused = "committed"
        except decree.UsageError as e:
            refused = str(e)
        return {"refused": refused, "session": session_of(tm)}

    got = Child(child).result()
    assert "fork" in got["refused"] and str(tx.xid) in got["refused"], got
    assert got["session"] != parent_session, "the child opened a session of its own"
    assert tx.commit().kind == "empty", "the parent's transaction is untouched"
    assert session_of(tm) == parent_session


def transfers(tm: decree.TransactionManager, bank: Bank, tids: Iterator[int], xids: list[str], done: list[int]) -> None:
    a, b = bank.connect_a(), bank.connect_b()
    try:
        for tid in tids:
            tx = tm.transaction()
            xids.append(str(tx.xid))
            with tx:
                tx.enlist(a, "pg-a")
                tx.enlist(b, bank.rm_b)
                bank.work(a, b, tid, 1, tid % bank.accounts, (tid * 7 + 3) % bank.accounts)
            done.append(tid)
    finally:
        a.close(), b.close()


def fill_pool(tm: decree.TransactionManager, bank: Bank, sessions: int, xids: list[str], done: list[int]) -> None:
    """Leaves ``sessions`` pooled sessions, each holding the buffered Complete of a transfer."""
    pairs = [(bank.connect_a(), bank.connect_b()) for _ in range(sessions)]
    txs = [tm.transaction() for _ in range(sessions)]
    for i, (tx, (a, b)) in enumerate(zip(txs, pairs)):
        xids.append(str(tx.xid))
        tx.enlist(a, "pg-a")
        tx.enlist(b, bank.rm_b)
        bank.work(a, b, 500 + i, 1, i, i + 1)
    for i, tx in enumerate(txs):
        assert tx.commit().kind == "two_phase"
        done.append(500 + i)
    for a, b in pairs:
        a.close(), b.close()


@pytest.mark.parametrize("rm_b", ["pg-b", "maria"], ids=["pg-pg", "pg-mariadb"])
def test_forks_under_load_mint_unique_xids_and_every_transfer_lands_once(
    server: Server, dsns: dict[str, str], tm: decree.TransactionManager, rm_b: str
) -> None:
    bank = Bank(dsns, rm_b).create()
    threads, children, per_child = 3, 3, 15
    xids: list[str] = []
    done: list[int] = []
    failures: list[BaseException] = []
    stop = threading.Event()

    def worker(t: int) -> None:
        def tids() -> Iterator[int]:
            i = 0
            while not stop.is_set():
                i += 1
                yield 10_000 * (t + 1) + i

        try:
            transfers(tm, bank, tids(), xids, done)
        except BaseException as e:
            failures.append(e)

    def child(c: int) -> dict[str, list[Any]]:
        mine: list[str] = []
        landed: list[int] = []
        transfers(tm, bank, iter(range(1_000_000 * (c + 1), 1_000_000 * (c + 1) + per_child)), mine, landed)
        return {"xids": mine, "done": landed}

    try:
        fill_pool(tm, bank, 2 * threads, xids, done)
        pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
        for th in pool:
            th.start()
        forked = []
        for c in range(children):
            time.sleep(0.15)  # the parent's sessions are busy and hold buffered completions.
            forked.append(Child(lambda c=c: child(c)))
        results = [f.result() for f in forked]
        stop.set()
        for th in pool:
            th.join()
        assert failures == []
        all_xids = xids + [x for r in results for x in r["xids"]]
        landed = set(done) | {t for r in results for t in r["done"]}
        assert len(all_xids) == len(set(all_xids)), "an Xid was minted twice"
        assert all(len(r["done"]) == per_child for r in results)
        assert len(done) > threads, "the parent worked while the children did"
        snap = bank.snapshot(server.node)
        assert snap.violations(bank.total, landed) == []
        assert snap.in_a == snap.in_b == landed
    finally:
        stop.set()
        bank.drop()


def test_the_child_keeps_its_own_session_alive(idle_server: Server, dsns: dict[str, str]) -> None:
    bank = Bank(dsns, "pg-b").create()
    try:
        with decree.connect(idle_server.endpoint) as tm:

            def child() -> dict[str, Any]:
                a, b = bank.connect_a(), bank.connect_b()
                with tm.transaction() as tx:
                    tx.enlist(a, "pg-a")
                    tx.enlist(b, "pg-b")
                    bank.work(a, b, 1, 5, 1, 2)
                    time.sleep(4 * IDLE_MS / 1000)  # only a keep-alive of the child's own keeps it.
                a.close(), b.close()
                assert tx.report is not None
                return {"kind": tx.report.kind, "resolved": tx.report.resolved_by_outcome}

            assert Child(child).result() == {"kind": "two_phase", "resolved": False}
            tm.ping()
        assert idle_server.metrics()["decree_sessions_idle_closed_total"] == 0
        assert bank.snapshot(idle_server.node).violations(bank.total, {1}) == []
    finally:
        bank.drop()


def test_a_tls_child_sends_no_close_notify_on_the_parents_session(tls_server: Server) -> None:  # noqa: F811
    with decree.connect(f"tls:127.0.0.1:{tls_server.tcp_port}", tls=tls_config(tls_server, "app-1")) as tm:
        parent_session = session_of(tm)
        opened = tls_server.metrics()["decree_sessions_opened_total"]

        def child() -> int:
            tm.ping()
            return session_of(tm)

        assert Child(child).result() != parent_session
        time.sleep(0.2)  # a close_notify, had one been sent, would have ended the session by now.
        assert session_of(tm) == parent_session, "the parent's TLS session survived the child"
        assert tls_server.metrics()["decree_sessions_opened_total"] == opened + 1


def test_a_lock_of_a_manager_of_several_pairs_held_at_the_fork_is_free_in_the_child(server: Server) -> None:
    """A thread of the parent inside the manager's lock when another forks: the child has
    no such thread, so the lock would stay held in it forever."""
    with decree.connect_pairs(server.endpoint) as pm:
        with pm._lock:  # as another thread of the parent would hold it at the fork.

            def child() -> int:
                with pm.transaction() as tx:
                    pass
                return tx.xid.origin.session if tx.xid.origin else -1

            session = Child(child, timeout=20).result()
        assert session > 0, "the child began a transaction of its own"
        with pm.transaction():
            pass
