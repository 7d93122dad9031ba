"""The server connection without a server: what a broken connection does to a completion,
and a reply that never comes."""

from __future__ import annotations

import socket
import time

import pytest

import decree
from decree import connection
from decree.connection import COMPLETES_BUFFERED_MAX, Options, ServerConnection


def test_a_completion_that_cannot_be_sent_raises_nothing() -> None:
    # The transaction is committed; a Complete lost with its connection only makes the
    # server complete it itself, so commit() must not raise for it.
    conn = ServerConnection(decree.Endpoint.parse("unix:/nonexistent"), Options())
    mine, theirs = socket.socketpair()
    theirs.close()
    conn._sock = mine
    conn.node, conn.incarnation, conn.session = 7, 1, 1
    for _ in range(COMPLETES_BUFFERED_MAX + 1):
        conn.complete(conn.next_xid())
    assert conn.broken
    conn.close()


@pytest.mark.parametrize("kernel", [True, False])
def test_a_reply_that_never_comes_times_out(kernel: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection, "_KERNEL_TIMEOUTS", kernel)
    conn = ServerConnection(decree.Endpoint.parse("unix:/nonexistent"), Options(reply_timeout=0.3))
    mine, theirs = socket.socketpair()
    conn._reply_timeout(mine)
    assert (mine.gettimeout() is None) == kernel
    conn._sock = mine
    conn.session = 1
    started = time.monotonic()
    with pytest.raises(decree.Unavailable, match="no reply .* within 0.3 s"):
        conn.ping()
    assert 0.25 <= time.monotonic() - started < 5
    assert conn.broken
    assert theirs.recv(100), "the Ping was sent"
    theirs.close()
