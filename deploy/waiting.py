"""Waiting for a condition, the one way: poll until it holds or a deadline passes.

Contract of both functions: an exception raised by the probe counts as "not yet" (a server
still starting refuses connections); on timeout a ``TimeoutError`` names what was awaited and
the last value (or exception) seen. The probe runs at least once, even with a zero timeout.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def _timeout(what: str, within: float, last: object) -> TimeoutError:
    return TimeoutError(f"{what} not within {within}s (last: {last!r})")


def wait_until(fn: Callable[[], T], timeout: float, interval: float = 0.05,
               what: str = "condition") -> T:
    """Call ``fn`` every ``interval`` s until it returns a truthy value, and return it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            last: object = fn()
            if last:
                return last  # type: ignore[return-value]
        except Exception as e:  # not yet: see the module contract
            last = e
        if time.monotonic() >= deadline:
            raise _timeout(what, timeout, last)
        time.sleep(interval)


async def eventually(probe: Callable[[], Awaitable[T]], ok: Callable[[T], object] = bool,
                     within: float = 10.0, interval: float = 0.05) -> T:
    """Await ``probe()`` every ``interval`` s until ``ok(value)``, and return that value."""
    deadline = time.monotonic() + within
    while True:
        try:
            last: object = await probe()
            if ok(last):  # type: ignore[arg-type]
                return last  # type: ignore[return-value]
        except Exception as e:  # not yet: see the module contract
            last = e
        if time.monotonic() >= deadline:
            raise _timeout("condition", within, last)
        await asyncio.sleep(interval)
