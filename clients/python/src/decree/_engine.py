"""Engines: code written once as a generator of calls (:class:`Call`), carried out blocking
(:func:`run_blocking`) or on an event loop (:func:`run_awaited`).

An engine yields a :class:`Call`, "prepare this branch", "run this SQL", and is sent the
call's result back, or has its exception thrown back in; it never makes the call itself.
The coordinator's rules (:mod:`decree._rules`) and the MariaDB branch's rules
(:class:`decree.branches.MySQLRules`) are engines, so that the synchronous and the asyncio
API run the same code and differ only in how a call is made.
"""

from __future__ import annotations

import inspect
from collections.abc import Generator
from typing import Any, Generic, NamedTuple, TypeVar

T = TypeVar("T")


class Call(NamedTuple):
    """One thing the runtime does for an engine: ``target.method(*args)``, awaited when it
    returns an awaitable (asyncio). Its result is sent back to the engine, or its exception
    thrown back in. (A tuple: several are made per commit, and a tuple is made fastest.)"""

    target: Any
    method: str
    args: tuple[Any, ...] = ()

    def invoke(self) -> Any:
        return getattr(self.target, self.method)(*self.args)


Steps = Generator[Call, Any, T]
"""An engine: yields calls, is sent their results, returns its own."""


class Driven(Generic[T]):
    """An engine being carried out: :attr:`call` is what it asks for now, ``None`` once it
    returned :attr:`value`. The runtime makes the call and hands over its result
    (:meth:`answer`) or exception (:meth:`fail`); the engine's own exceptions come out of
    these."""

    __slots__ = ("_steps", "call", "_value")

    def __init__(self, steps: Steps[T]) -> None:
        self._steps = steps
        self.call: Call | None = None
        self._value: Any = None
        self.answer(None)  # a generator's first step takes None.

    @property
    def value(self) -> T:
        """What the engine returned."""
        assert self.call is None, "the engine has not returned yet"
        value: T = self._value
        return value

    def answer(self, result: Any) -> None:
        try:
            self.call = self._steps.send(result)
        except StopIteration as done:
            self.call, self._value = None, done.value

    def fail(self, error: BaseException) -> None:
        try:
            self.call = self._steps.throw(error)
        except StopIteration as done:
            self.call, self._value = None, done.value


def run_blocking(steps: Steps[T]) -> T:
    """Carries out an engine with blocking calls, handing each result, or exception, back
    to it; returns what it returns."""
    driven = Driven(steps)
    while driven.call is not None:
        try:
            result = driven.call.invoke()
        except BaseException as e:
            driven.fail(e)
        else:
            driven.answer(result)
    return driven.value


async def run_awaited(steps: Steps[T]) -> T:
    """Carries out an engine on the event loop, awaiting each call that returns an
    awaitable and handing its result, or exception, back to the engine; returns what it
    returns."""
    driven = Driven(steps)
    while driven.call is not None:
        try:
            result = driven.call.invoke()
            if inspect.isawaitable(result):
                result = await result
        except BaseException as e:
            driven.fail(e)
        else:
            driven.answer(result)
    return driven.value
