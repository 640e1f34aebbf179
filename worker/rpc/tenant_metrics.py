"""Per-tenant Prometheus metrics of one worker: bounded labels, counters that never go back.

Families (labels ``worker_id``, ``tenant`` and, per tier, ``tier``; counters end in ``_total``
on the page):

- gauges ``kvmesh_worker_tenant_cached_blocks{tier}``, ``kvmesh_worker_tenant_quota_blocks
  {tier}`` (0: no quota);
- counters ``kvmesh_worker_tenant_hit_blocks{tier}``, ``kvmesh_worker_tenant_evicted_blocks
  {tier}``, ``kvmesh_worker_tenant_requests``, ``kvmesh_worker_tenant_prompt_tokens``,
  ``kvmesh_worker_tenant_cached_tokens``.

The label rule, computed at each scrape: the ``tenant`` values are those of
``top_tenants`` (the ``TOP_TENANTS`` largest by cached blocks, then prompt tokens, then
name; every other tenant under ``kvmesh.quota.OTHER``), the same rows ``WorkerService.Stats``
answers. One scrape therefore never shows more than ``TOP_TENANTS + 1`` tenant values, however
many tenants the worker has seen.

Counters stay monotonic per label although a tenant may move in and out of the top: each
scrape reads every tenant's cumulative counts, and adds what grew since the previous scrape
to the label the tenant has *now* (:class:`TenantSeries`). A label's counter is thus the sum
of the increments seen under it; a tenant leaving the top stops being exported (its series
goes stale in Prometheus) and resumes from the same total if it comes back. What grew
between two scrapes is credited to the label at the later one.

See docs/architecture.md#per-tenant-quotas-seeing-them.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from kvmesh.quota import OTHER, TOP_TENANTS
from worker.kv_cache.tenant_stats import TenantCounts, TenantTier, top_tenants

PREFIX = "kvmesh_worker_tenant_"
# (name, help) of the per-tier families: gauges read now, counters summed per label
TIER_GAUGES = (("cached_blocks", "Cached blocks charged to the tenant in the tier."),
               ("quota_blocks", "The tenant's quota in the tier, in blocks (0: none)."))
TIER_COUNTERS = (("hit_blocks", "The tenant's prompt blocks served from the tier."),
                 ("evicted_blocks", "The tenant's blocks dropped from the tier (not moved "
                                    "down)."))
TENANT_COUNTERS = (("requests", "The tenant's requests admitted."),
                   ("prompt_tokens", "The tenant's prompt tokens."),
                   ("cached_tokens", "The tenant's prompt tokens served from a cache (any "
                                     "tier or a peer)."))
_FIELD = {"cached_blocks": "blocks"}  # metric name -> TenantTier field, where they differ

Key = tuple[str, str]  # (counter name, tier; "" for a per-tenant counter)
T = TypeVar("T")


def _counters(c: TenantCounts) -> dict[Key, int]:
    out = {(name, ""): getattr(c, name) for name, _ in TENANT_COUNTERS}
    for tier, t in c.tiers.items():
        out.update({(name, tier): getattr(t, _FIELD.get(name, name)) for name, _ in
                    TIER_COUNTERS})
    return out


class TenantSeries:
    """The exported counters per tenant label (see the module docstring). Thread-safe: the
    HTTP server may scrape from several threads."""

    def __init__(self, n: int = TOP_TENANTS) -> None:
        self.n = n
        self._lock = threading.Lock()
        self._last: dict[str, dict[Key, int]] = {}    # tenant -> counts at the last scrape
        self._totals: dict[str, dict[Key, int]] = {}  # label -> exported counter values

    def update(self, counts: Mapping[str, TenantCounts]
               ) -> list[tuple[TenantCounts, dict[Key, int]]]:
        """Credit what every tenant of ``counts`` (cumulative, as the manager keeps them)
        did since the last call to its label now; the rows to export: each of
        ``top_tenants`` with its label's counter totals. A count that went down (a manager
        that forgot a tenant) credits nothing and is the new starting point."""
        rows = top_tenants(counts, self.n)
        labelled = {c.tenant for c in rows} - {OTHER}
        with self._lock:
            last, self._last = self._last, {}
            for tenant, c in counts.items():
                now = self._last[tenant] = _counters(c)
                before = last.get(tenant, {})
                totals = self._totals.setdefault(tenant if tenant in labelled else OTHER, {})
                for key, value in now.items():
                    grew = value - before.get(key, 0)
                    if grew > 0:
                        totals[key] = totals.get(key, 0) + grew
            return [(c, dict(self._totals.get(c.tenant, {}))) for c in rows]


def tenant_families(series: TenantSeries, counts: Mapping[str, TenantCounts],
                    tiers: Sequence[str], worker_id: str) -> Iterator[Metric]:
    """The families above for one scrape of ``counts`` (``tiers``: the enabled ones,
    fastest first: a tenant gets a sample in each, zero where it has nothing)."""
    rows = series.update(counts)
    per_tier = ["worker_id", "tenant", "tier"]
    for name, doc in TIER_GAUGES:
        g = GaugeMetricFamily(PREFIX + name, doc, labels=per_tier)
        for c, _ in rows:
            for tier in tiers:
                t = c.tiers.get(tier) or TenantTier()
                g.add_metric([worker_id, c.tenant, tier], getattr(t, _FIELD.get(name, name)))
        yield g
    for name, doc in TIER_COUNTERS:
        m = CounterMetricFamily(PREFIX + name, doc, labels=per_tier)
        for c, totals in rows:
            for tier in tiers:
                m.add_metric([worker_id, c.tenant, tier], totals.get((name, tier), 0))
        yield m
    for name, doc in TENANT_COUNTERS:
        m = CounterMetricFamily(PREFIX + name, doc, labels=["worker_id", "tenant"])
        for c, totals in rows:
            m.add_metric([worker_id, c.tenant], totals.get((name, ""), 0))
        yield m


def read_racing(fn: Callable[[], T], tries: int = 5) -> T:
    """``fn()`` from a thread other than the engine's: a dict the engine thread resizes
    meanwhile raises ``RuntimeError``; retried, the next read is almost always clean."""
    for _ in range(tries - 1):
        try:
            return fn()
        except RuntimeError:
            continue
    return fn()
