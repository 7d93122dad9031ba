"""The pure rules of a client over several independent pairs (docs in
:mod:`decree.pairs`), shared by the blocking and the asyncio API and tested without IO: how a
pair list is written, in which order the pairs are tried for a new transaction, and which
pair answers for an Xid. The same rules as the Rust client's ``decree_client::route``.

Every pair (or single server) has its own node id and its own log, so a transaction lives on
the pair whose node id its Xid carries, and only that pair answers for it: an Xid whose node
id no known pair has is refused by name, never asked of another pair."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from . import protocol as p
from .connection import Endpoint
from .errors import Unavailable, UsageError

PAIR_DOWN_FOR = 1.0
"""Seconds a pair that failed to open a session is tried only after the others: a dead pair
then costs new transactions one failed connection a second, not one each."""


def parse_pairs(text: str) -> list[list[Endpoint]]:
    """Parses a pair list: pairs separated by ``;``, the members of one pair by ``,``
    (``tcp:a1:7411,tcp:a2:7411;tcp:b1:7411,tcp:b2:7411``). A single pair (no ``;``) is the
    endpoint list ``decree.connect`` takes. Refuses an empty list, an empty pair and a member
    named twice (in one pair or in two)."""
    pairs = []
    for number, pair in enumerate(text.split(";"), 1):
        if not pair.strip():
            raise UsageError(
                f"pair {number} of {text!r} names no member (pairs are separated by ';', members by ',')"
            )
        pairs.append([Endpoint.parse(e.strip()) for e in pair.split(",")])
    check_pairs(pairs)
    return pairs


def check_pairs(pairs: list[list[Endpoint]]) -> None:
    """At least one pair, each with a member, and no member named twice (a member in two
    pairs would make its node id ambiguous)."""
    if not pairs:
        raise UsageError("no pair to connect to: the pair list is empty")
    seen: dict[Endpoint, int] = {}
    for index, members in enumerate(pairs):
        if not members:
            raise UsageError(f"pair {index + 1} names no member")
        for member in members:
            first = seen.get(member)
            if first is not None:
                where = f"twice in pair {index + 1}" if first == index else f"in pair {first + 1} and in pair {index + 1}"
                raise UsageError(f"member {member} is named {where}: each member belongs to one pair, once")
            seen[member] = index


def session_order(turn: int, down: list[bool]) -> list[int]:
    """The pairs to try for a new transaction, each once: first those not ``down``, in a
    rotation that starts one further at each ``turn`` (round robin over the pairs that
    serve, so that a down pair's share is spread evenly), then the down ones (tried last,
    not skipped: one may be the only pair left)."""

    def rotate(indexes: list[int]) -> list[int]:
        return [indexes[(turn + i) % len(indexes)] for i in range(len(indexes))]

    live = rotate([i for i, d in enumerate(down) if not d])
    dead = rotate([i for i, d in enumerate(down) if d])
    return live + dead


class UnknownNode(UsageError):
    """No pair of this client has the Xid's node id (or the Xid is not decree's)."""


def pair_of_xid(nodes: list[int | None], xid: p.Xid) -> int:
    """The index of the pair whose node id (``nodes[i]``, ``None`` while pair ``i`` was never
    reached) ``xid`` carries. Raises :class:`UnknownNode` for an Xid of no known pair, and
    :class:`decree.Unavailable` while a pair whose node id is unknown might be its."""
    origin = xid.origin
    if origin is None:
        raise UnknownNode(f"{xid} is not a decree Xid: it names no node, so no pair answers for it")
    if origin.node in nodes:
        return nodes.index(origin.node)
    known = ", ".join(f"pair {i + 1} has node {n}" for i, n in enumerate(nodes) if n is not None)
    why = f"{xid}: no pair has node id {origin.node} ({known})"
    unlearned = [f"pair {i + 1}" for i, n in enumerate(nodes) if n is None]
    if unlearned:
        raise Unavailable(f"{why}; not reached yet, node id unknown: {', '.join(unlearned)}")
    raise UnknownNode(why)


def node_taken(nodes: list[int | None], index: int, node: int) -> int | None:
    """The other pair that already has ``node``, if one does."""
    for i, n in enumerate(nodes):
        if i != index and n == node:
            return i
    return None


def names(members: list[Endpoint]) -> str:
    """A pair's members as written in a pair list."""
    return ",".join(str(m) for m in members)


@dataclass
class PairsState:
    """What a client over several pairs knows of them: each pair's node id (learnt at its
    first session, kept while it is down), when each last failed, and whose turn is next.
    Both APIs' managers keep one and do the IO around it."""

    pairs: list[list[Endpoint]]
    nodes: list[int | None] = field(default_factory=list)
    down_since: list[float | None] = field(default_factory=list)
    turn: int = 0

    def __post_init__(self) -> None:
        check_pairs(self.pairs)
        self.nodes = [None] * len(self.pairs)
        self.down_since = [None] * len(self.pairs)

    def order(self) -> list[int]:
        """The pairs to try for the next transaction (and one turn further)."""
        now = time.monotonic()
        down = [t is not None and now - t < PAIR_DOWN_FOR for t in self.down_since]
        order = session_order(self.turn, down)
        self.turn += 1
        return order

    def learn(self, index: int, node: int) -> None:
        """Records pair ``index``'s node id; raises :class:`decree.Unavailable` when another
        pair has it (the pair is then not used: its Xids could not be told apart)."""
        other = node_taken(self.nodes, index, node)
        if other is not None:
            raise Unavailable(
                f"pair {index + 1} ({names(self.pairs[index])}) has node id {node}, as pair {other + 1} "
                f"({names(self.pairs[other])}) has: every pair needs its own node id"
            )
        self.nodes[index] = node

    def served(self, index: int) -> None:
        self.down_since[index] = None

    def failed(self, index: int) -> None:
        self.down_since[index] = time.monotonic()

    def none_serves(self, failures: list[tuple[int, Exception]]) -> Unavailable:
        """The error when no pair serves: every pair, its members and why."""
        each = "; ".join(f"pair {i + 1} ({names(self.pairs[i])}): {e}" for i, e in failures)
        return Unavailable(f"no pair serves: {each}")

    def unreachable(self, index: int, e: Exception) -> Unavailable:
        """``e``, saying which pair it came from."""
        return Unavailable(f"pair {index + 1} ({names(self.pairs[index])}): {e}")
