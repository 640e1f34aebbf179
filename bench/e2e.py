"""`kvmesh bench e2e`: kvmesh vs round robin on a real local cluster, open loop, side by side.

For each policy, a FRESH ``LocalCluster`` (embedded Valkey, the service, ``workers`` worker
processes running the tiny model with ``num_blocks`` KV blocks each) serves the same seeded
request stream (``bench.workload.stream`` of ``spec.workload``):

- ``tenants`` tenants, each with its own cache salt and its own ``system_tokens``-token system
  prompt; every request is one tenant's system prompt plus a fresh ``question_tokens``-token
  question, generating exactly ``max_tokens`` tokens (``ignore_eos``);
- arrivals are open loop: Poisson with mean rate ``rate_per_s`` requests/s, the same
  schedule for every policy; a request is sent at its arrival time whether or not earlier
  ones finished.

The per-worker cache (``num_blocks``) holds only a few tenants' system prompts while the
cluster's caches together hold them all: that is the regime where the routing decides the
hit rate (round robin shows every tenant to every worker, which then evicts them in turn).

Measured per request through ``AsyncKvmeshClient.generate_stream``: client-side TTFT (send to
first streamed token: routing + queueing + prefill), the worker's own TTFT, cached tokens.
Per policy: throughput = (prompt + generated tokens) / makespan (first arrival to last
completion), generated tokens/s, requests/s, mean / p90 TTFT, token hit rate (cached / prompt
tokens), requests per worker. When the offered load is within a policy's capacity its
throughput equals the offered load; it drops below only for a policy that cannot keep up,
which is what the throughput ratio shows.

Rate: on 2 shared cores round robin sustains about 16 req/s of this workload and kvmesh
about 22. The default, 12/s, loads the machine well while leaving headroom for other load on
a shared machine, so both keep up (equal throughput) and TTFT and hit rate show the
difference; ``--rate 24 --requests 300`` overloads round robin only, which is where the
throughput ratio means something (and needs a quiet machine). A run of both policies takes
about two minutes, cluster starts included.

``--cpu-blocks M`` (the tiered cache, issue 14): each policy runs twice, on a cluster
without and with a CPU tier of ``M`` blocks per worker (rows ``kvmesh`` and
``kvmesh+cpu``), and the ratios compare the two: mean and p90 TTFT, hit rate (the share of
hits that came from the CPU tier is shown apart). Pick ``--num-blocks`` below the tenants'
system prompts together and ``M`` at a few times it, so that the device pools cannot hold
every tenant and the CPU tier can.
"""
from __future__ import annotations

import asyncio
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import typer

from bench.workload import Request, WorkloadSpec, stream
from kvmesh.policies import POLICIES as ALL_POLICIES

POLICIES = ("kvmesh", "round_robin")


@dataclass(frozen=True)
class E2ESpec:
    """The cluster and its load (``bench.workload.stream`` of ``workload``)."""

    workers: int = 3
    num_blocks: int = 448         # per worker: ~4.5 system prompts of 96 blocks
    cpu_blocks: int = 0           # per worker, when a run's setup has the CPU tier
    # rate: requests per second (Poisson), see the module docstring
    workload: WorkloadSpec = WorkloadSpec(tenants=8, system_tokens=1536, question_tokens=64,
                                          max_tokens=8, rate_per_s=12.0, requests=240)


@dataclass(frozen=True)
class Outcome:
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    ttft_s: float          # client side: send -> first streamed token
    worker_ttft_s: float   # the worker's own measure
    done_s: float          # completion time since the run's start
    worker: str
    error: str = ""


async def drive(addresses: list[str], requests: list[Request], policy: str,
                on_done: Any = None) -> tuple[list[Outcome], float]:
    """Send every request at its arrival time (open loop); returns outcomes and makespan."""
    from client import AsyncKvmeshClient, GenerateResult

    outcomes: list[Outcome] = []
    async with AsyncKvmeshClient(addresses, generate_timeout=300.0) as client:
        t0 = time.perf_counter()

        async def one(r: Request) -> None:
            await asyncio.sleep(max(0.0, r.arrival_s - (time.perf_counter() - t0)))
            sent = time.perf_counter()
            first = math.nan
            try:
                async for item in client.generate_stream(r.tokens, r.max_tokens, salt=r.salt,
                                                         policy=policy, ignore_eos=True):
                    if math.isnan(first):
                        first = time.perf_counter() - sent
                    if isinstance(item, GenerateResult):
                        outcomes.append(Outcome(
                            len(r.tokens), item.num_cached_tokens, len(item.token_ids), first,
                            item.ttft_s, time.perf_counter() - t0, item.worker_id))
            except Exception as exc:  # counted and reported, never silently dropped
                outcomes.append(Outcome(len(r.tokens), 0, 0, math.nan, math.nan,
                                        time.perf_counter() - t0, "", repr(exc)[:200]))
            if on_done is not None:
                on_done()

        await asyncio.gather(*(one(r) for r in requests))
        return outcomes, max(o.done_s for o in outcomes)


async def tier_hits(worker_addresses: list[str]) -> dict[str, int]:
    """Prompt tokens the workers served from each KV tier (their ``Stats``, summed)."""
    from client import AsyncKvmeshClient

    out: dict[str, int] = {}
    async with AsyncKvmeshClient(worker_addresses[:1]) as client:
        for address in worker_addresses:
            for t in (await client.worker_stats(address)).get("tiers", ()):
                out[t["tier"]] = out.get(t["tier"], 0) + t["hit_tokens"]
    return out


def summarize(policy: str, outcomes: list[Outcome], makespan: float,
              hits_by_tier: dict[str, int] | None = None) -> dict[str, Any]:
    """One policy's row (see the module docstring for the definitions); ``hits_by_tier``:
    the workers' cache hits per tier (their ``Stats``), shown as shares of the prompts."""
    ok = [o for o in outcomes if not o.error]
    ttft = sorted(o.ttft_s for o in ok)
    prompt = sum(o.prompt_tokens for o in ok)
    output = sum(o.output_tokens for o in ok)
    spread: dict[str, int] = {}
    for o in ok:
        spread[o.worker] = spread.get(o.worker, 0) + 1
    return {
        "policy": policy, "requests": len(outcomes), "errors": len(outcomes) - len(ok),
        "makespan_s": makespan,
        "tokens_per_s": (prompt + output) / makespan if makespan else 0.0,
        "output_tokens_per_s": output / makespan if makespan else 0.0,
        "requests_per_s": len(ok) / makespan if makespan else 0.0,
        "mean_ttft_s": statistics.fmean(ttft) if ttft else math.nan,
        "p90_ttft_s": ttft[min(len(ttft) - 1, math.ceil(0.9 * len(ttft)) - 1)]
        if ttft else math.nan,
        "mean_worker_ttft_s": statistics.fmean(o.worker_ttft_s for o in ok) if ok else math.nan,
        "token_hit_rate": sum(o.cached_tokens for o in ok) / prompt if prompt else 0.0,
        "hit_rate_by_tier": {t: n / prompt for t, n in sorted((hits_by_tier or {}).items())
                             if prompt},
        "per_worker": dict(sorted(spread.items())),
    }


def run(spec: E2ESpec, policies: tuple[str, ...] = POLICIES, progress: Any = None,
        model: str = "tiny") -> dict[str, Any]:
    """Each policy on a fresh cluster (twice, without and with the CPU tier, when
    ``spec.cpu_blocks``); rows plus ratios: kvmesh over round robin, or with the CPU tier over
    without."""
    from deploy.local import ClusterSpec, LocalCluster

    reqs = stream(spec.workload)
    rows = []
    tiers = (0, spec.cpu_blocks) if spec.cpu_blocks else (0,)
    for policy in policies:
        for cpu_blocks in tiers:
            name = f"{policy}+cpu" if cpu_blocks else policy
            cluster = LocalCluster(ClusterSpec(workers=spec.workers,
                                               num_blocks=spec.num_blocks,
                                               cpu_blocks=cpu_blocks, policy=policy,
                                               model=model))
            try:
                cluster.start()
                tick = None if progress is None else progress(name, len(reqs))
                outcomes, makespan = asyncio.run(drive(cluster.service_addresses, reqs,
                                                       policy, tick))
                by_tier = asyncio.run(tier_hits(cluster.worker_addresses))
            finally:
                cluster.stop()
            rows.append(summarize(name, outcomes, makespan, by_tier))
    offered = sum(len(r.tokens) + r.max_tokens for r in reqs) / max(reqs[-1].arrival_s, 1e-9)
    return {"spec": asdict(spec), "offered_tokens_per_s": offered, "rows": rows,
            "ratios": _ratios(rows, cpu=bool(spec.cpu_blocks))}


def _ratios(rows: list[dict[str, Any]], cpu: bool = False) -> dict[str, float]:
    """kvmesh over round robin; with ``cpu``: kvmesh with the CPU tier over without."""
    by = {r["policy"]: r for r in rows}
    k, rr = (by.get("kvmesh+cpu"), by.get("kvmesh")) if cpu else (by.get("kvmesh"),
                                                                   by.get("round_robin"))
    if k is None or rr is None:
        return {}
    return {"throughput": k["tokens_per_s"] / rr["tokens_per_s"],
            "mean_ttft_lower": rr["mean_ttft_s"] / k["mean_ttft_s"],
            "p90_ttft_lower": rr["p90_ttft_s"] / k["p90_ttft_s"],
            "token_hit_rate": (k["token_hit_rate"] / rr["token_hit_rate"]
                               if rr["token_hit_rate"] else math.inf)}


def _print(res: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    s = {**res["spec"], **res["spec"]["workload"]}
    cpu_note = f" (+{s['cpu_blocks']} CPU-tier blocks)" if s.get("cpu_blocks") else ""
    t = Table(title=f"e2e: {s['workers']} tiny-model workers x {s['num_blocks']} blocks"
                    f"{cpu_note}, "
                    f"{s['requests']} requests at {s['rate_per_s']}/s (Poisson), {s['tenants']} "
                    f"tenants x {s['system_tokens']}-token system prompt + "
                    f"{s['question_tokens']}-token question, {s['max_tokens']} out")
    cols = ("policy", "tokens/s", "out tok/s", "req/s", "mean TTFT ms", "p90 TTFT ms",
            "token hit rate", "makespan s", "errors", "requests per worker")
    for c in cols:
        t.add_column(c, justify="right")
    for r in res["rows"]:
        t.add_row(r["policy"], f"{r['tokens_per_s']:,.0f}", f"{r['output_tokens_per_s']:,.0f}",
                  f"{r['requests_per_s']:.2f}", f"{r['mean_ttft_s'] * 1e3:,.0f}",
                  f"{r['p90_ttft_s'] * 1e3:,.0f}", f"{r['token_hit_rate']:.1%}",
                  f"{r['makespan_s']:.1f}", str(r["errors"]),
                  " ".join(str(n) for n in r["per_worker"].values()))
    ra = res["ratios"]
    cpu = bool(res["spec"].get("cpu_blocks"))
    if ra:
        t.add_row("+cpu / without" if cpu else "kvmesh / rr", f"{ra['throughput']:.2f}x", "", "",
                  f"{ra['mean_ttft_lower']:.2f}x lower", f"{ra['p90_ttft_lower']:.2f}x lower",
                  f"{ra['token_hit_rate']:.2f}x", "", "", "")
    console = Console(width=max(Console().width, 160))  # wide tables, even in a pipe
    console.print(t)
    console.print(f"offered load: {res['offered_tokens_per_s']:,.0f} tokens/s")
    for r in res["rows"]:
        if r["hit_rate_by_tier"].get("cpu"):
            console.print(f"{r['policy']}: {r['hit_rate_by_tier']['cpu']:.1%} of prompt tokens "
                          "came from the CPU tier")
    if ra and cpu:
        console.print(f"CPU tier: mean TTFT {ra['mean_ttft_lower']:.2f}x lower, p90 "
                      f"{ra['p90_ttft_lower']:.2f}x lower, hit rate {ra['token_hit_rate']:.2f}x")
    elif ra:
        console.print(f"goals: throughput >= 1.5x: {'met' if ra['throughput'] >= 1.5 else 'MISSED'}"
                      f"; mean TTFT >= 2x lower: "
                      f"{'met' if ra['mean_ttft_lower'] >= 2 else 'MISSED'}")


def register(bench: typer.Typer) -> None:
    d, w = E2ESpec(), E2ESpec().workload

    @bench.command("e2e")
    def e2e(workers: int = typer.Option(d.workers), tenants: int = typer.Option(w.tenants),
            system_tokens: int = typer.Option(w.system_tokens),
            question_tokens: int = typer.Option(w.question_tokens),
            max_tokens: int = typer.Option(w.max_tokens),
            rate: float = typer.Option(w.rate_per_s, help="arrivals per second (Poisson)"),
            requests: int = typer.Option(w.requests),
            num_blocks: int = typer.Option(d.num_blocks, help="KV blocks per worker"),
            cpu_blocks: int = typer.Option(
                d.cpu_blocks, min=0, help="CPU-tier blocks per worker: run each policy "
                "without and with this CPU tier (0: no CPU tier)"),
            policies: str = typer.Option(None, help="comma-separated, each on a fresh cluster: "
                                         f"{', '.join(ALL_POLICIES)} (default: "
                                         f"{','.join(POLICIES)}; with --cpu-blocks: kvmesh)"),
            seed: int = typer.Option(w.seed),
            as_json: bool = typer.Option(False, "--json")) -> None:
        """kvmesh vs round robin on a real local cluster: throughput, TTFT, hit rate."""
        from rich.progress import Progress

        load = replace(w, tenants=tenants, system_tokens=system_tokens,
                       question_tokens=question_tokens, max_tokens=max_tokens,
                       rate_per_s=rate, requests=requests, seed=seed)
        spec = E2ESpec(workers, num_blocks, cpu_blocks, load)
        if policies is None:
            policies = "kvmesh" if cpu_blocks else ",".join(POLICIES)
        names = tuple(p.strip() for p in policies.split(",") if p.strip())
        bad = [p for p in names if p not in ALL_POLICIES]
        if bad:  # before any cluster starts
            raise typer.BadParameter(f"unknown policy {bad[0]!r}; valid: "
                                     f"{', '.join(ALL_POLICIES)}", param_hint="--policies")
        with Progress(transient=True, disable=as_json) as bar:
            def progress(policy: str, total: int) -> Any:
                task = bar.add_task(policy, total=total)
                return lambda: bar.advance(task)

            res = run(spec, names, progress)
        if as_json:
            print(json.dumps(res))
        else:
            _print(res)
