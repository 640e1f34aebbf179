"""Where the time of one route goes: each step timed alone, on the benchmark's own data."""
from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Callable

from bench.route.fleet import ALGO, BLOCK_SIZE


def _median_us(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def breakdown(prompts: dict[int, list[int]], chains: dict[int, list[bytes]], redis_url: str,
               worker_ids: list[str], repeats: int) -> dict[int, dict[str, float]]:
    """Median microseconds of each step of a route, timed alone in this process: the
    client's request, the service's parse + validate, hashing (cold and through the memo),
    ranking + building the answer (``rank_us``, every worker holding the whole chain), the
    lookup, the client's parse of the response."""
    from client.convert import route_request, route_result
    from kvmesh.hashing import block_hashes
    from kvmesh.v1 import index_pb2 as pb
    from service import validate
    from service.clock import wall_ms as now_ms
    from service.config import ServiceConfig
    from service.hash_memo import BlockHashMemo
    from service.index.base import BlockMatch, WorkerLoad, namespace
    from service.index.redis import RedisBackend
    from service.policy import WorkerView, make_policies
    from service.route_steps import cap_match, response, usable_blocks

    cfg = ServiceConfig()
    ns = namespace("tiny", BLOCK_SIZE, ALGO)
    resp = pb.RouteResponse(candidates=[pb.Candidate(
        worker_id=w, address="127.0.0.1:1", matched_tokens=8192, cost=1.0,
        load=pb.WorkerLoad(free_blocks=1)) for w in worker_ids], prompt_tokens=8192)
    wire = resp.SerializeToString()
    response_us = _median_us(lambda: route_result(pb.RouteResponse.FromString(wire)), repeats)

    async def lookups(backend: RedisBackend, chain: list[bytes]) -> tuple[float, float]:
        """(round trip median, server-side time per lookup) in µs; the server's SLOWLOG with
        a threshold of 0 records every command's execution time (inside MULTI/EXEC each
        command apart, EXEC itself not at all), summed over the lookups' commands."""
        await backend.client.config_set("slowlog-log-slower-than", 0)
        await backend.client.config_set("slowlog-max-len", 32 * repeats)
        await backend.client.slowlog_reset()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            await backend.lookup(ns, chain, now_ms(), worker_ids)
            times.append(time.perf_counter() - t0)
        log = await backend.client.slowlog_get(32 * repeats)
        await backend.client.config_set("slowlog-log-slower-than", 10_000)
        server = sum(e["duration"] for e in log
                     if not bytes(e["command"]).upper().startswith((b"SLOWLOG", b"CONFIG")))
        return statistics.median(times) * 1e6, server / repeats

    async def all_lookups() -> dict[int, tuple[float, float]]:
        backend = RedisBackend.from_url(redis_url, timeout_s=5.0)
        try:
            return {n: await lookups(backend, chains[n]) for n in prompts}
        finally:
            await backend.close()

    lookup_us = asyncio.run(all_lookups())
    policy = make_policies(cfg.weights, cfg.fetch_costs)[cfg.policy]
    rng = random.Random(0)
    out: dict[int, dict[str, float]] = {}
    for n, toks in prompts.items():
        data = route_request(toks).SerializeToString()
        inp = validate.route(pb.RouteRequest.FromString(data), cfg)
        memo = BlockHashMemo()
        memo.block_hashes(inp.tokens, BLOCK_SIZE, algo=ALGO, seed=cfg.hash_seed)
        held = len(chains[n])
        views = [WorkerView(w, "127.0.0.1:1", WorkerLoad(free_blocks=900_000,
                                                        total_blocks=1_000_000),
                            cap_match(BlockMatch(held, held), usable_blocks(n, BLOCK_SIZE)),
                            BLOCK_SIZE, ns) for w in worker_ids]

        def rank(i: validate.RouteInput = inp, v: list[WorkerView] = views) -> None:
            response(i, policy.rank(len(i.tokens), v, rng), cfg.policy, False)

        out[n] = {
            "rank_us": _median_us(rank, repeats),
            "client_build_us": _median_us(
                lambda t=toks: route_request(t, dry_run=True).SerializeToString(), repeats),
            "parse_validate_us": _median_us(
                lambda d=data: validate.route(pb.RouteRequest.FromString(d), cfg), repeats),
            "hash_cold_us": _median_us(lambda i=inp: block_hashes(
                i.tokens, BLOCK_SIZE, algo=ALGO, seed=cfg.hash_seed), repeats),
            "hash_memo_us": _median_us(lambda i=inp, m=memo: m.block_hashes(
                i.tokens, BLOCK_SIZE, algo=ALGO, seed=cfg.hash_seed), repeats),
            "lookup_us": lookup_us[n][0],
            "lookup_server_us": lookup_us[n][1],
            "response_us": response_us,
        }
    return out
