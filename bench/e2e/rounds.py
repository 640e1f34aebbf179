"""Rounds of ``kvmesh bench e2e`` (``--rounds N``): every row N times, each round in a
rotated order, each row reported as the median of its rounds.

Why: on a shared 2-core host one saturated run swings by a quarter (a worker that falls
behind once stays behind for the rest of the run), and the row that runs first meets a
colder host than the others. One side-by-side run then ranks close policies by luck.
Rotating the order puts every row in every position; the median row is what the table and
the goals read, and each row keeps its rounds (``rounds``: throughput, mean TTFT and hit
rate per round, in round order) so the spread and the rounds a policy won are printed too.
With one round a row is exactly that run's row.
"""
from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any, TypeVar

T = TypeVar("T")

# the fields of a row (``bench.e2e.summarize``) that are figures: medianed over rounds
FIGURES = ("makespan_s", "tokens_per_s", "output_tokens_per_s", "requests_per_s",
           "mean_ttft_s", "p90_ttft_s", "mean_worker_ttft_s", "token_hit_rate")
# what each round keeps of a row, to show the spread
KEPT = ("tokens_per_s", "mean_ttft_s", "token_hit_rate")


def rotated(items: Sequence[T], round_index: int) -> list[T]:
    """``items`` starting at ``round_index`` (mod their count): round i's running order."""
    if not items:
        return []
    k = round_index % len(items)
    return [*items[k:], *items[:k]]


def median_row(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from the same row's ``rounds`` (in round order): each figure's median, the
    errors and requests summed, the spread of work per worker and the tier hit shares of the
    round whose throughput is the median (the lower one of an even count), and ``rounds``
    (each round's :data:`KEPT` figures). A single round is returned as it is."""
    if len(rounds) == 1:
        return rounds[0]
    by_tps = sorted(rounds, key=lambda r: r["tokens_per_s"])
    middle = by_tps[(len(by_tps) - 1) // 2]
    row = dict(middle)
    for name in FIGURES:
        row[name] = statistics.median(r[name] for r in rounds)
    row["errors"] = sum(r["errors"] for r in rounds)
    row["requests"] = sum(r["requests"] for r in rounds)
    row["rounds"] = [{name: r[name] for name in KEPT} for r in rounds]
    return row


def wins(row: dict[str, Any], other: dict[str, Any]) -> dict[str, int]:
    """In how many rounds ``row`` beat ``other`` (both carry ``rounds``, the same count):
    ``throughput`` (more tokens/s) and ``mean_ttft`` (lower), out of ``rounds``."""
    pairs = list(zip(row.get("rounds", ()), other.get("rounds", ()), strict=True))
    return {"rounds": len(pairs),
            "throughput": sum(a["tokens_per_s"] > b["tokens_per_s"] for a, b in pairs),
            "mean_ttft": sum(a["mean_ttft_s"] < b["mean_ttft_s"] for a, b in pairs)}
