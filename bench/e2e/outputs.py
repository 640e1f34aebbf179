"""Outputs identical across the rows of ``kvmesh bench e2e``, and the peer fetch's ratios.

Every row sends the same seeded requests, greedy (temperature 0), so a request's generated
token ids must be the same in every row, whether its prefix was recomputed, found in a local
tier or fetched from a peer. Each row records them by the request's index in the stream
(``outputs``); :func:`compare` checks every row (every round) against the first row's
first round and reports how many requests both answered (``compared``) and how many of
those differ (``mismatches``: 0 or a bug).
"""
from __future__ import annotations

from typing import Any

from bench.e2e.rows import FETCH


def compare(outputs: dict[str, list[dict[int, list[int]]]]) -> dict[str, dict[str, int]]:
    """Row label -> ``{"compared": n, "mismatches": m}`` against the reference (the first
    row's first round; itself included, for its later rounds)."""
    if not outputs:
        return {}
    ref = next(iter(outputs.values()))[0]
    out = {}
    for label, rounds in outputs.items():
        compared = mismatches = 0
        for answers in rounds:
            for index, tokens in answers.items():
                if index in ref:
                    compared += 1
                    mismatches += tokens != ref[index]
        out[label] = {"compared": compared, "mismatches": mismatches}
    return out


def fetch_ratios(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each ``X+fetch`` row over its ``X`` row: throughput (times higher) and mean and p90
    TTFT (times lower). Empty without such pairs."""
    by = {r["policy"]: r for r in rows}
    out = {}
    for label, r in by.items():
        base = by.get(label.removesuffix(FETCH)) if label.endswith(FETCH) else None
        if base is None:
            continue
        out[label] = {"throughput": r["tokens_per_s"] / base["tokens_per_s"],
                      "mean_ttft_lower": base["mean_ttft_s"] / r["mean_ttft_s"],
                      "p90_ttft_lower": base["p90_ttft_s"] / r["p90_ttft_s"]}
    return out


def fetch_goals(ratios: dict[str, dict[str, float]]) -> list[tuple[str, bool]]:
    """Issue 26's goals for kvmesh with fetch over kvmesh without: p90 TTFT >= 1.5x lower,
    throughput >= 1.2x."""
    out = []
    for label, ra in ratios.items():
        base = label.removesuffix(FETCH)
        out.append((f"{label} p90 TTFT >= 1.5x lower than {base} "
                    f"({ra['p90_ttft_lower']:.2f}x)", ra["p90_ttft_lower"] >= 1.5))
        out.append((f"{label} throughput >= 1.2x {base} ({ra['throughput']:.2f}x)",
                    ra["throughput"] >= 1.2))
    return out
