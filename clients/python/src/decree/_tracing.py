"""OpenTelemetry spans of a transaction, when the application has OpenTelemetry.

Optional: without the ``opentelemetry`` package nothing is imported and every helper is a
no-op. With it, spans go to the application's tracer provider (so nothing is exported
until the application configures an SDK, for example with the standard
``OTEL_EXPORTER_OTLP_*`` variables and ``opentelemetry-exporter-otlp-proto-http``): the
transaction, each branch's prepare, commit and rollback (database semantic conventions),
the decision and the completion, with the Xid on every span. The context of the current
span travels to the state server in the trace-context field (protocol version 3), so that
the server's spans join the trace.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from . import protocol as p

try:  # pragma: no cover - which branch runs depends on the environment
    from opentelemetry import trace as _trace
except ImportError:  # pragma: no cover
    _trace = None  # type: ignore[assignment]

_DB_SYSTEMS = {"postgres": "postgresql", "psycopg": "postgresql", "pymysql": "mysql", "mysql": "mysql", "mariadb": "mariadb"}


def db_system(adapter: Any) -> str:
    """The ``db.system.name`` of a branch's adapter, guessed from its driver's module."""
    module = type(getattr(adapter, "connection", adapter)).__module__.split(".")[0].lower()
    return next((v for k, v in _DB_SYSTEMS.items() if k in module), "other_sql")


@contextlib.contextmanager
def span(name: str, xid: p.Xid | None, **attributes: Any) -> Iterator[Any]:
    """A span named ``name`` made current for the block (None without OpenTelemetry)."""
    if _trace is None:
        yield None
        return
    attrs = {k.replace("__", "."): v for k, v in attributes.items()}
    if xid is not None:
        attrs["decree.xid"] = str(xid.global_xid())
    tracer = _trace.get_tracer("decree")
    with tracer.start_as_current_span(name, attributes=attrs) as current:
        yield current


def wire_context() -> p.TraceContext | None:
    """The trace context of the current span, for the trace-context field; None without
    OpenTelemetry or without a valid current span."""
    if _trace is None:
        return None
    sc = _trace.get_current_span().get_span_context()
    if not sc.is_valid:
        return None
    return p.TraceContext(sc.trace_id.to_bytes(16, "big"), sc.span_id.to_bytes(8, "big"), int(sc.trace_flags) & 0xFF)


def trailer(version: int, message: p.Message) -> tuple[p.Field, ...]:
    """The trace-context field for ``message`` on a session of ``version``: only from
    version 3 on, only on the messages that may carry it, only with a current span."""
    if version < p.TRAILER_VERSION or not isinstance(message, (p.Decide, p.Complete, p.CompleteHeuristic, p.OnePhase, p.OutcomeQuery)):
        return ()
    context = wire_context()
    return (context.field(),) if context is not None else ()
