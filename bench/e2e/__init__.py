"""`kvmesh bench e2e`: kvmesh vs round robin on a real local cluster, open loop, side by side.

Each row (a policy, a variant ``kvmesh[weight=value,...]``, or ``kvmesh@REV``) gets a FRESH
``LocalCluster`` and the same seeded open-loop request stream (tenants with their own salts
and system prompts, Poisson arrivals), sized so each worker's cache holds only a few tenants:
the regime where routing decides the hit rate. Reported per row: throughput, TTFT, hit rate,
requests per worker, and ratios of plain ``kvmesh`` over the others. Options add skewed load,
rounds, route logs and a CPU tier; ``--workload chats`` sends long multi-turn chats
(``bench.workload.chats``) and ``--peer-fetch`` runs kvmesh with and without peer KV fetch
(``bench.e2e.outputs``: the fetch's ratios, and every row's outputs checked identical);
``--model 8-layer`` serves a random 8-layer model (``bench.random_checkpoint``).

See docs/architecture.md#end-to-end-and-serving-benches.
"""
from __future__ import annotations

import asyncio
import json
import math
import statistics
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import typer

from bench.e2e.outputs import compare, fetch_ratios
from bench.e2e.rounds import median_row, rotated
from bench.e2e.rows import Setup, preflight, revision_setups, setups
from bench.revision import service_flags, source_tree
from bench.route_log import read as read_routes
from bench.route_log import summarize as summarize_routes
from bench.variants import Variant, parse, parse_list
from bench.workload import Request, WorkloadSpec, chats, stream
from kvmesh.contract import KVMESH, ROUND_ROBIN
from kvmesh.contract import POLICIES as ALL_POLICIES

POLICIES = (KVMESH, ROUND_ROBIN)
WORKLOADS = {"stream": stream, "chats": chats}


@dataclass(frozen=True)
class E2ESpec:
    """The cluster and its load (``bench.workload.stream`` of ``workload``)."""

    workers: int = 3
    num_blocks: int = 448         # per worker: ~4.5 system prompts of 96 blocks
    cpu_blocks: int = 0           # per worker, when a run's setup has the CPU tier
    # rate: requests per second (Poisson), see the module docstring
    workload: WorkloadSpec = WorkloadSpec(tenants=8, system_tokens=1536, question_tokens=64,
                                          max_tokens=8, rate_per_s=12.0, requests=240)
    kind: str = "stream"          # the generator: a key of WORKLOADS
    max_batched_tokens: int = 2048  # per worker step (a step is the read lease's wait)

    def __post_init__(self) -> None:
        if self.kind not in WORKLOADS:
            raise ValueError(f"workload {self.kind!r}: one of {', '.join(WORKLOADS)}")


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
    index: int = -1                  # the request's place in the stream
    token_ids: tuple[int, ...] = ()  # what it generated (greedy: the same in every row)
    peer_tokens: int = 0             # prompt tokens whose KV came from a peer


async def drive(addresses: list[str], requests: list[Request], policy: str,
                on_done: Any = None) -> tuple[list[Outcome], float]:
    """Send every request at its arrival time (open loop); returns outcomes and makespan."""
    from client import AsyncKvmeshClient, GenerateResult

    outcomes: list[Outcome] = []
    async with AsyncKvmeshClient(addresses, generate_timeout=300.0) as client:
        t0 = time.perf_counter()

        async def one(i: int, r: Request) -> None:
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
                            item.ttft_s, time.perf_counter() - t0, item.worker_id, "", i,
                            tuple(item.token_ids),
                            item.cached_tokens_by_tier.get("peer", 0)))
            except Exception as exc:  # counted and reported, never silently dropped
                outcomes.append(Outcome(len(r.tokens), 0, 0, math.nan, math.nan,
                                        time.perf_counter() - t0, "", repr(exc)[:200], i))
            if on_done is not None:
                on_done()

        await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))
        return outcomes, max(o.done_s for o in outcomes)


async def tier_hits(worker_addresses: list[str]) -> dict[str, int]:
    """Prompt tokens the workers served from each KV tier (their ``Stats``, summed), and
    their peer-fetch counters summed under ``peer:<name>`` (fetches, fallbacks, ...)."""
    from client import AsyncKvmeshClient
    from client.peer_stats import peer_counts

    out: dict[str, int] = {}
    async with AsyncKvmeshClient(worker_addresses[:1]) as client:
        for address in worker_addresses:
            stats = await client.worker_stats(address)
            for t in stats.get("tiers", ()):
                out[t["tier"]] = out.get(t["tier"], 0) + t["hit_tokens"]
            for name, n in (peer_counts(stats) or {}).items():
                out[f"peer:{name}"] = out.get(f"peer:{name}", 0) + n
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
        "peer_hit_rate": sum(o.peer_tokens for o in ok) / prompt if prompt else 0.0,
        "hit_rate_by_tier": {t: n / prompt for t, n in sorted((hits_by_tier or {}).items())
                             if prompt and not t.startswith("peer:")},
        "peer": {t.removeprefix("peer:"): n for t, n in sorted((hits_by_tier or {}).items())
                 if t.startswith("peer:")},
        "per_worker": dict(sorted(spread.items())),
    }


def run_setup(spec: E2ESpec, setup: Setup, reqs: list[Request], progress: Any = None,
              model: str = "tiny") -> dict[str, Any]:
    """One row: ``reqs`` through a fresh cluster of ``setup``; with a route log, the row
    carries its records (``bench.route_log.read``) under ``route_log``; ``outputs``: each
    answered request's generated token ids by its index in ``reqs``."""
    from deploy.local import ClusterSpec, LocalCluster
    from worker.kv_cache.tier_config import TierConfig

    v = setup.variant
    cluster = LocalCluster(ClusterSpec(
        workers=spec.workers, num_blocks=spec.num_blocks,
        max_batched_tokens=spec.max_batched_tokens,
        tiers=TierConfig(cpu_blocks=setup.cpu_blocks),
        policy=v.policy, model=model, cost_weights=dict(v.overrides),
        route_log_dir=setup.route_log_dir, code_dir=setup.code_dir,
        peer_fetch=setup.peer_fetch))
    try:
        cluster.start()
        tick = None if progress is None else progress(setup.label, len(reqs))
        outcomes, makespan = asyncio.run(drive(cluster.service_addresses, reqs, v.policy,
                                               tick))
        by_tier = asyncio.run(tier_hits(cluster.worker_addresses))
    finally:
        cluster.stop()
    row = summarize(setup.label, outcomes, makespan, by_tier)
    row["outputs"] = {o.index: list(o.token_ids) for o in outcomes if not o.error}
    if setup.route_log_dir:
        row["route_log"] = read_routes(setup.route_log_dir)  # summarized by run()
    return row


def run(spec: E2ESpec, policies: Sequence[str | Variant] = POLICIES, progress: Any = None,
        model: str = "tiny", against: str | None = None,
        route_log: str | None = None, rounds: int = 1,
        peer_fetch: bool = False) -> dict[str, Any]:
    """Each policy (a name or a ``bench.variants.Variant``) on a fresh cluster (twice,
    without and with the CPU tier, when ``spec.cpu_blocks``), then ``kvmesh@against`` (its
    cluster runs git revision ``against``) when given; rows plus ratios: ``ratios``, kvmesh
    over round robin (or with the CPU tier over without), and ``ratios_over``, kvmesh over
    every other row. ``route_log``: each row's cluster logs its routes to
    ``route_log/<label>/`` (which must hold no logs yet) and ``route_logs`` holds their
    analyses. ``rounds``: every row that many times, in a rotated order, reported as the
    median of its rounds (``bench.e2e.rounds``). ``peer_fetch``: kvmesh with and without
    fetch (``bench.e2e.rows``), ``fetch_ratios`` the first over the second; ``outputs``: each
    row's requests compared with the first row's (``bench.e2e.outputs``). ``model``:
    ``tiny``, a name of ``bench.recompute.MODELS`` (a random checkpoint) or a directory."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, not {rounds}")
    variants = [p if isinstance(p, Variant) else parse(p, ALL_POLICIES) for p in policies]
    preflight(variants, spec.cpu_blocks, against, route_log)
    reqs = WORKLOADS[spec.kind](spec.workload)
    model = served_model(model)
    todo = setups(variants, spec.cpu_blocks, route_log, peer_fetch)
    with source_tree(against) if against else nullcontext(None) as tree:
        if against:
            todo += revision_setups(against, tree, service_flags(tree), spec.cpu_blocks,
                                    route_log)
        done: dict[str, list[dict[str, Any]]] = {s.label: [] for s in todo}
        for i in range(rounds):
            for s in rotated(todo, i):
                if rounds > 1 and s.route_log_dir:
                    s = replace(s, route_log_dir=str(Path(s.route_log_dir) / f"round-{i}"))
                done[s.label].append(run_setup(spec, s, reqs, progress, model))
    logs = {label: summarize_routes([rec for r in rs for rec in r.pop("route_log")])
            for label, rs in done.items() if "route_log" in rs[0]}
    outputs = compare({label: [r.pop("outputs") for r in rs] for label, rs in done.items()})
    rows = [median_row(rs) for rs in done.values()]
    offered = sum(len(r.tokens) + r.max_tokens for r in reqs) / max(reqs[-1].arrival_s, 1e-9)
    cpu = bool(spec.cpu_blocks)
    return {"spec": asdict(spec), "against": against, "offered_tokens_per_s": offered,
            "rounds": rounds, "rows": rows, "ratios": _ratios(rows, cpu=cpu),
            "ratios_over": _ratios_over(rows, cpu=cpu), "route_logs": logs,
            "fetch_ratios": fetch_ratios(rows), "outputs": outputs,
            "model": Path(model).name if model != "tiny" else model}


def served_model(model: str) -> str:
    """What the workers' ``--model`` gets: ``tiny``, a directory as it is, or the random
    checkpoint of a ``bench.recompute.MODELS`` name (written once under the temp dir)."""
    import tempfile

    from bench.random_checkpoint import checkpoint
    from bench.recompute import MODELS

    if model == "tiny" or model not in MODELS:
        return model
    return str(checkpoint(model, Path(tempfile.gettempdir()) / "kvmesh-bench-models"))


def _ratio(k: dict[str, Any], other: dict[str, Any]) -> dict[str, float]:
    """Row ``k`` over row ``other``: throughput, TTFT (how many times lower), hit rate."""
    return {"throughput": k["tokens_per_s"] / other["tokens_per_s"],
            "mean_ttft_lower": other["mean_ttft_s"] / k["mean_ttft_s"],
            "p90_ttft_lower": other["p90_ttft_s"] / k["p90_ttft_s"],
            "token_hit_rate": (k["token_hit_rate"] / other["token_hit_rate"]
                               if other["token_hit_rate"] else math.inf)}


def _ratios(rows: list[dict[str, Any]], cpu: bool = False) -> dict[str, float]:
    """kvmesh over round robin; with ``cpu``: kvmesh with the CPU tier over without."""
    by = {r["policy"]: r for r in rows}
    k, rr = (by.get("kvmesh+cpu"), by.get("kvmesh")) if cpu else (by.get("kvmesh"),
                                                                   by.get(ROUND_ROBIN))
    if k is None or rr is None:
        return {}
    return _ratio(k, rr)


def _ratios_over(rows: list[dict[str, Any]], cpu: bool = False
                 ) -> dict[str, dict[str, float]]:
    """Plain kvmesh over every other row of the same setup (with ``cpu``: the ``+cpu``
    rows), by that row's label: the baselines, the variants, ``kvmesh@REV``."""
    base = "kvmesh+cpu" if cpu else "kvmesh"
    by = {r["policy"]: r for r in rows}
    if base not in by:
        return {}
    return {name: _ratio(by[base], r) for name, r in by.items()
            if name != base and name.endswith("+cpu") == cpu}


def register(bench: typer.Typer) -> None:
    d, w = E2ESpec(), E2ESpec().workload

    @bench.command("e2e")
    def e2e(workers: int = typer.Option(d.workers), tenants: int = typer.Option(w.tenants),
            system_tokens: int = typer.Option(w.system_tokens),
            question_tokens: int = typer.Option(w.question_tokens),
            max_tokens: int = typer.Option(w.max_tokens),
            rate: float = typer.Option(w.rate_per_s, help="arrivals per second (Poisson)"),
            requests: int = typer.Option(w.requests),
            hot_share: float = typer.Option(
                w.hot_share, min=0.0, max=1.0, help="tenant-0's share of the requests, the "
                "rest uniform over the others (skewed load; 0: every tenant alike)"),
            num_blocks: int = typer.Option(d.num_blocks, help="KV blocks per worker"),
            cpu_blocks: int = typer.Option(
                d.cpu_blocks, min=0, help="CPU-tier blocks per worker: run each policy "
                "without and with this CPU tier (0: no CPU tier)"),
            policies: str = typer.Option(
                None, help="comma-separated, each on a fresh cluster: "
                f"{', '.join(ALL_POLICIES)}; kvmesh\\[weight=value,...] runs kvmesh with "
                "those cost weights (default: "
                f"{','.join(POLICIES)}; with --cpu-blocks: kvmesh)"),
            against: str = typer.Option(
                None, metavar="REV", help="add a row kvmesh@REV: a cluster running git "
                "revision REV's service and workers, under this bench and client"),
            route_log_dir: str = typer.Option(
                None, "--route-log", metavar="DIR", help="each row's services log their "
                "routes to DIR/<row>/ (an empty directory); print their analysis"),
            rounds: int = typer.Option(
                1, min=1, help="run every row this many times, each round in a rotated "
                "order, and report each row's median (a noisy host ranks close policies "
                "by luck in one run)"),
            workload: str = typer.Option(
                d.kind, help="stream: one question per request on a tenant's system prompt; "
                "chats: multi-turn chats growing turn after turn (--chats-per-tenant, "
                "--turns, --answer-tokens), all of a tenant's on its system prompt"),
            chats_per_tenant: int = typer.Option(w.chats_per_tenant, min=1),
            turns: int = typer.Option(w.turns_per_chat, min=1, help="turns per chat"),
            answer_tokens: int = typer.Option(w.answer_tokens, min=0),
            peer_fetch: bool = typer.Option(
                False, "--peer-fetch", help="run kvmesh with peer KV fetch (kvmesh+fetch) "
                "and without, and report the ratios"),
            model: str = typer.Option("tiny", help="tiny, 8-layer (a seeded random "
                                      "checkpoint) or a model directory"),
            max_batched_tokens: int = typer.Option(d.max_batched_tokens, min=16,
                                                   help="tokens per worker step"),
            seed: int = typer.Option(w.seed),
            as_json: bool = typer.Option(False, "--json")) -> None:
        """kvmesh vs the other policies on a real local cluster: throughput, TTFT, hit
        rate."""
        from rich.progress import Progress

        load = replace(w, tenants=tenants, system_tokens=system_tokens,
                       question_tokens=question_tokens, max_tokens=max_tokens,
                       rate_per_s=rate, requests=requests, hot_share=hot_share, seed=seed,
                       chats_per_tenant=chats_per_tenant, turns_per_chat=turns,
                       answer_tokens=answer_tokens)
        if workload not in WORKLOADS:
            raise typer.BadParameter(f"one of {', '.join(WORKLOADS)}",
                                     param_hint="--workload")
        spec = E2ESpec(workers, num_blocks, cpu_blocks, load, workload, max_batched_tokens)
        if policies is None:
            policies = "kvmesh" if cpu_blocks else ",".join(POLICIES)
        try:
            variants = parse_list(policies, ALL_POLICIES)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--policies") from e
        try:
            preflight(variants, cpu_blocks, against, route_log_dir)
        except ValueError as e:  # a revision git does not know, a used log directory
            raise typer.BadParameter(str(e)) from e
        with Progress(transient=True, disable=as_json) as bar:
            def progress(policy: str, total: int) -> Any:
                task = bar.add_task(policy, total=total)
                return lambda: bar.advance(task)

            res = run(spec, variants, progress, model=model, against=against,
                      route_log=route_log_dir, rounds=rounds, peer_fetch=peer_fetch)
        if as_json:
            print(json.dumps(res))
        else:
            from bench.e2e.report import show

            show(res)
