"""The replay loop: a trace through the simulated cluster under one routing policy.

Per request, at its timestamp: the workers advance, their KV events go to the real index
backend, the router picks a worker with the inputs the service's ``Route`` would give it, and
the request is queued there. Each row gets fresh workers, router and namespace; ``oracle``
(one pooled cache) is the hit-rate bound. Simulated time is the backends' clock.

See docs/architecture.md#replay-and-simulation.
"""
from __future__ import annotations

import asyncio
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvmesh.contract import (
    CONSISTENT_HASH,
    DEFAULT_ALGO,
    LEAST_LOADED,
    RANDOM,
    ROUND_ROBIN,
    TIER_PB,
)
from kvmesh.events.pool import PoolEvent, PoolRemoved, PoolStored
from service.config import CostWeights
from service.index import IndexBackend, open_backend
from service.index.base import (
    ApplyStatus,
    BlockMatch,
    IndexCleared,
    IndexEvent,
    IndexRemoved,
    IndexStored,
    WorkerRecord,
    namespace,
)
from service.policy import Policy, WorkerView
from service.route_steps import prompt_key
from worker.kv_cache import KVCacheManager, KVRequest

from . import INDEX_POLICIES, POLICIES
from .cluster import CostModel, SimRequest, SimWorker
from .copies import CopyTotals
from .fetch import FetchCost, FetchTotals, Plan
from .peers import ApproxTreeRouter, RayPrefixTreeRouter
from .rows import parse_row
from .trace import TokenSynth, TraceRequest

# Policies whose ranking never reads the matches: the index cannot change their choices, so
# their replay skips it (same results, half the time).
MATCH_BLIND = frozenset({CONSISTENT_HASH, LEAST_LOADED, ROUND_ROBIN, RANDOM})


@dataclass(frozen=True)
class ReplayConfig:
    """Cluster shape and model. ``capacity_blocks`` is per worker; the default, 25,000
    blocks of 16 tokens (400k tokens, ~52 GB of Llama-3-8B KV at 128 KiB/token), is what
    vLLM leaves for the KV cache on an 80 GB GPU at 0.9 memory utilization: 8 workers pool
    3.2M tokens against working sets of ~94M (conversation) and ~22M (synthetic)."""

    workers: int = 8
    block_size: int = 16
    capacity_blocks: int = 25_000
    hash_algo: str = DEFAULT_ALGO
    seed: int = 0
    cost: CostModel = field(default_factory=CostModel)
    weights: CostWeights | None = None
    provisional_ttl_s: float = 2.0  # the service's default
    # Each worker's manager beyond its device pool (``kvmesh bench tiers``); the defaults are
    # the plain device pool. Per worker, like ``capacity_blocks``.
    cpu_blocks: int = 0
    disk_blocks: int = 0
    eviction: str = "lru"
    auto_pin: bool = False
    # Rows ``kvmesh+fetch`` (``--peer-fetch``): the fewest blocks worth a fetch, and the
    # transfer's figures at this block size (None: :mod:`.fetch`'s defaults).
    min_fetch_blocks: int = 4
    fetch_us_per_block: float | None = None
    fetch_us_per_call: float | None = None

    def fetch_cost(self) -> FetchCost:
        """What one peer fetch costs in this cluster (:class:`.fetch.FetchCost`)."""
        return FetchCost.of(self.cost.block_bytes(self.block_size), self.fetch_us_per_block,
                            self.fetch_us_per_call)


@dataclass
class PolicyResult:
    """Totals of one policy's replay; :meth:`summary` is the JSON line."""

    policy: str
    requests: int
    rejected: int
    prompt_tokens: int
    hit_tokens: int
    prefill_tokens: int
    per_worker_prefill: list[float]
    ttfts: list[float]
    busy_s: float
    sim_s: float
    evictions: int
    wall_s: float
    hit_by_tier: dict[str, int] = field(default_factory=dict)  # sums to hit_tokens
    copies: CopyTotals = field(default_factory=CopyTotals)
    fetches: FetchTotals = field(default_factory=FetchTotals)

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def load_imbalance(self) -> float:
        """Max over mean of the prefill tokens computed per worker (1.0: perfect)."""
        per = self.per_worker_prefill
        mean = sum(per) / len(per) if per else 0.0
        return max(per) / mean if mean else 1.0

    def ttft_s(self, q: float | None = None) -> float:
        """Mean TTFT (``q`` None) or its ``q``-th percentile, in seconds (0.0: none)."""
        if not self.ttfts:
            return 0.0
        t = np.asarray(self.ttfts)
        return float(t.mean() if q is None else np.percentile(t, q))

    def summary(self) -> dict[str, object]:
        workers = len(self.per_worker_prefill)
        return {
            "policy": self.policy, "requests": self.requests, "rejected": self.rejected,
            "token_hit_rate": round(self.token_hit_rate, 4),
            "load_imbalance": round(self.load_imbalance, 3),
            "prefill_tokens": self.prefill_tokens, "prompt_tokens": self.prompt_tokens,
            "mean_ttft_s": round(self.ttft_s(), 3),
            "p50_ttft_s": round(self.ttft_s(50), 3),
            "p90_ttft_s": round(self.ttft_s(90), 3),
            "p99_ttft_s": round(self.ttft_s(99), 3),
            "utilization": round(self.busy_s / (self.sim_s * workers), 3) if self.sim_s else 0,
            "evictions": self.evictions, "wall_s": round(self.wall_s, 1),
            "peer_tokens": self.hit_by_tier.get("peer", 0), "fetches": self.fetches.fetches,
            "fetched_blocks": self.fetches.blocks,
        }


TIERS = TIER_PB  # the index's tier numbers are the wire's


def to_index_event(ev: PoolEvent) -> IndexEvent:
    """A KV manager event as the service's index applies it (what the worker publishes)."""
    if isinstance(ev, PoolStored):
        return IndexEvent(ev.seq, IndexStored(tuple(ev.block_hashes), ev.parent_hash or b"",
                                              TIERS[ev.tier]))
    if isinstance(ev, PoolRemoved):
        return IndexEvent(ev.seq, IndexRemoved(tuple(ev.block_hashes), TIERS[ev.tier]))
    return IndexEvent(ev.seq, IndexCleared())


class IndexRouter:
    """A real ``service.policy`` policy over a real index backend (see the module doc);
    ``label`` names its row and its namespace (default: the policy's name)."""

    def __init__(self, policy: Policy, backend: IndexBackend, cfg: ReplayConfig,
                 rng: random.Random, label: str | None = None) -> None:
        self.policy, self.backend, self.cfg, self.rng = policy, backend, cfg, rng
        self.name = label or policy.name
        self.uses_index = policy.name not in MATCH_BLIND
        self.ns = namespace(f"replay/{self.name}", cfg.block_size, cfg.hash_algo)

    async def start(self, workers: Sequence[SimWorker]) -> None:
        for w in workers if self.uses_index else ():
            await self.backend.register(WorkerRecord(
                w.worker_id, self.ns, f"sim://{w.worker_id}", f"replay/{self.name}",
                self.cfg.block_size, self.cfg.hash_algo))

    async def publish(self, workers: Sequence[SimWorker]) -> None:
        for w in workers:
            events = w.take_events()
            if events and self.uses_index:
                res = await self.backend.apply_events(
                    w.worker_id, [to_index_event(e) for e in events])
                if res.status is not ApplyStatus.OK:
                    raise RuntimeError(f"index refused {w.worker_id}'s events: {res}")

    async def choose(self, req: SimRequest, chain: list[bytes], workers: Sequence[SimWorker],
                     now: float) -> int:
        bs, now_ms = self.cfg.block_size, int(now * 1000)
        usable = chain[:(req.prompt_tokens - 1) // bs]
        matches = (await self.backend.lookup(self.ns, usable, now_ms,
                                             [w.worker_id for w in workers])
                   if usable and self.uses_index else {})
        views = [WorkerView(w.worker_id, f"sim://{w.worker_id}", w.load(now),
                            matches.get(w.worker_id, BlockMatch()), bs, self.ns)
                 for w in workers]
        key = (prompt_key(req.kv.token_ids, req.trace.salt, req.trace.lora)
               if self.policy.reads_key else b"")
        ranked = self.policy.rank(req.prompt_tokens, views, self.rng, key=key)[0]
        best, plan = ranked.view, ranked.fetch
        if plan is not None:
            req.fetch = Plan(int(plan.source.worker_id[1:]), plan.start_block + plan.blocks,
                             plan.blocks)
        if best.match.blocks < len(chain) and self.uses_index:
            await self.backend.add_provisional(self.ns, chain, best.worker_id,
                                               best.match.blocks, now_ms,
                                               int(self.cfg.provisional_ttl_s * 1000))
        return int(best.worker_id[1:])

    async def close(self, workers: Sequence[SimWorker]) -> None:
        for w in workers if self.uses_index else ():
            await self.backend.purge_worker(w.worker_id)


class PeerRouter:
    """Adapts an ``approx_tree`` / ``ray_prefix_tree`` router (or the oracle's single worker)
    to the loop; the KV events are drained and dropped (peers have no index)."""

    def __init__(self, name: str, peer: ApproxTreeRouter | RayPrefixTreeRouter | None) -> None:
        self.name, self.peer = name, peer

    async def start(self, workers: Sequence[SimWorker]) -> None:
        return None

    async def publish(self, workers: Sequence[SimWorker]) -> None:
        for w in workers:
            w.take_events()

    async def choose(self, req: SimRequest, chain: list[bytes], workers: Sequence[SimWorker],
                     now: float) -> int:
        if self.peer is None:  # oracle: every worker sees the whole cache; balance the queue
            return min(workers, key=lambda w: (w.load(now).queued_prefill_tokens,
                                               w.in_flight, w.index)).index
        return self.peer.choose(req.trace, [w.in_flight for w in workers], now)

    async def close(self, workers: Sequence[SimWorker]) -> None:
        return None


def make_cluster(name: str, cfg: ReplayConfig) -> list[SimWorker]:
    """The workers row ``name`` runs on: one pool each, or one shared pool for ``oracle``."""
    workers: list[SimWorker] = []

    def pool(blocks: int, i: int = 0) -> KVCacheManager:
        # pins live in simulated time: worker i's clock (read once the workers exist)
        kv = KVCacheManager(blocks, cfg.block_size, hash_algo=cfg.hash_algo,
                            cpu_blocks=cfg.cpu_blocks, disk_blocks=cfg.disk_blocks,
                            eviction=cfg.eviction, auto_pin=cfg.auto_pin,
                            clock=lambda: workers[i].clock)
        # The loop reads every event at each arrival; the backlog bound is for a worker
        # nobody reads, and a burst of offloads between two arrivals can pass it.
        kv.pool.max_pending_blocks = sys.maxsize
        return kv

    if parse_row(name).policy == "oracle":
        if cfg.cpu_blocks or cfg.disk_blocks:
            raise ValueError("oracle pools device blocks only; no lower tiers")
        shared = pool(cfg.capacity_blocks * cfg.workers)
        workers.extend(SimWorker(i, shared, cfg.cost) for i in range(cfg.workers))
    else:
        fetch = cfg.fetch_cost() if parse_row(name).fetch else None
        workers.extend(SimWorker(i, pool(cfg.capacity_blocks, i), cfg.cost, fetch)
                       for i in range(cfg.workers))
        for w in workers:
            w.fleet = workers
    return workers


def make_router(name: str, cfg: ReplayConfig, synth: TokenSynth,
                backend: Callable[[], IndexBackend]) -> IndexRouter | PeerRouter:
    """The router of row ``name`` (a fresh instance, seeded by ``cfg.seed``)."""
    rng = random.Random(cfg.seed)
    row = parse_row(name)
    if row.policy in INDEX_POLICIES:
        fetch = cfg.fetch_cost().costs(cfg.min_fetch_blocks) if row.fetch else None
        return IndexRouter(row.index_policy(cfg.weights, fetch), backend(), cfg, rng,
                           row.label)
    if row.policy == "approx_tree":
        return PeerRouter(name, ApproxTreeRouter(cfg.workers, rng))
    if row.policy == "ray_prefix_tree":
        return PeerRouter(name, RayPrefixTreeRouter(cfg.workers, rng, synth))
    if row.policy == "oracle":
        return PeerRouter(name, None)
    raise ValueError(f"unknown policy {name!r}; valid: {', '.join(POLICIES)}")


async def replay_policy(name: str, reqs: Sequence[TraceRequest], synth: TokenSynth,
                        cfg: ReplayConfig, backend: Callable[[], IndexBackend],
                        tick: Callable[[], None] = lambda: None) -> PolicyResult:
    """Replay ``reqs`` under row ``name`` (a label, :mod:`.rows`); ``backend()`` gives the
    index to use (only the index policies call it); ``tick()`` is called once per request
    (progress)."""
    t0 = time.perf_counter()
    workers = make_cluster(name, cfg)
    router = make_router(name, cfg, synth, backend)
    await router.start(workers)
    rejected = 0
    try:
        for tr in reqs:
            now = tr.arrival_s
            for w in workers:
                w.advance(now)
            await router.publish(workers)
            chain = synth.chain(tr)
            kv = KVRequest(f"r{tr.index}", synth.tokens(tr), salt=tr.salt, lora=tr.lora,
                           block_hashes=list(chain), num_prompt_tokens=tr.input_length)
            req = SimRequest(tr, kv)
            if not workers[0].fits(req):
                rejected += 1
            else:
                workers[await router.choose(req, chain, workers, now)].submit(req, now)
            tick()
        while any(w.waiting or w.running for w in workers):
            busy = sum(len(w.waiting) + len(w.running) for w in workers)
            for w in workers:
                w.advance(math.inf)
            if sum(len(w.waiting) + len(w.running) for w in workers) == busy:
                raise RuntimeError("the replay cannot drain: requests wait for blocks")
        await router.publish(workers)
    finally:
        await router.close(workers)
    end = max((w.clock for w in workers), default=0.0)
    start = reqs[0].arrival_s if reqs else 0.0
    tot = [w.totals for w in workers]
    managers = {id(w.kv): w.kv for w in workers}.values()
    by_tier: dict[str, int] = {}
    copies, fetches = CopyTotals(), FetchTotals()
    for t in tot:
        fetches.add(t.fetches)
        for tier, n in t.hit_by_tier.items():
            by_tier[tier] = by_tier.get(tier, 0) + n
        copies.add(t.copies)
    return PolicyResult(
        policy=name, requests=sum(t.requests for t in tot), rejected=rejected,
        prompt_tokens=sum(t.prompt_tokens for t in tot),
        hit_tokens=sum(t.hit_tokens for t in tot),
        prefill_tokens=sum(t.prefill_tokens for t in tot),
        per_worker_prefill=[t.prefill_tokens for t in tot],
        ttfts=[x for t in tot for x in t.ttfts],
        busy_s=sum(t.busy_s for t in tot), sim_s=end - start,
        evictions=sum(m.stats.evictions for m in managers),
        wall_s=time.perf_counter() - t0, hit_by_tier=by_tier, copies=copies,
        fetches=fetches)


def run(reqs: Sequence[TraceRequest], policies: Sequence[str], cfg: ReplayConfig, *,
        index: str = "memory", redis_url: str | None = None,
        progress: Callable[[str, int], Callable[[], None]] | None = None) -> list[PolicyResult]:
    """Replay ``reqs`` under each of ``policies`` (row labels, :mod:`.rows`) in turn, on one
    asyncio loop; raises ``ValueError`` for a label it cannot run before replaying any.

    ``index``: ``memory`` (a fresh in-process backend per policy) or ``redis`` (the server at
    ``redis_url``, or a private Valkey started for the run and stopped after it; each policy
    uses its own namespace and purges its workers at the end). ``progress(policy, total)``
    returns the per-request tick. The token/hash memo is shared by all policies.
    """
    rows = [parse_row(p) for p in policies]
    for row in rows:
        if row.revision is not None:
            row.index_policy()  # load the revision's code now, not after the other rows
    if index not in ("memory", "redis"):
        raise ValueError(f"unknown index backend {index!r}; valid: memory, redis")
    return asyncio.run(_run_all(reqs, policies, cfg, index, redis_url, progress))


async def _run_all(reqs: Sequence[TraceRequest], policies: Sequence[str], cfg: ReplayConfig,
                   index: str, redis_url: str | None,
                   progress: Callable[[str, int], Callable[[], None]] | None
                   ) -> list[PolicyResult]:
    server = None
    if index == "redis" and redis_url is None and any(parse_row(p).policy in INDEX_POLICIES
                                                      for p in policies):
        from deploy.redis_server import start_redis

        server = start_redis()
        redis_url = server.url
    opened: list[IndexBackend] = []

    def backend() -> IndexBackend:
        b = open_backend(index, redis_url, timeout_s=10.0)
        opened.append(b)
        return b

    synth = TokenSynth(cfg.block_size, algo=cfg.hash_algo)
    results: list[PolicyResult] = []
    try:
        for name in policies:
            tick = progress(name, len(reqs)) if progress is not None else (lambda: None)
            results.append(await replay_policy(name, reqs, synth, cfg, backend, tick))
    finally:
        for b in opened:
            await b.close()
        if server is not None:
            server.stop()
    return results
