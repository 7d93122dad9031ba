"""``python -m decree.bench`` with tiny values against a real server and the two test
PostgreSQL databases: it runs every mode at both thread counts, its figures are sane and
agree with each other, and it leaves the balances adding up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import psycopg
import pytest

from conftest import Server


@pytest.fixture
def table(dsns: dict[str, str]) -> Iterator[str]:
    name = f"pybench_{os.getpid()}_{time.monotonic_ns() % 10**9}"
    yield name
    for rm in ("pg-a", "pg-b"):
        with psycopg.connect(dsns[rm], autocommit=True) as c:
            c.execute(f"DROP TABLE IF EXISTS {name}")


def bench(server: Server, dsns: dict[str, str], table: str, *extra: str) -> subprocess.CompletedProcess[str]:
    args = [
        sys.executable, "-m", "decree.bench", "--connect", server.endpoint,
        "--dsn", dsns["pg-a"], "--dsn", dsns["pg-b"], "--rm-names", "pg-a,pg-b",
        "--table", table, "--accounts", "50", *extra,
    ]
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


def test_the_benchmark_measures_every_mode(server: Server, dsns: dict[str, str], table: str) -> None:
    assert server.proc is not None
    out = bench(
        server, dsns, table, "--threads", "1,3", "--duration", "0.4", "--rounds", "2", "--json",
        "--server-pid", str(server.proc.pid),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    assert [s["threads"] for s in doc["summaries"]] == [1, 3]
    for s in doc["summaries"]:
        assert s["rounds"] == 2
        modes = {r["mode"] for r in s["runs"]}
        assert modes == {"independent", "native-2pc", "decree"}
        assert len(s["runs"]) == 6
        for r in s["runs"]:
            assert r["threads"] == s["threads"]
            assert r["transfers"] >= r["threads"], r
            assert 0.3 <= r["seconds"] < 30, r
            assert abs(r["tps"] - r["transfers"] / r["seconds"]) < 1e-6 * r["tps"], r
            assert 0 < r["p50_ms"] <= r["p95_ms"] < 30_000, r
            assert 0 < r["cpu_us_per_transfer"] < 1_000_000, r
            assert r["server_cpu_us_per_transfer"] is not None and r["server_cpu_us_per_transfer"] >= 0, r
        ratios = []
        for rnd in (1, 2):
            tps = {r["mode"]: r["tps"] for r in s["runs"] if r["round"] == rnd}
            ratios.append(tps["decree"] / tps["independent"])
        assert s["ratio"] == pytest.approx(sorted(ratios)[0] / 2 + sorted(ratios)[1] / 2)
        assert 0 < s["ratio"] < 10
        assert s["ratio_range"] == pytest.approx([min(ratios), max(ratios)])
        assert s["tps"]["decree"] > 0 and s["tps"]["independent"] > 0
        assert s["library_cpu_us_per_transfer"] is not None
        assert s["atomicity_cpu_us_per_transfer"] is not None
        assert s["server_cpu_us_per_transfer"] is not None
    # Every round starts with the next mode.
    first = [r["mode"] for r in doc["summaries"][0]["runs"]]
    assert first[:3] == ["independent", "native-2pc", "decree"]
    assert first[3:] == ["native-2pc", "decree", "independent"]

    # The transfers happened in the databases: the total is unchanged, B gained.
    sums = []
    for rm in ("pg-a", "pg-b"):
        with psycopg.connect(dsns[rm], autocommit=True) as c:
            sums.append(int(c.execute(f"SELECT sum(balance) FROM {table}").fetchone()[0]))  # type: ignore[index]
    assert sums[0] + sums[1] == 2 * 50 * 1_000_000_000
    assert sums[1] - 50 * 1_000_000_000 >= sum(r["transfers"] for s in doc["summaries"] for r in s["runs"])


def test_the_table_output_and_a_refused_decision(server: Server, dsns: dict[str, str], table: str) -> None:
    out = bench(server, dsns, table, "--threads", "2", "--duration", "0.3", "--modes", "independent,decree")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "decree / independent tps:" in out.stdout
    assert "CPU per transfer of atomicity (decree - independent):" in out.stdout
    assert "native-2pc" not in out.stdout.split("threads 2,")[1]
    # An RM name the server does not know: the decision is refused, the benchmark fails.
    bad = bench(server, dsns, table, "--threads", "1", "--duration", "0.2", "--modes", "decree", "--rm-names", "pg-a,nope")
    assert bad.returncode == 1
    assert "decree.bench:" in bad.stderr and "nope" in bad.stderr
