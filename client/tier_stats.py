"""`kvmesh stats`: the workers' KV tiers (the KVBoost monitoring set) as a table.

Input: the ``worker_stats`` dicts (``WorkerService.Stats`` as plain Python, see
``client.convert.worker_stats_dict``) that ``kvmesh stats`` collects, each with ``tiers``
(one dict per enabled tier, ``TierStats``'s fields), ``pinned_blocks`` and
``mean_matched_tokens``. Per worker and tier: load factor (cached / capacity blocks), hit
rate (the tier's hit tokens over the worker's queried prompt tokens), evictions and
offloads (per second when two samples ``window_s`` apart are given), onboards (blocks,
bytes, mean time per block) and the index's precision on that tier (share of the tokens it
promised there that the worker still had there or on a faster tier).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.table import Table


def _rate(now: Mapping[str, Any], before: Mapping[str, Any] | None, key: str,
          window_s: float) -> str:
    if before is None or window_s <= 0:
        return f"{now.get(key, 0):,}"
    return f"{(now.get(key, 0) - before.get(key, 0)) / window_s:,.1f}/s"


def _precision(t: Mapping[str, Any]) -> str:
    promised = t.get("index_promised_tokens", 0)
    if not promised:
        return "-"
    return f"{1 - t.get('index_missed_tokens', 0) / promised:.1%} of {promised:,}"


def _onboard(t: Mapping[str, Any]) -> str:
    blocks = t.get("onboard_blocks", 0)
    if not blocks:
        return "-"
    per_ms = t.get("onboard_seconds", 0.0) * 1e3 / blocks
    return f"{blocks:,} ({t.get('onboard_bytes', 0) / 2**20:,.1f} MiB, {per_ms:.3f} ms/blk)"


def tier_rows(worker_id: str, stats: Mapping[str, Any],
              before: Mapping[str, Any] | None = None, window_s: float = 0.0
              ) -> list[list[str]]:
    """The table rows of one worker's ``worker_stats`` (one per tier; none without tiers).
    ``before``: the same worker's stats ``window_s`` seconds earlier, for per-second rates."""
    queries = (stats.get("cache") or {}).get("queries", 0)
    old = {t["tier"]: t for t in (before or {}).get("tiers", ())}
    rows = []
    for t in stats.get("tiers", ()):
        cap = t.get("capacity_blocks", 0)
        load = t.get("cached_blocks", 0) / cap if cap else 0.0
        prev = old.get(t["tier"]) if before is not None else None
        rows.append([
            worker_id, t["tier"], f"{t.get('cached_blocks', 0):,}/{cap:,} ({load:.0%})",
            f"{t.get('hit_tokens', 0) / queries:.1%}" if queries else "-",
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
