"""How far one engine's ingest trails the engine, against a bound, whatever the engine's clock.

Age is the growth of ``bridge clock - batch ts`` over its smallest value seen, so a skewed
engine clock is harmless; after a lag clear the next batch may rebase it. The subscriber asks
``observe(ts)`` after every live batch and clears the engine when behind with removals queued.

See docs/architecture.md#bridge-ingest-and-recovery.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("kvmesh.bridge.subscriber")

Bound = float | Callable[[], float]


class Lag:
    """One engine's ingest age against ``bound`` seconds (a callable is read at each batch:
    the bridge passes half the liveness timeout its link learned)."""

    WARN_EVERY_S = 30.0  # lag clears are logged at most this often per engine

    def __init__(self, bound: Bound, name: str) -> None:
        self.bound = bound
        self.name = name
        self.baseline: float | None = None  # min (wall clock - engine ts) of live batches
        self.age = 0.0  # of the last batch observed
        self.behind = False  # it was older than the bound
        self.rebases = 0
        self._rebase = False  # the next batch may move the baseline (after a lag clear)
        self._warned_at = -float("inf")
        self._unwarned = 0  # lag clears since the last warning

    def limit(self) -> float:
        return float(self.bound() if callable(self.bound) else self.bound)

    def observe(self, ts: float, now: float | None = None) -> float:
        """The age of the live batch just applied (engine time stamp ``ts``); sets
        ``behind``."""
        offset = (time.time() if now is None else now) - ts
        if self.baseline is None or offset < self.baseline:
            self.baseline = offset
        age = offset - self.baseline
        bound = self.limit()
        rebase, self._rebase = self._rebase, False
        if rebase and age > bound:  # fresh, yet "late": the engine's clock moved back
            self.rebases += 1
            log.warning("%s: the engine's clock moved %.1f s back against the bridge's; "
                        "measuring lag from here", self.name, age)
            self.baseline, age = offset, 0.0
        self.age, self.behind = age, age > bound
        return age

    def cleared(self, skipped: int) -> None:
        """The engine was cleared for lag: warn (rate-limited), arm the rebase check."""
        self.behind = False
        self._rebase = True
        self._unwarned += 1
        now = time.monotonic()
        if now - self._warned_at >= self.WARN_EVERY_S:
            log.warning("%s: ingest %.1f s behind the engine (bound %.1f s) with removals "
                        "queued: its index entries are cleared and %d+ queued batches skipped "
                        "(%d clear(s) since the last warning); the bridge is past its "
                        "capacity", self.name, self.age, self.limit(), skipped, self._unwarned)
            self._warned_at, self._unwarned = now, 0
