"""The tenant ledger: whom each cached block of each tier is charged to, who is over quota.

A cached block (a device block holding a hash, or a lower-tier entry) is charged to exactly
one tenant, its owner: the tenant of the request that cached it (a hit by another tenant
does not re-charge it; a duplicate is a block of its own and is charged too). Offloaded and
onboarded blocks keep their owner; a peer-imported block is the importing request's tenant's.

:class:`TierLedger` keeps, per tier: ``blocks`` (always equal to a recount of the tier's
charged blocks), the cumulative hit / eviction / moved-down counters, each tenant's quota in
blocks (``floor(fraction * capacity)``; ``None``: no quota) and :attr:`TierLedger.over`, the
tenants with more blocks than their quota, kept at every charge so an eviction finds them in
O(#over) rather than O(#tenants). :class:`TenantLedger` is one manager's ledgers of every
tier plus its admission counters; tenants are kept once seen (``top_tenants`` bounds what is
exported, not what is counted). Pure bookkeeping: it never evicts.

See docs/architecture.md#per-tenant-quotas-the-pool.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from kvmesh.quota import Quotas

from .tenant_stats import TenantCounts, TenantTier

EPS = 1e-9  # 0.29 * 100 is 28.999999999999996 in floats: a quota of 29 blocks is meant


class TierLedger:
    """The tenants of one tier of ``capacity`` blocks (or slots)."""

    def __init__(self, tier: str, capacity: int) -> None:
        self.tier = tier
        self.capacity = capacity
        self.blocks: dict[str, int] = {}     # tenant -> blocks charged now
        self.hits: dict[str, int] = {}       # tenant -> its prompt blocks served from here
        self.evictions: dict[str, int] = {}  # tenant -> its blocks that left the tier...
        self.moved: dict[str, int] = {}      # ...and of those, the ones moved down a tier
        self.over: dict[str, None] = {}      # tenants over quota (a dict: a stable order)
        self.limited = False                 # any quota in force on this tier
        self._quotas = Quotas()
        self._limits: dict[str, int | None] = {}  # tenant -> quota blocks (memo)

    @property
    def quotas(self) -> Quotas:
        """The quotas in force (``Quotas()``: none)."""
        return self._quotas

    def set_quotas(self, quotas: Quotas) -> None:
        """Apply ``quotas`` (rebuilds the over-quota set: O(#tenants))."""
        self._quotas = quotas
        self._limits.clear()
        self.limited = not quotas.empty
        self.over = {t: None for t, n in self.blocks.items() if self._above(t, n)}

    def limit(self, tenant: str) -> int | None:
        """``tenant``'s quota in blocks; ``None``: none."""
        try:
            return self._limits[tenant]
        except KeyError:
            fraction = self._quotas.fraction(tenant, self.tier)
            value = None if fraction is None else math.floor(fraction * self.capacity + EPS)
            self._limits[tenant] = value
            return value

    def _above(self, tenant: str, n: int) -> bool:
        if not self.limited:
            return False
        lim = self.limit(tenant)
        return lim is not None and n > lim

    def at_limit(self, tenant: str, pending: int = 0) -> bool:
        """Whether ``tenant`` has a quota here and holds at least that many blocks, counting
        ``pending`` blocks it is being handed out now (the next block it caches would put it
        over: it evicts its own first)."""
        if not self.limited:
            return False
        lim = self.limit(tenant)
        return lim is not None and self.blocks.get(tenant, 0) + pending >= lim

    def excess(self, tenant: str) -> int:
        """Blocks ``tenant`` holds beyond its quota (for a tenant in :attr:`over`)."""
        lim = self.limit(tenant)
        return self.blocks.get(tenant, 0) - (0 if lim is None else lim)

    def charge(self, tenant: str, n: int = 1) -> None:
        """``n`` blocks of this tier are cached and charged to ``tenant``."""
        held = self.blocks[tenant] = self.blocks.get(tenant, 0) + n
        if self.limited and tenant not in self.over and self._above(tenant, held):
            self.over[tenant] = None

    def uncharge(self, tenant: str, evicted: bool = False) -> None:
        """A block charged to ``tenant`` left this tier (or its hash was dropped); to free
        room if ``evicted`` (see :meth:`evicted`). One call: the pool's hot path."""
        blocks = self.blocks
        blocks[tenant] -= 1
        if evicted:
            evictions = self.evictions
            evictions[tenant] = evictions.get(tenant, 0) + 1
        if self.over and tenant in self.over and not self._above(tenant, blocks[tenant]):
            del self.over[tenant]

    def evicted(self, tenant: str) -> None:
        """A block of ``tenant`` left the tier to free room (dropped or moved down)."""
        evictions = self.evictions
        evictions[tenant] = evictions.get(tenant, 0) + 1

    def moved_down(self, tenant: str) -> None:
        """An eviction :meth:`evicted` counted was a move to the next tier, not a drop."""
        self.moved[tenant] = self.moved.get(tenant, 0) + 1

    def hit(self, tenant: str, n: int) -> None:
        self.hits[tenant] = self.hits.get(tenant, 0) + n

    def clear(self) -> None:
        """Every block left the tier at once (a cache reset): nobody is charged, nobody is
        over quota; cumulative counters stay."""
        for tenant in self.blocks:
            self.blocks[tenant] = 0
        self.over.clear()

    def row(self, tenant: str) -> TenantTier:
        return TenantTier(self.blocks.get(tenant, 0), self.limit(tenant) or 0,
                          self.hits.get(tenant, 0),
                          self.evictions.get(tenant, 0) - self.moved.get(tenant, 0))

    def tenants(self) -> Iterable[str]:
        return (*self.blocks, *self.hits, *self.evictions)


class TenantLedger:
    """Every tier's :class:`TierLedger` of one manager and its per-tenant admissions."""

    def __init__(self, tiers: Iterable[TierLedger]) -> None:
        self.tiers = {t.tier: t for t in tiers}
        self._admitted: dict[str, list[int]] = {}  # tenant -> [requests, prompt, cached]

    def set_quotas(self, quotas: Quotas) -> None:
        for tier in self.tiers.values():
            tier.set_quotas(quotas)

    def admitted(self, tenant: str, prompt_tokens: int, by_tier: Mapping[str, int],
                 block_size: int) -> None:
        """A first admission of ``tenant``'s with ``prompt_tokens`` tokens, ``by_tier`` of
        them served per tier (``KVCacheManager.cached_tokens_by_tier``: its ``gpu`` is the
        device pool's whatever the pool's tier is called; ``peer`` counts as cached only)."""
        row = self._admitted.setdefault(tenant, [0, 0, 0])
        row[0] += 1
        row[1] += prompt_tokens
        row[2] += sum(by_tier.values())
        pool = next(iter(self.tiers))  # the device pool's ledger comes first
        for name, tokens in by_tier.items():
            ledger = self.tiers.get(pool if name == "gpu" else name)
            if ledger is not None and tokens:
                ledger.hit(tenant, tokens // block_size)

    def stats(self) -> dict[str, TenantCounts]:
        """One :class:`TenantCounts` per tenant ever seen, with a row per tier; fresh
        objects (the caller may change them)."""
        names = dict.fromkeys(self._admitted)
        for tier in self.tiers.values():
            names.update(dict.fromkeys(tier.tenants()))
        out: dict[str, TenantCounts] = {}
        for name in names:
            requests, prompt, cached = self._admitted.get(name, (0, 0, 0))
            out[name] = TenantCounts(name, requests, prompt, cached,
                                     {t: ledger.row(name) for t, ledger in self.tiers.items()})
        return out
