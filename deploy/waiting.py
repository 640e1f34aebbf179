"""Waiting for a condition: the one deadline-polling loop (sync and async).

Launchers wait for clusters to come up and tests wait for state to settle; both poll a
probe until it answers, never sleep a fixed time and hope. Contract of both helpers:

- the probe is called at least once, and again every ``interval`` seconds until it is
  accepted or ``timeout``/``within`` seconds have passed since the first call;
- an exception raised by the probe counts as "not yet" (a replica still starting, a channel
  reconnecting); it is never swallowed silently: on timeout it is the error's cause;
- on timeout ``TimeoutError`` names ``what`` and the last value (or exception) seen.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


def _timed_out(what: str, timeout: float, last: Any) -> TimeoutError:
    err = TimeoutError(f"{what} not within {timeout:g}s (last: {last!r})")
    err.__cause__ = last if isinstance(last, BaseException) else None
    return err


def wait_until(fn: Callable[[], T], timeout: float, interval: float = 0.05,
               what: str = "condition") -> T:
    """Call ``fn`` until it returns something truthy and return that value.

    Raises ``TimeoutError`` (naming ``what`` and the last value) after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            last: Any = fn()
        except Exception as e:  # not yet: see the module contract
            last = e
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise _timed_out(what, timeout, last)
        time.sleep(interval)


async def eventually(probe: Callable[[], Awaitable[T]], ok: Callable[[T], Any] = bool,
                     within: float = 10.0, interval: float = 0.05) -> T:
    """Await ``probe()`` until ``ok(value)`` holds and return that value (async twin of
    :func:`wait_until`; an exception from ``probe`` or ``ok`` counts as not-yet).

    Raises ``TimeoutError`` with the last value after ``within`` seconds.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        try:
            last: Any = await probe()
            if ok(last):
                return last
        except Exception as e:  # not yet: see the module contract
            last = e
        if loop.time() >= deadline:
            raise _timed_out("condition", within, last)
        await asyncio.sleep(interval)
