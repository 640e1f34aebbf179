"""`kvmesh bench e2e`: the workload, the summary, and one tiny run on a real local cluster."""
from __future__ import annotations

import math

import pytest
import typer
from typer.testing import CliRunner

from bench import e2e
from bench.workload import WorkloadSpec, stream
from kvmesh.contract import POLICIES

TINY = e2e.E2ESpec(workers=2, num_blocks=64,
                   workload=WorkloadSpec(tenants=2, system_tokens=64, question_tokens=16,
                                         max_tokens=2, rate_per_s=5.0, requests=6, seed=1))


def test_workload_is_seeded_open_loop_and_salted_per_tenant() -> None:
    a, b = stream(TINY.workload), stream(TINY.workload)
    assert a == b and len(a) == 6
    assert [r.arrival_s for r in a] == sorted(r.arrival_s for r in a) and a[0].arrival_s == 0
    by_salt: dict[str, list[list[int]]] = {}
    for r in a:
        assert len(r.tokens) == 80 and max(r.tokens) < 256
        by_salt.setdefault(r.salt, []).append(r.tokens[:64])
    for prefixes in by_salt.values():  # one system prompt per tenant
        assert all(p == prefixes[0] for p in prefixes)


def test_summary_and_ratios() -> None:
    def o(cached: int, ttft: float, done: float, w: str, err: str = "") -> e2e.Outcome:
        return e2e.Outcome(100, cached, 0 if err else 4, ttft, ttft, done, w, err)

    k = e2e.summarize("kvmesh", [o(80, 0.1, 1.0, "a"), o(80, 0.3, 2.0, "b")], 2.0)
    assert k["tokens_per_s"] == pytest.approx(208 / 2.0)
    assert k["token_hit_rate"] == pytest.approx(0.8)
    assert k["mean_ttft_s"] == pytest.approx(0.2) and k["p90_ttft_s"] == pytest.approx(0.3)
    assert k["per_worker"] == {"a": 1, "b": 1}
    rr = e2e.summarize("round_robin", [o(0, 0.4, 4.0, "a"), o(0, 0.0, 4.0, "", "boom")], 4.0)
    assert rr["errors"] == 1 and rr["requests"] == 2 and rr["token_hit_rate"] == 0
    ratios = e2e._ratios([k, rr])
    assert ratios["throughput"] == pytest.approx((208 / 2.0) / (104 / 4.0))
    assert ratios["mean_ttft_lower"] == pytest.approx(2.0)
    assert math.isinf(ratios["token_hit_rate"])


@pytest.mark.integration
def test_one_policy_on_a_real_cluster() -> None:
    res = e2e.run(TINY, policies=("kvmesh",))
    (row,) = res["rows"]
    assert row["policy"] == "kvmesh" and row["requests"] == 6 and row["errors"] == 0
    assert row["tokens_per_s"] > 0 and 0 < row["mean_ttft_s"] <= row["p90_ttft_s"]
    assert 0 < row["token_hit_rate"] < 1  # each tenant's first request misses, later ones hit
    assert sum(row["per_worker"].values()) == 6
    assert res["ratios"] == {} and res["offered_tokens_per_s"] > 0


def test_cpu_tier_rows_and_ratios() -> None:
    def o(cached: int, ttft: float) -> e2e.Outcome:
        return e2e.Outcome(100, cached, 4, ttft, ttft, 1.0, "a")

    off = e2e.summarize("kvmesh", [o(20, 0.4), o(20, 0.2)], 1.0, {"gpu": 40})
    on = e2e.summarize("kvmesh+cpu", [o(80, 0.1), o(80, 0.2)], 1.0,
                       {"gpu": 100, "cpu": 60, "disk": 0})
    assert on["hit_rate_by_tier"] == {"cpu": 0.3, "disk": 0.0, "gpu": 0.5}
    assert off["hit_rate_by_tier"] == {"gpu": 0.2}
    ratios = e2e._ratios([off, on], cpu=True)
    assert ratios["mean_ttft_lower"] == pytest.approx(0.3 / 0.15)
    assert ratios["p90_ttft_lower"] == pytest.approx(0.4 / 0.2)
    assert ratios["token_hit_rate"] == pytest.approx(4.0)
    assert e2e._ratios([off, on]) == {}  # no round robin row: nothing to compare


@pytest.mark.integration
def test_cpu_tier_run_on_a_real_cluster() -> None:
    """Two tenants whose prompts do not both fit a worker's 8 blocks: with the CPU tier the
    evicted one comes back from host memory (hits from the CPU tier), without it is
    recomputed."""
    spec = e2e.E2ESpec(workers=1, num_blocks=8, cpu_blocks=32,
                       workload=WorkloadSpec(tenants=2, system_tokens=96, question_tokens=16,
                                             max_tokens=2, rate_per_s=4.0, requests=8, seed=1))
    res = e2e.run(spec, policies=("kvmesh",))
    off, on = res["rows"]
    assert (off["policy"], on["policy"]) == ("kvmesh", "kvmesh+cpu")
    assert off["errors"] == on["errors"] == 0
    assert "cpu" not in off["hit_rate_by_tier"] and on["hit_rate_by_tier"]["cpu"] > 0
    assert on["token_hit_rate"] > off["token_hit_rate"]
    assert set(res["ratios"]) >= {"mean_ttft_lower", "p90_ttft_lower", "token_hit_rate"}


def test_cli_offers_every_policy_and_refuses_others_before_any_cluster() -> None:
    app, bench = typer.Typer(), typer.Typer()
    app.add_typer(bench, name="bench")
    e2e.register(bench)
    wide = {"COLUMNS": "400"}  # rich wraps its boxes at the terminal's width
    out = CliRunner().invoke(app, ["bench", "e2e", "--policies", "kvmesh,nope"], env=wide)
    assert out.exit_code == 2 and "unknown policy 'nope'" in out.output
    helped = CliRunner().invoke(app, ["bench", "e2e", "--help"], env=wide)
    assert "consistent_hash" in POLICIES
    assert all(name in helped.output for name in POLICIES)
