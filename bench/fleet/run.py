"""The fleet run: a real Redis (one server or an S-shard cluster), one or more real service
processes, N simulated workers (:mod:`bench.fleet.sim`) and a router, in four phases.

Phases ``idle``, ``events``, ``routes``, ``mixed`` after a warm-up to steady state; Redis CPU
per entry and per route is each phase's minus the idle rate, per shard. Links drain between
phases, so each phase's operations are its own.

See docs/architecture.md#replay-and-simulation.
"""
from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.fleet.shards import Sample, control_shard, sample
from bench.fleet.sim import FleetWorker
from bench.replay.trace import CHUNK_TOKENS, TokenSynth, TraceRequest, load_trace
from deploy.local import ClusterSpec, LocalCluster
from deploy.waiting import eventually
from kvmesh.hashing import none_hash

PHASES = ("idle", "events", "routes", "mixed")


@dataclass(frozen=True)
class FleetConfig:
    workers: int = 8
    shards: int = 1                 # 1: one Valkey server; more: a cluster of that many
    service_replicas: int = 1
    tokens_per_s: float = 20_000.0  # prefilled tokens per worker per second (one GPU, 8B)
    routes_per_s: float = 50.0
    route_tokens: int = 8192        # a routed prompt's tokens at most (its first ones)
    phase_s: float = 3.0
    warmup_s: float = 2.0
    num_blocks: int = 2048          # per worker (32K tokens at 16 per block: small, so the
                                    # warm-up reaches steady-state eviction in ~2 s)
    block_size: int = 16
    chunk_tokens: int = 2048
    trace: Path | None = None       # None: a synthetic conversation-shaped trace
    limit: int = 2000               # trace requests read
    register_timeout_s: float = 30.0
    seed: int = 0
    insecure_cluster_bus: bool = False  # shards > 1 on a Valkey without TLS (deploy.redis_cluster)


def synthetic_trace(n: int, seed: int = 0) -> list[TraceRequest]:
    """``n`` requests shaped like the Mooncake conversation trace: every prompt starts with
    chunk 0 (one shared system prompt), conversations of 1-6 turns, each turn its previous
    turn's chunks plus 1-3 new ones, first turns of 8-24 chunks (~12K tokens on average)."""
    rng = random.Random(seed)
    out: list[TraceRequest] = []
    next_id = 1
    while len(out) < n:
        ids = [0] + list(range(next_id, next_id + rng.randint(7, 23)))
        next_id = ids[-1] + 1
        for _ in range(rng.randint(1, 6)):
            if len(out) == n:
                break
            out.append(TraceRequest(len(out), 0.0, len(ids) * CHUNK_TOKENS - rng.randrange(400),
                                    rng.randint(10, 500), tuple(ids)))
            grow = rng.randint(1, 3)
            ids = ids + list(range(next_id, next_id + grow))
            next_id += grow
    return out


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) * 1e3 if xs else float("nan")


class Router:
    """Routes at ``rate`` per second (open loop: arrivals do not wait for answers)."""

    def __init__(self, client: Any, fleet: list[FleetWorker], rate: float, seed: int,
                 max_tokens: int) -> None:
        self.client, self.fleet, self.rate, self.max_tokens = client, fleet, rate, max_tokens
        self.rng = random.Random(seed)
        self.latencies: list[float] = []
        self.tokens = 0  # prompt tokens routed
        self.degraded = 0
        self.errors: list[str] = []

    async def _one(self, tokens: list[int]) -> None:
        t0 = time.monotonic()
        try:
            res = await self.client.route(tokens)
        except Exception as e:  # counted and reported, never fatal to the run
            self.errors.append(f"{type(e).__name__}: {e}")
            return
        self.latencies.append(time.monotonic() - t0)
        self.tokens += len(tokens)
        self.degraded += bool(res.degraded)

    async def run(self, until: float) -> None:
        tasks: set[asyncio.Task] = set()
        start, k = time.monotonic(), 0
        while (now := time.monotonic()) < until:
            due = start + k / self.rate
            if now < due:
                await asyncio.sleep(due - now)
                continue
            k += 1
            w = self.rng.choice(self.fleet)
            if w.prompts:
                prompt = self.rng.choice(w.prompts)[:self.max_tokens]
                task = asyncio.create_task(self._one(prompt))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks)


async def _drain(fleet: list[FleetWorker], timeout: float = 30.0) -> None:
    """Until every link has published (or resynced) everything its manager emitted."""
    async def applied() -> bool:
        return all(w.applied >= w.made for w in fleet)

    await eventually(applied, within=timeout, interval=0.02)


def _cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes ``pids`` used so far."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:  # fields after the command's closing paren
            fields = f.read().rpartition(")")[2].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


async def _phase(name: str, cfg: FleetConfig, fleet: list[FleetWorker], urls: list[str],
                 client: Any, producing: asyncio.Event, services: list[int]) -> dict[str, Any]:
    """Run one phase (see the module docstring); its measurements."""
    applied = sum(w.applied for w in fleet)
    published = sum(w.link.counters["publishes"] for w in fleet)
    lag_from = [len(w.lags) for w in fleet]
    t0, before, cpu0 = time.monotonic(), sample(urls), _cpu_s(services)
    if name in ("events", "mixed"):
        producing.set()
    router = Router(client, fleet, cfg.routes_per_s, cfg.seed, cfg.route_tokens) \
        if name in ("routes", "mixed") else None
    if router is not None:
        await router.run(t0 + cfg.phase_s)
    else:
        await asyncio.sleep(cfg.phase_s)
    producing.clear()
    await _drain(fleet)
    wall = time.monotonic() - t0
    spent = [a - b for a, b in zip(sample(urls), before, strict=True)]
    service_cpu = _cpu_s(services) - cpu0
    lag = [x for w, n0 in zip(fleet, lag_from, strict=True) for x in w.lags[n0:]]
    batches = sum(w.link.counters["publishes"] for w in fleet) - published
    out: dict[str, Any] = {
        "phase": name, "wall_s": wall, "shards": spent, "service_cpu_s": service_cpu,
        "entries": sum(w.applied for w in fleet) - applied, "batches": batches,
        "event_lag_p50_ms": _pct(lag, 50), "event_lag_p99_ms": _pct(lag, 99),
        "event_lag_max_ms": max(lag, default=float("nan")) * 1e3}
    if router is not None:
        out.update(routes=len(router.latencies),
                   route_tokens=router.tokens / max(len(router.latencies), 1),
                   route_p50_ms=_pct(router.latencies, 50),
                   route_p99_ms=_pct(router.latencies, 99), degraded=router.degraded,
                   errors=len(router.errors), first_error=router.errors[:1])
    return out


def _per_op(phase: dict[str, Any], idle: dict[str, Any], ops: int,
            field: str = "usec", scale: float = 1.0) -> list[float]:
    """Per shard: microseconds of ``field`` (``usec``: commandstats; ``cpu_s``: the
    process's CPU, ``scale`` 1e6) per operation, idle spending subtracted."""
    out = []
    for s, i in zip(phase["shards"], idle["shards"], strict=True):
        extra = getattr(s, field) - getattr(i, field) * phase["wall_s"] / idle["wall_s"]
        out.append(max(extra, 0.0) * scale / ops if ops else float("nan"))
    return out


def _service_per_op(phase: dict[str, Any], idle: dict[str, Any], ops: int) -> float:
    """Service CPU microseconds (all replicas) per operation, idle spending subtracted."""
    extra = phase["service_cpu_s"] - idle["service_cpu_s"] * phase["wall_s"] / idle["wall_s"]
    return max(extra, 0.0) * 1e6 / ops if ops else float("nan")


async def _fleet(cfg: FleetConfig, cluster: LocalCluster, urls: list[str],
                 reqs: list[TraceRequest]) -> dict[str, Any]:
    from client import AsyncKvmeshClient

    synth = TokenSynth(cfg.block_size)
    root = none_hash(synth.algo, synth.seed)
    fleet = [FleetWorker(f"fleet-{i}", reqs[i::cfg.workers] or reqs, synth,
                         services=cluster.service_addresses,
                         token=cluster.service_token(f"fleet-{i}"), root_hash=root,
                         num_blocks=cfg.num_blocks, address=f"127.0.0.1:{20000 + i}",
                         chunk_tokens=cfg.chunk_tokens) for i in range(cfg.workers)]
    producing, stop = asyncio.Event(), asyncio.Event()
    tasks = [asyncio.create_task(w.link.run()) for w in fleet]
    tasks += [asyncio.create_task(w.drive(cfg.tokens_per_s, producing, stop)) for w in fleet]
    client = AsyncKvmeshClient(cluster.service_addresses)
    try:
        async def registered() -> bool:  # and the first snapshot sent
            return all(w.link.registered and w.link.counters["resyncs"] for w in fleet)

        try:
            await eventually(registered, within=cfg.register_timeout_s)
        except TimeoutError:
            errors = {k: v for w in fleet for k, v in w.link.counters.items()
                      if k.startswith("error")}
            raise RuntimeError(f"the workers did not register within "
                               f"{cfg.register_timeout_s:g} s (link errors {errors}); on a "
                               "multi-shard cluster the index's scripts must touch one slot "
                               "each") from None
        producing.set()  # warm up: at least warmup_s, and until every pool has filled once
        t0 = time.monotonic()
        fill = cfg.num_blocks * cfg.block_size

        async def warm() -> bool:
            return (time.monotonic() - t0 >= cfg.warmup_s
                    and all(w.prefilled >= fill for w in fleet))

        await eventually(warm, within=cfg.warmup_s + 10 * fill / cfg.tokens_per_s + 10)
        producing.clear()
        await _drain(fleet)
        pids = [s.pid for s in cluster.services if s.pid is not None]
        phases = {name: await _phase(name, cfg, fleet, urls, client, producing, pids)
                  for name in PHASES}
        merged = 0  # batches written in a wave with others (cluster: group commit), all run
        for address in cluster.service_addresses:
            async with AsyncKvmeshClient([address]) as one:
                merged += int((await one.stats())["counters"].get(
                    "index_merged_batches_total", 0))
    finally:
        stop.set()
        producing.set()  # wakes the drivers so they see ``stop``
        for w in fleet:
            await w.link.close()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.close()
    idle = phases["idle"]
    ev, ro = phases["events"], phases["routes"]
    prefilled = sum(w.prefilled for w in fleet)
    hits = sum(w.hit_tokens for w in fleet)
    return {"config": {k: (str(v) if isinstance(v, Path) else v)
                       for k, v in asdict(cfg).items()},
            "phases": [{**p, "shards": [asdict(s) for s in p["shards"]]}
                       for p in phases.values()],
            "usec_per_entry": _per_op(ev, idle, ev["entries"]),
            "usec_per_route": _per_op(ro, idle, ro.get("routes", 0)),
            "cpu_usec_per_entry": _per_op(ev, idle, ev["entries"], "cpu_s", 1e6),
            "cpu_usec_per_route": _per_op(ro, idle, ro.get("routes", 0), "cpu_s", 1e6),
            "service_usec_per_entry": _service_per_op(ev, idle, ev["entries"]),
            "service_usec_per_route": _service_per_op(ro, idle, ro.get("routes", 0)),
            "entries_per_s": ev["entries"] / ev["wall_s"],
            "keys": [s.keys for s in sample(urls)], "control_shard": control_shard(urls),
            "hit_rate": hits / max(hits + prefilled, 1),
            "merged_batches": merged,
            "batches": sum(w.link.counters["publishes"] for w in fleet),
            "resyncs": sum(w.link.counters["resyncs"] for w in fleet),
            "overflows": sum(w.link.counters["overflows"] for w in fleet)}


def run(cfg: FleetConfig) -> dict[str, Any]:
    """Start the Redis shard(s) and the service, run the fleet, stop everything."""
    reqs = (load_trace(cfg.trace, cfg.limit) if cfg.trace is not None
            else synthetic_trace(cfg.limit, cfg.seed))
    cluster = LocalCluster(ClusterSpec(workers=0, service_replicas=cfg.service_replicas,
                                       redis_shards=cfg.shards,
                                       insecure_cluster_bus=cfg.insecure_cluster_bus,
                                       block_size=cfg.block_size)).start()
    try:
        urls = (cluster.redis_cluster.node_urls if cluster.redis_cluster is not None
                else [cluster.redis_url or ""])
        return asyncio.run(_fleet(cfg, cluster, urls, reqs))
    finally:
        cluster.stop()


__all__ = ["PHASES", "FleetConfig", "Sample", "run", "synthetic_trace"]
