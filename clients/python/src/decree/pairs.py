"""A client over several independent pairs (or single servers), each with its own node id::

    tm = decree.connect_pairs("tcp:a1:7411,tcp:a2:7411;tcp:b1:7411,tcp:b2:7411")
    with tm.transaction() as tx:      # on pair a or pair b, round robin
        tx.enlist(pg_a, "pg-a")
        ...
    tm.outcome(tx.xid)                # asked of the pair whose node id the Xid carries

Pairs are separated by ``;``, the members of one pair by ``,`` (the members of one pair are
what :func:`decree.connect` takes; a backup answers NotPrimary and the other member is
tried). Each transaction takes a session on the next pair that serves, round robin, and
lives there entirely: its Xid carries that pair's node id, its decision goes to that pair,
and a lost answer is resolved by that pair. A pair that does not serve is left for the next
one (and tried only after the others for a second); when none serves, the error names every
pair and why. ``outcome`` goes to the pair whose node id the Xid carries, never to another:
an Xid of no pair raises :class:`UnknownNode`.

Every pair runs its own :class:`decree.TransactionManager` (its pool of sessions, its
keep-alive); the rules that pick the pair are :mod:`decree._pairs`', shared with the asyncio
API (:mod:`decree.aio_pairs`)."""

from __future__ import annotations

import dataclasses
import functools
import threading
from typing import Callable, Concatenate, ParamSpec, TypeVar

from . import protocol as p
from ._pairs import PairsState, UnknownNode, pair_of_xid, parse_pairs
from .connection import Endpoint, Options, ServerConnection, TlsConfig
from .errors import ServerError, Unavailable, UsageError
from .tm import _MANAGERS, Transaction, TransactionManager

__all__ = ["PairsManager", "UnknownNode", "connect_pairs", "pair_options"]

T = TypeVar("T")
P = ParamSpec("P")


def pair_options(
    tls: TlsConfig | None, client_name: str | None, connect_timeout: float, reply_timeout: float | None
) -> Options:
    """The options every pair's sessions share (the node id is each pair's own)."""
    options = Options(connect_timeout=connect_timeout, reply_timeout=reply_timeout, tls=tls)
    return options if client_name is None else dataclasses.replace(options, client_name=client_name)


def connect_pairs(
    pairs: str,
    *,
    tls: TlsConfig | None = None,
    client_name: str | None = None,
    connect_timeout: float = 5.0,
    reply_timeout: float | None = 30.0,
    outcome_timeout: float = 30.0,
) -> PairsManager:
    """A transaction manager over the pairs of ``pairs`` (``;`` between pairs, ``,`` between
    a pair's members). Opens a session on every pair at once, to learn each pair's node id;
    fails only when no pair serves (the others are tried again as transactions begin)."""
    options = pair_options(tls, client_name, connect_timeout, reply_timeout)
    tm = PairsManager(parse_pairs(pairs), options, outcome_timeout=outcome_timeout)
    tm.open()
    return tm


class PairsManager:
    """Transactions spread over several pairs, one :class:`decree.TransactionManager` per
    pair; threads may share it."""

    def __init__(self, pairs: list[list[Endpoint]], options: Options, *, outcome_timeout: float = 30.0) -> None:
        if options.node_expected:
            raise UsageError(
                f"node_expected = {options.node_expected} cannot hold for several pairs, each with its own "
                "node id: leave it 0"
            )
        self._state = PairsState(pairs)
        self.managers = [TransactionManager(members, options, outcome_timeout=outcome_timeout) for members in pairs]
        """Each pair's manager, in the order given."""
        self._lock = threading.Lock()
        _MANAGERS.add(self)  # tm.py's handler makes the lock anew in the child of os.fork().

    def _after_fork(self) -> None:
        """In the child of ``os.fork()``: a lock another thread of the parent held at the fork
        would stay held forever, so it is made anew (each pair's manager drops its own
        sessions)."""
        self._lock = threading.Lock()

    @property
    def nodes(self) -> list[int | None]:
        """Each pair's node id, ``None`` for a pair never reached."""
        return list(self._state.nodes)

    def open(self) -> None:
        """Opens (and pools) a session on every pair to learn its node id; raises
        :class:`decree.Unavailable` naming every pair when none serves."""
        failures: list[tuple[int, Exception]] = []
        for index, tm in enumerate(self.managers):
            try:
                tm._release(self._session_on(index))
            except (Unavailable, ServerError) as e:
                with self._lock:
                    self._state.failed(index)
                failures.append((index, e))
        if len(failures) == len(self.managers):
            raise self._state.none_serves(failures)

    def _session_on(self, index: int) -> ServerConnection:
        """A session of pair ``index``, whose node id must be its own and no other pair's."""
        tm = self.managers[index]
        conn = tm._acquire()
        try:
            with self._lock:
                self._state.learn(index, conn.node)
        except Unavailable:
            conn.close()
            raise
        if tm.options.node_expected != conn.node:
            # From now on a member with another node id is refused by the server itself.
            tm.options = dataclasses.replace(tm.options, node_expected=conn.node)
        return conn

    def _next_session(self) -> tuple[int, ServerConnection]:
        """A session on the next pair that serves, round robin."""
        with self._lock:
            order = self._state.order()
        failures: list[tuple[int, Exception]] = []
        for index in order:
            try:
                conn = self._session_on(index)
            except (Unavailable, ServerError) as e:
                with self._lock:
                    self._state.failed(index)
                failures.append((index, e))
                continue
            with self._lock:
                self._state.served(index)
            return index, conn
        raise self._state.none_serves(failures)

    def transaction(self) -> Transaction:
        """Begins a transaction on the next pair that serves (nothing is sent yet)."""
        index, conn = self._next_session()
        return Transaction(self.managers[index], conn)

    def transactional(self, fn: Callable[Concatenate[Transaction, P], T]) -> Callable[P, T]:
        """Decorator: runs ``fn(tx, *args, **kwargs)`` in a transaction on the next pair."""

        @functools.wraps(fn)
        def run(*args: P.args, **kwargs: P.kwargs) -> T:
            with self.transaction() as tx:
                return fn(tx, *args, **kwargs)

        return run

    def pair_of(self, xid: p.Xid) -> int:
        """The index of the pair whose node id ``xid`` carries (pairs never reached are tried
        first when no known pair has it); :class:`UnknownNode` when no pair has it."""
        try:
            return self._state_pair_of(xid)
        except Unavailable:
            for index, node in enumerate(self.nodes):
                if node is None:
                    try:
                        self.managers[index]._release(self._session_on(index))
                    except (Unavailable, ServerError):
                        pass
            return self._state_pair_of(xid)

    def _state_pair_of(self, xid: p.Xid) -> int:
        return pair_of_xid(self.nodes, xid)

    def outcome(self, xid: p.Xid) -> p.Outcome:
        """What became of ``xid``, asked of the pair whose node id it carries."""
        index = self.pair_of(xid)
        try:
            return self.managers[index].outcome(xid)
        except Unavailable as e:
            raise self._state.unreachable(index, e) from e

    def close(self) -> None:
        """Closes every pair's pooled sessions."""
        for tm in self.managers:
            tm.close()

    def __enter__(self) -> PairsManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
