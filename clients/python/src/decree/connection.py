"""One connection to the state server, which is one server session.

A :class:`ServerConnection` connects to ``unix:/path``, ``tcp:host:port`` or
``tls:host:port`` (TLS 1.3 with a client certificate, through the standard ``ssl``
module), says ``Hello`` offering protocol versions 1, 2 and 3, and then carries one request
at a time from the thread that holds it: ``decide``, ``outcome``, ``ping``, ``one_phase``
(version 3, no reply), and lazy ``complete`` (buffered, sent in front of the next request,
at 16 buffered, or at close). A request that could not be written whole raises
:class:`NotSent`: the server never received it.

Any IO failure, timeout or protocol violation breaks the connection: it is closed, and
the call in progress and every later call raise. A server that refuses the version list
as malformed (one older than protocol version 2) gets a plain ``Hello`` on a new
connection, and the session speaks version 1; on such a session the answers unknown and
heuristic come as errors 15 and 16 and are returned as the same :class:`Outcome` values.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import ssl
import struct
import sys
import threading
import time
from dataclasses import dataclass, field

from . import protocol as p
from ._session import COMPLETES_BUFFERED_MAX as COMPLETES_BUFFERED_MAX
from ._session import CLOSED_BY_SERVER, UNSOLICITED, SessionState, due_for_ping, first_bytes, gone_because
from ._session import falls_back_to_version_1
from .errors import NotSent as NotSent
from .errors import ServerError, Unavailable, UsageError

log = logging.getLogger("decree")

__version__ = "0.1.0"

_KERNEL_TIMEOUTS = sys.platform.startswith("linux")
"""Whether reply timeouts are the kernel's SO_RCVTIMEO/SO_SNDTIMEO (see ``_reply_timeout``)."""


def _readable_now(sock: socket.socket) -> bool:
    """Whether a read would not block (data, the end of the stream or an error), without waiting."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([sock], [], [], 0)[0])


@dataclass(frozen=True)
class Endpoint:
    """Where the server listens: ``unix:/path``, ``tcp:host:port`` or ``tls:host:port``."""

    kind: str
    address: str

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        kind, sep, address = text.partition(":")
        if not sep or kind not in ("unix", "tcp", "tls") or not address:
            raise UsageError(f"endpoint {text!r} must be unix:/path, tcp:host:port or tls:host:port")
        if kind != "unix":
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit():
                raise UsageError(f"endpoint {text!r} needs {kind}:host:port")
        return cls(kind, address)

    @property
    def host(self) -> str:
        host = self.address.rpartition(":")[0]
        return host[1:-1] if host.startswith("[") and host.endswith("]") else host

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])

    def __str__(self) -> str:
        return f"{self.kind}:{self.address}"


@dataclass(frozen=True)
class TlsConfig:
    """What a ``tls:`` endpoint needs: the CA that signed the server's certificate, and
    this client's certificate and key (mutual TLS). ``context`` replaces all three with a
    ready ``ssl.SSLContext``; ``server_hostname`` overrides the name checked in the
    server's certificate (the endpoint's host by default)."""

    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    context: ssl.SSLContext | None = None
    server_hostname: str | None = None

    def make_context(self) -> ssl.SSLContext:
        if self.context is not None:
            return self.context
        if self.certfile is None:
            raise UsageError("a tls: endpoint needs a client certificate (TlsConfig certfile and keyfile)")
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.cafile)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.load_cert_chain(self.certfile, self.keyfile)
        return context


@dataclass(frozen=True)
class Options:
    """How connections are made and how long they wait."""

    node_expected: int = 0
    """The node id the server must have; 0 accepts any."""
    client_name: str = field(default_factory=lambda: f"decree-python/{__version__} pid {os.getpid()}")
    """The name the server logs for this client (at most 255 bytes are sent)."""
    connect_timeout: float = 5.0
    reply_timeout: float | None = 30.0
    """The longest wait for a reply; past it the connection breaks (a decide is then resolved
    with ``Outcome``)."""
    tls: TlsConfig | None = None
    versions: tuple[int, ...] = p.PROTOCOL_VERSIONS


class ServerConnection(SessionState):
    """One open server session. Use it from one thread at a time; ``lock`` is held for
    each request (the keep-alive takes only connections nobody holds). What the session
    decides is :class:`decree._session.SessionState`'s; this class has the socket."""

    def __init__(self, endpoint: Endpoint, options: Options) -> None:
        super().__init__(endpoint, options, p.FrameDecoder())
        self.lock = threading.Lock()
        self.last_sent = time.monotonic()
        self._sock: socket.socket | None = None
        self._first_bytes = b""
        """The first bytes the server sent, kept until HelloOk to describe a peer that is not decree."""

    # --- opening --------------------------------------------------------------------------

    @classmethod
    def open(cls, endpoint: Endpoint, options: Options) -> ServerConnection:
        """Connects and greets; falls back to a plain Hello for a server older than version 2."""
        conn = cls(endpoint, options)
        try:
            conn._greet(options.versions)
        except ServerError as e:
            if not falls_back_to_version_1(e, endpoint, options.versions):
                raise
            conn = cls(endpoint, options)
            conn._greet(())
        return conn

    def _connect(self) -> socket.socket:
        ep, opts = self.endpoint, self.options
        try:
            if ep.kind == "unix":
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(opts.connect_timeout)
                try:
                    sock.connect(ep.address)
                except BaseException:
                    sock.close()
                    raise
            else:
                sock = socket.create_connection((ep.host, ep.port), timeout=opts.connect_timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if ep.kind == "tls":
                    if opts.tls is None:
                        sock.close()
                        raise UsageError(f"{ep} needs TLS settings (tls=decree.TlsConfig(...))")
                    hostname = opts.tls.server_hostname or ep.host
                    try:
                        sock = opts.tls.make_context().wrap_socket(sock, server_hostname=hostname)
                    except BaseException:
                        sock.close()
                        raise
        except (OSError, ssl.SSLError) as e:
            raise Unavailable(f"cannot connect to {ep}: {e}") from e
        self._reply_timeout(sock)
        return sock

    def _reply_timeout(self, sock: socket.socket) -> None:
        """Bounds every wait for the server by ``reply_timeout``. On Linux a plain socket
        gets it from the kernel (``SO_RCVTIMEO``/``SO_SNDTIMEO`` on a blocking socket), so
        that a request costs one system call each way; Python's own socket timeout polls
        before every ``recv`` and ``send``, which doubles the calls and, with many
        threads, the waits for the interpreter lock (docs/measurements.md, "The Python
        client against the Rust coordinator"). TLS sockets keep Python's timeout."""
        timeout = self.options.reply_timeout
        if _KERNEL_TIMEOUTS and self.endpoint.kind != "tls" and timeout is not None and timeout >= 0.001:
            sock.settimeout(None)
            tv = struct.pack("ll", int(timeout), int(timeout % 1 * 1_000_000))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
        else:
            sock.settimeout(timeout)

    def _greet(self, versions: tuple[int, ...]) -> None:
        self._sock = self._connect()
        self._agree(self._exchange(self._hello(versions)), versions)

    # --- requests ---------------------------------------------------------------------------

    def alive(self) -> bool:
        """Whether the server still holds this session: nothing unsolicited has arrived (a
        server that restarted or closed the session leaves an end of stream to read). A
        pooled session is checked before a transaction uses it, because a transaction of a
        session that is gone could only end with ``Outcome``."""
        if self.broken or self._sock is None:
            return False
        with self.lock:
            gone = self._gone()
            if gone is None:
                return True
            self._drop_gone(gone)
            return False

    def _gone(self) -> str | None:
        """Why the server no longer holds this session, seen without blocking: the end of
        the stream, a reset, or bytes nobody asked for (the server sends nothing unasked
        but an Error before it closes); ``None`` while it looks alive. The caller holds
        ``lock``."""
        sock = self._sock
        if self._broken is not None or sock is None:
            return self._broken or "closed"
        try:
            if isinstance(sock, ssl.SSLSocket):
                return self._tls_gone(sock)
            if not _readable_now(sock):
                return None
            data = sock.recv(1, socket.MSG_PEEK | getattr(socket, "MSG_DONTWAIT", 0))
        except BlockingIOError:
            return None
        except (OSError, ValueError) as e:
            return f"connection check failed: {e}"
        return gone_because(None if data else CLOSED_BY_SERVER, bool(data))

    def _tls_gone(self, sock: ssl.SSLSocket) -> str | None:
        """``_gone`` for TLS, which cannot peek: a readable socket may hold a record without
        application data (a session ticket, read and dropped here), a close_notify or the
        end of the stream (both read as b""), or application data (consumed: the session
        is given up anyway)."""
        if sock.pending():
            return UNSOLICITED
        for _ in range(4):
            if not _readable_now(sock):
                return None
            sock.setblocking(False)
            try:
                data = sock.recv(1)
            except ssl.SSLWantReadError:
                continue  # no application data in what arrived; look again.
            finally:
                self._reply_timeout(sock)
            return gone_because(None if data else CLOSED_BY_SERVER, bool(data))
        return None

    def _drop_gone(self, why: str) -> None:
        """Closes a session the server has let go of. A server that closed it itself still
        reads what comes before the client's close (docs/protocol.md, session rule 9), so
        the buffered completions are written first, for what they are worth."""
        if self._flushes_before_close(why) and self._sock is not None:
            try:
                self._sock.sendall(self._with_completes())
            except OSError as e:
                log.debug("completions not sent to the closing session %d: %s", self.session, e)
        self.close_now(why)

    def decide(self, xid: p.Xid, branches: tuple[p.Branch, ...]) -> None:
        """Sends Decide and waits for DecideOk. First checks, without blocking, that the
        server still holds the session: NotSent when it does not, or when the frame could
        not be written whole (the decision was not sent; the connection is closed).
        ServerError for an Error answer; Unavailable when the answer was lost after the
        write (the decision may or may not be durable)."""
        with self.lock:
            gone = self._gone()
            if gone is not None:
                self._drop_gone(gone)
                raise NotSent(f"session {self.session} on {self.endpoint} is gone ({gone}): the Decide was not sent")
            reply = self._exchange(p.Decide(xid, branches))
        self._decided(reply)

    def outcome(self, xid: p.Xid) -> p.Outcome:
        """Asks what became of ``xid`` (version-1 errors 15 and 16 read as unknown and heuristic)."""
        return self._outcome_of(self._request(p.OutcomeQuery(xid.global_xid())))

    def one_phase(self, xid: p.Xid) -> bool:
        """Version 3: tells the server that ``xid`` is about to commit in one phase
        (OnePhase, written at once with the buffered completions; no reply on success).
        Returns False on an older session, which has no such message: nothing is sent.
        NotSent when the frame could not be written whole: the branch must not commit."""
        if not self._tells_one_phase:
            return False
        with self.lock:
            self._send(self._one_phase_frame(xid, self._sock))
        return True

    def ping(self) -> None:
        self._ponged(self._request(p.Ping()))

    def complete(self, xid: p.Xid, heuristic: p.Heuristic | None = None) -> None:
        """Buffers the completion of ``xid`` (no reply on success; a version-1 session
        sends a plain Complete where version 2 sends CompleteHeuristic)."""
        with self.lock:
            if self._buffer_complete(xid, heuristic):
                try:
                    self._send(b"")
                except Unavailable as e:
                    # The transaction is committed whatever becomes of its Complete: the
                    # connection is closed now, and the server completes it itself.
                    log.debug("completions not sent on session %d: %s", self.session, e)

    def flush(self) -> None:
        """Sends the buffered completions now."""
        with self.lock:
            if self._completes and not self.broken:
                self._send(b"")

    def close(self) -> None:
        """Sends what is buffered, then closes (the server sees the session end)."""
        if self._sock is None:
            return
        try:
            self.flush()
        except Exception as e:  # the session ends either way; the server redoes phase two.
            log.debug("completions not sent at close of session %d: %s", self.session, e)
        self.close_now("closed by the client")

    def close_now(self, why: str) -> None:
        """Closes without sending anything more."""
        if self._broken is None:
            self._broken = why
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def drop_after_fork(self) -> None:
        """In a child process after ``os.fork()``: lets go of the session inherited from the
        parent without writing to it. The buffered completions are the parent's and stay
        unsent; the file descriptor is closed and nothing else: no ``shutdown()``, which
        would end the parent's session too, and for TLS no close_notify (closing an
        ``ssl.SSLSocket`` frees its state without one; ``unwrap()`` would send it). A lock
        another thread of the parent held stays held in the child, so it is made anew."""
        self.lock = threading.Lock()
        self._completes.clear()
        self.close_now("inherited from the parent process by os.fork()")

    def ping_if_idle(self, idle_for: float) -> None:
        """Keep-alive: pings when nobody holds the connection and nothing was sent for ``idle_for`` s."""
        if self.broken or not self.lock.acquire(blocking=False):
            return
        try:
            if due_for_ping(time.monotonic(), self.last_sent, idle_for):
                self._exchange(p.Ping())
        except Exception as e:
            log.warning("keep-alive ping of session %d failed: %s", self.session, e)
        finally:
            self.lock.release()

    # --- frames -----------------------------------------------------------------------------

    def _request(self, message: p.Message) -> p.Message:
        with self.lock:
            return self._exchange(message)

    def _exchange(self, message: p.Message) -> p.Message:
        """Sends ``message`` (after the buffered completions) and reads its reply; the caller holds ``lock``."""
        rid, frame = self._request_frame(message, self._sock)
        self._send(frame)
        while True:
            reply = self._answer(self._read_frame(), rid)
            if reply is not None:
                return reply

    def _send(self, frame: bytes) -> None:
        data = self._with_completes(frame)
        assert self._sock is not None
        try:
            self._sock.sendall(data)
        except OSError as e:
            self.close_now(f"write failed: {e}")
            raise NotSent(f"connection to {self.endpoint} broke while sending: {e}") from e
        self.last_sent = time.monotonic()

    def _read_frame(self) -> p.Frame:
        assert self._sock is not None
        while True:
            try:
                frame = self._decoder.next()
            except p.FrameError as e:
                raise self._frame_error(e, self._first_bytes) from e
            if frame is not None:
                return self._understood(frame)
            try:
                data = self._sock.recv(65536)
            except (socket.timeout, BlockingIOError) as e:  # BlockingIOError: SO_RCVTIMEO.
                self.close_now("reply timed out")
                raise Unavailable(f"no reply from {self.endpoint} within {self.options.reply_timeout} s") from e
            except OSError as e:
                self.close_now(f"read failed: {e}")
                raise Unavailable(f"connection to {self.endpoint} broke: {e}") from e
            if not data:
                self.close_now(CLOSED_BY_SERVER)
                raise Unavailable(f"{self.endpoint} closed the connection")
            if self.session == 0:
                self._first_bytes = first_bytes(self._first_bytes, data)
            self._decoder.feed(data)
