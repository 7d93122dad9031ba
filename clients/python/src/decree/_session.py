"""What one server session knows and decides, without its transport: the state that the
blocking :class:`decree.ServerConnection` and the asyncio
:class:`decree.AsyncServerConnection` both drive.

The transports move bytes and wait (sockets, locks, the event loop); everything they decide
from what they see is here, once: the session's parameters agreed in ``HelloOk``, request
ids and Xids, the frame of each request and the buffered completions written in front of
it (at most :data:`COMPLETES_BUFFERED_MAX`), what each reply means, what an Error for
another request does to the session, which frames break it (an unknown must-understand
field, a header that is not decree's), what a look at an idle session concludes
(:func:`gone_because`) and whether its completions are written before it is closed.

Not for: reading or writing bytes, timeouts, TLS. The one call back into the transport is
:meth:`SessionState.close_now`, which a rule makes when it ends the session (a protocol
violation, the server's Error on the connection); every such rule records why first.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from . import _tracing
from . import protocol as p
from .errors import NotSent, ProtocolError, ServerError, UsageError

if TYPE_CHECKING:
    from .connection import Endpoint, Options

log = logging.getLogger("decree")

COMPLETES_BUFFERED_MAX = 16
"""Completions buffered on one session before they are sent on their own."""

CLOSING_CODES = frozenset({1, 2, 3, 4, 5, 8, 9, 10, 17, 18, 19})
"""Error codes after which the server closes the connection."""

CLOSED_BY_SERVER = "closed by the server"
"""Why a session ended when the server closed it (an end of stream): it still reads what
the client writes before its own close (docs/protocol.md, session rule 9)."""

UNSOLICITED = "unsolicited bytes from the server"
"""Why an idle session is given up when bytes nobody asked for arrive (the server sends
nothing unasked but an Error before it closes)."""

FIRST_BYTES_SHOWN = 24
"""How many of a non-decree peer's first bytes an error shows."""

HEADER_ERRORS = frozenset({"TooLarge", "TooShort", "Version", "UnknownType"})
"""Frame errors of the header, which on the first reply mean that the peer is not decree."""


def peer_guess(head: bytes) -> str:
    """What a peer that is not decree may be, from its first bytes: `` (an HTTP server?)``."""
    if head.startswith(b"HTTP/"):
        return " (an HTTP server?)"
    if len(head) >= 2 and head[0] in (0x15, 0x16) and head[1] == 3:
        return " (a TLS server? only a tls: endpoint speaks TLS)"
    if len(head) >= 5 and head[3] == 0 and head[4] == 10:
        return " (a MySQL or MariaDB server?)"
    if len(head) >= 5 and head[:1] in (b"E", b"R") and head[1] == 0:
        return " (a PostgreSQL server?)"
    return ""


def first_bytes(kept: bytes, data: bytes) -> bytes:
    """``kept`` with as much of ``data`` as fits in :data:`FIRST_BYTES_SHOWN`."""
    return kept + data[: max(0, FIRST_BYTES_SHOWN - len(kept))]


def gone_because(ended: str | None, unsolicited: bool) -> str | None:
    """What a look at a session nobody is waiting on concludes: why the server no longer
    holds it (``ended``, the reason its stream ended, or unsolicited bytes), or ``None``
    while it looks alive. A transaction on a session that is gone could only end with
    ``Outcome``, so a Decide is never written on one."""
    if ended is not None:
        return ended
    return UNSOLICITED if unsolicited else None


def due_for_ping(now: float, last_sent: float, idle_for: float) -> bool:
    """Keep-alive: whether a session nobody holds has sent nothing for ``idle_for`` seconds
    (docs/protocol.md, "Timeouts")."""
    return now - last_sent >= idle_for


def falls_back_to_version_1(error: ServerError, endpoint: Endpoint, versions: tuple[int, ...]) -> bool:
    """Whether a refused Hello means a server older than version 2, which reads a version
    list as malformed: the session is then opened again with a plain Hello."""
    if error.code != p.ErrorCode.MALFORMED or not versions:
        return False
    log.info("%s refused the version list (%s): speaking protocol version 1", endpoint, error.server_message)
    return True


class SessionState:
    """One session's state and rules. A transport subclasses it, implements
    :meth:`close_now`, and sends the frames and hands over the replies that these methods
    make and read."""

    _KIND = ""
    """How the debug log names the transport after the version (", asyncio")."""

    def __init__(self, endpoint: Endpoint, options: Options, decoder: p.FrameDecoder) -> None:
        self.endpoint = endpoint
        self.options = options
        self.node = self.incarnation = self.session = 0
        self.version = 1
        self.frame_bytes_max = p.FRAME_BYTES_MAX
        self.inflight_max = 1
        self.idle_timeout_ms = 0
        self._decoder = decoder
        self._next_id = 1
        self._sequence = 0
        self._completes: list[bytes] = []
        self._broken: str | None = None

    def close_now(self, why: str) -> None:
        """Closes without sending anything more (the transport's part)."""
        raise NotImplementedError

    @property
    def broken(self) -> bool:
        return self._broken is not None

    def next_xid(self) -> p.Xid:
        """The global Xid of this session's next transaction (nothing is sent)."""
        self._sequence += 1
        return p.Xid.decree(self.node, self.incarnation, self.session, self._sequence)

    def _take_id(self) -> int:
        rid = self._next_id
        self._next_id += 1
        return rid

    # --- the greeting -----------------------------------------------------------------------

    def _hello(self, versions: tuple[int, ...]) -> p.Hello:
        return p.Hello(self.options.node_expected, self.options.client_name, tuple(versions))

    def _agree(self, reply: p.Message, versions: tuple[int, ...]) -> None:
        """Takes the session's parameters from the answer to Hello (docs/protocol.md,
        "Versions"); ServerError for a refusal, ProtocolError for anything but HelloOk."""
        if isinstance(reply, p.Error):
            self.close_now(f"refused: {reply.message}")
            raise ServerError(reply.code, reply.message)
        if not isinstance(reply, p.HelloOk):
            raise self._violation(f"expected HelloOk, got {type(reply).__name__}")
        if reply.negotiated is None:
            self.version = 1
        elif reply.negotiated.version not in versions:
            raise self._violation(f"the server chose protocol version {reply.negotiated.version}, not offered")
        else:
            self.version = reply.negotiated.version
            self.idle_timeout_ms = reply.negotiated.idle_timeout_ms
        if reply.session == 0:
            raise self._violation("HelloOk with session 0")
        self.node, self.incarnation, self.session = reply.node, reply.incarnation, reply.session
        self._decoder.version = self.version  # version 3 on: frames may carry a field trailer.
        self.frame_bytes_max = min(reply.frame_bytes_max, p.FRAME_BYTES_MAX)
        self.inflight_max = reply.inflight_max
        log.debug(
            "session %d of node %d incarnation %d on %s (protocol version %d%s)",
            self.session, self.node, self.incarnation, self.endpoint, self.version, self._KIND,
        )

    # --- requests ---------------------------------------------------------------------------

    def _request_frame(self, message: p.Message, transport: object) -> tuple[int, bytes]:
        """The request id and frame of ``message``; NotSent on a broken session (or one
        whose ``transport`` is gone), UsageError for a frame over the server's limit."""
        if self._broken is not None or transport is None:
            raise NotSent(f"connection to {self.endpoint} is broken: {self._broken}")
        rid = self._take_id()
        frame = p.encode_frame(rid, message, _tracing.trailer(self.version, message))
        if len(frame) > self.frame_bytes_max:
            raise UsageError(f"a {type(message).__name__} of {len(frame)} bytes exceeds the server's frame limit")
        return rid, frame

    @property
    def _tells_one_phase(self) -> bool:
        """Whether a one-phase commit is announced with OnePhase: version 3 on (rule 8);
        an older session has no such message."""
        return self.version >= p.TRAILER_VERSION

    def _one_phase_frame(self, xid: p.Xid, transport: object) -> bytes:
        """The OnePhase frame of ``xid`` (no reply on success)."""
        return self._request_frame(p.OnePhase(xid.global_xid()), transport)[1]

    def _buffer_complete(self, xid: p.Xid, heuristic: p.Heuristic | None) -> bool:
        """Buffers the completion of ``xid`` (a version-1 session sends a plain Complete
        where version 2 sends CompleteHeuristic); nothing on a broken session, whose
        transactions the server finishes itself. Whether the buffer is full: send it now."""
        message: p.Message
        if heuristic is not None and self.version >= 2:
            message = p.CompleteHeuristic(xid.global_xid(), heuristic)
        else:
            message = p.Complete(xid.global_xid())
        if self.broken:
            return False
        self._completes.append(p.encode_frame(self._take_id(), message, _tracing.trailer(self.version, message)))
        return len(self._completes) >= COMPLETES_BUFFERED_MAX

    def _with_completes(self, frame: bytes = b"") -> bytes:
        """The buffered completions, then ``frame``: what is written next (the buffer is emptied)."""
        data = b"".join(self._completes) + frame
        self._completes.clear()
        return data

    def _flushes_before_close(self, why: str) -> bool:
        """Whether a session that is gone for ``why`` gets its buffered completions before
        the client's close: only one the server closed itself, which reads on until then
        (docs/protocol.md, session rule 9); the rest, for what they are worth."""
        return why == CLOSED_BY_SERVER and bool(self._completes)

    # --- replies ----------------------------------------------------------------------------

    def _answer(self, got: p.Frame, rid: int) -> p.Message | None:
        """The reply to request ``rid`` when ``got`` is it; ``None`` for an Error that answered
        a buffered Complete (success has no answer, and it is never a decision), after which
        the session goes on unless the code closes it; raises for anything else."""
        if got.request_id == rid:
            return got.message
        if not isinstance(got.message, p.Error):
            raise self._violation(f"a {type(got.message).__name__} for request {got.request_id}, not {rid}")
        error = got.message
        if got.request_id == 0:
            self.close_now(f"error {error.code}: {error.message}")
            raise ServerError(error.code, error.message)
        log.warning(
            "session %d: the server refused a completion (request %d): error %d %s",
            self.session, got.request_id, error.code, error.message,
        )
        if error.code in CLOSING_CODES:
            self.close_now("the server closed the session")
            raise ServerError(error.code, error.message)
        return None

    def _decided(self, reply: p.Message) -> None:
        """The answer to Decide: DecideOk, or ServerError for an Error."""
        if isinstance(reply, p.DecideOk):
            return
        if isinstance(reply, p.Error):
            raise ServerError(reply.code, reply.message)
        raise self._violation(f"expected DecideOk, got {type(reply).__name__}")

    def _outcome_of(self, reply: p.Message) -> p.Outcome:
        """The answer to Outcome (version-1 errors 15 and 16 read as unknown and heuristic)."""
        if isinstance(reply, p.OutcomeIs):
            return reply.outcome
        if isinstance(reply, p.Error):
            if reply.code == p.ErrorCode.OUTCOME_UNKNOWN:
                return p.Outcome.UNKNOWN
            if reply.code == p.ErrorCode.OUTCOME_HEURISTIC:
                return p.Outcome.HEURISTIC
            raise ServerError(reply.code, reply.message)
        raise self._violation(f"expected OutcomeIs, got {type(reply).__name__}")

    def _ponged(self, reply: p.Message) -> None:
        if isinstance(reply, p.Error):
            raise ServerError(reply.code, reply.message)
        if not isinstance(reply, p.Pong):
            raise self._violation(f"expected Pong, got {type(reply).__name__}")

    def _understood(self, frame: p.Frame) -> p.Frame:
        """``frame``, unless its trailer has a must-understand field this client does not know."""
        unknown = p.unknown_must_understand(frame.trailer)
        if unknown is not None:
            name = type(frame.message).__name__
            raise self._violation(f"a {name} with the unknown must-understand field {unknown.tag:#06x}")
        return frame

    def _frame_error(self, error: p.FrameError, head: bytes) -> ProtocolError:
        """What a frame the decoder refused means: before the session is agreed, a bad header
        is a peer that is not decree (``head``: its first bytes); anything else a violation."""
        if self.session == 0 and error.kind in HEADER_ERRORS:
            return self._not_decree(head)
        return self._violation(str(error))

    def _not_decree(self, head: bytes) -> ProtocolError:
        """The first reply's header is not a decree frame: the peer is something else."""
        self.close_now("not a decree server")
        return ProtocolError(
            f"the server at {self.endpoint} did not answer as a decree server{peer_guess(head)}: its "
            f"first bytes read as ASCII {repr(head)[1:]}"
        )

    def _violation(self, why: str) -> ProtocolError:
        self.close_now(f"protocol violation: {why}")
        return ProtocolError(f"{self.endpoint}: {why}")
