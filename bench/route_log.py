"""What a router did, from its route log (``service.route_log``): how often it left the
holder of a prefix, why, and on how stale a load.

The holder is the candidate holding the most blocks of the prompt; the reason for leaving it
is the group of cost terms whose excess over the chosen worker's is largest (``queue``,
``load``, ``wait``, ``evict``, ``tie``, ``other``, ``no terms``).

See docs/architecture.md#end-to-end-and-serving-benches.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

STALE_MS = 100
REASONS = ("queue", "load", "wait", "evict", "tie", "other", "no terms")
_GROUPS = {"queue": ("queue",), "load": ("decode", "running"), "wait": ("wait",),
           "evict": ("evict",)}


def read(directory: str | Path) -> list[dict[str, Any]]:
    """Every record of the ``*.jsonl`` files under ``directory`` (one per service replica),
    in time order."""
    records = []
    for path in sorted(Path(directory).glob("*.jsonl")):
        with open(path) as f:
            records += [json.loads(line) for line in f if line.strip()]
    records.sort(key=lambda r: r["t_ms"])
    return records


def _blocks(cand: dict[str, Any]) -> int:
    m = cand["matched"]
    return m["gpu"] + m["cpu"] + m["disk"]


def reason(holder: dict[str, Any], chosen: dict[str, Any]) -> str:
    """Why ``chosen`` won over ``holder`` (see the module docstring)."""
    if "terms" not in holder or "terms" not in chosen:
        return "no terms"
    if math.isclose(holder["cost"], chosen["cost"], rel_tol=1e-9, abs_tol=1e-9):
        return "tie"
    excess = {g: sum(holder["terms"].get(t, 0.0) - chosen["terms"].get(t, 0.0) for t in names)
              for g, names in _GROUPS.items()}
    group, most = max(excess.items(), key=lambda kv: kv[1])
    return group if most > 0 else "other"


def _quantile(values: list[float], q: float) -> float | None:
    """Nearest rank (as the benches' p90): ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(math.ceil(q * len(ordered)) - 1, 0))]


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The analysis of ``records`` (see the module docstring); shares are of all decisions
    (``left_holder``) or of the decisions that left the holder (``why``, ``stale_left``)."""
    routes = len(records)
    left = 0
    why: Counter[str] = Counter()
    stale = 0
    given_up = 0
    ages: list[float] = []
    chosen_ages: list[float] = []
    for rec in records:
        cands = rec["candidates"]
        if not cands:
            continue
        ages += [c["load_age_ms"] for c in cands if c.get("load_age_ms") is not None]
        chosen = cands[0]
        if chosen.get("load_age_ms") is not None:
            chosen_ages.append(chosen["load_age_ms"])
        most = max(_blocks(c) for c in cands)
        if _blocks(chosen) >= most:
            continue
        holder = next(c for c in cands if _blocks(c) == most)
        left += 1
        given_up += most - _blocks(chosen)
        why[reason(holder, chosen)] += 1
        if (chosen.get("load_age_ms") or 0) > STALE_MS:
            stale += 1
    return {
        "routes": routes,
        "left_holder": left,
        "left_holder_share": left / routes if routes else 0.0,
        "why": {r: why[r] for r in REASONS if why[r]},
        "blocks_given_up_mean": given_up / left if left else 0.0,
        "load_age_ms": {"p50": _quantile(ages, 0.5), "p90": _quantile(ages, 0.9)},
        "chosen_load_age_ms": {"p50": _quantile(chosen_ages, 0.5),
                               "p90": _quantile(chosen_ages, 0.9)},
        "stale_left": stale,
        "stale_left_share": stale / left if left else 0.0,
    }


def describe(label: str, s: dict[str, Any]) -> str:
    """One paragraph of :func:`summarize`'s figures, for the bench's output."""
    if not s["routes"]:
        return f"{label}: no routes logged"
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f}"

    why = ", ".join(f"{r} {n / s['left_holder']:.0%}" for r, n in s["why"].items())
    age, chosen = s["load_age_ms"], s["chosen_load_age_ms"]
    return (f"{label}: {s['routes']} routes; left the holder in {s['left_holder']} "
            f"({s['left_holder_share']:.1%}){f' - why: {why}' if why else ''}; "
            f"{s['blocks_given_up_mean']:.1f} blocks given up per leave; load age p50 "
            f"{ms(age['p50'])} ms, p90 {ms(age['p90'])} ms (chosen: p50 {ms(chosen['p50'])}, "
            f"p90 {ms(chosen['p90'])}); left for a load older than {STALE_MS} ms: "
            f"{s['stale_left']} ({s['stale_left_share']:.0%} of the leaves)")
