"""One asyncio connection to the state server, which is one server session.

The asynchronous twin of :class:`decree.ServerConnection`: it connects to ``unix:/path``,
``tcp:host:port`` or ``tls:host:port`` (TLS 1.3 with a client certificate, through the
standard ``ssl`` module) on the running event loop, says ``Hello`` offering the versions
of :data:`decree.protocol.PROTOCOL_VERSIONS`, and then carries one request at a time
(``decide``, ``outcome``, ``ping``, ``one_phase`` on version 3 with no reply, and lazy
``complete``). Frames are encoded and decoded by :mod:`decree.protocol`, as in the
synchronous client, and what the session decides is :class:`decree._session.SessionState`'s,
as there. A ``decide`` first asks :meth:`alive`; a session the server closed gets its
buffered completions, then the client's close (session rule 9).

A session belongs to the event loop that opened it and is used from one task at a time
(``lock`` is held for each request; the keep-alive takes only sessions nobody holds).
Any IO failure, timeout, protocol violation or a cancellation in the middle of a request
breaks the session: it is closed, and the call in progress and every later call raise.

What a write did is known exactly on a Unix or TCP transport: a frame the socket took
whole, or one that was (at least partly) never taken, which
:class:`~decree.connection.NotSent` reports, as in the synchronous client.
Under TLS the encrypted bytes pass through a second buffer, and a connection lost while
they wait there counts as possibly sent; only the safe answer is ever drawn from it
(docs/protocol.md, "What a client does", step 5).
"""

from __future__ import annotations

import asyncio
import collections
import enum
import logging
import select
import time
from typing import Any

from . import protocol as p
from ._session import CLOSED_BY_SERVER, SessionState, due_for_ping, falls_back_to_version_1, first_bytes, gone_because
from .connection import Endpoint, Options
from .errors import NotSent, ServerError, Unavailable, UsageError

log = logging.getLogger("decree")

_POLL = 0.005
"""Seconds between looks at a TLS connection's inner buffer while a frame waits in it."""


class Written(enum.Enum):
    TAKEN = "taken"
    """The socket took every byte."""
    NOT_SENT = "not sent"
    """At least the last byte never reached the socket."""
    UNSURE = "unsure"
    """The connection ended while the bytes may have been in TLS's inner buffer."""


class _Stream(asyncio.Protocol):
    """The transport's protocol: frames decoded as bytes arrive, the end of the stream,
    and (on a plain transport) whether written bytes still wait in the transport."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.decoder = p.FrameDecoder()
        self.frames: collections.deque[p.Frame] = collections.deque()
        self.error: p.FrameError | None = None
        self.first_bytes = b""
        """The first bytes the peer sent, to describe one that is not decree."""
        self.ended: str | None = None
        self.paused = False
        self.tls = False
        self._changed = asyncio.Event()
        self._lost = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.tls = transport.get_extra_info("sslcontext") is not None
        if not self.tls:
            transport.set_write_buffer_limits(high=0)  # paused exactly while bytes wait.

    def data_received(self, data: bytes) -> None:
        self.first_bytes = first_bytes(self.first_bytes, data)
        if self.error is None:
            self.decoder.feed(data)
            self._decode()
        self._changed.set()

    def _decode(self) -> None:
        while True:
            try:
                frame = self.decoder.next()
            except p.FrameError as e:
                self.error = e
                return
            if frame is None:
                return
            self.frames.append(frame)

    def eof_received(self) -> bool:
        self.ended = self.ended or CLOSED_BY_SERVER
        self._changed.set()
        # A server that closes a session reads on until the client closes (docs/protocol.md,
        # session rule 9): the session writes its buffered completions, then closes.
        return not self.tls  # (asyncio's TLS transport closes on its own.)

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = self.ended or (f"connection lost: {exc}" if exc else "closed")
        self._changed.set()
        self._lost.set()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._changed.set()

    def unsolicited(self) -> bool:
        return bool(self.frames) or self.decoder.buffered() > 0 or self.error is not None

    async def changed(self, timeout: float | None) -> None:
        """Waits until something happens (or ``timeout`` s pass: asyncio.TimeoutError)."""
        self._changed.clear()
        await asyncio.wait_for(self._changed.wait(), timeout)

    async def closed(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self._lost.wait(), timeout)
        except asyncio.TimeoutError:
            pass


def _inner(transport: asyncio.BaseTransport) -> Any:
    """The TCP transport under an asyncio TLS transport (``None`` when not found)."""
    return getattr(getattr(transport, "_ssl_protocol", None), "_transport", None)


class AsyncServerConnection(SessionState):
    """One open server session on an event loop. Use it from one task at a time. What the
    session decides is :class:`decree._session.SessionState`'s; this class has the transport."""

    _KIND = ", asyncio"

    def __init__(self, endpoint: Endpoint, options: Options) -> None:
        self._stream = _Stream()
        super().__init__(endpoint, options, self._stream.decoder)
        self.lock = asyncio.Lock()
        self.last_sent = time.monotonic()
        self._transport: asyncio.Transport | None = None

    # --- opening --------------------------------------------------------------------------

    @classmethod
    async def open(cls, endpoint: Endpoint, options: Options) -> AsyncServerConnection:
        """Connects and greets; falls back to a plain Hello for a server older than version 2."""
        conn = cls(endpoint, options)
        try:
            await conn._greet(options.versions)
        except ServerError as e:
            if not falls_back_to_version_1(e, endpoint, options.versions):
                raise
            conn = cls(endpoint, options)
            await conn._greet(())
        return conn

    async def _connect(self) -> None:
        ep, opts = self.endpoint, self.options
        loop = asyncio.get_running_loop()
        try:
            if ep.kind == "unix":
                made = loop.create_unix_connection(lambda: self._stream, ep.address)
            elif ep.kind == "tcp":
                made = loop.create_connection(lambda: self._stream, ep.host, ep.port)
            else:
                if opts.tls is None:
                    raise UsageError(f"{ep} needs TLS settings (tls=decree.TlsConfig(...))")
                hostname = opts.tls.server_hostname or ep.host
                made = loop.create_connection(
                    lambda: self._stream, ep.host, ep.port, ssl=opts.tls.make_context(), server_hostname=hostname
                )
            transport, _ = await asyncio.wait_for(made, opts.connect_timeout)
        except (OSError, asyncio.TimeoutError) as e:
            raise Unavailable(f"cannot connect to {ep}: {e or 'timed out'}") from e
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    async def _greet(self, versions: tuple[int, ...]) -> None:
        await self._connect()
        self._agree(await self._exchange(self._hello(versions)), versions)

    # --- state ------------------------------------------------------------------------------

    async def alive(self) -> bool:
        """Whether the server still holds this session: nothing unsolicited has arrived and
        the stream has not ended. When the socket is readable, the event loop is let run
        so that what is there (an end of stream, a TLS record) reaches the session first."""
        if self.broken or self._transport is None:
            return False
        async with self.lock:  # a keep-alive's Pong is not unsolicited.
            if self._readable():
                for _ in range(3):
                    await asyncio.sleep(0)
            gone = gone_because(self._stream.ended, self._stream.unsolicited())
            if gone is not None:
                self._drop_gone(gone)
                return False
            return not self.broken

    def _readable(self) -> bool:
        sock = self._transport.get_extra_info("socket") if self._transport is not None else None
        if sock is None:
            return False
        try:
            readable, _, _ = select.select([sock.fileno()], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    # --- requests ---------------------------------------------------------------------------

    async def decide(self, xid: p.Xid, branches: tuple[p.Branch, ...]) -> None:
        """Sends Decide and waits for DecideOk. First checks that the server still holds the
        session (:meth:`alive`): NotSent when it does not, or when the frame was not written
        whole (not a decision); ServerError for an Error answer; Unavailable when the answer
        was lost (the decision may or may not be durable)."""
        if not await self.alive():
            raise NotSent(f"the session to {self.endpoint} is gone ({self._broken})")
        self._decided(await self._request(p.Decide(xid, branches)))

    async def outcome(self, xid: p.Xid) -> p.Outcome:
        """Asks what became of ``xid`` (version-1 errors 15 and 16 read as unknown and heuristic)."""
        return self._outcome_of(await self._request(p.OutcomeQuery(xid.global_xid())))

    async def ping(self) -> None:
        self._ponged(await self._request(p.Ping()))

    async def one_phase(self, xid: p.Xid) -> bool:
        """Version 3: tells the server that ``xid`` is about to commit in one phase
        (OnePhase, written with the buffered completions; no reply on success). Returns
        False on an older session, which has no such message: nothing is sent. NotSent
        unless the socket surely took the whole frame: the branch must not commit then."""
        if not self._tells_one_phase:
            return False
        async with self.lock:
            frame = self._one_phase_frame(xid, self._transport)
            try:
                await self._send(frame)
            except NotSent:
                raise
            except Unavailable as e:  # perhaps written: still not a notice to commit on.
                raise NotSent(f"the OnePhase frame to {self.endpoint} was not confirmed written: {e}") from e
            except asyncio.CancelledError:
                self.close_now("cancelled during a OnePhase")
                raise
        return True

    def complete(self, xid: p.Xid, heuristic: p.Heuristic | None = None) -> None:
        """Buffers the completion of ``xid`` (no reply on success; a version-1 session
        sends a plain Complete where version 2 sends CompleteHeuristic)."""
        if self._buffer_complete(xid, heuristic) and not self.lock.locked():
            self.flush()

    def flush(self) -> None:
        """Hands the buffered completions to the transport (a lost one only makes the
        server redo an idempotent phase two)."""
        if self._completes and not self.broken and self._transport is not None:
            self._transport.write(self._with_completes())
            self.last_sent = time.monotonic()

    async def aclose(self) -> None:
        """Sends what is buffered, closes, and waits (briefly) until the socket is closed."""
        if self._transport is None:
            return
        self.flush()
        self._broken = self._broken or "closed by the client"
        transport, self._transport = self._transport, None
        transport.close()
        await self._stream.closed(1.0)

    def _drop_gone(self, why: str) -> None:
        """Closes a session the server has let go of. A server that closed it itself still
        reads what comes before the client's close (docs/protocol.md, session rule 9), so
        the buffered completions are written first, for what they are worth."""
        transport = self._transport
        if not self._flushes_before_close(why) or transport is None or transport.is_closing():
            self.close_now(why)
            return
        transport.write(self._with_completes())
        self._broken = self._broken or why
        self._transport = None
        transport.close()  # after the written bytes.

    def close_now(self, why: str) -> None:
        """Closes without sending anything more."""
        if self._broken is None:
            self._broken = why
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.abort()

    async def ping_if_idle(self, idle_for: float) -> None:
        """Keep-alive: pings when nobody holds the session and nothing was sent for ``idle_for`` s."""
        if self.broken or self.lock.locked() or not due_for_ping(time.monotonic(), self.last_sent, idle_for):
            return
        try:
            await self.ping()
        except Exception as e:
            log.warning("keep-alive ping of session %d failed: %s", self.session, e)

    # --- frames -----------------------------------------------------------------------------

    async def _request(self, message: p.Message) -> p.Message:
        async with self.lock:
            return await self._exchange(message)

    async def _exchange(self, message: p.Message) -> p.Message:
        """Sends ``message`` (after the buffered completions) and reads its reply; the
        caller holds ``lock``. A cancellation breaks the session: its reply would
        otherwise answer a later request."""
        rid, frame = self._request_frame(message, self._transport)
        try:
            await self._send(frame)
            return await self._reply(rid)
        except asyncio.CancelledError:
            self.close_now(f"cancelled during a {type(message).__name__}")
            raise

    async def _reply(self, rid: int) -> p.Message:
        while True:
            reply = self._answer(await self._read_frame(), rid)
            if reply is not None:
                return reply

    async def _send(self, frame: bytes) -> None:
        """Writes the buffered completions and ``frame``; returns once the socket took
        every byte (or, under TLS, may have). NotSent when it surely did not."""
        transport, stream = self._transport, self._stream
        assert transport is not None
        if stream.ended is not None or transport.is_closing():
            self._drop_gone(stream.ended or "closing")
            self._raise_refusal()
            raise NotSent(f"{self.endpoint} closed the connection before the request was written")
        transport.write(self._with_completes(frame))
        written = await self._written(transport)
        if written == Written.NOT_SENT:
            self.close_now("write failed")
            raise NotSent(f"connection to {self.endpoint} broke before the request was written whole")
        if written == Written.UNSURE:
            self.close_now("write not confirmed")
            raise Unavailable(f"connection to {self.endpoint} broke while the request was being written")
        self.last_sent = time.monotonic()

    def _raise_refusal(self) -> None:
        """ServerError for an Error frame of request 0 that came before the close (a
        refusal right after accept: Busy, NotAllowed, TlsRequired, NotPrimary)."""
        for frame in self._stream.frames:
            if frame.request_id == 0 and isinstance(frame.message, p.Error):
                raise ServerError(frame.message.code, frame.message.message)

    def _failed_now(self, transport: asyncio.Transport) -> bool:
        """Whether the write just made failed at once (the transport closes itself)."""
        inner = _inner(transport)
        return transport.is_closing() or (inner is not None and inner.is_closing())

    async def _written(self, transport: asyncio.Transport) -> Written:
        if self._failed_now(transport):
            return Written.NOT_SENT
        stream = self._stream
        deadline = None if self.options.reply_timeout is None else time.monotonic() + self.options.reply_timeout
        while True:
            over = stream.ended is not None or (deadline is not None and time.monotonic() >= deadline)
            if not stream.tls:
                # On a plain transport "paused" is exactly "our bytes still wait in it".
                if not stream.paused:
                    return Written.TAKEN
                if over:
                    return Written.NOT_SENT
            else:
                inner = _inner(transport)
                if over or (inner is not None and inner.is_closing()):
                    return Written.NOT_SENT if stream.paused else Written.UNSURE
                if not stream.paused and (inner is None or inner.get_write_buffer_size() == 0):
                    return Written.TAKEN
            try:
                await stream.changed(_POLL if stream.tls else self._left(deadline))
            except asyncio.TimeoutError:
                pass

    @staticmethod
    def _left(deadline: float | None) -> float | None:
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    async def _read_frame(self) -> p.Frame:
        stream = self._stream
        timeout = self.options.reply_timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if stream.frames:
                return self._understood(stream.frames.popleft())
            if stream.error is not None:
                raise self._frame_error(stream.error, stream.first_bytes)
            if stream.ended is not None:
                self.close_now(stream.ended)
                raise Unavailable(f"{self.endpoint} closed the connection ({stream.ended})")
            left = self._left(deadline)
            if left is not None and left <= 0:
                self.close_now("reply timed out")
                raise Unavailable(f"no reply from {self.endpoint} within {timeout} s")
            try:
                await stream.changed(left)
            except asyncio.TimeoutError:
                pass

