"""The thread a link heartbeats from: its own event loop, apart from the events loop.

A heartbeat queued behind a busy ingest loop arrives late and costs a resync; here it waits
only for the GIL. :meth:`submit` runs a coroutine on this loop (a cancellable
``concurrent.futures.Future``); :meth:`call` runs one and waits from another loop;
:meth:`stop` cancels and joins. Loop-bound objects (gRPC aio channels, asyncio locks) used
here are created here; :func:`wake` sets an event of one loop from any thread.

See docs/architecture.md#the-index-link-kvmeshlink.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class BeatThread:
    """A daemon thread running one asyncio loop until :meth:`stop`."""

    def __init__(self, name: str = "kvmesh-bridge-beats") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._started = False

    def start(self) -> BeatThread:
        if not self._started:
            self._started = True
            self._thread.start()
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on this thread's loop."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` here and await its result from the caller's loop."""
        return await asyncio.wrap_future(self.submit(coro))

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel every task of this loop, stop it and join the thread."""
        if not self._started or not self._thread.is_alive():
            return

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            self.submit(cancel_all()).result(timeout)
        except (concurrent.futures.TimeoutError, RuntimeError):
            pass  # a task that ignores cancellation: the loop stops under it
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)


def wake(loop: asyncio.AbstractEventLoop | None, event: asyncio.Event) -> None:
    """Set ``event`` of ``loop`` from any thread (nothing once the loop is gone)."""
    if loop is None or loop.is_closed():
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        event.set()
        return
    try:
        loop.call_soon_threadsafe(event.set)
    except RuntimeError:
        pass  # closed meanwhile: nobody waits any more

