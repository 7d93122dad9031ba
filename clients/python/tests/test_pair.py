"""The Python client against a primary + backup pair of ``decree serve`` processes: given
both members, it finds the primary (the backup answers NotPrimary), and after the primary
is killed and the backup promoted, it finds the new one, whose answers about the old
primary's transfers are committed, and runs new transfers there. A Decide whose answer is
lost at the failover (the primary SIGKILLed after it answered, or before it saw the
Decide, while the client waits) is resolved with Outcome on the new primary, and the
databases agree with the answer."""

from __future__ import annotations

import atexit
import json
import os
import secrets
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import decree
from bank import Bank
from conftest import Server, decree_bin, free_port, rm_entries


def pair(dsns: dict[str, str]) -> tuple[Server, Server]:
    links = (free_port(), free_port())
    # Both members prove this secret on their link (mkstemp makes the file 0600).
    fd, secret = tempfile.mkstemp(prefix="decree-pair-", suffix=".secret")
    os.write(fd, secrets.token_hex(32).encode())
    os.close(fd)
    # Outside any server's directory (both members read it): removed when the tests end.
    atexit.register(os.unlink, secret)
    members = []
    for member, (link, peer) in ((1, links), (2, links[::-1])):
        extra = (
            f'[pair]\nmember = {member}\nlink = "127.0.0.1:{link}"\npeer_link = "127.0.0.1:{peer}"\n'
            f'secret_file = "{secret}"'
        )
        members.append(Server(rm_entries(dsns), extra=extra))
    a, b = members
    # The two members of a pair share the node id (the config's first line).
    b.node = a.node
    text = b.config.read_text().splitlines()
    text[0] = f"node = {a.node}"
    b.config.write_text("\n".join(text) + "\n")
    return a, b


def control(server: Server, *args: str) -> str:
    out = subprocess.run([str(decree_bin()), *args, "--config", str(server.config)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.strip()


def wait_strict(server: Server) -> None:
    deadline = time.monotonic() + 30
    while json.loads(control(server, "status", "--format", "json")).get("strict") is not True:
        assert time.monotonic() < deadline, "the primary never turned strict"
        time.sleep(0.05)


@pytest.fixture
def members(dsns: dict[str, str]) -> Iterator[tuple[Server, Server]]:
    a, b = pair(dsns)
    a.start()
    b.start()
    yield a, b
    a.cleanup()
    b.cleanup()


def test_the_client_follows_the_pair_through_a_failover(members: tuple[Server, Server], bank: Bank) -> None:
    a, b = members
    assert "leads epoch 1.1" in control(a, "promote", "--force")
    wait_strict(a)
    tm = decree.connect(f"{b.endpoint},{a.endpoint}", client_name="pytest-pair")
    assert str(tm.endpoint) == a.endpoint, "the backup refused, the primary serves"
    conn_a, conn_b = bank.connect_a(), bank.connect_b()
    reports = [bank.transfer(tm, conn_a, conn_b, tid=tid) for tid in range(1, 6)]
    assert all(r.kind == "two_phase" for r in reports)

    a.kill()
    assert "leads epoch 2.2" in control(b, "promote")
    for r in reports:
        assert tm.outcome(r.xid) == decree.Outcome.COMMITTED
    assert str(tm.endpoint) == b.endpoint
    after = bank.transfer(tm, conn_a, conn_b, tid=6)
    assert after.xid.origin is not None and after.xid.origin.incarnation == (2 << 8) | 2, "the new epoch"
    snap = bank.settled(a.node, set(range(1, 7)))
    assert snap.violations(bank.total, set(range(1, 7))) == []
    tm.close()
    conn_a.close(), conn_b.close()


class DecideProxy:
    """A Unix-socket proxy in front of a pair member that loses the reply of the first
    ``Decide`` sent through it once armed: with ``hold="reply"`` the Decide reaches the
    member and its answer is swallowed (the member decided; the client never hears it),
    with ``hold="decide"`` the Decide itself is held back (the member never hears it).
    Nothing passes either way after that; when the member dies, the client's connection
    is closed, as the member's own would be."""

    def __init__(self, upstream: Path, path: Path, hold: str) -> None:
        assert hold in ("reply", "decide")
        self.upstream, self.path, self.hold = upstream, path, hold
        self.armed = False
        self.lost = threading.Event()
        self._decide_id: int | None = None
        self._listener = socket.socket(socket.AF_UNIX)
        self._listener.bind(str(path))
        self._listener.listen(16)
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"unix:{self.path}"

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self._listener.accept()
            except OSError:
                return
            up = socket.socket(socket.AF_UNIX)
            try:
                up.connect(str(self.upstream))
            except OSError:
                up.close()
                down.close()  # the member is gone: so is every connection to it.
                continue
            self._sockets += [up, down]
            threading.Thread(target=self._pump, args=(down, up, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, down, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, to_server: bool) -> None:
        buf = b""
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                buf += data
                while len(buf) >= 4 and len(buf) >= 4 + int.from_bytes(buf[:4], "big"):
                    size = 4 + int.from_bytes(buf[:4], "big")
                    frame, buf = buf[:size], buf[size:]
                    if not self._forward(frame, to_server):
                        continue
                    dst.sendall(frame)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _forward(self, frame: bytes, to_server: bool) -> bool:
        """Whether ``frame`` goes on; records the lost one."""
        if self.lost.is_set():
            return False
        kind, request_id = frame[5], int.from_bytes(frame[6:14], "big")
        if to_server and self.armed and kind == 0x03 and self._decide_id is None:  # Decide
            self._decide_id = request_id
            if self.hold == "decide":
                self.lost.set()
                return False
        if not to_server and kind == 0x04 and request_id == self._decide_id:  # its DecideOk
            self.lost.set()
            return False
        return True

    def close(self) -> None:
        for s in self._sockets:
            try:
                s.close()
            except OSError:
                pass


@pytest.mark.parametrize("hold", ["reply", "decide"])
def test_a_decide_whose_answer_is_lost_at_failover_is_resolved_on_the_new_primary(
    members: tuple[Server, Server], bank: Bank, hold: str
) -> None:
    """The Decide went to the primary (``reply``: it decided and answered DecideOk;
    ``decide``: it never saw it), the primary is SIGKILLed before the client reads an
    answer, the backup is promoted, and the client asks ``Outcome`` on the new primary
    and ends the transaction with that answer; the databases agree with it."""
    a, b = members
    assert "leads epoch 1.1" in control(a, "promote", "--force")
    wait_strict(a)
    proxy = DecideProxy(a.socket, a.dir / "proxy.sock", hold)
    tm = decree.connect(f"{proxy.endpoint},{b.endpoint}", client_name="pytest-pair-lost-reply")
    conn_a, conn_b = bank.connect_a(), bank.connect_b()
    try:
        before = [bank.transfer(tm, conn_a, conn_b, tid=tid) for tid in (1, 2)]
        assert all(r.kind == "two_phase" for r in before)

        proxy.armed = True
        result: dict[str, object] = {}

        def commit() -> None:
            try:
                result["report"] = bank.transfer(tm, conn_a, conn_b, tid=3)
            except BaseException as e:  # the test thread judges it.
                result["error"] = e

        worker = threading.Thread(target=commit)
        worker.start()
        assert proxy.lost.wait(30), "the Decide never went through the proxy"
        time.sleep(0.2)  # the client is waiting for an answer it will never read.
        assert worker.is_alive(), f"the commit ended without an answer: {result}"
        a.kill()
        assert "leads epoch 2.2" in control(b, "promote")
        worker.join(60)
        assert not worker.is_alive(), "the client never resolved the transaction"
        assert str(tm.endpoint) == b.endpoint

        if hold == "reply":
            # The primary decided, so its in-sync backup holds the decision: committed.
            report = result.get("report")
            assert isinstance(report, decree.CommitReport), result
            assert report.resolved_by_outcome and report.kind == "two_phase"
            assert tm.outcome(report.xid) == decree.Outcome.COMMITTED
            acknowledged = {1, 2, 3}
        else:
            # Nobody decided: presumed abort, said by the new primary, never guessed.
            error = result.get("error")
            assert isinstance(error, decree.RolledBack), result
            assert "the server says the transaction is rolled back" in str(error), error
            assert error.xid is not None and tm.outcome(error.xid) == decree.Outcome.ROLLED_BACK
            acknowledged = {1, 2}
        snap = bank.settled(a.node, acknowledged)
        assert snap.violations(bank.total, acknowledged) == []
        assert snap.in_a == snap.in_b == acknowledged, "the databases agree with the answer"

        after = bank.transfer(tm, conn_a, conn_b, tid=4)
        assert after.kind == "two_phase" and not after.resolved_by_outcome
        snap = bank.settled(a.node, acknowledged | {4})
        assert snap.violations(bank.total, acknowledged | {4}) == []
    finally:
        tm.close()
        proxy.close()
        conn_a.close()
        conn_b.close()
