"""One line per benchmark run of guidellm, aiperf and inference-perf, side by side.

``python -m tools.bench_summary OUT`` reads the reports that the commands of
``docs/benchmarking.md`` leave under ``OUT`` and prints, for each run: requests that
succeeded and failed, time to first token (mean, p50, p90), inter-token latency (mean),
requests per second, and the share of prompt tokens the workers served from cache (the
``usage.prompt_tokens_details.cached_tokens`` every tool reads; guidellm keeps it per
request and prints no total, hence this script).

Runs are found by name: ``OUT/guidellm-NAME.json`` (``--output kind=json``),
``OUT/aiperf-NAME/profile_export_aiperf.json`` (``--artifact-dir``) and
``OUT/inference-perf-NAME/summary_lifecycle_metrics.json`` (the config's storage path).
The tools' report formats are theirs and change between versions: this reads the versions
the doc names (guidellm 0.8.1, aiperf 0.13.0, inference-perf 0.7.0).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def _guidellm(path: Path) -> dict:
    bench = json.loads(path.read_text())["benchmarks"][0]
    ok, metrics = bench["requests"]["successful"], bench["metrics"]
    ttft = metrics["time_to_first_token_ms"]["successful"]
    prompt = sum(r["input_metrics"].get("text_tokens") or 0 for r in ok)
    return {"ok": len(ok), "failed": len(bench["requests"].get("errored", [])),
            "ttft": (ttft["mean"], ttft["median"], ttft["percentiles"]["p90"]),
            "itl": metrics["inter_token_latency_ms"]["successful"]["mean"],
            "rps": metrics["requests_per_second"]["successful"]["mean"],
            "cached": sum(r.get("cached_tokens") or 0 for r in ok) / max(prompt, 1)}


def _aiperf(path: Path) -> dict:
    d = json.loads(path.read_text())
    ttft = d["time_to_first_token"]
    ok = d["request_count"]["avg"]  # successful; completed counts the errors too
    return {"ok": ok, "failed": d.get("completed_request_count", {}).get("avg", ok) - ok,
            "ttft": (ttft["avg"], ttft["p50"], ttft["p90"]),
            "itl": d["inter_token_latency"]["avg"], "rps": d["request_throughput"]["avg"],
            "cached": (d["total_usage_prompt_cache_read_tokens"]["avg"]
                       / d["total_usage_prompt_tokens"]["avg"])}


def _inference_perf(path: Path) -> dict:
    d = json.loads(path.read_text())
    ok = d["successes"]
    ttft, tokens = ok["latency"]["time_to_first_token"], ok["prompt_tokens"]
    return {"ok": ok["count"], "failed": d.get("failures", {}).get("count", 0),
            "ttft": tuple(1000 * ttft[k] for k in ("mean", "median", "p90")),
            "itl": 1000 * ok["latency"]["inter_token_latency"]["mean"],
            "rps": ok["throughput"]["requests_per_sec"],
            "cached": tokens["cached"] / tokens["total"]}


def runs(out: Path) -> list[tuple[str, dict]]:
    """``(run name, figures)`` of every report under ``out``, sorted by name."""
    found = [*((f"guidellm {p.stem.removeprefix('guidellm-')}", _guidellm, p)
               for p in out.glob("guidellm-*.json")),
             *((f"aiperf {p.parent.name.removeprefix('aiperf-')}", _aiperf, p)
               for p in out.glob("aiperf-*/profile_export_aiperf.json")),
             *((f"inference-perf {p.parent.name.removeprefix('inference-perf-')}",
                _inference_perf, p)
               for p in out.glob("inference-perf-*/summary_lifecycle_metrics.json"))]
    return [(name, read(path)) for name, read, path in sorted(found, key=lambda f: f[0])]


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    print(f"{'run':<24} {'ok':>4} {'failed':>6} {'TTFT mean/p50/p90 ms':>21} "
          f"{'ITL ms':>7} {'req/s':>6} {'cached':>7}")
    for name, r in runs(out):
        ttft = "/".join(f"{v:.0f}" for v in r["ttft"])
        print(f"{name:<24} {r['ok']:>4.0f} {r['failed']:>6.0f} {ttft:>21} {r['itl']:>7.1f} "
              f"{r['rps']:>6.2f} {100 * r['cached']:>6.1f}%")


if __name__ == "__main__":
    main()
