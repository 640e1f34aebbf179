"""`kvmesh stats`: the workers' KV tiers (the KVBoost monitoring set) as a table.

Input: the ``worker_stats`` dicts (``WorkerService.Stats`` as plain Python, see
``client.convert.worker_stats_dict``) that ``kvmesh stats`` collects, each with ``tiers``
(one dict per enabled tier, ``TierStats``'s fields), ``pinned_blocks`` and
``mean_matched_tokens``. Per worker and tier: load factor, hit rate, evictions and offloads
(per second when two samples ``window_s`` apart are given), onboards (blocks, bytes, mean
time per block) and the index's precision on that tier. Each tier dict is read back into
its ``TierStats``; the figures it implies are ``kvmesh.tier_figures``' (the worker's
Prometheus page derives them there too).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kvmesh.tier_figures import (
    TierStats,
    hit_rate,
    kept_share,
    load_factor,
    onboard_s_per_block,
    tier_stats,
)

if TYPE_CHECKING:
    from rich.table import Table


def _rate(now: TierStats, before: TierStats | None, field: str, window_s: float) -> str:
    if before is None or window_s <= 0:
        return f"{getattr(now, field):,}"
    return f"{(getattr(now, field) - getattr(before, field)) / window_s:,.1f}/s"


def _precision(t: TierStats) -> str:
    kept = kept_share(t)
    return "-" if kept is None else f"{kept:.1%} of {t.index_promised_tokens:,}"


def _onboard(t: TierStats) -> str:
    per_s = onboard_s_per_block(t)
    if per_s is None:
        return "-"
    return (f"{t.onboard_blocks:,} ({t.onboard_bytes / 2**20:,.1f} MiB, "
            f"{per_s * 1e3:.3f} ms/blk)")


def tier_rows(worker_id: str, stats: Mapping[str, Any],
              before: Mapping[str, Any] | None = None, window_s: float = 0.0
              ) -> list[list[str]]:
    """The table rows of one worker's ``worker_stats`` (one per tier; none without tiers).
    ``before``: the same worker's stats ``window_s`` seconds earlier, for per-second rates."""
    queries = (stats.get("cache") or {}).get("queries", 0)
    old = {t.tier: t for t in map(tier_stats, (before or {}).get("tiers", ()))}
    rows = []
    for t in map(tier_stats, stats.get("tiers", ())):
        prev = old.get(t.tier) if before is not None else None
        rows.append([
            worker_id, t.tier,
            f"{t.cached_blocks:,}/{t.capacity_blocks:,} ({load_factor(t):.0%})",
            f"{hit_rate(t, queries):.1%}" if queries else "-",
            _rate(t, prev, "evictions", window_s), _rate(t, prev, "offloads", window_s),
            _onboard(t), _precision(t)])
    return rows


def tier_table(workers: Sequence[Mapping[str, Any]], window_s: float = 0.0) -> Table | None:
    """One table over every live worker's tiers, or None when no worker reported any.
    Each worker dict carries ``worker_stats`` (and ``worker_stats_before`` with a window)."""
    from rich.table import Table

    per = " per s" if window_s > 0 else ""
    table = Table("worker", "tier", "cached/capacity", "hit rate", f"evictions{per}",
                  f"offloads{per}", "onboarded", "index precision", title="KV tiers")
    for w in workers:
        ws = w.get("worker_stats")
        for row in tier_rows(w["worker_id"], ws or {}, w.get("worker_stats_before"),
                             window_s):
            table.add_row(*row)
    if not table.row_count:
        return None
    table.caption = "; ".join(
        f"{w['worker_id']}: {w['worker_stats'].get('pinned_blocks', 0)} pinned blocks, mean "
        f"matched prefix {w['worker_stats'].get('mean_matched_tokens', 0.0):,.0f} tokens"
        for w in workers if w.get("worker_stats"))
    return table
