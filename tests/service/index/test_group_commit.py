"""``service/index/group_commit.py``: calls run at once below the limit, merge above it,
in submission order; a failure reaches every caller of its run; a cancelled caller's item
is left out; a stalled run holds no call while the limit leaves room."""
from __future__ import annotations

import asyncio

import pytest

from service.index.group_commit import GroupCommit


class Runs:
    """A ``run`` that records its calls and, while ``gate`` is clear, waits on it."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.gate = asyncio.Event()
        self.fail: Exception | None = None

    async def __call__(self, items):
        self.calls.append(list(items))
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return [i * 10 for i in items]


async def _until(cond) -> None:
    for _ in range(1000):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never met")


def test_calls_below_the_limit_run_at_once_alone() -> None:
    async def main() -> None:
        runs = Runs()
        runs.gate.set()
        g = GroupCommit(runs, limit=2)
        assert await asyncio.gather(g.submit(1), g.submit(2)) == [10, 20]
        assert runs.calls == [[1], [2]] and g.merged == 0 and g.flying == 0

    asyncio.run(main())


def test_calls_above_the_limit_merge_into_one_run_in_order() -> None:
    async def main() -> None:
        runs = Runs()
        g = GroupCommit(runs, limit=2)
        tasks = [asyncio.create_task(g.submit(i)) for i in range(1, 7)]
        await _until(lambda: len(g._queue) == 4)
        assert runs.calls == [[1], [2]]  # the two in flight; 3-6 wait
        runs.gate.set()
        assert await asyncio.gather(*tasks) == [10, 20, 30, 40, 50, 60]
        assert runs.calls == [[1], [2], [3, 4, 5, 6]] and g.merged == 4 and g.flying == 0

    asyncio.run(main())


def test_a_failed_run_fails_each_of_its_callers_and_the_next_runs() -> None:
    async def main() -> None:
        runs = Runs()
        g = GroupCommit(runs, limit=1)
        first = asyncio.create_task(g.submit(1))
        rest = [asyncio.create_task(g.submit(i)) for i in (2, 3)]
        await _until(lambda: len(g._queue) == 2)
        runs.fail = RuntimeError("a shard went away")
        runs.gate.set()
        with pytest.raises(RuntimeError):
            await first
        for t in rest:  # the merged run of 2 and 3 failed too: both callers see it
            with pytest.raises(RuntimeError, match="shard"):
                await t
        runs.fail = None
        assert await g.submit(4) == 40 and runs.calls[-1] == [4]

    asyncio.run(main())


def test_a_cancelled_caller_leaves_its_item_out_of_a_run_not_started() -> None:
    async def main() -> None:
        runs = Runs()
        g = GroupCommit(runs, limit=1)
        first = asyncio.create_task(g.submit(1))
        gone, kept = (asyncio.create_task(g.submit(i)) for i in (2, 3))
        await _until(lambda: len(g._queue) == 2)
        gone.cancel()
        runs.gate.set()
        assert await first == 10 and await kept == 30
        assert runs.calls == [[1], [3]] and gone.cancelled()

    asyncio.run(main())


def test_a_stalled_run_holds_no_call_while_the_limit_leaves_room() -> None:
    async def main() -> None:
        stalled = asyncio.Event()

        async def run(items):
            if items == [0]:
                await stalled.wait()  # a shard hanging until its timeout
            return list(items)

        g = GroupCommit(run, limit=2)
        slow = asyncio.create_task(g.submit(0))
        await _until(lambda: g.flying == 1)
        assert await asyncio.wait_for(g.submit(1), 5) == 1  # ran beside the stalled one
        stalled.set()
        assert await slow == 0

    asyncio.run(main())


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="limit"):
        GroupCommit(Runs(), limit=0)
