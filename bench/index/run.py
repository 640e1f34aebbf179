"""One `kvmesh bench index` run: build a large index in a real Valkey, then measure it.

On a private server with the production ``RedisBackend``: register, build (events/s), memory
per entry, lookups (kvmesh's against the ``GET``/``MGET`` walks, interleaved, every answer
checked), then evictions.

See docs/architecture.md#index-route-and-bridge-benches.
"""
from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
from typing import Any

import redis.asyncio as aioredis

from bench.index import pipelined
from bench.index.data import Dataset, Layout, plan
from kvmesh.contract import DEFAULT_ALGO
from service.index.base import ApplyStatus, BlockMatch, IndexRemoved, WorkerRecord, namespace
from service.index.redis import RedisBackend
from service.index.testing import block_key

BLOCK_SIZE = 16
ALGO = DEFAULT_ALGO


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


async def _used_memory(client: Any) -> int:
    return int((await client.info("memory"))["used_memory"])


async def _cmd_usec(client: Any) -> dict[str, tuple[int, int]]:
    """command -> (calls, usec) from ``INFO commandstats``."""
    stats = await client.info("commandstats")
    return {k.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
            for k, v in stats.items()}


async def _settled_memory(backend: RedisBackend) -> int:
    """``used_memory`` once the build's connections are closed and the server's cron has
    had a second to reclaim what they held (query buffers, script garbage): the index's
    own memory. ``bytes_per_entry`` is read right after the build, as it always was."""
    await backend.client.connection_pool.disconnect()
    await asyncio.sleep(1.0)
    return await _used_memory(backend.client)


async def _cpu_s(client: Any) -> float:
    """The server process's CPU time (``INFO cpu``: user + system), seconds. Unlike the
    ``commandstats`` times it counts protocol parsing and replies too, and not the time the
    process waited for a core (this machine is shared)."""
    cpu = await client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def _server_us(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]],
               cmd: str) -> float:
    return after.get(cmd, (0, 0))[1] - before.get(cmd, (0, 0))[1]


async def _build(backend: RedisBackend, data: Dataset) -> dict[str, float]:
    plans = [data.batches(w) for w in range(len(data.worker_ids))]
    events = sum(len(b) for p in plans for b in p)
    batches = sum(len(p) for p in plans)

    async def publish(w: int) -> None:
        wid = data.worker_ids[w]
        for batch in plans[w]:
            res = await backend.apply_events(wid, batch)
            if res.status is not ApplyStatus.OK:
                raise RuntimeError(f"batch of {wid} not applied: {res}")

    before, cpu0 = await _cmd_usec(backend.client), await _cpu_s(backend.client)
    t0 = time.perf_counter()
    await asyncio.gather(*(publish(w) for w in range(len(data.worker_ids))))
    wall = time.perf_counter() - t0
    after, cpu1 = await _cmd_usec(backend.client), await _cpu_s(backend.client)
    server_s = _server_us(before, after, "evalsha") / 1e6
    return {"build_s": wall, "events": events, "batches": batches,
            "events_per_s": events / wall, "batches_per_s": batches / wall,
            "entries_per_s": data.entries / wall, "apply_server_s": server_s,
            "apply_server_us_per_entry": server_s * 1e6 / data.entries,
            "apply_cpu_us_per_entry": (cpu1 - cpu0) * 1e6 / data.entries}


async def _evict(backend: RedisBackend, ns: str, data: Dataset) -> dict[str, Any]:
    """Every worker evicts the tail half of what it holds (BlockRemoved, all workers
    concurrently); Redis time per entry removed, and lookups of 20 chains afterwards."""
    plans = [data.evictions(w) for w in range(len(data.worker_ids))]
    removed = sum(len(ev.op.hashes) for p in plans for b in p for ev in b
                  if isinstance(ev.op, IndexRemoved))

    async def publish(w: int) -> None:
        for batch in plans[w]:
            res = await backend.apply_events(data.worker_ids[w], batch)
            if res.status is not ApplyStatus.OK:
                raise RuntimeError(f"batch of {data.worker_ids[w]} not applied: {res}")

    before, cpu0 = await _cmd_usec(backend.client), await _cpu_s(backend.client)
    await asyncio.gather(*(publish(w) for w in range(len(data.worker_ids))))
    after, cpu1 = await _cmd_usec(backend.client), await _cpu_s(backend.client)
    correct = True
    for c in range(min(20, len(data.chains))):
        got = await backend.lookup(ns, data.chains[c], 0, data.worker_ids)
        correct &= {w: m.blocks for w, m in got.items()} == data.expected_after_evictions(c)
    return {"removed_entries": removed, "correct_after_evictions": correct,
            "remove_server_us_per_entry": _server_us(before, after, "evalsha") / removed,
            "remove_cpu_us_per_entry": (cpu1 - cpu0) * 1e6 / removed}


async def _memory_split(client: Any, data: Dataset, total: int,
                        seed: int) -> dict[str, float]:
    """Bytes per entry of the block keys, from ``MEMORY USAGE`` (each key's own allocation,
    sampled, scaled to every block), and of everything else (the main hash table's slots,
    the records and live handles): the rest of the ``used_memory`` delta ``total``."""
    rng = random.Random(seed + 2)
    sample = []
    for _ in range(min(500, data.distinct_blocks)):
        chain = data.chains[rng.randrange(len(data.chains))]
        sample.append(block_key(rng.choice(chain)))
    per_key = [int(await client.memory_usage(k) or 0) for k in sample]
    blocks_total = statistics.mean(per_key) * data.distinct_blocks
    return {"block_keys_bytes_per_entry": blocks_total / data.entries,
            "other_bytes_per_entry": (total - blocks_total) / data.entries,
            "bytes_per_block_key": statistics.mean(per_key)}


# lookup kinds: (result name, the commands whose server time it costs; EXEC's time
# includes the commands it runs)
_KINDS = (("kvmesh", "multi", "exec"), ("pipelined", "get", "hgetall"),
          ("per_tag", "mget", "hgetall"))


async def _one(kind: str, backend: RedisBackend, raw: Any, ns: str, query: list[bytes],
               allowed: list[str]) -> dict[str, BlockMatch]:
    if kind == "kvmesh":
        return await backend.lookup(ns, query, 0, allowed)
    return await pipelined.lookup(raw, ns, query, allowed, per_tag=kind == "per_tag")


async def _lookups(backend: RedisBackend, raw: Any, ns: str, data: Dataset, queries: int,
                   tail_blocks: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed + 1)
    picks = [rng.randrange(len(data.chains)) for _ in range(queries)]
    allowed = list(data.worker_ids)
    times: dict[str, list[float]] = {k[0]: [] for k in _KINDS}
    server: dict[str, float] = {k[0]: 0.0 for k in _KINDS}
    identical = correct = True
    for c in picks[:5]:  # warm up every path (connections, script cache)
        for kind, *_ in _KINDS:
            await _one(kind, backend, raw, ns, data.chains[c], allowed)
    for k, c in enumerate(picks):
        query = data.chains[c] + [rng.randbytes(32) for _ in range(tail_blocks)]
        res: dict[str, dict[str, BlockMatch]] = {}
        for kind, *cmds in _KINDS[k % 3:] + _KINDS[:k % 3]:  # rotate who goes first
            before = await _cmd_usec(backend.client)  # the server's time of this call alone
            t0 = time.perf_counter()
            res[kind] = await _one(kind, backend, raw, ns, query, allowed)
            times[kind].append(time.perf_counter() - t0)
            after = await _cmd_usec(backend.client)
            server[kind] += sum(_server_us(before, after, cmd) for cmd in cmds)
        identical &= res["kvmesh"] == res["pipelined"] == res["per_tag"]
        correct &= {w: m.blocks for w, m in res["kvmesh"].items()} == data.expected(c)
    n = len(picks)
    blocks = data.layout.chain_blocks + tail_blocks
    cpu: dict[str, float] = {}
    for kind, *_ in _KINDS:  # the process CPU of each kind alone, on the same queries
        rng = random.Random(seed + 1)
        queries_ = [data.chains[c] + [rng.randbytes(32) for _ in range(tail_blocks)]
                    for c in picks]
        t0 = await _cpu_s(backend.client)
        for q in queries_:
            await _one(kind, backend, raw, ns, q, allowed)
        cpu[kind] = (await _cpu_s(backend.client) - t0) * 1e6 / n
    out: dict[str, Any] = {"queries": n, "query_blocks": blocks,
                           "identical": identical, "correct": correct,
                           "lookup_server_us_per_block": server["kvmesh"] / n / blocks}
    for kind in times:
        out[f"{kind}_p50_ms"] = statistics.median(times[kind]) * 1e3
        out[f"{kind}_p99_ms"] = _pct(times[kind], 0.99) * 1e3
        out[f"{kind}_server_us"] = server[kind] / n
        out[f"{kind}_cpu_us"] = cpu[kind]
    out["lookup_cpu_us_per_block"] = cpu["kvmesh"] / blocks
    return out


async def run_async(entries: int = 200_000, layout: Layout | None = None, queries: int = 300,
                    tail_blocks: int = 16, model: str = "meta-llama/Llama-3.1-8B-Instruct",
                    seed: int = 0) -> dict[str, Any]:
    """Build and measure; see the module docstring. Returns one flat result dict."""
    from deploy.redis_server import start_redis

    layout = layout or Layout()
    data = plan(entries, layout, seed)
    ns = namespace(model, BLOCK_SIZE, ALGO)
    server = start_redis()
    backend = RedisBackend.from_url(server.url, timeout_s=120.0)
    raw = aioredis.Redis.from_url(server.url, socket_timeout=120.0)  # binary replies
    try:
        await backend.load_scripts()
        for w, wid in enumerate(data.worker_ids):
            await backend.register(WorkerRecord(wid, ns, f"10.0.0.{w}:50052", model,
                                                BLOCK_SIZE, ALGO))
        mem0 = await _used_memory(backend.client)
        build = await _build(backend, data)
        mem1 = await _used_memory(backend.client)
        settled = await _settled_memory(backend) - mem0
        split = await _memory_split(raw, data, mem1 - mem0, seed)
        looks = await _lookups(backend, raw, ns, data, queries, tail_blocks, seed)
        evict = await _evict(backend, ns, data)
    finally:
        await raw.aclose()
        await backend.close()
        server.stop()
    return {
        "entries": data.entries, "distinct_blocks": data.distinct_blocks,
        "workers": layout.workers, "chains": len(data.chains),
        "chain_blocks": layout.chain_blocks, "holders": layout.holders,
        "event_blocks": layout.event_blocks, "batch_events": layout.batch_events,
        "model": model, "namespace": ns, **build,
        "memory_bytes": mem1 - mem0,
        "settled_bytes_per_entry": settled / data.entries,
        "bytes_per_entry": (mem1 - mem0) / data.entries,
        "bytes_per_block": (mem1 - mem0) / data.distinct_blocks,
        "goal_bytes_per_entry": 100, "bar_bytes_per_entry": 150, **split, **looks, **evict,
    }


def run(**kw: Any) -> dict[str, Any]:
    """Blocking wrapper of :func:`run_async`."""
    return asyncio.run(run_async(**kw))
