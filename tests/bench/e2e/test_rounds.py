"""``bench.e2e.rounds``: rotated running order, the median row, the rounds won; and a
two-round run on a real cluster with its route logs pooled."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench import e2e
from bench.e2e.report import spread
from bench.e2e.rounds import median_row, rotated, wins
from bench.workload import WorkloadSpec


def _row(policy: str, tps: float, ttft: float, hit: float, errors: int = 0) -> dict:
    return {"policy": policy, "requests": 10, "errors": errors, "makespan_s": 1000 / tps,
            "tokens_per_s": tps, "output_tokens_per_s": tps / 100, "requests_per_s": tps / 1e3,
            "mean_ttft_s": ttft, "p90_ttft_s": 2 * ttft, "mean_worker_ttft_s": ttft / 2,
            "token_hit_rate": hit, "hit_rate_by_tier": {"gpu": hit},
            "per_worker": {"w0": int(tps)}}


def test_every_row_runs_in_every_position() -> None:
    rows = ["a", "b", "c"]
    orders = [rotated(rows, i) for i in range(3)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert {o[0] for o in orders} == set(rows)  # each row runs first once
    assert rotated(rows, 4) == ["b", "c", "a"] and rotated([], 2) == []


def test_the_median_row_takes_each_figures_median_and_keeps_the_rounds() -> None:
    rounds = [_row("kvmesh", 50, 2.0, 0.80), _row("kvmesh", 58, 0.3, 0.93, errors=1),
              _row("kvmesh", 56, 0.9, 0.90)]
    row = median_row(rounds)
    assert row["tokens_per_s"] == 56 and row["mean_ttft_s"] == 0.9
    assert row["token_hit_rate"] == 0.90 and row["p90_ttft_s"] == 1.8
    # a figure's median is its own, not the median-throughput round's
    odd = [_row("x", 50, 0.1, 0.5), _row("x", 60, 0.9, 0.7), _row("x", 55, 0.5, 0.6)]
    assert median_row(odd)["mean_ttft_s"] == 0.5
    assert row["errors"] == 1 and row["requests"] == 30
    assert row["per_worker"] == {"w0": 56}  # the median-throughput round's spread
    assert [r["tokens_per_s"] for r in row["rounds"]] == [50, 58, 56]  # in round order
    one = _row("kvmesh", 50, 2.0, 0.8)
    assert median_row([one]) is one and "rounds" not in one


def test_rounds_won_and_the_printed_spread() -> None:
    k = median_row([_row("kvmesh", 58, 0.3, 0.9), _row("kvmesh", 48, 2.0, 0.85)])
    p = median_row([_row("prefix_only", 55, 0.4, 0.94), _row("prefix_only", 57, 0.5, 0.94)])
    assert wins(k, p) == {"rounds": 2, "throughput": 1, "mean_ttft": 1}
    res = {"spec": {"cpu_blocks": 0}, "rounds": 2, "rows": [k, p]}
    lines = spread(res)
    assert lines[0] == "kvmesh by round: 58 tok/s 300 ms 90.0%, 48 tok/s 2,000 ms 85.0%"
    assert lines[-1] == ("kvmesh beat prefix_only in throughput in 1 of 2 rounds, in mean "
                         "TTFT in 1")
    assert spread({**res, "rounds": 1}) == []


def test_rounds_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        e2e.run(e2e.E2ESpec(), policies=("kvmesh",), rounds=0)


@pytest.mark.integration
def test_two_rounds_on_a_real_cluster_pool_their_route_logs(tmp_path: Path) -> None:
    spec = e2e.E2ESpec(workers=2, num_blocks=64, workload=WorkloadSpec(
        tenants=2, system_tokens=64, question_tokens=16, max_tokens=2, rate_per_s=5.0,
        requests=6, seed=1))
    res = e2e.run(spec, policies=("kvmesh",), route_log=str(tmp_path), rounds=2)
    (row,) = res["rows"]
    assert res["rounds"] == 2 and len(row["rounds"]) == 2
    assert row["requests"] == 12 and row["errors"] == 0
    assert sorted(p.parent.name for p in (tmp_path / "kvmesh").rglob("*.jsonl")) == [
        "round-0", "round-1"]
    assert res["route_logs"]["kvmesh"]["routes"] == 12  # both rounds, pooled
