"""Group commit: concurrent calls merged into one when enough are in flight already.

A cluster batch's node writes cost each shard a command pair per tag slot it touches,
whatever the number of entries (docs/benchmarks.md, "Lanes"): merging the writes of
batches that arrive together into one wave divides that cost by the batches merged. At
low load nothing waits: a call runs at once while fewer than ``limit`` are in flight.

Contract: ``submit(item)`` returns ``run([..., item, ...])``'s result at ``item``'s
position, or raises what that run raised. Calls run at once while fewer than ``limit``
runs are in flight; the others queue, and when a run ends every queued item goes into
one run, in submission order. A queued caller that is cancelled leaves its item out if
its run has not started (once started, the run goes on without it). ``limit`` >= 2 keeps
one stalled run (a shard that hangs until its timeout) from holding every other call.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["GroupCommit"]

T = TypeVar("T")
R = TypeVar("R")


class GroupCommit(Generic[T, R]):
    """Merges concurrent :meth:`submit` calls into calls of ``run``; see the module."""

    def __init__(self, run: Callable[[Sequence[T]], Awaitable[Sequence[R]]],
                 limit: int = 2) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.run = run
        self.limit = limit
        self.flying = 0
        self.merged = 0  # items that ran in a run of more than one (for tests and metrics)
        self._queue: list[tuple[T, asyncio.Future[R]]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, item: T) -> R:
        if self.flying < self.limit and not self._queue:
            self.flying += 1
            try:
                (out,) = await self.run([item])
                return out
            finally:
                self.flying -= 1
                self._next()
        fut: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.append((item, fut))
        return await fut

    def _next(self) -> None:
        """Start one run of every queued item still awaited, if a run may start."""
        waiting = [(i, f) for i, f in self._queue if not f.done()]
        self._queue = []
        if not waiting:
            return
        if self.flying >= self.limit:
            self._queue = waiting
            return
        self.flying += 1
        if len(waiting) > 1:
            self.merged += len(waiting)
        task = asyncio.get_running_loop().create_task(self._run(waiting))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, waiting: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            out = await self.run([i for i, _ in waiting])
        except Exception as e:  # every caller of the run gets its failure
            for _, f in waiting:
                if not f.done():
                    f.set_exception(e)
        except BaseException:  # the loop is closing: the callers are cancelled with it
            for _, f in waiting:
                f.cancel()
            raise
        else:
            for (_, f), r in zip(waiting, out, strict=True):
                if not f.done():
                    f.set_result(r)
        finally:
            self.flying -= 1
            self._next()
