"""A copy lane: one background thread running the data plane's jobs in submission order.

The copy executor runs its onboards, its disk writes and its write-behind offloads on a lane
each, so a job of one kind never waits behind a slow job of another. Contract: jobs run one
at a time, in the order submitted; ``queued`` (read under ``cv``) counts the jobs not
finished yet and ``cv`` is notified after each; a job that raises is logged and the lane
goes on (a job reports its own failure, see the executor's ``take_lost``).

See docs/architecture.md#worker-data-plane.
"""
from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger("kvmesh.worker.kv_transfer")


class Lane:
    """One background thread running jobs in submission order; started on first use.
    ``queued`` (under ``cv``) counts jobs not finished yet; ``cv`` is notified after each."""

    def __init__(self, name: str, cv: threading.Condition,
                 on_start: Callable[[], None] | None = None) -> None:
        """``on_start`` runs first on the lane's thread (e.g. its torch settings)."""
        self.name = name
        self.cv = cv
        self.on_start = on_start
        self.queued = 0
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, job: Callable[[], None]) -> None:
        with self.cv:
            self.queued += 1
        self._jobs.put(job)
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
            self._thread.start()

    def close(self, timeout: float) -> None:
        """Run what is queued, then stop the thread."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout)
            self._thread = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        if self.on_start is not None:
            self.on_start()
        while (job := self._jobs.get()) is not None:
            try:
                job()
            except Exception:  # a failed job loses its copy, never the thread
                log.exception("KV copy job failed")
            with self.cv:
                self.queued -= 1
                self.cv.notify_all()
