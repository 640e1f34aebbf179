"""The figures of ``kvmesh bench tenants``: per run and tenant, the victims pooled, the goals.

A run's tenant row: requests sent, completed (answered without an error), token hit rate
(prompt tokens the worker served from its cache over prompt tokens, completed requests
only), mean and p90 TTFT (client side: send to first streamed token), and throughput
(completed requests, and prompt + output tokens, per second of the run's makespan: its
start to its last completion). ``victims`` pools every well-behaved tenant's requests.

The goals compare the runs (see docs/architecture.md#per-tenant-quotas-the-benchmark):
(a) the victims' pooled hit rate under the flood with quotas over theirs without the flood,
>= :data:`HIT_KEPT_GOAL` (the same without quotas is reported beside it); (b) the flood's
completed requests per second with quotas over without, >= :data:`FLOOD_GOAL`; (c) the
victims' mean TTFT under the flood over without it, with and without quotas: the second
ratio over the first, >= :data:`TTFT_GOAL`.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.tenants.workload import FLOOD

NO_FLOOD, FLOODED, QUOTAS = "no-flood", "flood", "flood+quotas"
RUNS = (NO_FLOOD, FLOODED, QUOTAS)
VICTIMS = "victims"  # the pooled row of every well-behaved tenant
HIT_KEPT_GOAL, FLOOD_GOAL, TTFT_GOAL = 0.9, 0.8, 2.0


@dataclass(frozen=True)
class Outcome:
    """One request's end: ``ttft_s`` is NaN and ``error`` set when it failed."""

    tenant: str
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    ttft_s: float
    done_s: float    # completion (or failure) time since the run's start
    error: str = ""


def p90(values: Sequence[float]) -> float:
    """The nearest-rank 90th percentile (NaN when empty)."""
    s = sorted(values)
    return s[max(0, math.ceil(0.9 * len(s)) - 1)] if s else math.nan


def row(outcomes: Iterable[Outcome], makespan_s: float) -> dict[str, Any]:
    """One tenant's (or the pooled victims') figures in a run (the module docstring)."""
    all_ = list(outcomes)
    ok = [o for o in all_ if not o.error]
    ttft = [o.ttft_s for o in ok]
    prompt = sum(o.prompt_tokens for o in ok)
    return {
        "requests": len(all_), "completed": len(ok), "errors": len(all_) - len(ok),
        "token_hit_rate": sum(o.cached_tokens for o in ok) / prompt if prompt else 0.0,
        "mean_ttft_s": statistics.fmean(ttft) if ttft else math.nan,
        "p90_ttft_s": p90(ttft),
        "requests_per_s": len(ok) / makespan_s if makespan_s > 0 else 0.0,
        "tokens_per_s": (prompt + sum(o.output_tokens for o in ok)) / makespan_s
        if makespan_s > 0 else 0.0,
    }


def run_rows(outcomes: Sequence[Outcome]) -> dict[str, dict[str, Any]]:
    """A run's rows: each tenant's (by name, sorted, the flood last), then ``victims``."""
    makespan = max((o.done_s for o in outcomes), default=0.0)
    names = sorted({o.tenant for o in outcomes}, key=lambda n: (n == FLOOD, n))
    out = {n: row((o for o in outcomes if o.tenant == n), makespan) for n in names}
    out[VICTIMS] = row((o for o in outcomes if o.tenant != FLOOD), makespan)
    return out


def _over(a: float, b: float) -> float:
    return a / b if b else (math.inf if a else math.nan)


def goals(runs: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """The goal figures and verdicts from the three runs' rows (:func:`run_rows` each)."""
    v = {name: runs[name][VICTIMS] for name in RUNS}
    base_hit, base_ttft = v[NO_FLOOD]["token_hit_rate"], v[NO_FLOOD]["mean_ttft_s"]
    ttft_quota = _over(v[QUOTAS]["mean_ttft_s"], base_ttft)
    ttft_noquota = _over(v[FLOODED]["mean_ttft_s"], base_ttft)
    out: dict[str, Any] = {
        "victim_hit_kept_quota": _over(v[QUOTAS]["token_hit_rate"], base_hit),
        "victim_hit_kept_noquota": _over(v[FLOODED]["token_hit_rate"], base_hit),
        "flood_throughput_ratio": _over(runs[QUOTAS][FLOOD]["requests_per_s"],
                                        runs[FLOODED][FLOOD]["requests_per_s"]),
        "victim_ttft_ratio_quota": ttft_quota,
        "victim_ttft_ratio_noquota": ttft_noquota,
        "ttft_improvement": _over(ttft_noquota, ttft_quota),
    }
    out["goal_hit_kept"] = out["victim_hit_kept_quota"] >= HIT_KEPT_GOAL
    out["goal_flood_throughput"] = out["flood_throughput_ratio"] >= FLOOD_GOAL
    out["goal_ttft"] = out["ttft_improvement"] >= TTFT_GOAL
    return out


def finite(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float made ``None`` (strict JSON: a tenant with
    nothing completed has no TTFT; a ratio over zero has no value)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj


def goal_lines(g: Mapping[str, Any]) -> list[tuple[str, bool, str]]:
    """(goal, met, figures) for the table's footer."""
    return [
        (f"victims keep >= {HIT_KEPT_GOAL:.0%} of their no-flood hit rate with quotas",
         g["goal_hit_kept"], f"{g['victim_hit_kept_quota']:.1%} kept with quotas, "
         f"{g['victim_hit_kept_noquota']:.1%} without"),
        (f"the flood keeps >= {FLOOD_GOAL:.1f}x its throughput with quotas",
         g["goal_flood_throughput"], f"{g['flood_throughput_ratio']:.2f}x"),
        (f"victims' TTFT ratio flood/no-flood >= {TTFT_GOAL:.0f}x better with quotas",
         g["goal_ttft"], f"{g['victim_ttft_ratio_noquota']:.2f}x without quotas, "
         f"{g['victim_ttft_ratio_quota']:.2f}x with: {g['ttft_improvement']:.2f}x better"),
    ]


def print_table(runs: Mapping[str, Mapping[str, Mapping[str, Any]]], g: Mapping[str, Any],
                title: str, console: Any) -> None:
    """The side-by-side table (a row per run and tenant), then the goals."""
    from rich.table import Table

    table = Table(title=title)
    for col in ("run", "tenant", "done/sent", "hit rate", "mean TTFT ms", "p90 TTFT ms",
                "req/s", "tokens/s"):
        table.add_column(col, justify="left" if col in ("run", "tenant") else "right")
    for name, rows in runs.items():
        for tenant, r in rows.items():
            table.add_row(name, f"[b]{tenant}[/]" if tenant == VICTIMS else tenant,
                          f"{r['completed']}/{r['requests']}", f"{r['token_hit_rate']:.1%}",
                          f"{r['mean_ttft_s'] * 1e3:.1f}", f"{r['p90_ttft_s'] * 1e3:.1f}",
                          f"{r['requests_per_s']:.2f}", f"{r['tokens_per_s']:,.0f}")
        table.add_section()
    console.print(table)
    for goal, met, detail in goal_lines(g):
        console.print(f"  {'[green]met[/]' if met else '[red]MISSED[/]'}  {goal}: {detail}")
