"""Per-tenant counters of one worker's KV cache, and the cardinality bound on exporting them.

``KVCacheManager.tenant_stats()`` returns one :class:`TenantCounts` per tenant it has seen;
the worker's Stats RPC and Prometheus metrics export :func:`top_tenants` of them: the largest
tenants by name, the rest summed under ``kvmesh.quota.OTHER``, so a flood of tenant names can
never grow a label set without bound.

See docs/architecture.md#per-tenant-quotas.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kvmesh.quota import OTHER, TOP_TENANTS


@dataclass
class TenantTier:
    """One tenant in one tier: ``blocks`` cached and charged to it now, ``quota_blocks`` its
    quota in blocks (0: none), cumulative ``hit_blocks`` (its requests' prompt blocks served
    from this tier) and ``evicted_blocks`` (its blocks dropped from the tier, not moved down)."""

    blocks: int = 0
    quota_blocks: int = 0
    hit_blocks: int = 0
    evicted_blocks: int = 0

    def add(self, other: TenantTier) -> None:
        self.blocks += other.blocks
        self.quota_blocks += other.quota_blocks
        self.hit_blocks += other.hit_blocks
        self.evicted_blocks += other.evicted_blocks


@dataclass
class TenantCounts:
    """One tenant on one worker: requests admitted, their prompt tokens and the prompt tokens
    served from a cache (any tier or a peer), and its counters per tier."""

    tenant: str
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    tiers: dict[str, TenantTier] = field(default_factory=dict)

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def add(self, other: TenantCounts) -> None:
        self.requests += other.requests
        self.prompt_tokens += other.prompt_tokens
        self.cached_tokens += other.cached_tokens
        for tier, counts in other.tiers.items():
            self.tiers.setdefault(tier, TenantTier()).add(counts)


def _size(c: TenantCounts) -> tuple[int, int]:
    return sum(t.blocks for t in c.tiers.values()), c.prompt_tokens


def top_tenants(counts: Mapping[str, TenantCounts] | Iterable[TenantCounts],
                n: int = TOP_TENANTS) -> list[TenantCounts]:
    """The ``n`` largest tenants (by cached blocks over all tiers, then prompt tokens; ties
    by name), largest first, then one :data:`~kvmesh.quota.OTHER` row summing the rest if
    there is any. The inputs are not changed."""
    rows = list(counts.values()) if isinstance(counts, Mapping) else list(counts)
    rows.sort(key=lambda c: (-_size(c)[0], -_size(c)[1], c.tenant))
    top, rest = rows[:n], rows[n:]
    if not rest:
        return top
    other = TenantCounts(OTHER)
    for c in rest:
        other.add(c)
    return [*top, other]
