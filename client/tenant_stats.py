"""`kvmesh stats --tenants`: every tenant's requests, hit rate, blocks and evictions, summed
over the workers.

Input: the ``worker_stats`` dicts ``kvmesh stats`` collects (``WorkerService.Stats`` as plain
Python), each with ``tenants`` (``TenantStats``'s fields, ``tiers`` one dict per enabled
tier). Each worker reports its ``TOP_TENANTS`` largest tenants and sums the rest as
``kvmesh.quota.OTHER``, so a tenant's row here sums the workers where it is among the
largest; what it did elsewhere is in ``(other)``. A worker that reports no tenants (one that
predates quotas) or whose stats could not be read adds nothing.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kvmesh.contract import TIERS
from kvmesh.quota import OTHER

if TYPE_CHECKING:
    from rich.table import Table

COUNTS = ("requests", "prompt_tokens", "cached_tokens")
TIER_COUNTS = ("blocks", "quota_blocks", "hit_blocks", "evicted_blocks")


def tenant_totals(workers: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One dict per tenant (``TenantStats``'s fields plus ``workers``: how many reported it;
    ``tiers``: tier -> summed counts, only tiers some worker reported), largest first (gpu
    blocks, then prompt tokens, then name), ``(other)`` last."""
    rows: dict[str, dict[str, Any]] = {}
    for w in workers:
        for t in (w.get("worker_stats") or {}).get("tenants") or ():
            row = rows.setdefault(t["tenant"], {"tenant": t["tenant"], "workers": 0,
                                                **dict.fromkeys(COUNTS, 0), "tiers": {}})
            row["workers"] += 1
            for f in COUNTS:
                row[f] += int(t.get(f, 0))
            for tier in t.get("tiers") or ():
                into = row["tiers"].setdefault(tier["tier"], dict.fromkeys(TIER_COUNTS, 0))
                for f in TIER_COUNTS:
                    into[f] += int(tier.get(f, 0))

    def order(r: dict[str, Any]) -> tuple[bool, int, int, str]:
        gpu = r["tiers"].get(TIERS[0], {}).get("blocks", 0)
        return r["tenant"] == OTHER, -gpu, -r["prompt_tokens"], r["tenant"]

    return sorted(rows.values(), key=order)


def _blocks(row: Mapping[str, Any], tier: str) -> str:
    """``blocks / quota`` of one tier (just the blocks without a quota; "-": not reported)."""
    t = row["tiers"].get(tier)
    if t is None:
        return "-"
    return f"{t['blocks']:,} / {t['quota_blocks']:,}" if t["quota_blocks"] else f"{t['blocks']:,}"


def tenant_cells(row: Mapping[str, Any]) -> list[str]:
    """One table row: tenant, requests, prompt tokens, hit rate, each tier's cached blocks
    (and quota, both summed over the workers), evictions (blocks dropped from any tier)."""
    prompt = row["prompt_tokens"]
    hit = f"{row['cached_tokens'] / prompt:.1%}" if prompt else "-"
    evicted = sum(t["evicted_blocks"] for t in row["tiers"].values())
    return [row["tenant"], f"{row['requests']:,}", f"{prompt:,}", hit,
            *(_blocks(row, tier) for tier in TIERS), f"{evicted:,}"]


def tenant_table(rows: Sequence[Mapping[str, Any]]) -> Table:
    """:func:`tenant_totals` as a table (an empty one says so in its caption)."""
    from rich.table import Table

    table = Table("tenant", title="Tenants (summed over workers)")
    for head in ("requests", "prompt tokens", "hit rate", *(f"{t} / quota" for t in TIERS),
                 "evictions"):
        table.add_column(head, justify="right")
    for row in rows:
        table.add_row(*tenant_cells(row))
    table.caption = ("no worker reported tenants" if not rows else
                     f"each worker reports its largest tenants; the rest are {OTHER}")
    return table
