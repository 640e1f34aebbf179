"""``python -m tools.bench_summary OUT``: the tools' reports, reduced to one line per run.

The reports below keep only the fields the summary reads, in the shapes guidellm 0.8.1,
aiperf 0.13.0 and inference-perf 0.7.0 write them (docs/benchmarking.md ran those)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.bench_summary import runs


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_each_tool_report_gives_the_same_figures(tmp_path: Path):
    ok = [{"cached_tokens": c, "input_metrics": {"text_tokens": 100}} for c in (0, 90)]
    _write(tmp_path / "guidellm-kvmesh.json", {"benchmarks": [{
        "requests": {"successful": ok, "errored": [{}]},
        "metrics": {"time_to_first_token_ms": {"successful": {
                        "mean": 50.0, "median": 40.0, "percentiles": {"p90": 90.0}}},
                    "inter_token_latency_ms": {"successful": {"mean": 6.0}},
                    "requests_per_second": {"successful": {"mean": 3.0}}}}]})
    _write(tmp_path / "aiperf-kvmesh" / "profile_export_aiperf.json", {
        "request_count": {"avg": 2}, "completed_request_count": {"avg": 3},
        "time_to_first_token": {"avg": 50.0, "p50": 40.0, "p90": 90.0},
        "inter_token_latency": {"avg": 6.0}, "request_throughput": {"avg": 3.0},
        "total_usage_prompt_cache_read_tokens": {"avg": 90},
        "total_usage_prompt_tokens": {"avg": 200}})
    _write(tmp_path / "inference-perf-kvmesh" / "summary_lifecycle_metrics.json", {
        "successes": {"count": 2, "prompt_tokens": {"cached": 90, "total": 200},
                      "latency": {"time_to_first_token": {"mean": 0.05, "median": 0.04,
                                                          "p90": 0.09},
                                  "inter_token_latency": {"mean": 0.006}},
                      "throughput": {"requests_per_sec": 3.0}},
        "failures": {"count": 1}})
    found = runs(tmp_path)
    assert [name for name, _ in found] == ["aiperf kvmesh", "guidellm kvmesh",
                                           "inference-perf kvmesh"]
    for name, r in found:
        assert (r["ok"], r["failed"], r["rps"]) == (2, 1, 3.0), name
        assert r["ttft"] == pytest.approx((50.0, 40.0, 90.0)), name
        assert r["itl"] == pytest.approx(6.0) and r["cached"] == pytest.approx(0.45), name
