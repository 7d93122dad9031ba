"""The Python client over several independent pairs (issue 34): ``decree.connect_pairs`` and
``decree.aconnect_pairs`` against real ``decree serve`` processes (two operator-promoted
pairs with distinct node ids, and single servers), and the pure rules that pick the pair.

The bugs this guards against: transactions that all land on one pair, an outcome asked of
a pair that did not mint the Xid, a dead pair that stops the live one, and errors that do
not say which pair failed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

import decree
from bank import Bank
from conftest import Server, rm_entries
from decree import protocol as p
from decree._pairs import node_taken, pair_of_xid, parse_pairs, session_order
from decree.connection import Endpoint
from test_asyncio import close_all, connect_pair
from test_asyncio import transfer as atransfer
from test_pair import control, pair, wait_strict

# --- the rules, without IO ----------------------------------------------------------------------


def test_a_pair_list_parses_into_pairs_of_members() -> None:
    tcp = lambda a: Endpoint("tcp", a)  # noqa: E731
    assert parse_pairs("tcp:a1:1,tcp:a2:1;tcp:b1:1, tcp:b2:1") == [[tcp("a1:1"), tcp("a2:1")], [tcp("b1:1"), tcp("b2:1")]]
    assert parse_pairs("unix:/r/a.sock") == [[Endpoint("unix", "/r/a.sock")]]


@pytest.mark.parametrize(
    "spec, why",
    [
        ("", "pair 1"),
        ("tcp:a:1;", "pair 2"),
        ("tcp:a:1;;tcp:b:1", "pair 2"),
        ("tcp:a:1,tcp:a:1", "twice in pair 1"),
        ("tcp:a:1,tcp:a2:1;tcp:b:1,tcp:a2:1", "in pair 1 and in pair 2"),
        ("tcp:a:1,;tcp:b:1", "must be unix"),
    ],
)
def test_bad_pair_lists_are_refused_by_name(spec: str, why: str) -> None:
    with pytest.raises(decree.UsageError, match=why):
        parse_pairs(spec)


def test_sessions_go_round_robin_and_down_pairs_come_last() -> None:
    assert [session_order(t, [False, False, False]) for t in range(4)] == [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]
    assert [session_order(t, [False, True, False])[0] for t in range(4)] == [0, 2, 0, 2]
    assert session_order(1, [False, True, False]) == [2, 0, 1]
    assert session_order(5, [True, True]) == [1, 0]
    for turn in range(6):
        for mask in range(8):
            down = [bool(mask & (1 << i)) for i in range(3)]
            assert sorted(session_order(turn, down)) == [0, 1, 2]


def test_an_xid_goes_to_the_pair_with_its_node_id_and_no_other() -> None:
    xid = lambda node: p.Xid.decree(node, 1, 1, 1)  # noqa: E731
    assert pair_of_xid([11, None, 33], xid(11)) == 0
    assert pair_of_xid([11, None, 33], xid(33)) == 2
    with pytest.raises(decree.Unavailable, match=r"no pair has node id 22 .*not reached yet, node id unknown: pair 2"):
        pair_of_xid([11, None, 33], xid(22))
    with pytest.raises(decree.UnknownNode, match="no pair has node id 22 \\(pair 1 has node 11, pair 2 has node 33\\)"):
        pair_of_xid([11, 33], xid(22))
    with pytest.raises(decree.UnknownNode, match="not a decree Xid"):
        pair_of_xid([11], p.Xid(7, b"g"))
    assert node_taken([11, None], 1, 11) == 0
    assert node_taken([11, None], 0, 11) is None


# --- real servers -------------------------------------------------------------------------------


def naming_peers(members: tuple[Server, Server]) -> tuple[Server, Server]:
    """``members`` (test_pair's pair), each naming the other's client address in its
    NotPrimary refusal (``peer_clients``)."""
    for m, peer in (members, members[::-1]):
        text = m.config.read_text()
        m.config.write_text(text.replace("secret_file = ", f'peer_clients = "{peer.endpoint}"\nsecret_file = ', 1))
    return members


@pytest.fixture
def two_pairs(dsns: dict[str, str]) -> Iterator[tuple[tuple[Server, Server], tuple[Server, Server]]]:
    a, b = naming_peers(pair(dsns)), naming_peers(pair(dsns))
    assert a[0].node != b[0].node
    for s in (*a, *b):
        s.start()
    yield a, b
    for s in (*a, *b):
        s.cleanup()


def node_of(xid: p.Xid) -> int:
    assert xid.origin is not None
    return xid.origin.node


def test_transactions_spread_over_two_pairs_and_a_dead_pair_leaves_the_other_serving(
    two_pairs: tuple[tuple[Server, Server], tuple[Server, Server]], bank: Bank
) -> None:
    (a1, a2), (b1, b2) = two_pairs
    for primary in (a1, b1):
        assert "leads epoch 1.1" in control(primary, "promote", "--force")
        wait_strict(primary)
    # A pair listed by its backup alone does not serve (the client never connects to an
    # address it was not given): transactions go to the other pair, and the refusal names
    # the primary to add to the list.
    with decree.connect_pairs(f"{a2.endpoint};{b1.endpoint}") as backup_only:
        assert backup_only.nodes == [None, b1.node]
        for _ in range(3):
            with backup_only.transaction() as tx:
                assert tx.xid.origin is not None and tx.xid.origin.node == b1.node
                tx.rollback()
        with pytest.raises(decree.ServerError, match=f"NOT_PRIMARY.*{a1.socket}"):
            backup_only._session_on(0)
    # Each pair listed backup first: its NotPrimary sends the client on to the primary.
    tm = decree.connect_pairs(f"{a2.endpoint},{a1.endpoint};{b2.endpoint},{b1.endpoint}", client_name="pytest-pairs")
    assert tm.nodes == [a1.node, b1.node]
    assert [str(m.endpoint) for m in tm.managers] == [a1.endpoint, b1.endpoint]
    conn_a, conn_b = bank.connect_a(), bank.connect_b()
    reports = [bank.transfer(tm, conn_a, conn_b, tid=tid) for tid in range(1, 5)]  # type: ignore[arg-type]
    nodes = [node_of(r.xid) for r in reports]
    assert sorted(nodes) == sorted([a1.node, a1.node, b1.node, b1.node]), "two transactions on each pair"
    for r in reports:
        assert tm.outcome(r.xid) == decree.Outcome.COMMITTED
        assert tm.pair_of(r.xid) == (0 if node_of(r.xid) == a1.node else 1)
    with pytest.raises(decree.UnknownNode, match=f"no pair has node id 99 \\(pair 1 has node {a1.node}"):
        tm.outcome(p.Xid.decree(99, 257, 1, 1))

    # Pair a's primary dies; its backup is not promoted: pair a serves nobody.
    a1.kill()
    later = [bank.transfer(tm, conn_a, conn_b, tid=tid) for tid in range(5, 9)]  # type: ignore[arg-type]
    assert [node_of(r.xid) for r in later] == [b1.node] * 4, "new transactions go to the live pair"
    for r in reports + later:
        if node_of(r.xid) == b1.node:
            assert tm.outcome(r.xid) == decree.Outcome.COMMITTED
    on_a = [r.xid for r in reports if node_of(r.xid) == a1.node]
    with pytest.raises(decree.Unavailable, match="pair 1 \\(.*a1|pair 1 \\("):
        tm.outcome(on_a[0])

    # The operator promotes pair a's backup: pair a answers for its Xids and takes
    # transactions again, in its new epoch.
    assert "leads epoch 2.2" in control(a2, "promote")
    for xid in on_a:
        assert tm.outcome(xid) == decree.Outcome.COMMITTED
    tid, deadline = 9, time.monotonic() + 30
    while True:
        r = bank.transfer(tm, conn_a, conn_b, tid=tid)  # type: ignore[arg-type]
        if node_of(r.xid) == a1.node:
            break
        assert time.monotonic() < deadline, "no transaction landed on pair a again"
        tid += 1
    assert r.xid.origin is not None and r.xid.origin.incarnation == (2 << 8) | 2
    tids = set(range(1, tid + 1))
    for node in (a1.node, b1.node):
        assert bank.settled(node, tids).violations(bank.total, tids) == []
    tm.close()
    conn_a.close(), conn_b.close()


@pytest.fixture
def singles(dsns: dict[str, str]) -> Iterator[tuple[Server, Server]]:
    one, two = Server(rm_entries(dsns)), Server(rm_entries(dsns))
    one.start(), two.start()
    yield one, two
    one.cleanup(), two.cleanup()


def test_hostile_pair_lists_and_a_pair_that_is_all_down(singles: tuple[Server, Server], bank: Bank) -> None:
    one, two = singles
    nowhere = lambda name: f"unix:{one.dir / name}.sock"  # noqa: E731
    for spec, why in [("", "names no member"), (f"{one.endpoint},{one.endpoint}", "twice in pair 1")]:
        with pytest.raises(decree.UsageError, match=why):
            decree.connect_pairs(spec)
    with pytest.raises(decree.UsageError, match="node_expected"):
        decree.PairsManager([[Endpoint.parse(one.endpoint)]], decree.Options(node_expected=3))

    # Every pair down: the error names each pair and its members.
    with pytest.raises(decree.Unavailable, match=r"no pair serves: pair 1 \(.*x1.sock,unix:.*x2.sock\): .*; pair 2 \(.*y1"):
        decree.connect_pairs(f"{nowhere('x1')},{nowhere('x2')};{nowhere('y1')}")

    # A pair whose members are all down beside two that serve: transactions go to the live
    # ones only, and each outcome comes from the pair that minted the Xid.
    tm = decree.connect_pairs(f"{one.endpoint};{nowhere('z1')},{nowhere('z2')};{two.endpoint}")
    assert tm.nodes == [one.node, None, two.node]
    conn_a, conn_b = bank.connect_a(), bank.connect_b()
    reports = [bank.transfer(tm, conn_a, conn_b, tid=tid) for tid in range(1, 7)]  # type: ignore[arg-type]
    nodes = {node_of(r.xid) for r in reports}
    assert nodes == {one.node, two.node}, "both live pairs take transactions"
    for r in reports:
        assert tm.outcome(r.xid) == decree.Outcome.COMMITTED
    # An unknown node id while pair 2's is unknown: it may be pair 2's, so "cannot reach".
    with pytest.raises(decree.Unavailable, match="no pair has node id 99 .*not reached yet, node id unknown: pair 2"):
        tm.outcome(p.Xid.decree(99, 1, 1, 1))

    # Both live servers die: beginning names every pair.
    one.kill(), two.kill()
    with pytest.raises(decree.Unavailable, match="no pair serves") as e:
        tm.transaction()
    for name in ("pair 1", "z1.sock", "pair 3"):
        assert name in str(e.value)
    tm.close()
    conn_a.close(), conn_b.close()


def test_two_servers_with_one_node_id_are_not_two_pairs(dsns: dict[str, str]) -> None:
    one, twin = Server(rm_entries(dsns)), Server(rm_entries(dsns))
    text = twin.config.read_text().splitlines()
    text[0] = f"node = {one.node}"
    twin.config.write_text("\n".join(text) + "\n")
    one.start(), twin.start()
    try:
        tm = decree.connect_pairs(f"{one.endpoint};{twin.endpoint}")
        assert tm.nodes == [one.node, None], "the twin is refused"
        with pytest.raises(decree.Unavailable, match=f"has node id {one.node}, as pair 1 .*its own node id"):
            tm._session_on(1)
        tm.close()
    finally:
        one.cleanup(), twin.cleanup()


def test_asyncio_transactions_spread_over_the_pairs(singles: tuple[Server, Server], bank: Bank) -> None:
    one, two = singles

    async def scenario() -> None:
        async with decree.aconnect_pairs(f"{one.endpoint};{two.endpoint}", client_name="pytest-aio-pairs") as tm:
            assert tm.nodes == [one.node, two.node]
            a, b = await connect_pair(bank)
            reports = [await atransfer(tm, bank, a, b, tid) for tid in range(1, 5)]  # type: ignore[arg-type]
            assert sorted(node_of(r.xid) for r in reports) == sorted([one.node, one.node, two.node, two.node])
            for r in reports:
                assert await tm.outcome(r.xid) == decree.Outcome.COMMITTED
            with pytest.raises(decree.UnknownNode, match="no pair has node id 99"):
                await tm.outcome(p.Xid.decree(99, 1, 1, 1))
            one.kill()
            later = [await atransfer(tm, bank, a, b, tid) for tid in range(5, 8)]  # type: ignore[arg-type]
            assert [node_of(r.xid) for r in later] == [two.node] * 3
            with pytest.raises(decree.Unavailable, match="pair 1 \\("):
                await tm.outcome(reports[0].xid if node_of(reports[0].xid) == one.node else reports[1].xid)
            await close_all(a, b)

    asyncio.run(asyncio.wait_for(scenario(), 120))
    tids = set(range(1, 8))
    assert bank.settled(two.node, tids).violations(bank.total, tids) == []
