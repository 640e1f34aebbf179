"""The runs of ``kvmesh bench tenants`` on one real local cluster.

One ``LocalCluster`` (embedded Valkey, the service, ``workers`` real worker processes with
``gpu_blocks`` KV blocks each) serves the three runs in turn: ``no-flood``, ``flood``, then
``flood+quotas``, whose quota is set the way an operator sets it, the admin RPC
``SetTenantQuota`` on the service, and in force on every worker (their heartbeats carry it)
before its first request. One cluster rather than three: starting one costs more than a quick
run on a shared host, and the runs cannot help each other, since each run salts its tenants
with its own name (``alpha/flood``): nothing one run cached ever hits in another, and what it
left in the pools is evicted like any other old block.

Every request goes out open loop at its arrival time, streamed, carrying its tenant
(``GenerateRequest.tenant``: whom the blocks it caches are charged to).
"""
from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.tenants.report import FLOODED, NO_FLOOD, QUOTAS, RUNS, Outcome
from bench.tenants.workload import FLOOD, TenantRequest
from kvmesh.contract import TIERS


@dataclass(frozen=True)
class ClusterShape:
    """The cluster every run shares."""

    workers: int = 2
    gpu_blocks: int = 192
    model: str = "tiny"
    max_batched_tokens: int = 2048


def salted(r: TenantRequest, run: str) -> str:
    """The salt ``r`` is sent with in ``run`` (see the module docstring)."""
    return f"{r.salt}/{run}"


async def drive(addresses: list[str], reqs: Sequence[TenantRequest], run: str,
                tick: Callable[[], None] | None = None) -> list[Outcome]:
    """Send ``reqs`` open loop (each at its arrival time); one outcome per request."""
    from client import AsyncKvmeshClient, GenerateResult

    outcomes: list[Outcome] = []
    async with AsyncKvmeshClient(addresses, generate_timeout=300.0) as client:
        t0 = time.perf_counter()

        async def one(r: TenantRequest) -> None:
            await asyncio.sleep(max(0.0, r.arrival_s - (time.perf_counter() - t0)))
            sent = time.perf_counter()
            first = math.nan
            try:
                async for item in client.generate_stream(
                        list(r.tokens), r.max_tokens, salt=salted(r, run), ignore_eos=True,
                        tenant=r.tenant):
                    if math.isnan(first):
                        first = time.perf_counter() - sent
                    if isinstance(item, GenerateResult):
                        outcomes.append(Outcome(r.tenant, len(r.tokens),
                                                item.num_cached_tokens, len(item.token_ids),
                                                first, time.perf_counter() - t0))
            except Exception as exc:  # counted and reported, never silently dropped
                outcomes.append(Outcome(r.tenant, len(r.tokens), 0, 0, math.nan,
                                        time.perf_counter() - t0, repr(exc)[:200]))
            if tick is not None:
                tick()

        await asyncio.gather(*(one(r) for r in reqs))
    return outcomes


def run_requests(reqs: Sequence[TenantRequest], run: str) -> list[TenantRequest]:
    """What ``run`` sends: everything, or without the flood for ``no-flood``."""
    return [r for r in reqs if run != NO_FLOOD or r.tenant != FLOOD]


def run_all(shape: ClusterShape, reqs: Sequence[TenantRequest], flood_quota: float,
            progress: Callable[[str, int], Callable[[], None]] | None = None,
            ) -> dict[str, list[Outcome]]:
    """The three runs (:data:`bench.tenants.report.RUNS`, in that order) on one cluster;
    each run's outcomes by its name."""
    from deploy.local import ClusterSpec, LocalCluster

    cluster = LocalCluster(ClusterSpec(workers=shape.workers, num_blocks=shape.gpu_blocks,
                                       model=shape.model,
                                       max_batched_tokens=shape.max_batched_tokens))
    out: dict[str, list[Outcome]] = {}
    try:
        cluster.start()
        for run in RUNS:
            todo = run_requests(reqs, run)
            if run == QUOTAS:
                set_quota(cluster, FLOOD, flood_quota)
            tick = progress(run, len(todo)) if progress is not None else None
            out[run] = asyncio.run(drive(cluster.service_addresses, todo, run, tick))
    finally:
        cluster.stop()
    assert set(out) == {NO_FLOOD, FLOODED, QUOTAS}
    return out


def set_quota(cluster: Any, tenant: str, fraction: float, timeout_s: float = 30.0) -> None:
    """Give ``tenant`` ``fraction`` of every tier through the admin RPC (the cluster has no
    admin token: the role is open, as on any cluster started without tokens), then wait
    until every worker enforces it: its stats show ``tenant``'s quota in blocks (the tenant
    must have cached blocks there already: the ``flood`` run left them)."""
    from deploy.waiting import wait_until

    with cluster.client() as client:
        client.set_tenant_quota(tenant, gpu=fraction, cpu=fraction, disk=fraction)

        def enforced() -> bool:
            return all(quota_blocks(client.worker_stats(a), tenant) > 0
                       for a in cluster.worker_addresses)

        wait_until(enforced, timeout_s, interval=0.2,
                   what=f"every worker enforcing {tenant}'s quota")


def quota_blocks(worker_stats: dict[str, Any], tenant: str) -> int:
    """``tenant``'s device-tier quota in blocks in one worker's stats (0: none, or the
    tenant is not among its rows)."""
    for row in worker_stats.get("tenants") or ():
        if row["tenant"] == tenant:
            return sum(int(t.get("quota_blocks", 0)) for t in row.get("tiers") or ()
                       if t["tier"] == TIERS[0])
    return 0
