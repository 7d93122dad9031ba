"""The Python client against a primary + backup pair of ``decree serve`` processes: given
both members, it finds the primary (the backup answers NotPrimary), and after the primary
is killed and the backup promoted, it finds the new one, whose answers about the old
primary's transfers are committed, and runs new transfers there."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest

import decree
from bank import Bank
from conftest import Server, decree_bin, free_port, rm_entries


def pair(dsns: dict[str, str]) -> tuple[Server, Server]:
    links = (free_port(), free_port())
    members = []
    for member, (link, peer) in ((1, links), (2, links[::-1])):
        extra = f'[pair]\nmember = {member}\nlink = "127.0.0.1:{link}"\npeer_link = "127.0.0.1:{peer}"'
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
    while json.loads(control(server, "status")).get("strict") is not True:
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


@pytest.fixture
def bank(dsns: dict[str, str]) -> Iterator[Bank]:
    b = Bank(dsns, "pg-b").create()
    yield b
    b.drop()


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
