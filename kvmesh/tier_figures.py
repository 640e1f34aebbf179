"""The figures a worker's per-tier counters imply, derived in this one place for every reader.

A worker reports each KV tier as a ``worker_pb2.TierStats`` (``WorkerService.Stats``; the
worker computes it once, ``worker.kv_cache.tier_stats``): sizes and cumulative counters.
What the message does not carry - the load factor, the tier's hit rate, the index's
precision on it, the mean onboard time per block - is derived from its fields here, so the
worker's Prometheus page and ``kvmesh stats`` show the same numbers. Every function is
total: a zero denominator gives 0.0, or None where "no data" must not read as 0%.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvmesh.v1 import worker_pb2

TierStats = worker_pb2.TierStats


def tier_stats(fields: TierStats | Mapping[str, Any]) -> TierStats:
    """``fields`` as a ``TierStats`` (a dict of its fields, as ``kvmesh stats`` gets them,
    is read back into the message; unknown keys raise ``ValueError``)."""
    return fields if isinstance(fields, TierStats) else TierStats(**fields)


def load_factor(t: TierStats) -> float:
    """Cached blocks over capacity (0.0 for a tier of no capacity)."""
    return t.cached_blocks / t.capacity_blocks if t.capacity_blocks else 0.0


def hit_rate(t: TierStats, queries: int) -> float:
    """The tier's hit tokens over the worker's queried prompt tokens (0.0 with none)."""
    return t.hit_tokens / queries if queries else 0.0


def kept_share(t: TierStats) -> float | None:
    """The index's precision on the tier: the share of the tokens it promised there that
    the worker still had there or on a faster tier; None when it promised none."""
    if not t.index_promised_tokens:
        return None
    return 1 - t.index_missed_tokens / t.index_promised_tokens


def onboard_s_per_block(t: TierStats) -> float | None:
    """Mean copy time of one block onboarded from the tier; None when none was."""
    return t.onboard_seconds / t.onboard_blocks if t.onboard_blocks else None
