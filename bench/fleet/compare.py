"""`kvmesh bench fleet --shards 1,3`: fleet runs over one server and over a cluster, side by
side, and how each shard's Redis time per operation compares with the one server's.

The ratios divide per-operation costs, not rates, so they do not depend on how many cores
the host has: Redis time is ``INFO commandstats`` (time inside commands, per node; a
command a script runs is counted twice, under its name and in the script's time) and, beside
it, each server process's CPU time; the service's is its process CPU. With several runs of
one shard count (``--shards 1,3,1,3``, alternating against drift on a shared host) each
figure is the median over them.
"""
from __future__ import annotations

from statistics import median
from typing import Any

__all__ = ["compare", "print_comparison"]


def _busiest(res: dict[str, Any], key: str) -> float:
    return max(res[key])


def _ctl_per_batch(res: dict[str, Any]) -> float:
    """Redis microseconds per batch the control slot's shard spends beyond the mean of
    the others in the events phase (its begin and end steps); 0 on one server."""
    xs, ctl = res["usec_per_entry"], res["control_shard"]
    if len(xs) < 2:
        return 0.0
    others = [x for i, x in enumerate(xs) if i != ctl]
    ev = next(p for p in res["phases"] if p["phase"] == "events")
    per_batch = ev["entries"] / max(ev["batches"], 1)
    return (xs[ctl] - sum(others) / len(others)) * per_batch


def _summary(runs: list[dict[str, Any]]) -> dict[str, float]:
    def med(f: Any) -> float:
        return median(f(r) for r in runs)

    def entries_per_batch(r: dict[str, Any]) -> float:
        ev = next(p for p in r["phases"] if p["phase"] == "events")
        return ev["entries"] / max(ev["batches"], 1)

    return {"runs": len(runs),
            "apply_usec_busiest": med(lambda r: _busiest(r, "usec_per_entry")),
            "apply_usec_total": med(lambda r: sum(r["usec_per_entry"])),
            "apply_cpu_busiest": med(lambda r: _busiest(r, "cpu_usec_per_entry")),
            "apply_cpu_total": med(lambda r: sum(r["cpu_usec_per_entry"])),
            "lookup_usec_busiest": med(lambda r: _busiest(r, "usec_per_route")),
            "lookup_usec_total": med(lambda r: sum(r["usec_per_route"])),
            "lookup_cpu_busiest": med(lambda r: _busiest(r, "cpu_usec_per_route")),
            "lookup_cpu_total": med(lambda r: sum(r["cpu_usec_per_route"])),
            "service_usec_per_route": med(lambda r: r["service_usec_per_route"]),
            "service_usec_per_entry": med(lambda r: r["service_usec_per_entry"]),
            "entries_per_batch": med(entries_per_batch),
            "control_usec_per_batch": med(_ctl_per_batch)}


def compare(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per shard count, the medians of its runs; and the largest shard count's busiest
    shard against the smallest's (the single server when it is 1)."""
    by: dict[int, list[dict[str, Any]]] = {}
    for r in results:
        by.setdefault(r["config"]["shards"], []).append(r)
    base_n, top_n = min(by), max(by)
    base, top = _summary(by[base_n]), _summary(by[top_n])
    return {"summary": {str(n): _summary(rs) for n, rs in sorted(by.items())},
            "base_shards": base_n, "shards": top_n,
            "busiest_shard_apply_ratio": top["apply_usec_busiest"] / base["apply_usec_total"],
            "busiest_shard_lookup_ratio": top["lookup_usec_busiest"] / base["lookup_usec_total"],
            "route_cpu_ratio": top["service_usec_per_route"] / base["service_usec_per_route"],
            "total_apply_ratio": top["apply_usec_total"] / base["apply_usec_total"],
            "total_lookup_ratio": top["lookup_usec_total"] / base["lookup_usec_total"],
            # the same from each server process's CPU time (commandstats counts a command
            # run inside a script twice: under its own name and in the script's time)
            "busiest_shard_apply_cpu_ratio": top["apply_cpu_busiest"] / base["apply_cpu_total"],
            "busiest_shard_lookup_cpu_ratio":
                top["lookup_cpu_busiest"] / base["lookup_cpu_total"],
            "runs": results}


def print_comparison(cmp: dict[str, Any]) -> None:
    """The side-by-side table and the ratios (what ``--json`` prints as one object)."""
    rows = cmp["summary"]
    names = list(rows)
    print(f"{'shards':<34}" + "".join(f"{n:>12}" for n in names))
    for key, label, digits in (
            ("runs", "runs", 0),
            ("entries_per_batch", "entries per batch (events phase)", 1),
            ("apply_usec_busiest", "Redis us per entry, busiest shard", 2),
            ("apply_usec_total", "Redis us per entry, all shards", 2),
            ("control_usec_per_batch", "control shard's extra us per batch", 1),
            ("apply_cpu_busiest", "Redis CPU us per entry, busiest", 2),
            ("apply_cpu_total", "Redis CPU us per entry, all", 2),
            ("lookup_usec_busiest", "Redis us per route, busiest shard", 1),
            ("lookup_usec_total", "Redis us per route, all shards", 1),
            ("lookup_cpu_busiest", "Redis CPU us per route, busiest", 1),
            ("lookup_cpu_total", "Redis CPU us per route, all", 1),
            ("service_usec_per_entry", "service CPU us per entry", 2),
            ("service_usec_per_route", "service CPU us per route", 1)):
        print(f"{label:<34}" + "".join(f"{rows[n][key]:>12,.{digits}f}" for n in names))
    s, b = cmp["shards"], cmp["base_shards"]
    print(f"{s} shards against {b}: busiest shard per entry "
          f"{cmp['busiest_shard_apply_ratio']:.2f}x (goal <= 0.4), per route "
          f"{cmp['busiest_shard_lookup_ratio']:.2f}x (goal <= 0.4); "
          f"service CPU per route {cmp['route_cpu_ratio']:.2f}x (goal <= 1.2); all shards "
          f"per entry {cmp['total_apply_ratio']:.2f}x, per route {cmp['total_lookup_ratio']:.2f}x; "
          f"by process CPU, busiest shard per entry {cmp['busiest_shard_apply_cpu_ratio']:.2f}x, "
          f"per route {cmp['busiest_shard_lookup_cpu_ratio']:.2f}x")
