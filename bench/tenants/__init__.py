"""`kvmesh bench tenants`: a noisy neighbour on a real cluster, without and with quotas.

Well-behaved tenants (their own salts, each a shared system prompt and short unique
questions, repeated) and a :data:`~bench.tenants.workload.FLOOD` tenant sending long unique
prompts, all at once, on workers whose KV pools the flood alone would churn
(``bench.tenants.workload``). Three runs side by side on one real cluster
(``bench.tenants.drive``): ``no-flood``, ``flood`` (no quotas), ``flood+quotas`` (the flood
limited to ``--flood-quota`` of every tier through the admin RPC). Per run and tenant: token
hit rate, mean and p90 TTFT, completed requests and throughput; then issue 27's goals
(``bench.tenants.report``).

See docs/architecture.md#per-tenant-quotas-the-benchmark.
"""
from __future__ import annotations

import json
from dataclasses import asdict, replace
from typing import Any

import typer

from bench.tenants.drive import ClusterShape
from bench.tenants.workload import TenantLoad

# Pools of 192 blocks (3,072 tokens) per worker: the victims' three system prompts are 144
# blocks over the two workers; the flood brings 96 blocks a second, ~190 per worker between
# two requests of one victim (4 s apart on average): under LRU, about a pool, so most victim
# requests find their prompt evicted; with the flood's quota (48 blocks) and its request in
# flight, the prompts fit. The flood's compute stays light (1,536 tokens/s over both
# workers), so the victims' TTFT under the flood measures their misses more than its load.
# (docs/benchmarks.md#per-tenant-quotas-kvmesh-bench-tenants: how smaller pools and faster
# victims fared.)
FULL = (ClusterShape(workers=2, gpu_blocks=192), TenantLoad())
# the end-to-end test's: one worker, a few seconds per run
QUICK = (ClusterShape(workers=1, gpu_blocks=96),
         TenantLoad(system_tokens=256, question_tokens=16, victim_rate=2.0, flood_tokens=512,
                    flood_rate=3.0, duration_s=4.0, max_tokens=2))


def bench(shape: ClusterShape, load: TenantLoad, flood_quota: float,
          progress: Any = None) -> dict[str, Any]:
    """Run the three runs and report them: the ``--json`` object."""
    from bench.tenants import drive, report
    from bench.tenants.workload import requests

    reqs = requests(load)
    outcomes = drive.run_all(shape, reqs, flood_quota, progress)
    runs = {name: report.run_rows(o) for name, o in outcomes.items()}
    return {"cluster": asdict(shape), "load": asdict(load), "flood_quota": flood_quota,
            "runs": runs, **report.goals(runs)}


def register(group: typer.Typer) -> None:
    """Add the ``tenants`` command to the ``kvmesh bench`` group."""
    shape, load = FULL

    @group.command("tenants")
    def tenants(
        workers: int = typer.Option(None, min=1, help=f"workers (default {shape.workers})"),
        requests: int = typer.Option(
            None, min=1, help="requests per well-behaved tenant per run (default "
            f"{round(load.duration_s * load.victim_rate)}); the flood sends for as long"),
        gpu_blocks: int = typer.Option(
            None, min=16, help=f"KV blocks per worker (default {shape.gpu_blocks})"),
        flood_quota: float = typer.Option(0.25, min=0.0, max=1.0,
                                          help="the flood's share of every tier"),
        victim_rate: float = typer.Option(None, min=0.01, help="requests/s per "
                                          f"well-behaved tenant (default {load.victim_rate})"),
        flood_rate: float = typer.Option(None, min=0.01,
                                         help=f"flood requests/s (default {load.flood_rate})"),
        seed: int = typer.Option(0),
        model: str = typer.Option("tiny", help="tiny, 8-layer (a seeded random checkpoint, "
                                  "costlier prefills) or a model directory"),
        quick: bool = typer.Option(False, "--quick", help="a small fast run (one worker, "
                                   "a few seconds per run) for tests"),
        as_json: bool = typer.Option(False, "--json", help="the last line: one JSON object"),
    ) -> None:
        """Noisy neighbours: victims' hit rate and TTFT with a flooding tenant, without and
        with a quota on it, on a real local cluster."""
        from rich.console import Console
        from rich.progress import Progress

        from bench.tenants import report

        s, ld = QUICK if quick else FULL
        from bench.e2e import served_model

        s = replace(s, model=served_model(model), workers=workers or s.workers,
                    gpu_blocks=gpu_blocks or s.gpu_blocks)
        ld = replace(ld, seed=seed, victim_rate=victim_rate or ld.victim_rate,
                     flood_rate=flood_rate or ld.flood_rate)
        if requests:
            ld = replace(ld, duration_s=requests / ld.victim_rate)
        with Progress(transient=True, disable=as_json, console=Console(stderr=True)) as bar:
            def progress(run: str, total: int) -> Any:
                task = bar.add_task(run, total=total)
                return lambda: bar.advance(task)

            res = bench(s, ld, flood_quota, progress)
        if as_json:
            print(json.dumps(report.finite(res), allow_nan=False))
            return
        title = (f"{s.workers} workers x {s.gpu_blocks} blocks; {ld.victims} tenants x "
                 f"{ld.system_tokens}+{ld.question_tokens} tokens at {ld.victim_rate:g}/s, "
                 f"flood {ld.flood_tokens} tokens at {ld.flood_rate:g}/s, "
                 f"{ld.duration_s:g} s; quota {flood_quota:g}")
        out = Console()
        report.print_table(res["runs"], res, title, out if out.is_terminal
                           else Console(width=140))
