"""One worker's figures per KV tier, computed once for ``WorkerService.Stats`` and Prometheus.

The manager counts blocks and tokens per tier (``KVCacheManager.tier_stats()``, one
:class:`~worker.kv_cache.stats.TierCounters` each); the copy executor knows what a block
weighs and how long onboards took; the server knows what the index promised
(:class:`~worker.kv_cache.tier_precision.TierPrecision`). :func:`tier_figures` joins them into
the wire's record, one ``worker_pb2.TierStats`` per enabled tier, fastest first; what the
record does not carry (load factor, hit rate, ...) is derived by ``kvmesh.tier_figures``.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from kvmesh.v1.worker_pb2 import TierStats
from worker.kv_cache.stats import TierCounters
from worker.kv_cache.tier_precision import TIER_ORDER, TierPrecision


def engine_tier_figures(engine: Any, precision: TierPrecision) -> list[TierStats]:
    """:func:`tier_figures` of a ``worker.engine.engine.Engine`` (call on its thread)."""
    cache = engine.kv_cache  # [layers, 2, blocks, ...]: one block is cache[:, :, i]
    block_bytes = cache[:, :, 0].numel() * cache.element_size()
    return tier_figures(engine.kv.tier_stats(), precision, block_bytes,
                        engine.onboards.seconds)


def tier_figures(counters: Mapping[str, TierCounters], precision: TierPrecision,
                 block_bytes: int, onboard_seconds: Mapping[str, float]) -> list[TierStats]:
    """Join the manager's ``tier_stats()`` (``counters``: tier -> ``TierCounters``, whose
    fields are ``TierStats``'s) with the bytes per block, the summed onboard seconds per
    tier and the index's precision."""
    return [TierStats(tier=tier, **asdict(c), onboard_bytes=c.onboard_blocks * block_bytes,
                      onboard_seconds=float(onboard_seconds.get(tier, 0.0)),
                      index_promised_tokens=precision.promised.get(tier, 0),
                      index_missed_tokens=precision.missed.get(tier, 0))
            for tier, c in sorted(counters.items(), key=lambda tc: TIER_ORDER.index(tc[0]))]
