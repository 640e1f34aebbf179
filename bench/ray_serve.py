"""``kvmesh bench serve``: Ray Serve routers side by side on one workload.

The same Serve deployment is deployed once per router (kvmesh's, Ray's prefix affinity with
and without load balance, power-of-two) and gets the same requests in the same order, one app
busy at a time. Reported: hit rate against the ceiling, caller and replica TTFT, requests per
replica. ``compare(...)`` leaves no Serve app or actor behind.

See docs/architecture.md#end-to-end-and-serving-benches.
"""
from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections import Counter
from dataclasses import replace
from typing import Any

import typer

from bench.workload import WorkloadSpec, ceiling_tokens, text_rounds
from deploy.ray.request import ServeRequest

ROUTERS = ("kvmesh", "prefix_affinity", "prefix_affinity_lb", "pow2")
REPLICA_CPUS = 0.25
QUIET = {"enable_access_log": False, "log_level": "WARNING"}
# The default load (characters == tokens): 4 tenants x 3 chats x 3 turns, 2 app prompts.
SERVE_WORKLOAD = WorkloadSpec(tenants=4, system_prompts=2, chats_per_tenant=3,
                              turns_per_chat=3, system_tokens=640, question_tokens=96,
                              answer_tokens=64, max_tokens=4)
PCAR = ("ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router:"
        "PrefixCacheAffinityRouter")


def router_config(name: str, service_addresses: list[str]) -> Any:
    """The ``RequestRouterConfig`` of one compared router."""
    from ray.serve.config import RequestRouterConfig

    from deploy.ray.serve import kvmesh_router_config

    if name == "kvmesh":
        return kvmesh_router_config(service_addresses)
    if name == "prefix_affinity":  # Ray's defaults (imbalanced_threshold=inf)
        return RequestRouterConfig(request_router_class=PCAR)
    if name == "prefix_affinity_lb":  # load-aware: prefix only while queues differ <= 2
        return RequestRouterConfig(request_router_class=PCAR,
                                   request_router_kwargs={"imbalanced_threshold": 2})
    if name == "pow2":
        return RequestRouterConfig()
    raise ValueError(f"unknown router {name!r}; choose from {ROUTERS}")


async def _request(handle: Any, req: Any) -> dict[str, Any]:
    """One streamed request; its last chunk plus the caller-side time to first token."""
    start = time.perf_counter()
    first = None
    last: dict[str, Any] = {}
    async for chunk in handle.options(stream=True).generate.remote(req):
        if first is None:
            first = time.perf_counter() - start
        last = chunk
    return {**last, "client_ttft_s": first}


async def _drive(handles: dict[str, Any], rounds: list,
                 concurrency: int) -> dict[str, list[dict[str, Any]]]:
    """Round k for every router in turn (start rotated each round), then round k+1: the
    machine's noise falls on all routers alike; only one app is busy at a time."""
    for handle in handles.values():  # off the clock: channels, Ray's prefix-tree actor
        for _ in range(2):
            await _request(handle, ServeRequest(token_ids=list(b"warm up"),
                                                salt="kvmesh-warmup", prompt="warm up"))
    names = list(handles)
    rows: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for k, batch in enumerate(rounds):
        for name in names[k % len(names):] + names[:k % len(names)]:
            gate = asyncio.Semaphore(concurrency)

            async def one(req: Any, handle: Any = handles[name],
                          gate: asyncio.Semaphore = gate) -> dict[str, Any]:
                async with gate:
                    return await _request(handle, req)

            rows[name] += await asyncio.gather(*(one(r) for r in batch))
    return rows


def _summary(rows: list[dict[str, Any]], ceiling: int) -> dict[str, Any]:
    prompt = sum(r["prompt_tokens"] for r in rows)
    cached = sum(r["num_cached_tokens"] for r in rows)
    ttft = sorted(r["client_ttft_s"] for r in rows)
    return {"requests": len(rows), "prompt_tokens": prompt, "cached_tokens": cached,
            "hit_rate": cached / prompt, "ceiling_hit_rate": ceiling / prompt,
            "mean_ttft_ms": 1000 * statistics.fmean(ttft),
            "median_ttft_ms": 1000 * statistics.median(ttft),
            "p90_ttft_ms": 1000 * ttft[int(0.9 * (len(ttft) - 1))],
            "replica_ttft_ms": 1000 * statistics.fmean(r["ttft_s"] for r in rows),
            "per_replica": sorted(Counter(r["worker_id"] for r in rows).values(),
                                  reverse=True)}


def compare(routers: tuple[str, ...] = ROUTERS, *, replicas: int = 3, num_blocks: int = 256,
            concurrency: int = 4, workload: WorkloadSpec | None = None,
            heartbeat_s: float = 0.25, num_cpus: int = 4) -> dict[str, Any]:
    """Deploy one app per router (fresh, empty replicas), drive them interleaved round by
    round with the same requests, summarize each; see the module docstring."""
    import ray
    from ray import serve

    from deploy.ray.cluster import RayCluster
    from deploy.ray.serve import kvmesh_app

    workload = workload or SERVE_WORKLOAD
    rounds = text_rounds(workload)
    ceiling = ceiling_tokens(rounds, 16)
    owns_ray = not ray.is_initialized()
    if owns_ray:  # logical CPUs: room for every app's replicas at once (they only gate)
        need = math.ceil(len(routers) * replicas * REPLICA_CPUS + 0.5)
        ray.init(num_cpus=max(num_cpus, need), include_dashboard=False, logging_level="error",
                 log_to_driver=False, object_store_memory=100 * 1024 * 1024)
    cluster = RayCluster(workers=0, service_cpus=0.1, heartbeat_s=heartbeat_s)
    results: dict[str, Any] = {"workload": vars(workload), "replicas": replicas,
                               "num_blocks": num_blocks, "concurrency": concurrency,
                               "heartbeat_s": heartbeat_s}
    try:
        cluster.start()
        free = ray.available_resources().get("CPU", 0.0)
        if free < len(routers) * replicas * REPLICA_CPUS:
            raise RuntimeError(f"{len(routers)} apps x {replicas} replicas need "
                               f"{len(routers) * replicas * REPLICA_CPUS} CPUs; Ray has {free}")
        serve.start(proxy_location="Disabled", logging_config=QUIET)
        handles = {}
        for name in routers:
            # Only the kvmesh app's replicas register with the index: its rankings then
            # name no replica of another app.
            index = cluster.service_addresses if name == "kvmesh" else []
            app = kvmesh_app(index, replicas=replicas,
                             router=router_config(name, cluster.service_addresses),
                             num_cpus=REPLICA_CPUS, num_blocks=num_blocks, warmup=True,
                             heartbeat_s=heartbeat_s,
                             worker_secret=cluster.spec.worker_secret)
            handles[name] = serve.run(app, name=f"cmp-{name}", route_prefix=None,
                                      logging_config=QUIET)
        start = time.perf_counter()
        rows = asyncio.run(_drive(handles, rounds, concurrency))
        results["wall_s"] = time.perf_counter() - start
        for name in routers:
            results[name] = _summary(rows[name], ceiling)
    finally:
        serve.shutdown()
        cluster.stop()
        if owns_ray:
            ray.shutdown()
    return results


def render(results: dict[str, Any]) -> str:
    """A plain-text table of ``compare``'s result."""
    lines = [f"{'router':<20}{'hit rate':>9}{'ceiling':>9}{'mean TTFT':>11}"
             f"{'median':>10}{'p90':>10}{'replica':>10}  requests per replica"]
    for name in ROUTERS:
        r = results.get(name)
        if r:
            lines.append(f"{name:<20}{r['hit_rate']:>9.1%}{r['ceiling_hit_rate']:>9.1%}"
                         f"{r['mean_ttft_ms']:>9.1f}ms{r['median_ttft_ms']:>8.1f}ms"
                         f"{r['p90_ttft_ms']:>8.1f}ms{r['replica_ttft_ms']:>8.1f}ms"
                         f"  {r['per_replica']}")
    return "\n".join(lines)


def register(group: typer.Typer) -> None:
    """Add ``serve`` to the ``kvmesh bench`` group."""

    @group.command("serve")
    def serve_cmd(
        routers: str = typer.Option(",".join(ROUTERS), help="comma-separated subset"),
        replicas: int = typer.Option(3, help="Serve replicas (kvmesh workers)"),
        num_blocks: int = typer.Option(256, help="KV blocks per replica (16 tokens each)"),
        concurrency: int = typer.Option(4, help="requests in flight"),
        tenants: int = typer.Option(4, help="tenants (distinct cache salts)"),
        turns: int = typer.Option(3, help="turns per chat"),
        seed: int = typer.Option(0),
        heartbeat_s: float = typer.Option(0.25, help="kvmesh heartbeat interval (load view "
                                          "freshness)"),
        json_out: str = typer.Option(None, "--json", help="also write the raw result (JSON) "
                                     "to this file (Ray may print warnings on stdout)"),
    ) -> None:
        """Ray Serve routers side by side on local Ray (CPU): hit rate and TTFT."""
        import json

        chosen = tuple(r.strip() for r in routers.split(",") if r.strip())
        bad = [r for r in chosen if r not in ROUTERS]
        if bad:
            raise typer.BadParameter(f"unknown router(s) {bad}; choose from {ROUTERS}")
        results = compare(chosen, replicas=replicas, num_blocks=num_blocks,
                          concurrency=concurrency, heartbeat_s=heartbeat_s,
                          workload=replace(SERVE_WORKLOAD, tenants=tenants,
                                           turns_per_chat=turns, seed=seed))
        if json_out:
            with open(json_out, "w") as f:
                json.dump(results, f, indent=2)
        print(render(results))


if __name__ == "__main__":
    _app = typer.Typer(add_completion=False)
    register(_app)
    _app()
