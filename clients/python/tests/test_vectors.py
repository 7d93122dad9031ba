"""The package against docs/vectors: every message vector encodes to exactly its bytes and
decodes to exactly its fields, every invalid one is refused with its named error, and every
branch id is what the package writes for PostgreSQL and MariaDB."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from decree import protocol as p

VECTORS = Path(__file__).resolve().parents[3] / "docs" / "vectors"
MESSAGES = json.loads((VECTORS / "messages.json").read_text())
BRANCH_IDS = json.loads((VECTORS / "branch_ids.json").read_text())


def xid(v: dict[str, Any]) -> p.Xid:
    return p.Xid(v["format_id"], bytes.fromhex(v["gtrid"]), bytes.fromhex(v["bqual"]))


def message(kind: str, f: dict[str, Any]) -> p.Message:
    """The message a vector's type and fields describe."""
    if kind == "Hello":
        return p.Hello(f["node_expected"], f["client"], tuple(f.get("versions") or ()))
    if kind == "HelloOk":
        n = f.get("negotiated")
        negotiated = p.Negotiated(n["version"], n["idle_timeout_ms"]) if n else None
        return p.HelloOk(f["node"], f["incarnation"], f["session"], f["frame_bytes_max"], f["inflight_max"], negotiated)
    if kind == "Decide":
        return p.Decide(xid(f["xid"]), tuple(p.Branch(b["branch"], b["rm"]) for b in f["branches"]))
    if kind == "DecideOk":
        return p.DecideOk()
    if kind == "Complete":
        return p.Complete(xid(f["xid"]))
    if kind == "CompleteHeuristic":
        return p.CompleteHeuristic(xid(f["xid"]), p.Heuristic[f["heuristic"].upper()])
    if kind == "Outcome":
        return p.OutcomeQuery(xid(f["xid"]))
    if kind == "OnePhase":
        return p.OnePhase(xid(f["xid"]))
    if kind == "OutcomeIs":
        return p.OutcomeIs(p.Outcome[f["outcome"].upper()])
    if kind == "Ping":
        return p.Ping()
    if kind == "Pong":
        return p.Pong()
    if kind == "Error":
        return p.Error(f["code"], f["message"])
    raise AssertionError(f"unknown message type {kind} in the vectors")


def trailer(f: dict[str, Any]) -> tuple[p.Field, ...]:
    """The version-3 field trailer of a vector's fields (none when it has no "trailer")."""
    return tuple(p.Field(t["tag"], bytes.fromhex(t["value"])) for t in f.get("trailer", ()))


TYPE_NAMES = {
    p.MessageType.HELLO: "Hello", p.MessageType.HELLO_OK: "HelloOk", p.MessageType.DECIDE: "Decide",
    p.MessageType.DECIDE_OK: "DecideOk", p.MessageType.COMPLETE: "Complete",
    p.MessageType.COMPLETE_HEURISTIC: "CompleteHeuristic", p.MessageType.OUTCOME: "Outcome",
    p.MessageType.ONE_PHASE: "OnePhase",
    p.MessageType.OUTCOME_IS: "OutcomeIs", p.MessageType.PING: "Ping", p.MessageType.PONG: "Pong",
    p.MessageType.ERROR: "Error",
}


def test_the_vector_file_describes_this_protocol() -> None:
    assert MESSAGES["frame_version"] == p.FRAME_VERSION
    assert tuple(MESSAGES["protocol_versions"]) == p.PROTOCOL_VERSIONS
    assert MESSAGES["frame_bytes_max"] == p.FRAME_BYTES_MAX
    assert MESSAGES["byte_order"] == "big-endian"
    kinds = {v["type"] for v in MESSAGES["messages"]}
    assert kinds == set(TYPE_NAMES.values()), "every message type has a vector"


def decode(hex_frame: str, version: int) -> p.Frame:
    decoder = p.FrameDecoder(version=version)
    decoder.feed(bytes.fromhex(hex_frame))
    frame = decoder.next()
    assert frame is not None and decoder.buffered() == 0
    return frame


@pytest.mark.parametrize("vector", MESSAGES["messages"], ids=lambda v: v["name"])
def test_every_vector_encodes_and_decodes_exactly(vector: dict[str, Any]) -> None:
    m, fields = message(vector["type"], vector["fields"]), trailer(vector["fields"])
    assert TYPE_NAMES[p.message_type(m)] == vector["type"]
    assert p.encode_frame(vector["request_id"], m, fields).hex() == vector["hex"]
    # Read by a session of the vector's own version, and by every later one alike.
    for version in range(vector.get("since", 1), max(p.PROTOCOL_VERSIONS) + 1):
        frame = decode(vector["hex"], version)
        expected = (vector["request_id"], m, fields, len(vector["hex"]) // 2)
        assert (frame.request_id, frame.message, frame.trailer, frame.frame_bytes) == expected, f"version {version}"


@pytest.mark.parametrize("vector", [v for v in MESSAGES["messages"] if "trailer" in v["fields"]], ids=lambda v: v["name"])
def test_a_trailer_is_malformed_on_a_session_older_than_version_3(vector: dict[str, Any]) -> None:
    for version in (1, 2):
        decoder = p.FrameDecoder(version=version)
        decoder.feed(bytes.fromhex(vector["hex"]))
        with pytest.raises(p.FrameError, match="Malformed.*trailing bytes"):
            decoder.next()


def test_all_vectors_back_to_back_split_at_every_byte_decode_in_order() -> None:
    stream = b"".join(bytes.fromhex(v["hex"]) for v in MESSAGES["messages"])
    expected = [(v["request_id"], message(v["type"], v["fields"]), trailer(v["fields"])) for v in MESSAGES["messages"]]
    for step in (1, 3, 7, 64, len(stream)):
        decoder, got = p.FrameDecoder(version=3), []
        for at in range(0, len(stream), step):
            decoder.feed(stream[at : at + step])
            while (frame := decoder.next()) is not None:
                got.append((frame.request_id, frame.message, frame.trailer))
        assert got == expected, f"fed {step} bytes at a time"


@pytest.mark.parametrize("version", p.PROTOCOL_VERSIONS)
@pytest.mark.parametrize("vector", MESSAGES["invalid"], ids=lambda v: v["name"])
def test_every_invalid_vector_is_refused_with_its_named_error(vector: dict[str, Any], version: int) -> None:
    decoder = p.FrameDecoder(version=version)
    decoder.feed(bytes.fromhex(vector["hex"]))
    with pytest.raises(p.FrameError) as refused:
        decoder.next()
    assert refused.value.kind == vector["error"]


def test_the_trailer_vectors_are_refused_for_their_own_reason_on_a_version_3_session() -> None:
    reasons = {"decide_trailer_overrun": "overruns the frame", "decide_trailer_duplicate_tag": "given twice"}
    for v in MESSAGES["invalid"]:
        if v["name"] in reasons:
            with pytest.raises(p.FrameError, match=reasons.pop(v["name"])):
                decode(v["hex"], 3)
    assert reasons == {}, "both trailer vectors are in the file"


def test_hello_and_error_never_carry_a_trailer_and_helloOk_only_after_choosing_version_3() -> None:
    field = (p.Field(0x0101, b"abc"),)
    for m in (p.Hello(0, "c", (1, 2, 3)), p.Error(1, "x")):
        with pytest.raises(ValueError, match="carries no field trailer"):
            p.encode_frame(1, m, field)
    old = p.HelloOk(1, 7, 42, 65536, 64, p.Negotiated(2, 0))
    with pytest.raises(ValueError, match="version 3"):
        p.encode_frame(1, old, field)
    frame = p.encode_frame(1, old) + b"\x01\x01\x00\x00"
    with pytest.raises(p.FrameError, match="trailing bytes"):
        decode((frame[:3] + bytes((frame[3] + 4,)) + frame[4:]).hex(), 3)
    new = p.HelloOk(1, 7, 42, 65536, 64, p.Negotiated(3, 0))
    got = decode(p.encode_frame(1, new, field).hex(), 1)  # the HelloOk says its own version.
    assert (got.message, got.trailer) == (new, field)
    with pytest.raises(ValueError, match="at most once"):
        p.encode_frame(2, p.Ping(), field + field)


def test_a_receiver_skips_unknown_optional_fields_only() -> None:
    optional, must = p.Field(0x0101, b"abc"), p.Field(0x8101)
    assert not optional.must_understand and must.must_understand
    assert p.unknown_must_understand((optional,)) is None
    assert p.unknown_must_understand((optional, must)) == must
    assert p.unknown_must_understand((must,), known=frozenset({0x8101})) is None


def test_a_frame_is_judged_by_its_header_before_its_body_arrives() -> None:
    decoder = p.FrameDecoder()
    decoder.feed(bytes.fromhex("0000ffff"))  # 65,539 bytes announced: refused after 4 bytes.
    with pytest.raises(p.FrameError, match="TooLarge"):
        decoder.next()
    decoder = p.FrameDecoder()
    decoder.feed(bytes.fromhex("0000001001ee"))  # unknown type, body not sent yet.
    with pytest.raises(p.FrameError, match="UnknownType"):
        decoder.next()


@pytest.mark.parametrize("vector", BRANCH_IDS["branches"], ids=lambda v: v["name"])
def test_every_branch_id_is_what_the_package_writes(vector: dict[str, Any]) -> None:
    o = vector["origin"]
    branch = p.Xid.decree(o["node"], o["incarnation"], o["session"], o["sequence"]).branch(vector["branch"])
    assert branch.format_id == vector["format_id"] == BRANCH_IDS["format_id"] == p.DECREE_FORMAT_ID
    assert (branch.gtrid.hex(), branch.bqual.hex()) == (vector["gtrid"], vector["bqual"])
    assert branch.encode().hex() == vector["xid_binary"]
    assert branch.pg_gid() == vector["postgres_gid"]
    assert p.Xid.from_pg_gid(vector["postgres_gid"]) == branch
    assert branch.mysql_xid() == vector["mysql_xid"]
    row = vector["mysql_xa_recover"]
    recovered = p.Xid.from_xa_recover(row["formatID"], row["gtrid_length"], row["bqual_length"], bytes.fromhex(row["data"]))
    assert recovered == branch
    named = vector["mariadb_name"]
    name = branch.mariadb_name(named["connection_id"])
    assert (name.bqual.hex(), name.mysql_xid()) == (named["bqual"], named["mysql_xid"])
    row = named["mysql_xa_recover"]
    listed = p.Xid.from_xa_recover(row["formatID"], row["gtrid_length"], row["bqual_length"], bytes.fromhex(row["data"]))
    assert listed == name and listed.from_mariadb_name() == (branch, named["connection_id"])
    assert branch.from_mariadb_name() == (branch, None)
    assert branch.origin == p.Origin(**o)
    assert branch.branch_number == vector["branch"]
    assert branch.global_xid().pg_gid() == vector["postgres_gid"].rsplit(":", 1)[0] + ":"


def test_the_global_xid_vector() -> None:
    g = BRANCH_IDS["global"]
    o = g["origin"]
    x = p.Xid.decree(o["node"], o["incarnation"], o["session"], o["sequence"])
    assert (x.gtrid.hex(), x.bqual.hex(), x.encode().hex(), x.pg_gid()) == (
        g["gtrid"], g["bqual"], g["xid_binary"], g["postgres_gid"]
    )


@pytest.mark.parametrize("vector", BRANCH_IDS["non_canonical_gids"], ids=lambda v: v["name"])
def test_non_canonical_gids_are_not_decree_branches(vector: dict[str, Any]) -> None:
    try:
        parsed = p.Xid.from_pg_gid(vector["gid"])
    except ValueError:
        return  # refused outright: the package never reads it as decree's.
    assert parsed.branch_number is None or parsed.origin is None, vector["why"]


def test_decisions_past_the_limits_are_refused_before_anything_is_sent() -> None:
    g = p.Xid.decree(1, 7, 42, 1)
    with pytest.raises(ValueError, match="at least one branch"):
        p.encode_frame(2, p.Decide(g, ()))
    with pytest.raises(ValueError, match="used twice"):
        p.encode_frame(2, p.Decide(g, (p.Branch(0, "a"), p.Branch(0, "b"))))
    with pytest.raises(ValueError, match="1 to 64 bytes"):
        p.encode_frame(2, p.Decide(g, (p.Branch(0, "n" * 65),)))
    with pytest.raises(ValueError, match="bqual"):
        p.encode_frame(2, p.Decide(g.branch(0), (p.Branch(0, "a"),)))
    big = tuple(p.Branch(i, "n" * 64) for i in range(p.BRANCHES_MAX))
    frame = p.encode_frame(2, p.Decide(g, big))
    assert len(frame) <= p.FRAME_BYTES_MAX, "a decision at every limit fits one frame"


def test_a_long_client_name_is_cut_on_a_character_boundary() -> None:
    frame = p.encode_frame(1, p.Hello(0, "é" * 200))
    decoder = p.FrameDecoder()
    decoder.feed(frame)
    got = decoder.next()
    assert got is not None and isinstance(got.message, p.Hello)
    assert got.message.client == "é" * 127  # 254 bytes: the 128th character would need 256.


def test_the_trace_context_vectors_read_back_and_encode_byte_for_byte() -> None:
    """The trace-context field (tag 0x0001, optional) of the version-3 vectors: read back
    as its ids and flags, and written by TraceContext.field() into exactly the vector."""
    seen = []
    for v in MESSAGES["messages"]:
        tc = v["fields"].get("trace_context")
        if tc is None:
            continue
        expected = p.TraceContext(bytes.fromhex(tc["trace_id"]), bytes.fromhex(tc["span_id"]), tc["flags"])
        assert p.trace_context(trailer(v["fields"])) == expected, v["name"]
        m = message(v["type"], v["fields"])
        assert p.encode_frame(v["request_id"], m, (expected.field(),)).hex() == v["hex"], v["name"]
        seen.append(v["type"])
    assert sorted(seen) == ["Complete", "Decide", "OnePhase", "Outcome"]
    assert p.trace_context((p.Field(p.TRACE_CONTEXT, bytes(25)),)) is None
    assert p.trace_context((p.Field(p.TRACE_CONTEXT, b"\x01" * 24),)) is None
