"""One worker's per-tenant counters as the wire's rows (``WorkerStatsResponse.tenants``).

The manager counts every tenant it has seen (``KVCacheManager.tenant_stats()``);
:func:`tenant_rows` keeps the cardinality bound of :func:`.tenant_stats.top_tenants` (the
largest ``TOP_TENANTS``, the rest summed as ``kvmesh.quota.OTHER``) and gives each row one
``TenantTier`` per enabled tier, fastest first, zeros where the tenant has nothing: a reader
never has to guess whether a missing tier means "none" or "not enabled".

See docs/architecture.md#per-tenant-quotas-seeing-them.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from kvmesh.quota import TOP_TENANTS
from kvmesh.v1.worker_pb2 import TenantStats, TenantTier

from .tenant_stats import TenantCounts, top_tenants
from .tenant_stats import TenantTier as Tier
from .tier_precision import TIER_ORDER


def enabled(tiers: Iterable[str]) -> list[str]:
    """``tiers`` (the keys of ``KVCacheManager.tier_stats()``), fastest first."""
    have = set(tiers)
    return [t for t in TIER_ORDER if t in have]


def tenant_rows(counts: Mapping[str, TenantCounts], tiers: Iterable[str],
                n: int = TOP_TENANTS) -> list[TenantStats]:
    """The ``n`` largest tenants of ``counts`` (then ``OTHER`` if any are left), each with a
    ``TenantTier`` for every tier of ``tiers`` that is enabled (``TIER_ORDER``; counts of a
    tier not in ``tiers`` are left out). ``counts`` is not changed."""
    order = enabled(tiers)
    return [TenantStats(tenant=c.tenant, requests=c.requests, prompt_tokens=c.prompt_tokens,
                        cached_tokens=c.cached_tokens,
                        tiers=[_tier(t, c.tiers.get(t) or Tier()) for t in order])
            for c in top_tenants(counts, n)]


def _tier(tier: str, t: Tier) -> TenantTier:
    return TenantTier(tier=tier, blocks=t.blocks, quota_blocks=t.quota_blocks,
                      hit_blocks=t.hit_blocks, evicted_blocks=t.evicted_blocks)
