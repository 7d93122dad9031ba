"""Protocol version 3 from the client's side (docs/protocol.md, session rules 8 and 9, "What
a client does" steps 3 and 5), against a real ``decree serve`` and real databases:

- a one-phase commit tells the server first (``OnePhase``) and completes after, so that
  ``Outcome`` never answers rolled back for a transaction a database committed in one
  phase: the client killed right after the commit (unknown), a normal close (committed),
  the server closing the session for idleness (unknown or committed);
- a lost one-phase answer is reported as "only the database knows";
- a ``Decide`` on a session the server has closed (a restart between begin and commit) is
  not written: the transaction rolls back and no branch stays prepared.

Tests that need the server's version 3 are skipped when it speaks an older one (and fail
under CI=true). Without a server: the session check and the field trailer on a socket pair.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import decree
from bank import Bank, prepared_branches
from conftest import Server, need
from decree import protocol as p
from decree.branches import BranchInDoubt, PsycopgBranch
from decree.connection import NotSent, Options, ServerConnection
from test_tls import tls_config, tls_server  # noqa: F401 (tls_server is a fixture)

WORKER = Path(__file__).resolve().parent / "one_phase_worker.py"


def needs_version_3(server: Server) -> None:
    """Skips the test (fails it under CI=true) when the server does not speak version 3."""
    conn = ServerConnection.open(decree.Endpoint.parse(server.endpoint), Options(versions=(1, 2, 3)))
    conn.close()
    if conn.version < 3:
        need("protocol version 3 in decree serve", f"it chose version {conn.version}; rebuild target/release/decree")


def final_outcome(tm: decree.TransactionManager, xid: p.Xid, timeout: float = 15.0) -> p.Outcome:
    """The server's answer once it is no longer "in progress" (its session's close seen)."""
    deadline = time.monotonic() + timeout
    while True:
        answer = tm.outcome(xid)
        if answer != p.Outcome.IN_PROGRESS or time.monotonic() > deadline:
            return answer
        time.sleep(0.05)


def insert_one_phase(tm: decree.TransactionManager, bank: Bank, a: Any, tid: int) -> decree.Transaction:
    with tm.transaction() as tx:
        tx.enlist(a, "pg-a")
        a.execute(f"INSERT INTO {bank.prefix}_transfers VALUES (%s, 0)", (tid,))
    assert tx.report is not None and tx.report.kind == "one_phase"
    return tx


# --- one-phase commits --------------------------------------------------------------------


@pytest.fixture
def a(bank: Bank) -> Iterator[Any]:
    """A connection to the bank's database A (pg-a), closed after the test."""
    conn = bank.connect_a()
    yield conn
    conn.close()


def test_a_client_killed_after_a_one_phase_commit_leaves_it_unknown_not_rolled_back(
    server: Server, bank: Bank, tm: decree.TransactionManager, tmp_path: Path
) -> None:
    needs_version_3(server)
    before = server.metrics()
    out = tmp_path / "xid"
    done = subprocess.run(
        [sys.executable, str(WORKER), server.endpoint, f"{bank.prefix}_transfers", "7", str(out)],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == -9, f"the worker was to kill itself after the commit: {done.stderr[-2000:]}"
    gtrid, version = out.read_text().split()
    xid = p.Xid(p.DECREE_FORMAT_ID, bytes.fromhex(gtrid))
    assert bank.snapshot(server.node).in_a == {7}, "the database committed it"
    assert final_outcome(tm, xid) == p.Outcome.UNKNOWN, "the server got OnePhase: only the database knows"
    assert version == "3"
    after = server.metrics()
    assert after["decree_one_phase_notices_total"] == before["decree_one_phase_notices_total"] + 1
    assert after["decree_one_phase_completes_total"] == before["decree_one_phase_completes_total"], "killed first"


def test_a_one_phase_commit_is_completed_and_remembered_committed(
    server: Server, bank: Bank, tm: decree.TransactionManager, a: Any
) -> None:
    needs_version_3(server)
    before = server.metrics()
    other = decree.connect(server.endpoint, client_name="one-phase")
    tx = insert_one_phase(other, bank, a, 1)
    assert tm.outcome(tx.xid) == p.Outcome.IN_PROGRESS, "marked, its Complete still buffered"
    other.ping()  # the same pooled session: the buffered Complete goes first.
    assert tm.outcome(tx.xid) == p.Outcome.COMMITTED
    later = insert_one_phase(other, bank, a, 2)
    other.close()  # the buffered Complete goes with the close.
    assert final_outcome(tm, later.xid) == p.Outcome.COMMITTED
    assert bank.snapshot(server.node).in_a == {1, 2}
    after = server.metrics()
    assert after["decree_one_phase_completes_total"] == before["decree_one_phase_completes_total"] + 2


class CommitAnswerLost(PsycopgBranch):
    """A branch whose one-phase commit happens in the database but whose answer is lost."""

    def commit_one_phase(self) -> None:
        super().commit_one_phase()
        raise BranchInDoubt(f"{self.rm}: COMMIT lost its answer (after the commit, by the test)")


def test_a_lost_one_phase_answer_is_unknown_and_the_server_says_so(
    server: Server, bank: Bank, tm: decree.TransactionManager, a: Any
) -> None:
    needs_version_3(server)
    with pytest.raises(decree.OutcomeUnknown, match="one-phase: only the database knows;") as unknown:
        with tm.transaction() as tx:
            tx.enlist(CommitAnswerLost(a, "pg-a"), "pg-a")
            a.execute(f"INSERT INTO {bank.prefix}_transfers VALUES (3, 0)")
    assert unknown.value.xid == tx.xid and tx.state == "unknown"
    # The session was closed, so the server answers unknown at once, not in progress.
    assert final_outcome(tm, tx.xid, timeout=5) == p.Outcome.UNKNOWN
    assert bank.snapshot(server.node).in_a == {3}


def test_an_older_session_is_not_told_and_the_error_says_so(server: Server, bank: Bank, a: Any) -> None:
    endpoint = decree.Endpoint.parse(server.endpoint)
    old = decree.TransactionManager(endpoint, Options(versions=(1, 2)))
    before = server.metrics()
    insert_one_phase(old, bank, a, 4)
    with pytest.raises(decree.OutcomeUnknown) as unknown:
        with old.transaction() as tx:
            tx.enlist(CommitAnswerLost(a, "pg-a"), "pg-a")
            a.execute(f"INSERT INTO {bank.prefix}_transfers VALUES (5, 0)")
    assert "one-phase: only the database knows (the server speaks protocol version 2 and was not told of " \
        "this transaction)" in str(unknown.value)
    old.close()
    assert bank.snapshot(server.node).in_a == {4, 5}
    assert server.metrics()["decree_commits_total"] == before["decree_commits_total"]


def test_a_one_phase_notice_that_cannot_be_written_rolls_the_branch_back(
    server: Server, bank: Bank, tm: decree.TransactionManager, a: Any
) -> None:
    needs_version_3(server)
    with pytest.raises(decree.RolledBack, match="OnePhase notice could not be written") as refused:
        with tm.transaction() as tx:
            tx.enlist(a, "pg-a")
            a.execute(f"INSERT INTO {bank.prefix}_transfers VALUES (6, 0)")
            session = tx._session
            assert session is not None and session._sock is not None
            session._sock.shutdown(socket.SHUT_WR)  # the next write fails (EPIPE).
    assert refused.value.rm == "pg-a" and tx.state == "rolled_back"
    assert bank.snapshot(server.node).in_a == set()
    assert final_outcome(tm, tx.xid) == p.Outcome.ROLLED_BACK, "the server never got OnePhase"
    insert_one_phase(tm, bank, a, 7)  # the connection is usable again.


# --- the idle timeout ---------------------------------------------------------------------


def wait_idle_closes(server: Server, count: float, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while server.metrics()["decree_sessions_idle_closed_total"] < count:
        assert time.monotonic() < deadline, "the server closed no idle session"
        time.sleep(0.01)


@pytest.mark.parametrize("then", ["close", "next_transaction"])
def test_a_one_phase_commit_whose_session_the_idle_timeout_closes_is_never_rolled_back(
    idle_server: Server, dsns: dict[str, str], monkeypatch: pytest.MonkeyPatch, then: str
) -> None:
    needs_version_3(idle_server)
    # The application stalls its keep-alive: the server closes the session for idleness.
    monkeypatch.setattr(ServerConnection, "ping_if_idle", lambda self, idle_for: None)
    bank = Bank(dsns, "pg-b").create()
    try:
        tm = decree.connect(idle_server.endpoint)
        a = bank.connect_a()
        closed = idle_server.metrics()["decree_sessions_idle_closed_total"]
        tx = insert_one_phase(tm, bank, a, 1)
        wait_idle_closes(idle_server, closed + 1)
        if then == "next_transaction":
            insert_one_phase(tm, bank, a, 2)  # finds the session gone and opens another.
        tm.close()
        with decree.connect(idle_server.endpoint) as asker:
            assert final_outcome(asker, tx.xid) in (p.Outcome.UNKNOWN, p.Outcome.COMMITTED)
            if idle_server.metrics()["decree_sessions_closed_unread_total"] == 0:
                # The client closed within close_drain_ms, after writing its Complete.
                assert final_outcome(asker, tx.xid) == p.Outcome.COMMITTED
        assert 1 in bank.snapshot(idle_server.node).in_a
        a.close()
    finally:
        bank.drop()


def test_a_one_phase_notice_written_as_the_server_closes_the_session_is_read(idle_server: Server) -> None:
    needs_version_3(idle_server)
    endpoint = decree.Endpoint.parse(idle_server.endpoint)
    closed = idle_server.metrics()["decree_sessions_idle_closed_total"]
    told, silent = ServerConnection.open(endpoint, Options()), ServerConnection.open(endpoint, Options())
    told_xid, silent_xid = told.next_xid(), silent.next_xid()
    wait_idle_closes(idle_server, closed + 2)
    assert told.one_phase(told_xid), "written into a session the server is closing"
    told.close_now("test"), silent.close_now("test")
    with decree.connect(idle_server.endpoint) as asker:
        assert final_outcome(asker, told_xid) == p.Outcome.UNKNOWN, "only the database knows"
        assert final_outcome(asker, silent_xid) == p.Outcome.ROLLED_BACK, "read to the end, nothing came"


# --- a Decide on a session the server has closed ------------------------------------------


@pytest.mark.parametrize(
    "kind,rm_b", [("unix", "pg-b"), ("unix", "maria"), ("tcp", "pg-b"), ("tls", "pg-b")]
)
def test_a_decide_after_the_server_restarted_is_not_sent_and_rolls_back(
    request: pytest.FixtureRequest, dsns: dict[str, str], kind: str, rm_b: str
) -> None:
    server: Server = request.getfixturevalue("tls_server" if kind == "tls" else "tcp_server")
    endpoint = server.endpoint if kind == "unix" else f"{kind}:127.0.0.1:{server.tcp_port}"
    tls = tls_config(server, "app-1") if kind == "tls" else None
    bank = Bank(dsns, rm_b).create()
    try:
        tm = decree.connect(endpoint, tls=tls, outcome_timeout=3)
        a, b = bank.connect_a(), bank.connect_b()
        tx = tm.transaction()
        tx.enlist(a, "pg-a")
        tx.enlist(b, rm_b)
        bank.work(a, b, 1, 5, 1, 2)
        server.kill()
        server.start()
        with pytest.raises(decree.RolledBack, match="the decision was not sent .*closed by the server"):
            tx.commit()
        assert prepared_branches(dsns, server.node) == [], "every prepared branch is rolled back"
        assert bank.snapshot(server.node).violations(bank.total, set()) == []
        bank.transfer(tm, a, b, 2)  # the next transaction gets a new session.
        assert bank.snapshot(server.node).violations(bank.total, {2}) == []
        tm.close()
        a.close(), b.close()
    finally:
        bank.drop()


# --- without a server: the session check and the trailer ---------------------------------


def fake_session(version: int) -> tuple[ServerConnection, socket.socket]:
    """A ServerConnection of ``version`` on one end of a socket pair; the other is the server."""
    conn = ServerConnection(decree.Endpoint.parse("unix:/nonexistent"), Options(reply_timeout=2))
    mine, theirs = socket.socketpair()
    conn._reply_timeout(mine)
    conn._sock, conn.version, conn._decoder.version = mine, version, version
    conn.node, conn.incarnation, conn.session = 1, 7, 42
    return conn, theirs


def read_all(sock: socket.socket) -> bytes:
    """What the client wrote, up to its close."""
    sock.settimeout(2)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except ConnectionResetError:  # closed with our unread bytes in its buffer.
        pass
    return out


def test_a_decide_on_a_session_the_server_closed_is_not_written() -> None:
    conn, server = fake_session(3)
    xid = conn.next_xid()
    conn.complete(xid)  # buffered from an earlier transaction.
    server.shutdown(socket.SHUT_WR)  # the server closes its side and reads on (rule 9).
    with pytest.raises(NotSent, match="closed by the server"):
        conn.decide(conn.next_xid(), (p.Branch(0, "pg-a"), p.Branch(1, "pg-b")))
    assert conn.broken
    assert read_all(server) == p.encode_frame(1, p.Complete(xid)), "the Complete went, the Decide did not"


def test_a_decide_after_unsolicited_bytes_is_not_written() -> None:
    conn, server = fake_session(2)
    server.sendall(p.encode_frame(0, p.Error(int(p.ErrorCode.SHUTTING_DOWN), "bye")))
    with pytest.raises(NotSent, match="unsolicited bytes"):
        conn.decide(conn.next_xid(), (p.Branch(0, "pg-a"), p.Branch(1, "pg-b")))
    assert read_all(server) == b""


def test_a_decide_whose_write_fails_is_not_sent() -> None:
    conn, server = fake_session(3)
    assert conn._sock is not None
    conn._sock.shutdown(socket.SHUT_WR)  # the session looks alive, the write fails (EPIPE).
    with pytest.raises(NotSent, match="broke while sending"):
        conn.decide(conn.next_xid(), (p.Branch(0, "pg-a"), p.Branch(1, "pg-b")))
    assert conn.broken
    assert read_all(server) == b""


def test_a_written_decide_whose_answer_is_lost_is_not_reported_unsent() -> None:
    conn, server = fake_session(3)
    xid = conn.next_xid()

    def answer_then_close() -> None:
        server.recv(65536)
        server.close()

    t = threading.Thread(target=answer_then_close)
    t.start()
    with pytest.raises(decree.Unavailable) as lost:
        conn.decide(xid, (p.Branch(0, "pg-a"), p.Branch(1, "pg-b")))
    t.join()
    assert not isinstance(lost.value, NotSent), "written: only Outcome can tell"


def test_one_phase_is_sent_on_version_3_only() -> None:
    conn, server = fake_session(2)
    assert conn.one_phase(conn.next_xid()) is False
    conn.close_now("test")
    assert read_all(server) == b"", "nothing is sent on an older session"
    conn, server = fake_session(3)
    done = conn.next_xid()
    conn.complete(done)
    xid = conn.next_xid()
    assert conn.one_phase(xid) is True
    conn.close_now("test")
    assert read_all(server) == p.encode_frame(1, p.Complete(done)) + p.encode_frame(2, p.OnePhase(xid))


def test_a_server_message_with_an_unknown_must_understand_field_breaks_the_session() -> None:
    conn, server = fake_session(3)
    server.sendall(p.encode_frame(1, p.Pong(), (p.Field(0x0101, b"skip me"),)))
    conn.ping()  # an unknown optional field is skipped.
    server.sendall(p.encode_frame(2, p.Pong(), (p.Field(0x8101),)))
    with pytest.raises(decree.ProtocolError, match="must-understand field 0x8101"):
        conn.ping()
    assert conn.broken


def test_a_trailer_on_a_version_2_session_is_malformed() -> None:
    conn, server = fake_session(2)
    server.sendall(p.encode_frame(1, p.Pong(), (p.Field(0x0101, b"x"),)))
    with pytest.raises(decree.ProtocolError, match="trailing bytes"):
        conn.ping()
