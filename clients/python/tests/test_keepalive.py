"""A server that closes idle sessions (``[limits] idle_timeout_ms``): the client learns the
bound in HelloOk and pings every session nobody is using, so a transaction whose
application pauses longer than the bound between its SQL and its commit still commits in
two phases, and the server closes no session."""

from __future__ import annotations

import time

import pytest

import decree
from bank import Bank
from conftest import IDLE_MS, Server

def test_sessions_are_kept_alive_through_a_pause_longer_than_the_idle_bound(
    idle_server: Server, dsns: dict[str, str]
) -> None:
    bank = Bank(dsns, "pg-b").create()
    try:
        with decree.connect(idle_server.endpoint) as tm:
            a, b = bank.connect_a(), bank.connect_b()
            with tm.transaction() as tx:
                tx.enlist(a, "pg-a")
                tx.enlist(b, "pg-b")
                bank.work(a, b, 1, 5, 1, 2)
                time.sleep(4 * IDLE_MS / 1000)  # the application thinks; its session stays idle.
            assert tx.report is not None and tx.report.kind == "two_phase" and not tx.report.resolved_by_outcome
            time.sleep(4 * IDLE_MS / 1000)  # the pooled session, idle as well.
            tm.ping()
            assert tm.outcome(tx.xid) == decree.Outcome.COMMITTED
            a.close(), b.close()
        metrics = idle_server.metrics()
        assert metrics["decree_sessions_idle_closed_total"] == 0, "no session was closed for idleness"
        assert metrics["decree_sessions_opened_total"] == 1, "one session served the whole test"
        assert bank.snapshot(idle_server.node).violations(bank.total, {1}) == []
    finally:
        bank.drop()


def test_a_raw_session_that_stays_silent_is_closed_by_the_server(idle_server: Server) -> None:
    """The bound is real: a session nobody pings is closed, and the client sees it."""
    endpoint = decree.Endpoint.parse(idle_server.endpoint)
    conn = decree.ServerConnection.open(endpoint, decree.Options())
    assert conn.idle_timeout_ms == IDLE_MS and conn.version == 3
    time.sleep(3 * IDLE_MS / 1000)
    assert not conn.alive()
    with pytest.raises(decree.Unavailable):
        conn.ping()
