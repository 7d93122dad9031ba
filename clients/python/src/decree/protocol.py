"""The decree wire protocol: frames, messages and Xids, as docs/protocol.md describes them.

Pure functions and values, no IO: :func:`encode_frame` turns a message into the bytes of
one frame, :class:`FrameDecoder` turns a byte stream back into messages and refuses
anything the document calls invalid, naming the kind of error (``TooLarge``,
``TooShort``, ``Version``, ``UnknownType``, ``Malformed``, as in the vector file).
Every integer is big-endian. The branch ids of the databases (the PostgreSQL gid, the
MariaDB/MySQL XA xid) are methods of :class:`Xid`.

Protocol version 3 lets most messages end with a field trailer (:class:`Field`, see
``encode_frame``'s ``trailer``); a decoder reads one only when told that its session speaks
version 3 (``FrameDecoder.version``), and on older sessions trailing bytes stay malformed.
Which fields a receiver understands is the session's business (:func:`unknown_must_understand`).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field
from typing import Callable, Sequence, Union

FRAME_VERSION = 1
"""The byte at offset 4 of every frame, for every protocol version."""

PROTOCOL_VERSIONS: tuple[int, ...] = (1, 2, 3)
"""The protocol versions this client speaks; it offers them in every Hello."""

FRAME_BYTES_MAX = 65536
"""The largest frame, length field included; a server may announce a lower limit."""

HEADER_BYTES = 14
"""length u32, version u8, type u8, request id u64."""

DECREE_FORMAT_ID = 0x64637265
"""The format id of decree's Xids ("dcre")."""

DECREE_GTRID_BYTES = 28
"""node u32, incarnation u64, session u64, sequence u64."""

PART_BYTES_MAX = 64
"""The longest gtrid or bqual (XA)."""

CLIENT_NAME_BYTES_MAX = 255
"""The longest client name of a Hello, in bytes of UTF-8."""

HELLO_VERSIONS_MAX = 16
"""The most protocol versions one Hello may offer."""

RM_NAME_BYTES_MAX = 64
"""The longest resource-manager name of a decision."""

BRANCHES_MAX = 512
"""The most branches of one decision."""

GID_PREFIX = "decree:"
"""The prefix of decree's PostgreSQL gids."""

DECISION_MAGIC = b"DCD1"

MARIADB_PREPARER_BYTES = 8
"""Bytes of the preparing connection's id at the end of a decree branch's MariaDB bqual."""

TRAILER_VERSION = 3
"""The first protocol version whose messages may carry a field trailer (and OnePhase)."""

MUST_UNDERSTAND = 0x8000
"""The bit of a field's tag that forbids a receiver to skip the field when it does not know it."""

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I32 = struct.Struct(">i")
_HEADER = struct.Struct(">IBBQ")
_FIELD = struct.Struct(">HH")
_GTRID = struct.Struct(">IQQQ")


class MessageType(enum.IntEnum):
    """The type byte of a frame."""

    HELLO = 0x01
    HELLO_OK = 0x02
    DECIDE = 0x03
    DECIDE_OK = 0x04
    COMPLETE = 0x05
    OUTCOME = 0x06
    OUTCOME_IS = 0x07
    PING = 0x08
    PONG = 0x09
    COMPLETE_HEURISTIC = 0x0A
    ONE_PHASE = 0x0B
    ERROR = 0x7F


def _words(member: enum.Enum) -> str:
    """A member's name as words: ``ROLLED_BACK`` is ``rolled back``."""
    return member.name.lower().replace("_", " ")


class Outcome(enum.IntEnum):
    """What became of a transaction (the OutcomeIs byte). A member prints as words,
    ``str(Outcome.ROLLED_BACK) == "rolled back"``, and compares as its byte."""

    COMMITTED = 1
    IN_PROGRESS = 2
    ROLLED_BACK = 3
    UNKNOWN = 4
    """Protocol version 2 (version 1: Error 15)."""
    HEURISTIC = 5
    """Protocol version 2 (version 1: Error 16)."""

    def __str__(self) -> str:
        return _words(self)

    def __format__(self, spec: str) -> str:
        return format(_words(self), spec)


class Heuristic(enum.IntEnum):
    """The combined outcome of branches that decided on their own (CompleteHeuristic)."""

    COMMITTED = 1
    ROLLED_BACK = 2
    MIXED = 3

    def combine(self, other: Heuristic | None) -> Heuristic:
        """The outcome after one more branch: the same stays, different ones are mixed."""
        if other is None or other == self:
            return self
        return Heuristic.MIXED

    def __str__(self) -> str:
        return _words(self)

    def __format__(self, spec: str) -> str:
        return format(_words(self), spec)


class ErrorCode(enum.IntEnum):
    """The codes of the Error message."""

    MALFORMED = 1
    FRAME_TOO_LARGE = 2
    UNKNOWN_TYPE = 3
    VERSION = 4
    PROTOCOL = 5
    LOG_FAILED = 6
    WRONG_SESSION = 7
    NODE_MISMATCH = 8
    SHUTTING_DOWN = 9
    BUSY = 10
    UNKNOWN_RM = 11
    BRANCH_QUALIFIER = 12
    DUPLICATE_BRANCH = 13
    NO_BRANCHES = 14
    OUTCOME_UNKNOWN = 15
    OUTCOME_HEURISTIC = 16
    NOT_ALLOWED = 17
    TLS_REQUIRED = 18
    NOT_PRIMARY = 19
    MUST_UNDERSTAND = 20


class FrameError(Exception):
    """Bytes that are not a valid frame; ``kind`` is the vector file's name of the error."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind


# --- Xids -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Origin:
    """What a decree gtrid says: who minted the Xid, in which life, session and order."""

    node: int
    incarnation: int
    session: int
    sequence: int


@dataclass(frozen=True)
class Xid:
    """An XA transaction id: format id, gtrid and bqual (each part at most 64 bytes)."""

    format_id: int
    gtrid: bytes
    bqual: bytes = b""

    def __post_init__(self) -> None:
        if not -(2**31) <= self.format_id < 2**31:
            raise ValueError(f"format id {self.format_id} is not a 32-bit signed integer")
        for part, value in (("gtrid", self.gtrid), ("bqual", self.bqual)):
            if len(value) > PART_BYTES_MAX:
                raise ValueError(f"{part} is {len(value)} bytes, XA allows at most {PART_BYTES_MAX}")

    @classmethod
    def decree(cls, node: int, incarnation: int, session: int, sequence: int) -> Xid:
        """decree's global Xid (empty bqual) of one transaction."""
        return cls(DECREE_FORMAT_ID, _GTRID.pack(node, incarnation, session, sequence), b"")

    def branch(self, number: int) -> Xid:
        """The Xid of branch ``number``: the same gtrid, the number as a 2-byte bqual."""
        if not 0 <= number < 2**16:
            raise ValueError(f"branch number {number} does not fit in 2 bytes")
        return Xid(self.format_id, self.gtrid, _U16.pack(number))

    def global_xid(self) -> Xid:
        """The same transaction without a branch qualifier."""
        return Xid(self.format_id, self.gtrid, b"")

    @property
    def origin(self) -> Origin | None:
        """The origin of a decree Xid, ``None`` for any other transaction manager's."""
        if self.format_id != DECREE_FORMAT_ID or len(self.gtrid) != DECREE_GTRID_BYTES:
            return None
        return Origin(*_GTRID.unpack(self.gtrid))

    @property
    def branch_number(self) -> int | None:
        """The branch number of a branch Xid (2-byte bqual), else ``None``."""
        return _U16.unpack(self.bqual)[0] if len(self.bqual) == 2 else None

    def encode(self) -> bytes:
        """The binary form of Decide, Complete and Outcome."""
        return _I32.pack(self.format_id) + bytes((len(self.gtrid), len(self.bqual))) + self.gtrid + self.bqual

    @classmethod
    def decode(cls, buf: bytes | memoryview, at: int = 0) -> tuple[Xid, int]:
        """Reads the binary form at ``at``; returns the Xid and the offset after it."""
        if len(buf) - at < 6:
            raise FrameError("Malformed", "binary Xid shorter than 6 bytes")
        (format_id,) = _I32.unpack_from(buf, at)
        g, b = buf[at + 4], buf[at + 5]
        end = at + 6 + g + b
        if len(buf) < end:
            raise FrameError("Malformed", "binary Xid truncated")
        if g > PART_BYTES_MAX or b > PART_BYTES_MAX:
            raise FrameError("Malformed", f"Xid part of {max(g, b)} bytes, XA allows at most 64")
        return cls(format_id, bytes(buf[at + 6 : at + 6 + g]), bytes(buf[at + 6 + g : end])), end

    def pg_gid(self) -> str:
        """The PostgreSQL gid: ``decree:<format 8 hex>:<gtrid hex>:<bqual hex>``, lowercase."""
        return f"{GID_PREFIX}{self.format_id & 0xFFFFFFFF:08x}:{self.gtrid.hex()}:{self.bqual.hex()}"

    @classmethod
    def from_pg_gid(cls, gid: str) -> Xid:
        """Parses a gid of decree's form; only the exact lowercase form is accepted."""
        if not gid.startswith(GID_PREFIX):
            raise ValueError(f"not a decree gid: {gid!r}")
        parts = gid[len(GID_PREFIX) :].split(":")
        if len(parts) != 3 or len(parts[0]) != 8:
            raise ValueError(f"not a decree gid: {gid!r}")
        try:
            format_id = int(parts[0], 16)
            xid = cls(format_id - (1 << 32) if format_id >= 1 << 31 else format_id, bytes.fromhex(parts[1]), bytes.fromhex(parts[2]))
        except ValueError as e:
            raise ValueError(f"not a decree gid: {gid!r} ({e})") from None
        if xid.pg_gid() != gid:
            raise ValueError(f"not decree's exact gid form (lowercase hex): {gid!r}")
        return xid

    def mysql_xid(self) -> str:
        """The xid of MariaDB's and MySQL's XA statements: ``X'<gtrid>',X'<bqual>',<format>``."""
        if self.format_id < 0:
            raise ValueError("MariaDB and MySQL accept only non-negative XA format ids")
        return f"X'{self.gtrid.hex()}',X'{self.bqual.hex()}',{self.format_id}"

    def mariadb_name(self, connection_id: int) -> Xid:
        """This branch's name on a MariaDB/MySQL server when the connection whose full
        ``CONNECTION_ID()`` is ``connection_id`` starts it: a decree branch's bqual gains
        that id, 8 bytes big-endian, so that whoever finishes the branch by name can first
        wait until that connection has let go of it (docs/protocol.md). Any other Xid is
        its own name."""
        if self.origin is None or len(self.bqual) != 2:
            return self
        return Xid(self.format_id, self.gtrid, self.bqual + _U64.pack(connection_id))

    def from_mariadb_name(self) -> tuple[Xid, int | None]:
        """A name listed by ``XA RECOVER`` read back: the branch's Xid and the id of the
        connection that prepared it (``None`` when the name does not carry one)."""
        if self.origin is None or len(self.bqual) != 2 + MARIADB_PREPARER_BYTES:
            return self, None
        return Xid(self.format_id, self.gtrid, self.bqual[:2]), _U64.unpack(self.bqual[2:])[0]

    @classmethod
    def from_xa_recover(cls, format_id: int, gtrid_length: int, bqual_length: int, data: bytes) -> Xid:
        """The Xid of one ``XA RECOVER`` row (``data`` is gtrid and bqual back to back)."""
        if len(data) != gtrid_length + bqual_length:
            raise ValueError(f"data is {len(data)} bytes, lengths say {gtrid_length}+{bqual_length}")
        return cls(format_id, bytes(data[:gtrid_length]), bytes(data[gtrid_length:]))

    def __str__(self) -> str:
        """The text form, ``decree:<format id, 8 hex>:<gtrid hex>:<bqual hex>``: the
        PostgreSQL gid, what the server's logs and ``decree recover`` show, and what
        :meth:`parse` reads back."""
        return self.pg_gid()

    @classmethod
    def parse(cls, text: str) -> Xid:
        """Reads back ``str(xid)`` (hex digits of either case), e.g. an Xid kept to ask its
        outcome later: ``tm.outcome(Xid.parse(saved))``. ValueError names what is wrong."""
        if not text.startswith(GID_PREFIX):
            raise ValueError(f"an Xid's text starts with {GID_PREFIX!r}: {text!r}")
        parts = text[len(GID_PREFIX) :].split(":")
        if len(parts) != 3:
            raise ValueError(
                f"an Xid's text has three parts after {GID_PREFIX!r} (format id, gtrid, bqual), "
                f"not {len(parts)}: {text!r}"
            )
        digits, gtrid, bqual = parts
        if len(digits) != 8 or not set(digits) <= _HEX_DIGITS:
            raise ValueError(f"the format id of an Xid's text is 8 hex digits, not {digits!r}")
        format_id = int(digits, 16)
        signed = format_id - (1 << 32) if format_id >= 1 << 31 else format_id
        return cls(signed, _hex_part("gtrid", gtrid), _hex_part("bqual", bqual))


_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


def _hex_part(name: str, digits: str) -> bytes:
    """The bytes of an Xid part written as hex digits (``Xid.parse``)."""
    if len(digits) % 2 or not set(digits) <= _HEX_DIGITS:
        raise ValueError(f"the {name} of an Xid's text is pairs of hex digits, not {digits!r}")
    if len(digits) // 2 > PART_BYTES_MAX:
        raise ValueError(f"the {name} of an Xid's text is {len(digits) // 2} bytes, XA allows at most {PART_BYTES_MAX}")
    return bytes.fromhex(digits)


# --- Messages ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Branch:
    """One branch of a decision: its number (the bqual) and its resource manager's name."""

    branch: int
    rm: str


@dataclass(frozen=True)
class Field:
    """One field of a version-3 trailer: a tag (bit 15: must understand) and its value."""

    tag: int
    value: bytes = b""

    @property
    def must_understand(self) -> bool:
        return bool(self.tag & MUST_UNDERSTAND)


#: The trace-context field (optional): trace id (16 bytes), parent span id (8), flags (1).
TRACE_CONTEXT = 0x0001
TRACE_CONTEXT_BYTES = 25


@dataclass(frozen=True)
class TraceContext:
    """A W3C trace context as the trace-context field carries it (flags bit 0: sampled)."""

    trace_id: bytes
    span_id: bytes
    flags: int = 1

    def field(self) -> Field:
        """The trailer field that carries this context."""
        if len(self.trace_id) != 16 or len(self.span_id) != 8 or not 0 <= self.flags < 256:
            raise ValueError("a trace context is a 16-byte trace id, an 8-byte span id and a flags byte")
        return Field(TRACE_CONTEXT, self.trace_id + self.span_id + bytes([self.flags]))


def trace_context(fields: Sequence[Field]) -> TraceContext | None:
    """The trace context a trailer carries: None without the field, with a value shorter
    than 25 bytes or with an all-zero id (ignored, never an error); bytes past 25 are
    ignored."""
    value = next((f.value for f in fields if f.tag == TRACE_CONTEXT), None)
    if value is None or len(value) < TRACE_CONTEXT_BYTES:
        return None
    trace_id, span_id = value[:16], value[16:24]
    if trace_id == bytes(16) or span_id == bytes(8):
        return None
    return TraceContext(trace_id, span_id, value[24])


@dataclass(frozen=True)
class Negotiated:
    """The HelloOk trailer: the session's protocol version and the server's idle bound."""

    version: int
    idle_timeout_ms: int


@dataclass(frozen=True)
class Hello:
    node_expected: int
    client: str
    versions: tuple[int, ...] = ()


@dataclass(frozen=True)
class HelloOk:
    node: int
    incarnation: int
    session: int
    frame_bytes_max: int
    inflight_max: int
    negotiated: Negotiated | None = None


@dataclass(frozen=True)
class Decide:
    xid: Xid
    branches: tuple[Branch, ...]


@dataclass(frozen=True)
class DecideOk:
    pass


@dataclass(frozen=True)
class Complete:
    xid: Xid


@dataclass(frozen=True)
class CompleteHeuristic:
    xid: Xid
    heuristic: Heuristic


@dataclass(frozen=True)
class OnePhase:
    """Version 3: "this session is about to commit ``xid`` in one phase" (no reply)."""

    xid: Xid


@dataclass(frozen=True)
class OutcomeQuery:
    """The ``Outcome`` request (named so to leave :class:`Outcome` to the answer's values)."""

    xid: Xid


@dataclass(frozen=True)
class OutcomeIs:
    outcome: Outcome


@dataclass(frozen=True)
class Ping:
    pass


@dataclass(frozen=True)
class Pong:
    pass


@dataclass(frozen=True)
class Error:
    code: int
    message: str = field(default="")

    @property
    def name(self) -> str:
        try:
            return ErrorCode(self.code).name
        except ValueError:
            return f"code {self.code}"


Message = Union[
    Hello, HelloOk, Decide, DecideOk, Complete, CompleteHeuristic, OnePhase, OutcomeQuery, OutcomeIs, Ping, Pong, Error
]

_TYPE_OF: dict[type, MessageType] = {
    Hello: MessageType.HELLO,
    HelloOk: MessageType.HELLO_OK,
    Decide: MessageType.DECIDE,
    DecideOk: MessageType.DECIDE_OK,
    Complete: MessageType.COMPLETE,
    CompleteHeuristic: MessageType.COMPLETE_HEURISTIC,
    OnePhase: MessageType.ONE_PHASE,
    OutcomeQuery: MessageType.OUTCOME,
    OutcomeIs: MessageType.OUTCOME_IS,
    Ping: MessageType.PING,
    Pong: MessageType.PONG,
    Error: MessageType.ERROR,
}

TRAILER_TYPES = frozenset(MessageType) - {MessageType.HELLO, MessageType.ERROR}
"""The messages a version-3 trailer may follow (HelloOk: after its negotiation trailer)."""


def message_type(message: Message) -> MessageType:
    """The type byte of ``message``."""
    return _TYPE_OF[type(message)]


def _utf8_cut(text: str, limit: int) -> bytes:
    """``text`` in UTF-8, cut to at most ``limit`` bytes on a character boundary."""
    raw = text.encode()
    if len(raw) <= limit:
        return raw
    return raw[:limit].decode("utf-8", errors="ignore").encode()


def check_decision(xid: Xid, branches: tuple[Branch, ...]) -> None:
    """Refuses a decision the server would refuse or that the record cannot hold."""
    if xid.bqual:
        raise ValueError(f"a decision names the global transaction; {xid} has a bqual")
    if not branches:
        raise ValueError("a decision names at least one branch")
    if len(branches) > BRANCHES_MAX:
        raise ValueError(f"{len(branches)} branches exceed BRANCHES_MAX = {BRANCHES_MAX}")
    seen: set[int] = set()
    for b in branches:
        if not 0 <= b.branch < 2**16:
            raise ValueError(f"branch number {b.branch} does not fit in 2 bytes")
        if b.branch in seen:
            raise ValueError(f"branch number {b.branch} is used twice")
        seen.add(b.branch)
        name = b.rm.encode()
        if not 1 <= len(name) <= RM_NAME_BYTES_MAX:
            raise ValueError(f"resource manager name {b.rm!r} is not 1 to {RM_NAME_BYTES_MAX} bytes")


def encode_body(message: Message) -> bytes:
    """The body of ``message`` (the frame without its 14-byte header)."""
    if isinstance(message, Hello):
        name = _utf8_cut(message.client, CLIENT_NAME_BYTES_MAX)
        out = _U32.pack(message.node_expected) + bytes((len(name),)) + name
        if message.versions:
            if len(message.versions) > HELLO_VERSIONS_MAX or len(set(message.versions)) != len(message.versions):
                raise ValueError(f"a Hello offers 1 to {HELLO_VERSIONS_MAX} distinct versions: {message.versions}")
            out += bytes((len(message.versions),)) + bytes(message.versions)
        return out
    if isinstance(message, HelloOk):
        out = _U32.pack(message.node) + _U64.pack(message.incarnation) + _U64.pack(message.session)
        out += _U32.pack(message.frame_bytes_max) + _U32.pack(message.inflight_max)
        if message.negotiated is not None:
            out += bytes((message.negotiated.version,)) + _U32.pack(message.negotiated.idle_timeout_ms)
        return out
    if isinstance(message, Decide):
        check_decision(message.xid, message.branches)
        parts = [DECISION_MAGIC, message.xid.encode(), _U16.pack(len(message.branches))]
        for b in message.branches:
            name = b.rm.encode()
            parts.append(_U16.pack(b.branch) + bytes((len(name),)) + name)
        return b"".join(parts)
    if isinstance(message, (Complete, OutcomeQuery, OnePhase)):
        return message.xid.encode()
    if isinstance(message, CompleteHeuristic):
        return message.xid.encode() + bytes((int(message.heuristic),))
    if isinstance(message, OutcomeIs):
        return bytes((int(message.outcome),))
    if isinstance(message, (DecideOk, Ping, Pong)):
        return b""
    if isinstance(message, Error):
        return _U16.pack(message.code) + _utf8_cut(message.message, FRAME_BYTES_MAX // 2)
    raise TypeError(f"not a message: {message!r}")


def encode_trailer(message: Message, fields: Sequence[Field]) -> bytes:
    """The version-3 trailer of ``fields`` after ``message``'s body; ValueError when the
    message cannot carry one or a field does not fit."""
    kind = message_type(message)
    if kind not in TRAILER_TYPES:
        raise ValueError(f"a {kind.name} carries no field trailer")
    if kind == MessageType.HELLO_OK:
        assert isinstance(message, HelloOk)
        if message.negotiated is None or message.negotiated.version < TRAILER_VERSION:
            raise ValueError("only a HelloOk that chose version 3 or later carries a field trailer")
    tags = [f.tag for f in fields]
    if len(set(tags)) != len(tags):
        raise ValueError(f"a trailer gives each tag at most once: {[hex(t) for t in tags]}")
    out = []
    for f in fields:
        if not 0 <= f.tag < 2**16 or len(f.value) >= 2**16:
            raise ValueError(f"field {f.tag:#06x} of {len(f.value)} bytes does not fit u16 tag and length")
        out.append(_FIELD.pack(f.tag, len(f.value)) + f.value)
    return b"".join(out)


def encode_frame(request_id: int, message: Message, trailer: Sequence[Field] = ()) -> bytes:
    """The whole frame of ``message`` with ``request_id``, followed by the version-3 field
    ``trailer`` when one is given (send one only on a session of version 3 or later)."""
    body = encode_body(message)
    if trailer:
        body += encode_trailer(message, trailer)
    return _HEADER.pack(HEADER_BYTES - 4 + len(body), FRAME_VERSION, message_type(message), request_id) + body


def _malformed(kind: MessageType, reason: str) -> FrameError:
    return FrameError("Malformed", f"{kind.name}: {reason}")


def _text(kind: MessageType, raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _malformed(kind, f"{what} is not UTF-8") from None


def _decode_hello(body: bytes) -> Hello:
    kind = MessageType.HELLO
    if len(body) < 5:
        raise _malformed(kind, "body shorter than 5 bytes")
    (node_expected,) = _U32.unpack_from(body)
    n = body[4]
    if len(body) < 5 + n:
        raise _malformed(kind, "client name length exceeds the body")
    client = _text(kind, body[5 : 5 + n], "client name")
    rest = body[5 + n :]
    versions: tuple[int, ...] = ()
    if rest:
        count = rest[0]
        if not 1 <= count <= HELLO_VERSIONS_MAX:
            raise _malformed(kind, f"version count {count} is not between 1 and {HELLO_VERSIONS_MAX}")
        if len(rest) - 1 != count:
            raise _malformed(kind, f"version count {count} does not match the {len(rest) - 1} bytes after it")
        versions = tuple(rest[1:])
        if len(set(versions)) != count:
            raise _malformed(kind, "a version is offered twice")
    return Hello(node_expected, client, versions)


def _decode_hello_ok(body: bytes) -> tuple[HelloOk, int]:
    """The HelloOk and the offset after its negotiation trailer (a field trailer may follow
    when the version it chose has them)."""
    if len(body) != 28 and len(body) < 33:
        raise _malformed(MessageType.HELLO_OK, f"body is {len(body)} bytes, expected 28, or 33 and more")
    node, incarnation, session, frame_max, inflight = struct.unpack_from(">IQQII", body)
    if len(body) == 28:
        return HelloOk(node, incarnation, session, frame_max, inflight), 28
    negotiated = Negotiated(body[28], _U32.unpack_from(body, 29)[0])
    return HelloOk(node, incarnation, session, frame_max, inflight, negotiated), 33


def _decode_decide(body: bytes) -> tuple[Decide, int]:
    kind = MessageType.DECIDE
    if not body.startswith(DECISION_MAGIC):
        raise _malformed(kind, "missing DCD1 magic")
    xid, at = Xid.decode(body, 4)
    if len(body) - at < 2:
        raise _malformed(kind, "branch count missing")
    (count,) = _U16.unpack_from(body, at)
    at += 2
    if count > BRANCHES_MAX:
        raise _malformed(kind, f"{count} branches exceed BRANCHES_MAX = {BRANCHES_MAX}")
    branches = []
    for _ in range(count):
        if len(body) - at < 3:
            raise _malformed(kind, "branch truncated")
        (number,) = _U16.unpack_from(body, at)
        n = body[at + 2]
        if n > RM_NAME_BYTES_MAX:
            raise _malformed(kind, f"resource manager name of {n} bytes exceeds {RM_NAME_BYTES_MAX}")
        at += 3
        if len(body) - at < n:
            raise _malformed(kind, "branch name truncated")
        branches.append(Branch(number, _text(kind, body[at : at + n], "branch name")))
        at += n
    return Decide(xid, tuple(branches)), at


_EMPTY_MESSAGES: dict[MessageType, Callable[[], Message]] = {
    MessageType.DECIDE_OK: DecideOk, MessageType.PING: Ping, MessageType.PONG: Pong
}
_XID_MESSAGES: dict[MessageType, Callable[[Xid], Message]] = {
    MessageType.COMPLETE: Complete, MessageType.OUTCOME: OutcomeQuery, MessageType.ONE_PHASE: OnePhase
}


def _decode_layout(kind: MessageType, body: bytes) -> tuple[Message, int]:
    """The message whose fixed layout starts ``body``, and the offset where that layout ends."""
    if kind == MessageType.DECIDE:
        return _decode_decide(body)
    if kind in _EMPTY_MESSAGES:
        return _EMPTY_MESSAGES[kind](), 0
    if kind in _XID_MESSAGES:
        xid, end = Xid.decode(body)
        return _XID_MESSAGES[kind](xid), end
    if kind == MessageType.COMPLETE_HEURISTIC:
        xid, end = Xid.decode(body)
        if end >= len(body):
            raise _malformed(kind, "heuristic outcome missing")
        try:
            return CompleteHeuristic(xid, Heuristic(body[end])), end + 1
        except ValueError:
            raise _malformed(kind, f"unknown heuristic outcome {body[end]}") from None
    if kind == MessageType.OUTCOME_IS:
        if not body:
            raise _malformed(kind, "empty body")
        try:
            return OutcomeIs(Outcome(body[0])), 1
        except ValueError:
            raise _malformed(kind, f"unknown outcome {body[0]}") from None
    raise FrameError("UnknownType", f"type {int(kind)}")


def decode_trailer(kind: MessageType, raw: bytes) -> tuple[Field, ...]:
    """The fields of a version-3 trailer; FrameError when a field overruns the frame or a
    tag comes twice."""
    fields: list[Field] = []
    at = 0
    while at < len(raw):
        if len(raw) - at < _FIELD.size:
            raise _malformed(kind, f"a field header of {len(raw) - at} bytes (4 needed) ends the frame")
        tag, n = _FIELD.unpack_from(raw, at)
        at += _FIELD.size
        if len(raw) - at < n:
            raise _malformed(kind, f"field {tag:#06x} of {n} bytes overruns the frame by {n - (len(raw) - at)}")
        if any(f.tag == tag for f in fields):
            raise _malformed(kind, f"field {tag:#06x} given twice")
        fields.append(Field(tag, bytes(raw[at : at + n])))
        at += n
    return tuple(fields)


def decode_message(kind: MessageType, body: bytes, version: int = 1) -> tuple[Message, tuple[Field, ...]]:
    """The message of a frame of type ``kind`` and its field trailer, read as a session of
    protocol ``version`` reads it: before version 3 every byte after the body is malformed.
    A HelloOk is read by the version it chose itself. FrameError when it does not parse."""
    if kind == MessageType.HELLO:
        return _decode_hello(body), ()
    if kind == MessageType.ERROR:
        if len(body) < 2:
            raise _malformed(kind, "body shorter than the 2-byte code")
        return Error(_U16.unpack_from(body)[0], _text(kind, body[2:], "message")), ()
    message: Message
    if kind == MessageType.HELLO_OK:
        hello_ok, end = _decode_hello_ok(body)
        version = hello_ok.negotiated.version if hello_ok.negotiated is not None else 1
        message = hello_ok
    else:
        message, end = _decode_layout(kind, body)
    if end == len(body):
        return message, ()
    if version < TRAILER_VERSION:
        raise _malformed(kind, f"{len(body) - end} trailing bytes after the body")
    return message, decode_trailer(kind, body[end:])


def decode_body(kind: MessageType, body: bytes, version: int = 1) -> Message:
    """The message of a frame of type ``kind`` with ``body`` (a version-3 trailer is checked,
    then left out: see :func:`decode_message`); FrameError when it does not parse."""
    return decode_message(kind, body, version)[0]


def unknown_must_understand(trailer: Sequence[Field], known: frozenset[int] = frozenset()) -> Field | None:
    """The first field of ``trailer`` that its receiver may not skip although it does not
    know its tag (a protocol violation), or ``None``."""
    return next((f for f in trailer if f.must_understand and f.tag not in known), None)


@dataclass(frozen=True)
class Frame:
    """One decoded frame."""

    request_id: int
    message: Message
    frame_bytes: int
    trailer: tuple[Field, ...] = ()


class FrameDecoder:
    """Splits a byte stream into frames, checking each header as soon as it arrives.

    ``feed`` bytes as they come, then take frames with ``next`` until it returns ``None``.
    A length above ``frame_bytes_max`` is refused after 4 bytes, a wrong version or type
    after 6, before the body is buffered. After an error the stream cannot be resumed.
    ``version`` is the session's protocol version (set it once the hello has chosen one):
    from 3 on, a frame may end with a field trailer, returned in :attr:`Frame.trailer`.
    """

    def __init__(self, frame_bytes_max: int = FRAME_BYTES_MAX, version: int = 1) -> None:
        self.frame_bytes_max = frame_bytes_max
        self.version = version
        self._buf = bytearray()

    def feed(self, data: bytes) -> None:
        self._buf += data

    def buffered(self) -> int:
        """Bytes received and not yet returned as a frame."""
        return len(self._buf)

    def next(self) -> Frame | None:
        buf = self._buf
        if len(buf) < 4:
            return None
        (length,) = _U32.unpack_from(buf)
        frame_bytes = length + 4
        if frame_bytes > self.frame_bytes_max:
            raise FrameError("TooLarge", f"frame of {frame_bytes} bytes exceeds the limit of {self.frame_bytes_max}")
        if length < HEADER_BYTES - 4:
            raise FrameError("TooShort", f"length {length} is shorter than the header")
        if len(buf) < 6:
            return None
        if buf[4] != FRAME_VERSION:
            raise FrameError("Version", f"frame version {buf[4]}")
        try:
            kind = MessageType(buf[5])
        except ValueError:
            raise FrameError("UnknownType", f"type {buf[5]:#04x}") from None
        if len(buf) < frame_bytes:
            return None
        (request_id,) = _U64.unpack_from(buf, 6)
        body = bytes(buf[HEADER_BYTES:frame_bytes])
        del buf[:frame_bytes]
        message, trailer = decode_message(kind, body, self.version)
        return Frame(request_id, message, frame_bytes, trailer)
