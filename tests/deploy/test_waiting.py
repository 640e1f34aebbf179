"""deploy.waiting: the one polling loop keeps its contract (module docstring there)."""
from __future__ import annotations

import asyncio
import itertools

import pytest

from deploy.waiting import eventually, wait_until


def test_wait_until_returns_the_first_truthy_value_and_skips_exceptions() -> None:
    calls = itertools.count()

    def probe() -> int:
        n = next(calls)
        if n == 0:
            raise ConnectionError("still starting")
        return n if n >= 2 else 0

    assert wait_until(probe, 5, interval=0) == 2


def _down() -> None:
    raise OSError("down")


def test_wait_until_names_what_and_the_last_value_on_timeout() -> None:
    with pytest.raises(TimeoutError, match=r"the answer not within 0s \(last: \[\]\)"):
        wait_until(list, 0, what="the answer")
    with pytest.raises(TimeoutError, match="OSError") as err:
        wait_until(_down, 0)
    assert isinstance(err.value.__cause__, OSError)


def test_eventually_awaits_until_ok_and_times_out_with_the_last_value() -> None:
    seen: list[int] = []

    async def probe() -> int:
        seen.append(len(seen))
        if len(seen) == 1:
            raise ConnectionError("reconnecting")
        return seen[-1]

    assert asyncio.run(eventually(probe, lambda v: v >= 3, interval=0)) == 3
    with pytest.raises(TimeoutError, match=r"last: 0"):
        asyncio.run(eventually(lambda: asyncio.sleep(0, 0), within=0))
