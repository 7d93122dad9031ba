"""The adapter API as docs/guide.md documents it: the names an adapter author needs are
exported by ``decree``, and the guide's example adapter (a PostgreSQL branch whose
statements it sends itself), run as it is written there, commits in one and two phases
next to a PyMySQL branch, votes no, and reports a branch the application ended."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import decree
from bank import Bank
from conftest import REPO, Server, bank_fixture

MARKER = "<!-- guide-adapter:"

NAMES = ["BranchAdapter", "BranchFailed", "BranchInDoubt", "BranchEnded", "PhaseTwo", "Step", "Heuristic", "Xid"]


def test_what_an_adapter_author_needs_is_exported() -> None:
    for name in NAMES:
        assert name in decree.__all__ and hasattr(decree, name), name
    assert decree.PhaseTwo(decree.Step.DONE).step is decree.Step.DONE
    assert not issubclass(decree.BranchEnded, (decree.BranchFailed, decree.BranchInDoubt))


def guide_adapter() -> type[decree.BranchAdapter]:
    text = (REPO / "docs" / "guide.md").read_text()
    match = re.search(r"```python\n(.*?)\n```", text[text.index(MARKER):], re.S)
    assert match is not None, "no python block after the guide-adapter marker"
    namespace: dict[str, Any] = {"__name__": "guide_adapter"}
    exec(compile(match.group(1), "docs/guide.md (adapter)", "exec"), namespace)
    adapter = namespace["SqlPostgresBranch"]
    assert issubclass(adapter, decree.BranchAdapter)
    return adapter  # type: ignore[no-any-return]


bank = bank_fixture("maria")


@pytest.fixture
def pair(bank: Bank) -> Iterator[tuple[Any, Any]]:
    """The guide adapter's connection to pg-a (autocommit, as its driver has no two-phase
    API) and a PyMySQL connection to the bank's MariaDB, closed after the test."""
    a, b = psycopg.connect(bank.dsns["pg-a"], autocommit=True), bank.connect_b()
    yield a, b
    a.close()
    b.close()


def test_the_guides_adapter_commits_in_two_phases_and_in_one(
    server: Server, bank: Bank, tm: decree.TransactionManager, pair: tuple[Any, Any]
) -> None:
    adapter = guide_adapter()
    a, b = pair
    with tm.transaction() as tx:
        assert tx.enlist(adapter(a, "pg-a"), "pg-a") == 0
        tx.enlist(b, "maria")
        bank.work(a, b, 1, 5, 1, 2)
    assert tx.report is not None and tx.report.kind == "two_phase" and tx.report.phase_two_pending == ()
    with tm.transaction() as tx:
        tx.enlist(adapter(a, "pg-a"), "pg-a")
        a.execute(f"INSERT INTO {bank.prefix}_transfers VALUES (2, 0)")
    assert tx.report is not None and tx.report.kind == "one_phase"
    snap = bank.snapshot(server.node)
    assert snap.total == bank.total and snap.prepared == []
    assert snap.in_a == {1, 2} and snap.in_b == {1}, "transfer 2 is the one-phase commit's, in A only"


def test_the_guides_adapter_votes_no_and_everything_rolls_back(
    server: Server, bank: Bank, tm: decree.TransactionManager, pair: tuple[Any, Any]
) -> None:
    adapter = guide_adapter()
    a, b = pair
    with pytest.raises(decree.RolledBack) as refused:
        with tm.transaction() as tx:
            tx.enlist(b, "maria")
            tx.enlist(adapter(a, "pg-a"), "pg-a")
            bank.work(a, b, 3, 5, 1, 2)
            with pytest.raises(psycopg.errors.UniqueViolation):
                a.execute(f"INSERT INTO {bank.prefix}_transfers VALUES (3, 5)")
    assert (refused.value.rm, refused.value.branch) == ("pg-a", 1)
    assert isinstance(refused.value.cause, decree.BranchFailed)
    snap = bank.snapshot(server.node)
    assert snap.violations(bank.total, set()) == [] and not snap.in_a and not snap.in_b


def test_the_guides_adapter_reports_a_branch_the_application_ended(
    server: Server, bank: Bank, tm: decree.TransactionManager, pair: tuple[Any, Any]
) -> None:
    adapter = guide_adapter()
    a, b = pair
    with pytest.raises(decree.BranchEndedByApplication) as ended:
        with tm.transaction() as tx:
            tx.enlist(adapter(a, "pg-a"), "pg-a")
            tx.enlist(b, "maria")
            bank.work(a, b, 4, 5, 1, 2)
            a.execute("COMMIT")
    assert (ended.value.rm, ended.value.branch) == ("pg-a", 0)
    snap = bank.snapshot(server.node)
    assert snap.in_a == {4} and not snap.in_b and snap.prepared == []
