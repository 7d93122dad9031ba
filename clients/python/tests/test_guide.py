"""The program of docs/guide.md, run as it is written there, against a real server and the
two test PostgreSQL databases: it moves 30 and refuses an overdraft, and the databases
agree with what it printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from bank import prepared_branches
from conftest import REPO, Server

MARKER = "<!-- guide-program:"


def guide_program() -> str:
    text = (REPO / "docs" / "guide.md").read_text()
    after = text[text.index(MARKER):]
    match = re.search(r"```python\n(.*?)\n```", after, re.S)
    assert match is not None, "no python block after the guide-program marker"
    return match.group(1) + "\n"


@pytest.fixture
def schema(dsns: dict[str, str]) -> Iterator[str]:
    """A schema of its own in both databases, so that the program's `accounts` table is
    this test's (the databases are shared with other test runs)."""
    name = f"guide_{os.getpid()}_{time.monotonic_ns() % 10**9}"
    for rm in ("pg-a", "pg-b"):
        with psycopg.connect(dsns[rm], autocommit=True) as c:
            c.execute(f"CREATE SCHEMA {name}")
    yield name
    for rm in ("pg-a", "pg-b"):
        with psycopg.connect(dsns[rm], autocommit=True) as c:
            c.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


@pytest.fixture
def bank_server(dsns: dict[str, str]) -> Iterator[Server]:
    s = Server([("bank-a", "postgres", dsns["pg-a"]), ("bank-b", "postgres", dsns["pg-b"])])
    s.start()
    yield s
    s.cleanup()


def test_the_guide_program_moves_money(bank_server: Server, dsns: dict[str, str], schema: str, tmp_path: Path) -> None:
    program = tmp_path / "bank.py"
    program.write_text(guide_program())
    env = dict(os.environ)
    env["DECREE"] = bank_server.endpoint
    env["BANK_A"] = f"{dsns['pg-a']} options='-c search_path={schema}'"
    env["BANK_B"] = f"{dsns['pg-b']} options='-c search_path={schema}'"
    out = subprocess.run([sys.executable, str(program)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.split() == ["A", "70", "B", "130"], out.stdout
    assert "not enough money to move 1000" in out.stderr
    for rm, balance in (("pg-a", 70), ("pg-b", 130)):
        with psycopg.connect(dsns[rm], autocommit=True) as c:
            row = c.execute(f"SELECT balance FROM {schema}.accounts WHERE id = 1").fetchone()
            assert row is not None and row[0] == balance
    assert prepared_branches(dsns, bank_server.node) == []
    # The first transfer took two phases through the server: one decision was written.
    assert bank_server.metrics()["decree_commits_total"] == 1
