"""Which API drives a connection: the driver classes, recognised by ``isinstance``.

A connection is recognised by its class, so that subclasses of a driver's connection
class are recognised too, and never by its module's name (which also matched psycopg's
``AsyncConnection``, whose two-phase methods are coroutines the synchronous API never
awaited). The drivers' modules are looked up in ``sys.modules`` only: a connection of a
driver implies that its module is imported, and nothing is imported here.
"""

from __future__ import annotations

import enum
import sys
from typing import Any

from .errors import UsageError


class Driver(enum.Enum):
    """The kinds of connection decree knows, and the API that drives each."""

    PSYCOPG = ("psycopg.Connection", "sync")
    PSYCOPG_ASYNC = ("psycopg.AsyncConnection", "async")
    PYMYSQL = ("pymysql.connections.Connection", "sync")
    AIOMYSQL = ("aiomysql.connection.Connection", "async")
    BRANCH_ADAPTER = ("decree.BranchAdapter", "sync")
    ASYNC_BRANCH_ADAPTER = ("decree.AsyncBranchAdapter", "async")

    @property
    def class_name(self) -> str:
        return self.value[0]

    @property
    def api(self) -> str:
        """``tm.transaction()`` or ``tm.atransaction()``: the API that drives this kind."""
        return "tm.transaction()" if self.value[1] == "sync" else "tm.atransaction()"


def _class(module: str, name: str) -> type | None:
    found = getattr(sys.modules.get(module), name, None)
    return found if isinstance(found, type) else None


def driver_of(connection: Any) -> Driver | None:
    """The kind of ``connection``, or ``None`` for an object decree cannot drive."""
    from .branches import BranchAdapter

    if isinstance(connection, BranchAdapter):
        return Driver.BRANCH_ADAPTER
    aio = sys.modules.get("decree.aio_branches")
    if aio is not None and isinstance(connection, aio.AsyncBranchAdapter):
        return Driver.ASYNC_BRANCH_ADAPTER
    for driver, module, name in (
        (Driver.PSYCOPG, "psycopg", "Connection"),
        (Driver.PSYCOPG_ASYNC, "psycopg", "AsyncConnection"),
        (Driver.PYMYSQL, "pymysql.connections", "Connection"),
        (Driver.AIOMYSQL, "aiomysql.connection", "Connection"),
    ):
        cls = _class(module, name)
        if cls is not None and isinstance(connection, cls):
            return driver
    return None


def _type_name(connection: Any) -> str:
    cls = type(connection)
    return f"{cls.__module__}.{cls.__qualname__}"


def refusal(connection: Any, api: str) -> UsageError:
    """The error for ``connection`` given to ``api`` (``"tm.transaction()"`` or
    ``"tm.atransaction()"``), which cannot drive it: names its type and the API that can."""
    driver = driver_of(connection)
    name = _type_name(connection)
    if driver is None:
        accepted = "a psycopg 3 or PyMySQL connection, or a decree.BranchAdapter"
        if api == "tm.atransaction()":
            accepted = "a psycopg 3 AsyncConnection or an aiomysql Connection, or a decree.AsyncBranchAdapter"
        return UsageError(f"cannot enlist a {name} in {api}: pass {accepted}")
    shown = driver.class_name if name == driver.class_name else f"{name} (a {driver.class_name})"
    return UsageError(f"{shown} is driven by {driver.api}, not {api}")
