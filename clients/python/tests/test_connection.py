"""The server connection without a server: what a broken connection does to a completion."""

from __future__ import annotations

import socket

import decree
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
