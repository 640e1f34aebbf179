"""The KV cache manager's counters: prefix-cache hits per admission kind, and per tier."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .block_pool import BlockPool


@dataclass(frozen=True, slots=True)
class CacheStats:
    """Prefix-cache counters (cumulative) and the pool's block counts (now).

    ``requests`` / ``queries`` / ``hits`` count first admissions: one request, its token count,
    and the tokens served from cache, recorded when ``allocate_slots`` admits it. A request
    that waits (``None``) and retries is counted once; re-admissions after preemption go to
    the ``preempted_*`` counters so they do not inflate the hit rate.
    """

    requests: int
    queries: int
    hits: int
    preempted_requests: int
    preempted_queries: int
    preempted_hits: int
    evictions: int
    blocks_total: int
    blocks_used: int
    blocks_cached: int
    blocks_free: int
    hashes_cached: int = 0  # distinct hashes (duplicate blocks share one): the index's view

    @classmethod
    def of(cls, pool: BlockPool, first: Admissions, again: Admissions) -> CacheStats:
        """The counters now: ``first`` / ``again`` admissions over ``pool``."""
        return cls(first.requests, first.queries, first.hits, again.requests, again.queries,
                   again.hits, evictions=pool.evictions, blocks_total=pool.num_blocks,
                   blocks_used=pool.num_blocks - pool.num_free_blocks,
                   blocks_cached=pool.num_cached_blocks, blocks_free=pool.num_free_blocks,
                   hashes_cached=len(pool.cached))

    @property
    def hit_rate(self) -> float:
        """Fraction of queried prompt tokens served from cache (0.0 with no queries)."""
        return self.hits / self.queries if self.queries else 0.0


@dataclass(slots=True)
class Admissions:
    """Admission counters of one kind (first admissions, or re-admissions after preemption):
    requests admitted, prompt tokens queried, tokens served from cache."""

    requests: int = 0
    queries: int = 0
    hits: int = 0

    def add(self, num_tokens: int, num_hits: int) -> None:
        self.requests += 1
        self.queries += num_tokens
        self.hits += num_hits


@dataclass(frozen=True, slots=True)
class TierCounters:
    """One tier's counters for ``KVCacheManager.tier_stats`` (cumulative, except the sizes).

    ``hit_tokens``: prompt tokens served from this tier at first admissions; ``evictions``:
    blocks dropped from this tier (not moved down); ``offloads``: blocks moved from this tier
    to the next lower one; ``onboard_blocks``: blocks copied from this tier to the device.
    The names are ``worker_pb2.TierStats``'s: ``tier_stats.tier_figures`` copies them by name.
    """

    capacity_blocks: int
    cached_blocks: int
    hit_tokens: int
    evictions: int
    offloads: int
    onboard_blocks: int
