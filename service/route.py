"""Route (and Stats): the router-facing reads of the index, over the replica's worker table.

:class:`Router` holds what a Route uses: policies, the hash memo, provisional entries, the
route log and the backend's health. A Route or Stats never fails because of the backend
(degraded: least loaded from the worker table). Not on a dry run, the chosen worker gets
provisional entries and the routed load. Time comes from the injected ``clock`` only.

See docs/architecture.md#routing-in-the-service.
"""
from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import replace

import grpc

from kvmesh.contract import LEAST_LOADED
from kvmesh.v1 import index_pb2 as pb
from service import fetch_plans, validate
from service.clock import Clock
from service.config import ServiceConfig
from service.hash_memo import BlockHashMemo
from service.index.base import BlockMatch, IndexBackend, IndexUnavailable, WorkerRecord
from service.liveness import WorkerTable
from service.metrics import ServiceMetrics
from service.policy import Policy, Ranked, WorkerView
from service.route_log import RouteLog, decision
from service.route_steps import (
    cap_match,
    hash_in_thread,
    live_groups,
    only,
    pb_load,
    prefix_key,
    response,
    usable_blocks,
)
from service.validate import RequestError

log = logging.getLogger("kvmesh.service")


class Router:
    """Route and Stats over one backend and the replica's worker ``table``."""

    def __init__(self, config: ServiceConfig, backend: IndexBackend, table: WorkerTable,
                 metrics: ServiceMetrics, policies: dict[str, Policy], rng: random.Random,
                 clock: Clock) -> None:
        self.cfg = config
        self.backend = backend
        self.table = table
        self.metrics = metrics
        self.policies = policies
        self.rng = rng
        self.clock = clock
        self.hash_memo = BlockHashMemo()  # shared prefixes are hashed once (exact memo)
        self._down_until_ms = 0  # until then Route answers degraded at once
        self._forced_refresh_ms = 0  # last refresh a Route forced (see _forced_refresh)
        # None (the default): no record is even built (service.route_log)
        self.route_log = RouteLog(config.route_log) if config.route_log else None

    def close(self) -> None:
        """Release what the router holds open (the route log)."""
        if self.route_log is not None:
            self.route_log.close()

    # --- backend health -----------------------------------------------------------------

    def mark_down(self) -> None:
        self._down_until_ms = self.clock() + int(self.cfg.degraded_retry_s * 1000)

    def mark_up(self) -> None:
        self._down_until_ms = 0

    @property
    def index_down(self) -> bool:
        return self.clock() < self._down_until_ms

    async def refresh(self) -> None:
        """Re-read every worker record (the background loop calls this)."""
        records = await self.backend.workers()
        now = self.clock()
        self.table.replace_all(records, now)
        self.mark_up()
        self.metrics.live_workers.set(len(self.table.live(now)))

    # --- Route --------------------------------------------------------------------------

    async def route(self, inp: validate.RouteInput) -> pb.RouteResponse:
        """Live workers by namespace, their cached matches, the policy's ranking, then (not
        on a dry run) the chosen worker's provisional entries and routed load. Whenever the
        index cannot answer, the answer comes from the worker table (degraded). With
        ``worker_id`` every live worker of its model is ranked (a peer fetch to it may pull
        from any of them) and only that worker's entry is answered."""
        now = self.clock()
        if inp.worker_id:
            inp = await self._target(inp, now)
        groups = None if self.index_down else await self._groups(inp.model, now)
        if groups is None:
            return self._degraded(inp, now)
        try:
            views, chains, held = await self._views(inp, groups, now)
        except IndexUnavailable:
            return self._degraded(inp, now)
        policy = self.policies[inp.policy]
        key = prefix_key(inp) if policy.reads_key else b""  # a few us: only for its readers
        ranked = only(policy.rank(len(inp.tokens), views, self.rng, key=key), inp.worker_id)
        if self.route_log is not None and not inp.dry_run:
            self.route_log.write(decision(self.clock(), policy, len(inp.tokens), ranked,
                                          self.table))
        if not inp.dry_run:
            best = ranked[0].view
            await self._provisional(best, chains[best.ns], held[best.ns, best.worker_id], now)
            self.table.add_work(best.worker_id,
                                max(len(inp.tokens) - ranked[0].matched_tokens, 0))
        return self._answer(inp, ranked, inp.policy, degraded=False, chains=chains)

    async def _target(self, inp: validate.RouteInput, now: int) -> validate.RouteInput:
        """``inp`` with its model set to that of the live worker ``inp.worker_id`` (once
        re-reading the records when this replica does not know it: it may have registered
        through another replica). Raises NOT_FOUND for a worker that is not live here,
        INVALID_ARGUMENT for one serving another model than ``inp.model``."""
        rec = self._live_record(inp.worker_id, now)
        if rec is None and not self.index_down and await self._forced_refresh(now):
            rec = self._live_record(inp.worker_id, self.clock())
        if rec is None:
            raise RequestError(grpc.StatusCode.NOT_FOUND, f"worker_id {inp.worker_id!r} is "
                               "not a live worker: route without worker_id, or name one that "
                               "`kvmesh stats` lists as alive")
        if inp.model and rec.model != inp.model:
            raise RequestError(validate.INVALID, f"worker {inp.worker_id!r} serves model "
                               f"{rec.model!r}, not {inp.model!r}: name a worker of that "
                               "model, or leave RouteRequest.model empty")
        return replace(inp, model=rec.model)

    def _live_record(self, worker_id: str, now: int) -> WorkerRecord | None:
        rec = self.table.get(worker_id)
        if rec is None:
            return None
        alive = self.table.degraded_alive(rec, now) if self.index_down else \
            self.table.alive(rec, now)
        return rec if alive else None

    def _live_groups(self, model: str, now: int, degraded: bool) -> dict[str, list[WorkerRecord]]:
        return live_groups(self.table.live(now, degraded), model)

    async def hashes(self, inp: validate.RouteInput, block_size: int, algo: str) -> list[bytes]:
        """``inp``'s chain of block hashes for one namespace, through the memo; in a worker
        thread when it is long enough to stall the event loop (``hash_thread_work``)."""
        def run() -> list[bytes]:
            return self.hash_memo.block_hashes(inp.tokens, block_size, algo=algo,
                                               seed=self.cfg.hash_seed, salt=inp.salt,
                                               lora=inp.lora, mm=inp.mm)

        if hash_in_thread(inp, block_size, self.cfg.hash_thread_work):
            return await asyncio.to_thread(run)
        return run()

    def _answer(self, inp: validate.RouteInput, ranked: list[Ranked], policy: str,
                degraded: bool, chains: dict[str, list[bytes]] | None = None,
                ) -> pb.RouteResponse:
        """The response, with the fetch plan (and its ticket) of each returned candidate
        that pulls blocks from a peer (``service.fetch_plans``), counted in the metrics."""
        self.metrics.routes.labels(policy, str(degraded).lower()).inc()
        self.metrics.prompt_tokens.inc(len(inp.tokens))
        if ranked:
            self.metrics.matched_tokens.inc(ranked[0].matched_tokens)
        if degraded:
            self.metrics.degraded.inc()
        out = response(inp, ranked, policy, degraded)
        now = self.clock()
        for rank, (cand, r) in enumerate(zip(out.candidates, ranked, strict=False)):
            if r.fetch is not None and chains is not None:
                cand.fetch.CopyFrom(fetch_plans.plan(self.cfg, r.view.worker_id, r.fetch,
                                                     chains[r.view.ns], now))
                self.metrics.fetch_plans.labels("chosen" if rank == 0 else "other").inc()
                if rank == 0:
                    self.metrics.fetch_blocks.inc(r.fetch.blocks)
        return out

    def _degraded(self, inp: validate.RouteInput, now: int) -> pb.RouteResponse:
        """Route from the worker table alone (least loaded first): the index is down."""
        groups = self._live_groups(inp.model, now, degraded=True)
        views = [WorkerView(r.worker_id, r.address, self.table.load(r), BlockMatch(),
                            r.block_size, r.ns) for recs in groups.values() for r in recs]
        ranked = only(self.policies[LEAST_LOADED].rank(len(inp.tokens), views, self.rng),
                      inp.worker_id)
        if self.route_log is not None and not inp.dry_run:
            self.route_log.write(decision(self.clock(), self.policies[LEAST_LOADED],
                                          len(inp.tokens), ranked, self.table, degraded=True))
        return self._answer(inp, ranked, LEAST_LOADED, degraded=True)

    async def _groups(self, model: str, now: int) -> dict[str, list[WorkerRecord]] | None:
        """The live workers of ``model`` by namespace; ``None``: answer degraded."""
        try:
            return self._live_groups(model, now, degraded=False)
        except RequestError as e:
            if e.code != grpc.StatusCode.UNAVAILABLE:
                raise
            # An emptied/restarted Redis forgets every worker until they re-register (one
            # heartbeat): answer from what this replica last knew instead of failing.
            if self.table.lost(now):
                return None
            if not await self._forced_refresh(now):
                raise
        return self._live_groups(model, self.clock(), degraded=False)

    async def _forced_refresh(self, now: int) -> bool:
        """Refresh for a Route that found no worker: some may have registered through
        another replica since this one's last refresh. At most once every
        ``forced_refresh_min_s``, so a flood of routes for an unserved model cannot turn
        into a flood of reads. False: throttled, or the index is unreachable."""
        if now - self._forced_refresh_ms < int(self.cfg.forced_refresh_min_s * 1000):
            return False
        self._forced_refresh_ms = now
        try:
            await self.refresh()
        except IndexUnavailable:
            return False
        return True

    async def _views(self, inp: validate.RouteInput, groups: dict[str, list[WorkerRecord]],
                     now: int) -> tuple[list[WorkerView], dict[str, list[bytes]],
                                        dict[tuple[str, str], int]]:
        """What the policy sees of each live worker (its match capped at the usable
        blocks), each namespace's chain, and the blocks each (ns, worker) holds uncapped.
        Raises IndexUnavailable (the index marked down) when a lookup fails."""
        views: list[WorkerView] = []
        chains: dict[str, list[bytes]] = {}
        held: dict[tuple[str, str], int] = {}
        for ns, recs in groups.items():
            bs, algo = recs[0].block_size, recs[0].algo
            chain = chains[ns] = await self.hashes(inp, bs, algo)
            matches = await self.lookup(ns, chain, recs, now) if chain else {}
            usable = usable_blocks(len(inp.tokens), bs)
            for r in recs:
                m = matches.get(r.worker_id, BlockMatch())
                held[ns, r.worker_id] = m.blocks
                views.append(WorkerView(r.worker_id, r.address, self.table.load(r),
                                        cap_match(m, usable), bs, ns))
        return views, chains, held

    async def lookup(self, ns: str, chain: list[bytes], recs: list[WorkerRecord],
                     now: int) -> dict[str, BlockMatch]:
        """Each of ``recs``' match of ``chain`` in ``ns``, counted in the metrics; a failure
        marks the index down and is raised."""
        try:
            matches = await self.backend.lookup(ns, chain, now, [r.worker_id for r in recs])
        except IndexUnavailable as e:
            log.warning("index lookup failed, answering degraded: %s", e)
            self.metrics.lookups.labels("error").inc()
            self.mark_down()
            raise
        self.metrics.lookups.labels("ok").inc()
        return matches

    async def _provisional(self, best: WorkerView, chain: list[bytes], start: int,
                           now: int) -> None:
        """Record that ``best`` will compute and hold ``chain[start:]``: said at once, so
        the next route of the same prefix goes there too (a failure only loses that)."""
        if start >= len(chain):
            return
        try:
            await self.backend.add_provisional(best.ns, chain, best.worker_id, start, now,
                                               int(self.cfg.provisional_ttl_s * 1000))
        except IndexUnavailable as e:
            log.warning("could not record provisional entries: %s", e)
            self.mark_down()

    # --- Stats --------------------------------------------------------------------------

    async def stats(self) -> pb.StatsResponse:
        """Every worker record with its blocks; from the worker table (degraded) when the
        index cannot answer."""
        degraded = self.index_down
        records: list[WorkerRecord] = []
        if not degraded:
            try:
                records = await self.backend.workers(with_blocks=True)
            except IndexUnavailable:
                self.mark_down()
                degraded = True
        if degraded:
            records = self.table.all()
            self.metrics.degraded.inc()
        now = self.clock()
        self.metrics.live_workers.set(len(self.table.live(now)))
        infos = [pb.WorkerInfo(
            worker_id=r.worker_id, address=r.address, model=r.model,
            alive=self.table.alive(r, now), load=pb_load(r.load),
            indexed_blocks=max(r.indexed_blocks, 0), last_seq=r.last_seq,
            heartbeat_age_s=max(now - r.heartbeat_ms, 0) / 1000.0) for r in records]
        return pb.StatsResponse(workers=infos, counters=self.metrics.summary(),
                                degraded=degraded)
