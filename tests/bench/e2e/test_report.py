"""The goals ``kvmesh bench e2e`` prints (kvmesh against every baseline), judged from one
run's rows."""
from __future__ import annotations

from bench.e2e.report import goals


def _row(policy: str, tokens_per_s: float, mean_ttft_s: float) -> dict:
    return {"policy": policy, "tokens_per_s": tokens_per_s, "mean_ttft_s": mean_ttft_s}


def test_e2e_goals_compare_kvmesh_with_every_baseline_but_not_its_own_variants() -> None:
    res = {"rows": [_row("kvmesh", 50_000, 0.9), _row("kvmesh[evict_weight=0]", 60_000, 0.1),
                    _row("prefix_only", 48_000, 2.0), _row("consistent_hash", 52_000, 1.4),
                    _row("round_robin", 24_000, 8.0)]}
    got = dict((goal.split(" (")[0], met) for goal, met in goals(res))
    assert got == {"throughput >= 2x round_robin": True, "throughput >= prefix_only": True,
                   "throughput >= consistent_hash": False, "lowest mean TTFT": True}
    assert goals({"rows": [_row("round_robin", 1, 1)]}) == []
    # every policy kept up with the offered load: only the TTFT lead is a goal
    light = dict(res, offered_tokens_per_s=25_000.0)
    assert [goal.split(" (")[0] for goal, _ in goals(light)] == ["lowest mean TTFT"]
