"""`kvmesh bench tenants --quick --json` end to end on a real cluster: the JSON's fields and
their internal consistency (not the goals: those are measurements)."""
from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from bench.tenants import QUICK, report
from bench.tenants.report import FLOODED, NO_FLOOD, QUOTAS, RUNS, VICTIMS
from bench.tenants.workload import FLOOD, requests
from client.cli import app

ROW = {"requests", "completed", "errors", "token_hit_rate", "mean_ttft_s", "p90_ttft_s",
       "requests_per_s", "tokens_per_s"}
FIGURES = ("victim_hit_kept_quota", "victim_hit_kept_noquota", "flood_throughput_ratio",
           "victim_ttft_ratio_quota", "victim_ttft_ratio_noquota", "ttft_improvement")


@pytest.mark.integration
def test_quick_json_run_on_a_real_cluster() -> None:
    res = CliRunner().invoke(app, ["bench", "tenants", "--quick", "--json"],
                             env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert list(out["runs"]) == list(RUNS) and out["flood_quota"] == 0.25
    sent = requests(QUICK[1])
    victims = sorted({r.tenant for r in sent if r.tenant != FLOOD})
    for name, rows in out["runs"].items():
        want = [*victims, *([] if name == NO_FLOOD else [FLOOD]), VICTIMS]
        assert list(rows) == want, name
        for tenant, row in rows.items():
            assert set(row) == ROW
            assert row["errors"] == 0 and row["completed"] == row["requests"]
            assert 0.0 <= row["token_hit_rate"] < 1.0
            assert row["mean_ttft_s"] > 0 and row["p90_ttft_s"] > 0
            assert row["requests_per_s"] > 0 and row["tokens_per_s"] > 0
            if tenant not in (VICTIMS, FLOOD):  # every run sends the same victims' requests
                assert row["requests"] == sum(r.tenant == tenant for r in sent)
        assert rows[VICTIMS]["requests"] == sum(rows[v]["requests"] for v in victims)
        if name != NO_FLOOD:
            assert rows[FLOOD]["requests"] == sum(r.tenant == FLOOD for r in sent)
            assert rows[FLOOD]["token_hit_rate"] == 0.0  # unique prompts: nothing to hit
    # the victims' repeated system prompts hit once cached
    assert out["runs"][NO_FLOOD][VICTIMS]["token_hit_rate"] > 0.5
    # the goal figures are the arithmetic of the rows, the verdicts their thresholds
    again = report.goals(out["runs"])
    for f in FIGURES:
        assert math.isfinite(out[f]) and out[f] == pytest.approx(again[f]), f
    v = {n: out["runs"][n][VICTIMS] for n in RUNS}
    assert out["victim_hit_kept_quota"] == pytest.approx(
        v[QUOTAS]["token_hit_rate"] / v[NO_FLOOD]["token_hit_rate"])
    assert out["ttft_improvement"] == pytest.approx(
        v[FLOODED]["mean_ttft_s"] / v[QUOTAS]["mean_ttft_s"])
    assert out["goal_hit_kept"] == (out["victim_hit_kept_quota"] >= report.HIT_KEPT_GOAL)
    assert out["goal_flood_throughput"] == (out["flood_throughput_ratio"]
                                            >= report.FLOOD_GOAL)
    assert out["goal_ttft"] == (out["ttft_improvement"] >= report.TTFT_GOAL)
