"""Peer KV transfer in the CLI: `kvmesh stats`' figures per worker, `kvmesh route`'s plans.

Input: the ``worker_stats`` dicts ``kvmesh stats`` collects (``WorkerService.Stats`` as plain
Python), each with ``peer`` (``PeerStats``'s fields). A worker that reports no ``peer``
(one that predates peer fetch, or has not fetched) shows zeros; a worker whose stats could
not be read is left out. As receiver: fetches, blocks and bytes pulled, fallbacks to
recompute, prompt tokens served from peer blocks; as source: fetches served, blocks and
bytes sent, fetches refused (ticket, lease or switch). A route candidate's plan reads as
its blocks, tokens, source and estimated time (:func:`plan_cell`).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.table import Table

    from client.results import FetchPlan

FIELDS = ("fetches", "fetched_blocks", "fetched_bytes", "fallbacks", "peer_hit_tokens",
          "served", "served_blocks", "served_bytes", "refused")


def peer_counts(stats: Mapping[str, Any] | None) -> dict[str, int] | None:
    """A worker's peer counters (zeros for those it does not report), its fallbacks by
    reason as ``fallback:<reason>``; None without stats."""
    if stats is None:
        return None
    peer = stats.get("peer") or {}
    counts = {f: int(peer.get(f, 0)) for f in FIELDS}
    for reason, n in sorted((peer.get("fallbacks_by_reason") or {}).items()):
        counts[f"fallback:{reason}"] = int(n)
    return counts


def in_out(stats: Mapping[str, Any] | None) -> str:
    """The ``peer in/out`` cell of the workers table: fetches made / fetches served."""
    counts = peer_counts(stats)
    return "-" if counts is None else f"{counts['fetches']:,}/{counts['served']:,}"


def plan_cell(plan: FetchPlan | None) -> str:
    """A route candidate's fetch plan in one cell ("-": it runs on what it holds)."""
    if plan is None:
        return "-"
    return (f"{plan.blocks} blk ({plan.tokens} tok) from {plan.source_worker_id}, "
            f"~{plan.est_s * 1e3:.1f} ms")


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def peer_table(workers: Sequence[Mapping[str, Any]]) -> Table | None:
    """One row per worker whose stats were read, or None when none were."""
    from rich.table import Table

    table = Table("worker", "fetches", "blocks in", "bytes in", "fallbacks",
                  "peer hit tokens", "served", "blocks out", "bytes out", "refused",
                  title="Peer KV transfer")
    for w in workers:
        c = peer_counts(w.get("worker_stats"))
        if c is None:
            continue
        table.add_row(w["worker_id"], f"{c['fetches']:,}", f"{c['fetched_blocks']:,}",
                      _mib(c["fetched_bytes"]), f"{c['fallbacks']:,}",
                      f"{c['peer_hit_tokens']:,}", f"{c['served']:,}",
                      f"{c['served_blocks']:,}", _mib(c["served_bytes"]), f"{c['refused']:,}")
    return table if table.row_count else None
