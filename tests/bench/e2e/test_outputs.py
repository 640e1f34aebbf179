"""``bench.e2e.outputs``: every row's outputs against the first row's; fetch ratios, goals."""
from __future__ import annotations

import pytest

from bench.e2e.outputs import compare, fetch_goals, fetch_ratios


def test_rows_are_compared_request_by_request_with_the_first_rows_first_round() -> None:
    ref = {0: [1, 2], 1: [3, 4], 2: [5, 6]}
    got = compare({"kvmesh+fetch": [ref, {0: [1, 2], 1: [3, 9]}],
                   "kvmesh": [{0: [1, 2], 2: [5, 6], 7: [0]}],   # 7: not answered in ref
                   "round_robin": [{0: [2, 1], 1: [3, 4], 2: [5, 6]}]})
    assert got == {"kvmesh+fetch": {"compared": 5, "mismatches": 1},
                   "kvmesh": {"compared": 2, "mismatches": 0},
                   "round_robin": {"compared": 3, "mismatches": 1}}
    assert compare({}) == {}


def _row(name: str, tps: float, mean: float, p90: float) -> dict:
    return {"policy": name, "tokens_per_s": tps, "mean_ttft_s": mean, "p90_ttft_s": p90}


def test_each_fetch_row_is_set_against_its_row_without_fetch() -> None:
    rows = [_row("kvmesh+fetch", 300.0, 0.5, 1.0), _row("kvmesh", 200.0, 1.0, 3.0),
            _row("round_robin", 100.0, 2.0, 4.0), _row("kvmesh+cpu+fetch", 1.0, 1.0, 1.0)]
    ratios = fetch_ratios(rows)
    assert ratios == {"kvmesh+fetch": {"throughput": pytest.approx(1.5),
                                       "mean_ttft_lower": pytest.approx(2.0),
                                       "p90_ttft_lower": pytest.approx(3.0)}}
    goals = fetch_goals(ratios)
    assert [met for _, met in goals] == [True, True]
    assert "3.00x" in goals[0][0] and "1.50x" in goals[1][0]
    slow = fetch_goals(fetch_ratios([_row("kvmesh+fetch", 210.0, 1.0, 2.5),
                                     _row("kvmesh", 200.0, 1.0, 3.0)]))
    assert [met for _, met in slow] == [False, False]
