"""What the worker's onboards cost, per tier: summed time and a latency histogram.

The engine observes each finished onboard once per tier it read from (the blocks it copied
from that tier and the wall time they took, as the copy executor measured them).
Prometheus reads :meth:`OnboardLog.histogram` as ``kvmesh_worker_onboard_latency_seconds``
(per tier); ``WorkerService.Stats`` reads :attr:`OnboardLog.seconds` as
``TierStats.onboard_seconds``.

Written by the engine thread, read by the scrape and RPC threads: plain numbers, each
updated by one statement, so a reader sees a value that is at worst one onboard behind.
"""
from __future__ import annotations

import bisect

# From a fraction of a millisecond (a few blocks from host memory) to seconds (a long chain
# from a slow disk).
ONBOARD_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25,
                   0.5, 1.0, 2.5, 5.0, 10.0)


class OnboardLog:
    """Per tier: onboards observed, blocks, summed seconds, and bucket counts."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}
        self.blocks: dict[str, int] = {}
        self.seconds: dict[str, float] = {}
        self._buckets: dict[str, list[int]] = {}

    def observe(self, tier: str, blocks: int, seconds: float) -> None:
        """One onboard copied ``blocks`` blocks from ``tier`` in ``seconds``."""
        if blocks <= 0:
            return
        counts = self._buckets.setdefault(tier, [0] * (len(ONBOARD_BUCKETS) + 1))
        counts[bisect.bisect_left(ONBOARD_BUCKETS, seconds)] += 1
        self.blocks[tier] = self.blocks.get(tier, 0) + blocks
        self.seconds[tier] = self.seconds.get(tier, 0.0) + seconds
        self.count[tier] = self.count.get(tier, 0) + 1

    def histogram(self, tier: str) -> tuple[list[tuple[str, int]], float]:
        """Cumulative ``(le, count)`` buckets (``+Inf`` last) and the sum, for ``tier``."""
        counts = self._buckets.get(tier, [0] * (len(ONBOARD_BUCKETS) + 1))
        out, total = [], 0
        for le, n in zip((*map(str, ONBOARD_BUCKETS), "+Inf"), counts, strict=True):
            total += n
            out.append((le, total))
        return out, self.seconds.get(tier, 0.0)
