"""`kvmesh bench route` at a tiny size: real Valkey, service process, protocol workers."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench import route

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.integration
def test_route_bench_reports_every_size_and_the_breakdown() -> None:
    # the baseline replica: this very tree, routed with the old repeated token_ids field
    res = route.run(workers=2, routes=8, rounds=2, threads=2, duration_s=0.6,
                    sizes=(16, 256), baseline=str(ROOT))
    rows = {r["tokens"]: r for r in res["sizes"]}
    assert set(rows) == {16, 256}
    assert rows[16]["ratio_p50"] == 1.0 == rows[16]["ratio_p50_nomemo"]
    assert rows[256]["blocks"] == 16
    for r in rows.values():
        assert 0 < r["p50_ms"] <= r["p99_ms"]
        assert 0 < r["p50_ms_live"] <= r["p99_ms_live"]
        assert 0 < r["p50_ms_nomemo"] <= r["p99_ms_nomemo"]
        assert r["routes_per_s"] > 0 and r["handler_ms"] > 0
        assert r["routes_per_s_nomemo"] > 0 and r["handler_ms_nomemo"] > 0
        for key in ("client_build_us", "parse_validate_us", "hash_cold_us", "hash_memo_us",
                    "rank_us", "lookup_us", "response_us"):
            assert r[key] > 0, key
        assert r["lookup_server_us"] > 0
        for v in ("", "_nomemo", "_base"):
            assert r["routes_per_s" + v] > 0 and r["handler_ms" + v] > 0
            # every route costs the service and Redis CPU (/proc counts 10 ms ticks: 0.3 s
            # of routes per replica and size is many of them)
            assert r["cpu_ms_service" + v] > 0 and r["cpu_ms_redis" + v] > 0
            assert r["cpu_ms_client" + v] > 0
            assert 0 < r["p50_ms" + v] <= r["p99_ms" + v]
    assert res["routes_per_size"] == 8 + 2  # the measured rounds + the handler pass
    lines = route.goals(res)
    assert len(lines) == 3 and "routes/s" in lines[2] and "own CPU" in lines[1]
