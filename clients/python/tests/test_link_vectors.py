"""docs/vectors/link.json against an encoder written here from docs/replication.md's frame
table alone (struct.pack, no decree code): every message vector of the pair's link is
exactly the bytes the document describes, so that the vectors, which decree-pair's Rust
tests decode, cannot drift from the document with the Rust encoder. The Python client does
not speak the link; this only checks the document and its vectors."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

LINK = json.loads((Path(__file__).resolve().parents[3] / "docs" / "vectors" / "link.json").read_text())

FRAME_VERSION = 1
TYPES = {"Hello": 1, "Batch": 2, "CaughtUp": 3, "Ack": 4, "Refuse": 5}
RECORD_KINDS = {"decision": 1, "completion": 2, "outcome": 3}
DECREE_FORMAT_ID = 0x64637265  # "dcre"


def frame(kind: str, body: bytes) -> bytes:
    """length u32 (bytes after it), version u8, type u8, body."""
    return struct.pack(">IBB", 2 + len(body), FRAME_VERSION, TYPES[kind]) + body


def xid(x: dict) -> bytes:
    """The client protocol's Xid: format id i32, gtrid and bqual lengths u8, gtrid (node u32,
    incarnation u64, session u64, sequence u64), empty bqual."""
    gtrid = struct.pack(">IQQQ", x["node"], x["incarnation"], x["session"], x["sequence"])
    return struct.pack(">iBB", DECREE_FORMAT_ID, len(gtrid), 0) + gtrid


def body(kind: str, f: dict) -> bytes:
    if kind == "Hello":
        return struct.pack(">QBIQQ", f["epoch"], f["member"], f["node"], f["next_sequence"], f["run"])
    if kind == "Batch":
        out = struct.pack(">QQH", f["epoch"], f["sequence"], len(f["records"]))
        for r in f["records"]:
            payload = bytes.fromhex(r["payload"])
            out += struct.pack(">B", RECORD_KINDS[r["kind"]]) + xid(r["xid"])
            out += struct.pack(">I", len(payload)) + payload
        return out
    if kind == "CaughtUp":
        return struct.pack(">QQ", f["epoch"], f["up_to"])
    if kind == "Ack":
        return struct.pack(">QQ", f["epoch"], f["sequence"])
    if kind == "Refuse":
        return struct.pack(">Q", f["seen"])
    raise AssertionError(f"a link message type the document does not describe: {kind}")


@pytest.mark.parametrize("vector", LINK["messages"], ids=[m["name"] for m in LINK["messages"]])
def test_each_link_message_vector_is_the_documented_encoding(vector: dict) -> None:
    assert frame(vector["type"], body(vector["type"], vector["fields"])).hex() == vector["hex"]


def test_every_link_message_type_has_a_vector() -> None:
    assert {m["type"] for m in LINK["messages"]} == set(TYPES)
