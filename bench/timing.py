"""Timing for side-by-side benchmarks on noisy shared machines."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_s(fn: Callable[[], object], repeats: int) -> float:
    """Median wall seconds of ``repeats`` calls. Callers alternate rounds of the things they
    compare, so both sides see the same machine load, and report ratios."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
