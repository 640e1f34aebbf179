"""One worker's figures per KV tier, as ``WorkerService.Stats`` and Prometheus report them.

The manager counts blocks and tokens per tier (``KVCacheManager.tier_stats()``); the copy
executor knows what a block weighs and how long onboards took; the server knows what the
index promised (:class:`~worker.kv_cache.tier_precision.TierPrecision`). :func:`tier_figures` joins
them, one :class:`TierFigures` per enabled tier, fastest first.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from worker.kv_cache.tier_precision import TIER_ORDER, TierPrecision


@dataclass(frozen=True, slots=True)
class TierFigures:
    """The fields of ``worker_pb2.TierStats`` (same names). ``load_factor`` is
    ``cached_blocks / capacity_blocks`` (0.0 for an empty tier)."""

    tier: str
    capacity_blocks: int
    cached_blocks: int
    hit_tokens: int
    evictions: int
    offloads: int
    onboard_blocks: int
    onboard_bytes: int
    onboard_seconds: float
    index_promised_tokens: int
    index_missed_tokens: int

    @property
    def load_factor(self) -> float:
        return self.cached_blocks / self.capacity_blocks if self.capacity_blocks else 0.0

    def proto_fields(self) -> dict[str, Any]:
        return asdict(self)


def engine_tier_figures(engine: Any, precision: TierPrecision) -> list[TierFigures]:
    """:func:`tier_figures` of a ``worker.engine.engine.Engine`` (call on its thread)."""
    cache = engine.kv_cache  # [layers, 2, blocks, ...]: one block is cache[:, :, i]
    block_bytes = cache[:, :, 0].numel() * cache.element_size()
    return tier_figures(engine.kv.tier_stats(), precision, block_bytes,
                        engine.onboards.seconds)


def tier_figures(counters: Mapping[str, Any], precision: TierPrecision, block_bytes: int,
                 onboard_seconds: Mapping[str, float]) -> list[TierFigures]:
    """Join the manager's ``tier_stats()`` (``counters``: tier -> ``TierCounters``) with the
    bytes per block, the summed onboard seconds per tier and the index's precision."""
    out = []
    for tier in sorted(counters, key=lambda t: TIER_ORDER.index(t)):
        c = counters[tier]
        out.append(TierFigures(
            tier, c.capacity_blocks, c.cached_blocks, c.hit_tokens, c.evictions, c.offloads,
            c.onboard_blocks, c.onboard_blocks * block_bytes,
            float(onboard_seconds.get(tier, 0.0)), precision.promised.get(tier, 0),
            precision.missed.get(tier, 0)))
    return out
