"""`kvmesh bench transfer` at a tiny size: every figure the router and the docs read is
there, measured (positive) and consistent with the others."""
from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from bench import transfer
from client.cli import app


@pytest.mark.slow
def test_bench_transfer_json_reports_every_figure_consistently(monkeypatch) -> None:
    monkeypatch.setattr(transfer, "FRAMES", (64 << 10, 1 << 20))
    monkeypatch.setattr(transfer, "FETCH_COUNTS", (1, 3, 6))
    res = CliRunner().invoke(app, ["bench", "transfer", "--json", "--mib", "1", "--rounds", "1",
                                   "--repeats", "1", "--prompt-tokens", "16"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])

    assert set(out["gbps"]) == {"zmq", "grpc", "shm", "zmq+curve"}
    for table in (out["gbps"], out["cpu_bound_gbps"]):
        for row in table.values():
            assert set(row) == {str(64 << 10), str(1 << 20)}
            assert all(v > 0 for v in row.values())
    d = out["default_transport"]
    assert out["default_vs_grpc"] == pytest.approx(
        out["gbps"][d][str(1 << 20)] / out["gbps"]["grpc"][str(1 << 20)])

    assert set(out["models"]) == {"tiny", "8-layer"}
    assert out["models"]["8-layer"]["block_bytes"] == 8 * 2 * 4 * 64 * 16 * 4
    for m, r in out["models"].items():
        assert r["prefill_us_per_token"] > 0
        assert r["recompute_us_per_block"] == pytest.approx(16 * r["prefill_us_per_token"])
        fetch = r["fetch"][d]
        assert out["fetch_over_recompute"][m] == pytest.approx(
            fetch["us_per_block"] / r["recompute_us_per_block"])
        saving = r["recompute_us_per_block"] - fetch["us_per_block"]
        cross = out["crossover_tokens"][m]
        if saving > 0:
            assert cross == math.ceil(max(0.0, fetch["us_per_call"]) / saving) * 16
        else:
            assert cross is None
    assert out["curve_vs_plain"] == pytest.approx(
        out["gbps"]["zmq+curve"][str(1 << 20)] / out["gbps"][d][str(1 << 20)])
    assert out["curve_vs_plain_cpu_bound"] == pytest.approx(
        out["cpu_bound_gbps"]["zmq+curve"][str(1 << 20)] / out["cpu_bound_gbps"][d][str(1 << 20)])
    assert set(out["curve_fetch_over_recompute"]) == {"tiny", "8-layer"}
    assert out["us_per_block"] == out["models"]["8-layer"]["fetch"][d]["us_per_block"]
    assert out["us_per_call"] == out["models"]["8-layer"]["fetch"][d]["us_per_call"]
    assert out["default_vs_grpc_cpu_bound"] == pytest.approx(
        out["cpu_bound_gbps"][d][str(1 << 20)] / out["cpu_bound_gbps"]["grpc"][str(1 << 20)])
    assert set(out["goals"]) == {"default_ge_1_gbps", "default_ge_1_gbps_cpu_bound",
                                 "default_ge_4x_grpc", "default_ge_4x_grpc_cpu_bound",
                                 "fetch_le_0.1x_recompute"}


def test_the_fit_recovers_a_line() -> None:
    call, block = transfer._fit({1: 1.5, 4: 3.0, 16: 9.0})
    assert (call, block) == (pytest.approx(1.0), pytest.approx(0.5))
