"""`bench.tenants.report`: per-tenant rows, the pooled victims, the goal arithmetic."""
from __future__ import annotations

import io
import math

import pytest
from rich.console import Console

from bench.tenants import report
from bench.tenants.report import FLOODED, NO_FLOOD, QUOTAS, VICTIMS, Outcome
from bench.tenants.workload import FLOOD


def o(tenant: str, cached: int, ttft: float, done: float, err: str = "") -> Outcome:
    return Outcome(tenant, 100, 0 if err else cached, 0 if err else 4,
                   math.nan if err else ttft, done, err)


def test_rows_per_tenant_and_pooled_victims() -> None:
    rows = report.run_rows([o("alpha", 90, 0.1, 1.0), o("alpha", 50, 0.3, 2.0),
                            o("beta", 80, 0.2, 1.0), o(FLOOD, 0, 0.5, 4.0),
                            o(FLOOD, 0, 0.0, 3.0, "boom")])
    assert list(rows) == ["alpha", "beta", FLOOD, VICTIMS]
    a = rows["alpha"]
    assert a["requests"] == a["completed"] == 2 and a["errors"] == 0
    assert a["token_hit_rate"] == pytest.approx(0.7)
    assert a["mean_ttft_s"] == pytest.approx(0.2) and a["p90_ttft_s"] == pytest.approx(0.3)
    assert a["requests_per_s"] == pytest.approx(2 / 4.0)  # the run's makespan: 4 s
    assert a["tokens_per_s"] == pytest.approx(208 / 4.0)
    f = rows[FLOOD]
    assert (f["requests"], f["completed"], f["errors"]) == (2, 1, 1)
    assert f["token_hit_rate"] == 0.0 and f["mean_ttft_s"] == pytest.approx(0.5)
    v = rows[VICTIMS]
    assert v["completed"] == 3 and v["token_hit_rate"] == pytest.approx(220 / 300)


def test_p90_is_nearest_rank() -> None:
    assert report.p90([float(i) for i in range(1, 11)]) == 9.0
    assert report.p90([5.0]) == 5.0 and math.isnan(report.p90([]))


def _runs(hit: tuple[float, float, float], ttft: tuple[float, float, float],
          flood_rps: tuple[float, float]) -> dict:
    def victims(h: float, t: float) -> dict:
        return {VICTIMS: {"token_hit_rate": h, "mean_ttft_s": t}}

    return {NO_FLOOD: victims(hit[0], ttft[0]),
            FLOODED: {**victims(hit[1], ttft[1]), FLOOD: {"requests_per_s": flood_rps[0]}},
            QUOTAS: {**victims(hit[2], ttft[2]), FLOOD: {"requests_per_s": flood_rps[1]}}}


def test_goals_met() -> None:
    g = report.goals(_runs((0.8, 0.2, 0.76), (0.010, 0.050, 0.020), (4.0, 3.6)))
    assert g["victim_hit_kept_quota"] == pytest.approx(0.95)
    assert g["victim_hit_kept_noquota"] == pytest.approx(0.25)
    assert g["flood_throughput_ratio"] == pytest.approx(0.9)
    assert g["victim_ttft_ratio_noquota"] == pytest.approx(5.0)
    assert g["victim_ttft_ratio_quota"] == pytest.approx(2.0)
    assert g["ttft_improvement"] == pytest.approx(2.5)
    assert g["goal_hit_kept"] and g["goal_flood_throughput"] and g["goal_ttft"]


def test_goals_missed() -> None:
    g = report.goals(_runs((0.8, 0.2, 0.6), (0.010, 0.030, 0.020), (4.0, 2.0)))
    assert g["victim_hit_kept_quota"] == pytest.approx(0.75)
    assert g["flood_throughput_ratio"] == pytest.approx(0.5)
    assert g["ttft_improvement"] == pytest.approx(1.5)
    assert not (g["goal_hit_kept"] or g["goal_flood_throughput"] or g["goal_ttft"])


def test_table_names_every_run_and_the_verdicts() -> None:
    outs = [o("alpha", 90, 0.01, 1.0), o(FLOOD, 0, 0.05, 1.0)]
    runs = {name: report.run_rows(outs) for name in report.RUNS}
    g = report.goals(runs)
    buf = io.StringIO()
    report.print_table(runs, g, "t", Console(file=buf, width=200))
    text = buf.getvalue()
    assert all(name in text for name in report.RUNS) and "victims" in text
    # identical runs: every ratio 1.0, so the hit and throughput goals hold, the TTFT one not
    assert text.count(" met ") == 2 and text.count("MISSED") == 1


def test_finite_makes_strict_json() -> None:
    got = report.finite({"a": math.nan, "b": [1.0, math.inf], "c": {"d": 2, "e": "x"}})
    assert got == {"a": None, "b": [1.0, None], "c": {"d": 2, "e": "x"}}
