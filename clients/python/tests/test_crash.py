"""Crash safety from Python: the client process killed with SIGKILL at each protocol point
and at random moments, and the server killed with SIGKILL during a run. After each, once
the server has finished what the dead client left: the total is unchanged, every
acknowledged transfer is in both databases, none is in one only, nothing is left
prepared. A branch prepared by psycopg's own ``tpc_prepare`` is committed by the server
after the client dies between DecideOk and phase two.

``DECREE_PY_KILL_CYCLES`` (default 2) sets the kills per point and pair kind."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import decree
from bank import Bank
from conftest import Server, bank_fixture

WORKER = Path(__file__).resolve().parent / "crash_worker.py"
CYCLES = int(os.environ.get("DECREE_PY_KILL_CYCLES", "2"))
POINTS = ["prepare", "decide_sent", "decide_ok", "phase_two"]


bank = bank_fixture("pg-b", "maria")


def run_worker(server: Server, bank: Bank, first: int, count: int, acks: Path, *crash: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(WORKER), server.endpoint, bank.rm_b, bank.prefix, str(first), str(count), str(acks), *crash],
        capture_output=True, text=True, timeout=120,
    )


def acknowledged(acks: Path) -> set[int]:
    return {int(line) for line in acks.read_text().split()} if acks.exists() else set()


@pytest.mark.parametrize("point", POINTS)
def test_a_client_killed_at_a_protocol_point_leaves_every_invariant(
    server: Server, bank: Bank, point: str, tmp_path: Path
) -> None:
    all_acked: set[int] = set()
    first = 1
    for cycle in range(CYCLES):
        nth = random.randint(1, 4)
        acks = tmp_path / f"acks-{cycle}"
        done = run_worker(server, bank, first, 10, acks, point, str(nth))
        assert done.returncode == -9, f"cycle {cycle}: the worker was to die at {point}: {done.stderr[-2000:]}"
        acked = acknowledged(acks)
        assert acked == set(range(first, first + nth - 1)), f"cycle {cycle}: acknowledged before transfer {nth}"
        all_acked |= acked
        snap = bank.settled(server.node, all_acked)
        assert snap.violations(bank.total, all_acked) == [], f"cycle {cycle}, killed at {point} in transfer {nth}"
        dying = first + nth - 1
        if point in ("decide_ok", "phase_two"):
            assert dying in snap.in_a and dying in snap.in_b, f"transfer {dying} was decided: the server commits it"
        if point == "prepare":
            assert dying not in snap.in_a, f"transfer {dying} was never decided: the server rolls it back"
        first += 10
    # A new client runs on after the crashes.
    acks = tmp_path / "acks-after"
    done = run_worker(server, bank, first, 3, acks)
    assert done.returncode == 0, done.stderr[-2000:]
    all_acked |= acknowledged(acks)
    assert {first, first + 1, first + 2} <= all_acked
    assert bank.settled(server.node, all_acked).violations(bank.total, all_acked) == []


def test_a_client_killed_at_random_moments_leaves_every_invariant(server: Server, bank: Bank, tmp_path: Path) -> None:
    acks = tmp_path / "acks"
    first = 1
    for cycle in range(2 * CYCLES):
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), server.endpoint, bank.rm_b, bank.prefix, str(first), "1000", str(acks)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        time.sleep(random.uniform(0.6, 1.5))
        proc.kill()
        _, stderr = proc.communicate()
        acked = acknowledged(acks)
        print(f"cycle {cycle}: {len(acked)} acknowledged so far; worker stderr: {stderr.decode()[-800:]!r}")
        snap = bank.settled(server.node, acked)
        assert snap.violations(bank.total, acked) == [], f"cycle {cycle}"
        first += 1000
    assert len(acknowledged(acks)) > 0, "the workers committed transfers before they were killed"


def test_the_server_killed_during_a_run_loses_no_acknowledged_transfer(server: Server, bank: Bank) -> None:
    tm = decree.connect(server.endpoint, client_name="server-kill", outcome_timeout=60)
    acked: set[int] = set()
    unknown: set[int] = set()
    counts = {"resolved_by_outcome": 0, "rolled_back": 0}
    failures: list[BaseException] = []
    stop = threading.Event()
    lock = threading.Lock()

    def worker(t: int) -> None:
        a, b = bank.connect_a(), bank.connect_b()
        tid = 100_000 * (t + 1)
        while not stop.is_set():
            tid += 1
            if bank.closed(b):
                b = bank.connect_b()  # a MariaDB connection the client let go after a lost reply.
            try:
                report = bank.transfer(tm, a, b, tid)
                with lock:
                    acked.add(tid)
                    counts["resolved_by_outcome"] += report.resolved_by_outcome
            except decree.RolledBack:
                with lock:
                    counts["rolled_back"] += 1
            except decree.OutcomeUnknown:
                with lock:
                    unknown.add(tid)
            except decree.Unavailable:
                time.sleep(0.05)  # the server is down: nothing was decided, try again.
            except BaseException as e:
                failures.append(e)
                return
        a.close()
        if not bank.closed(b):
            b.close()

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    try:
        for _ in range(3):
            time.sleep(random.uniform(0.5, 1.0))
            server.kill()
            time.sleep(random.uniform(0.1, 0.5))
            server.start()
        time.sleep(1.0)
    finally:
        stop.set()
        for th in threads:
            th.join(120)
        tm.close()
    print(f"server killed 3 times: {len(acked)} transfers acknowledged, {len(unknown)} outcome unknown, {counts}")
    assert failures == []
    assert len(acked) > 0
    snap = bank.settled(server.node, acked)
    assert snap.violations(bank.total, acked) == [], f"{len(acked)} acknowledged, {len(unknown)} unknown"
