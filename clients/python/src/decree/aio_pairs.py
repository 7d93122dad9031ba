"""The asyncio API over several independent pairs: :mod:`decree.pairs` for ``async``
applications, one :class:`decree.AsyncTransactionManager` per pair::

    tm = await decree.aconnect_pairs("tcp:a1:7411,tcp:a2:7411;tcp:b1:7411,tcp:b2:7411")
    async with tm.atransaction() as tx:      # on the next pair that serves
        ...
    await tm.outcome(tx.xid)                 # asked of the pair whose node id it carries

The rules (syntax, round robin, routing by node id) are :mod:`decree._pairs`', the same as
the blocking API's; this module awaits the IO."""

from __future__ import annotations

import dataclasses
from collections.abc import Generator
from typing import Any

from . import protocol as p
from ._pairs import PairsState, pair_of_xid, parse_pairs
from .aio import AsyncTransaction, AsyncTransactionManager
from .aio_connection import AsyncServerConnection
from .connection import Endpoint, Options, TlsConfig
from .errors import ServerError, Unavailable, UsageError
from .pairs import pair_options

__all__ = ["AsyncPairsManager", "aconnect_pairs"]


def aconnect_pairs(
    pairs: str,
    *,
    tls: TlsConfig | None = None,
    client_name: str | None = None,
    connect_timeout: float = 5.0,
    reply_timeout: float | None = 30.0,
    outcome_timeout: float = 30.0,
) -> AsyncPairsManager:
    """An asyncio transaction manager over the pairs of ``pairs`` (``;`` between pairs,
    ``,`` between a pair's members). Await it or enter it: either opens a session on every
    pair, and fails only when none serves."""
    options = pair_options(tls, client_name, connect_timeout, reply_timeout)
    return AsyncPairsManager(parse_pairs(pairs), options, outcome_timeout=outcome_timeout)


class AsyncPairsManager:
    """Asyncio transactions spread over several pairs, one manager per pair (all of one
    event loop)."""

    def __init__(self, pairs: list[list[Endpoint]], options: Options, *, outcome_timeout: float = 30.0) -> None:
        if options.node_expected:
            raise UsageError(
                f"node_expected = {options.node_expected} cannot hold for several pairs, each with its own "
                "node id: leave it 0"
            )
        self._state = PairsState(pairs)
        self.managers = [
            AsyncTransactionManager(members, options, outcome_timeout=outcome_timeout) for members in pairs
        ]
        """Each pair's manager, in the order given."""

    @property
    def nodes(self) -> list[int | None]:
        """Each pair's node id, ``None`` for a pair never reached."""
        return list(self._state.nodes)

    async def open(self) -> AsyncPairsManager:
        """Opens (and pools) a session on every pair to learn its node id; raises
        :class:`decree.Unavailable` naming every pair when none serves."""
        failures: list[tuple[int, Exception]] = []
        for index, tm in enumerate(self.managers):
            try:
                await tm._release(await self._session_on(index))
            except (Unavailable, ServerError) as e:
                self._state.failed(index)
                failures.append((index, e))
        if len(failures) == len(self.managers):
            raise self._state.none_serves(failures)
        return self

    def __await__(self) -> Generator[Any, None, AsyncPairsManager]:
        return self.open().__await__()

    async def __aenter__(self) -> AsyncPairsManager:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Closes every pair's pooled sessions."""
        for tm in self.managers:
            await tm.aclose()

    async def _session_on(self, index: int) -> AsyncServerConnection:
        """A session of pair ``index``, whose node id must be its own and no other pair's."""
        tm = self.managers[index]
        conn = await tm._acquire()
        try:
            self._state.learn(index, conn.node)
        except Unavailable:
            await conn.aclose()
            raise
        if tm.options.node_expected != conn.node:
            tm.options = dataclasses.replace(tm.options, node_expected=conn.node)
        return conn

    async def _next_session(self) -> tuple[int, AsyncServerConnection]:
        """A session on the next pair that serves, round robin."""
        failures: list[tuple[int, Exception]] = []
        for index in self._state.order():
            try:
                conn = await self._session_on(index)
            except (Unavailable, ServerError) as e:
                self._state.failed(index)
                failures.append((index, e))
                continue
            self._state.served(index)
            return index, conn
        raise self._state.none_serves(failures)

    def atransaction(self) -> AsyncTransaction:
        """A transaction on the next pair that serves, begun when entered or awaited."""
        return _OnNextPair(self)

    async def pair_of(self, xid: p.Xid) -> int:
        """The index of the pair whose node id ``xid`` carries (pairs never reached are tried
        first when no known pair has it); :class:`UnknownNode` when no pair has it."""
        try:
            return pair_of_xid(self.nodes, xid)
        except Unavailable:
            for index, node in enumerate(self.nodes):
                if node is None:
                    try:
                        await self.managers[index]._release(await self._session_on(index))
                    except (Unavailable, ServerError):
                        pass
            return pair_of_xid(self.nodes, xid)

    async def outcome(self, xid: p.Xid) -> p.Outcome:
        """What became of ``xid``, asked of the pair whose node id it carries."""
        index = await self.pair_of(xid)
        try:
            return await self.managers[index].outcome(xid)
        except Unavailable as e:
            raise self._state.unreachable(index, e) from e


class _OnNextPair(AsyncTransaction):
    """An :class:`decree.AsyncTransaction` whose pair is chosen when it begins: it then
    belongs to that pair's manager, as any transaction of a single-pair manager does."""

    def __init__(self, pairs: AsyncPairsManager) -> None:
        super().__init__(pairs.managers[0])
        self._pairs = pairs

    async def begin(self) -> AsyncTransaction:
        if self.state != "new":
            raise self._state_error("begin")
        index, conn = await self._pairs._next_session()
        self.tm = self._pairs.managers[index]
        self._session = conn
        self.xid = conn.next_xid()
        self.state = "active"
        return self
