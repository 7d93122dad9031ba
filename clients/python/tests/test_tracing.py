"""OpenTelemetry spans of the Python client (issue 36), when the application has
OpenTelemetry: a transfer between two PostgreSQL databases through a real ``decree serve``
gives one trace (the transaction, each branch's prepare and commit with the database
semantic conventions, the decision and the completion, the Xid on every span), and the
frames the client sends carry the current span's context in the trace-context field.
Skipped when ``opentelemetry-sdk`` is not installed (the client does not require it)."""

from __future__ import annotations

from typing import Any

import pytest

sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

import decree  # noqa: E402
from bank import Bank  # noqa: E402
from conftest import Server, bank_fixture  # noqa: E402
from decree import _tracing  # noqa: E402
from decree import protocol as p  # noqa: E402

bank = bank_fixture("pg-b")


@pytest.fixture(scope="module")
def exporter() -> Any:
    exporter = InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter


def test_a_transfer_is_one_trace_with_a_span_per_branch_call(
    server: Server, bank: Bank, tm: decree.TransactionManager, exporter: Any
) -> None:
    exporter.clear()
    a, b = bank.connect_a(), bank.connect_b()
    report = bank.transfer(tm, a, b, tid=21)
    assert report.kind == "two_phase"
    spans = {s.name: s for s in exporter.get_finished_spans()}
    names = {"decree.transaction", "prepare pg-a", "prepare pg-b", "decree.decide", "commit pg-a", "commit pg-b", "decree.complete"}
    assert names <= set(spans), sorted(spans)
    root = spans["decree.transaction"]
    assert root.attributes["decree.outcome"] == "committed"
    for name in names:
        s = spans[name]
        assert s.context.trace_id == root.context.trace_id, name
        assert s.attributes["decree.xid"] == str(report.xid), name
    assert spans["prepare pg-a"].attributes["db.system.name"] == "postgresql"
    assert spans["decree.decide"].parent.span_id == root.context.span_id
    a.close(), b.close()


def test_frames_carry_the_current_span_context_from_version_3_on(exporter: Any) -> None:
    xid = p.Xid(p.DECREE_FORMAT_ID, bytes(28), b"")
    assert _tracing.trailer(3, p.Complete(xid)) == ()  # no current span
    with trace.get_tracer("test").start_as_current_span("app") as span:
        sc = span.get_span_context()
        (field,) = _tracing.trailer(3, p.Complete(xid))
        assert p.trace_context((field,)) == p.TraceContext(sc.trace_id.to_bytes(16, "big"), sc.span_id.to_bytes(8, "big"), int(sc.trace_flags))
        assert _tracing.trailer(2, p.Complete(xid)) == (), "older sessions refuse any trailer"
        assert _tracing.trailer(3, p.Ping()) == (), "only the messages that may carry it"
