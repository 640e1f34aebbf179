"""IndexService handlers. Stateless: all durable state is in the backend; what a replica
keeps (the worker table, metrics, round-robin counter) is a cache or per-replica statistics.

Error contract: malformed input -> INVALID_ARGUMENT, over a limit -> RESOURCE_EXHAUSTED,
unknown worker on Publish/Sync -> NOT_FOUND (register again), root hash mismatch ->
FAILED_PRECONDITION, a Heartbeat/Publish/Sync of an incarnation other than the one that
registered last -> FAILED_PRECONDITION ("stale incarnation", see ``service.index.base``), a
RegisterWorker for an id a live worker holds from another address or credential ->
ALREADY_EXISTS (the state of the id, not the caller's rights, refuses it: a worker restarted
on a new port gets it too, and its link retries until the old record expires),
backend unreachable on a worker call -> UNAVAILABLE (retry). The worker calls' bodies live
in ``service.feed``. Route and Stats never fail because of the backend: they answer from the
worker table with ``degraded=true``.
PinPrefix needs the index to find the holders (UNAVAILABLE without it); UnpinPrefix does
not; a worker that fails either is an error string in the answer (``service.pins``). A
rejected request changes nothing. Every handler goes through :func:`_rpc`, so no handler
answers UNKNOWN: any other exception is a bug, logged with its traceback and answered
INTERNAL.

Time: every handler reads the injected ``clock`` (``service.clock``), never ``time``: tests
move it by hand. Route's steps are methods named for what they do; their pure parts live in
``service.route``.
"""
from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from kvmesh.contract import LEAST_LOADED
from kvmesh.rpc.auth import bearer
from kvmesh.v1 import index_pb2 as pb
from kvmesh.v1 import index_pb2_grpc as pb_grpc
from service import validate
from service.auth import fingerprint
from service.clock import Clock, wall_ms
from service.config import ServiceConfig
from service.feed import WorkerFeed
from service.hash_memo import BlockHashMemo
from service.index.base import (
    BlockCap,
    BlockMatch,
    IndexBackend,
    IndexUnavailable,
    OverCap,
    StaleIncarnation,
    WorkerIdInUse,
    WorkerRecord,
)
from service.liveness import WorkerTable
from service.metrics import ServiceMetrics
from service.pins import PinService
from service.policy import Policy, Ranked, WorkerView, make_policies
from service.route import (
    cap_match,
    hash_in_thread,
    live_groups,
    pb_load,
    prefix_key,
    response,
    usable_blocks,
)
from service.route_log import RouteLog, decision
from service.validate import RequestError

log = logging.getLogger("kvmesh.service")
T = TypeVar("T")
def _rpc(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """Turn RequestError into ``context.abort``, an unreachable backend into UNAVAILABLE and
    anything else (a bug) into INTERNAL with a message and a logged traceback: an exception
    escaping a grpc.aio handler would reach the client as UNKNOWN, which says nothing and
    which no retry rule can classify. A handler with a ``context`` parameter gets the call's
    context too (to read its metadata)."""
    wants_context = "context" in inspect.signature(fn).parameters  # to read call metadata

    @functools.wraps(fn)
    async def wrapper(self: IndexServicer, request: Any, context: grpc.aio.ServicerContext) -> T:
        try:
            if wants_context:
                return await fn(self, request, context)
            return await fn(self, request)
        except RequestError as e:
            await context.abort(e.code, e.message)
        except StaleIncarnation as e:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        except OverCap as e:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        except WorkerIdInUse as e:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, str(e))
        except IndexUnavailable as e:
            self.mark_down()
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"index backend unreachable: {e}")
        except Exception as e:
            log.exception("%s failed", fn.__name__)
            await context.abort(grpc.StatusCode.INTERNAL,
                                f"{fn.__name__}: internal error: {type(e).__name__}: {e}")
        raise AssertionError("unreachable")

    return wrapper


class IndexServicer(pb_grpc.IndexServiceServicer):
    """The eight RPCs over one backend; see the module docstring for the error contract."""

    def __init__(self, config: ServiceConfig, backend: IndexBackend,
                 clock: Clock = wall_ms) -> None:
        self.cfg = config
        self.clock = clock  # every time the servicer reads (see service.clock)
        self.backend = backend
        self.table = WorkerTable(int(config.liveness_timeout_s * 1000))
        self.block_cap = BlockCap(config.indexed_blocks_per_pool, config.min_indexed_cap)
        self.metrics = ServiceMetrics()
        self.policies: dict[str, Policy] = make_policies(config.weights)
        self.rng = random.Random()
        self.hash_memo = BlockHashMemo()  # shared prefixes are hashed once (exact memo)
        self._down_until_ms = 0  # until then Route answers degraded at once
        self._forced_refresh_ms = 0  # last refresh a Route forced (see _forced_refresh)
        self.pins = PinService(config, self.table, self._lookup, self._hashes,
                               self.policies["kvmesh"], self.rng, self.clock)
        self.feed = WorkerFeed(config, backend, self.table, self.block_cap, self.metrics,
                               self.clock)
        # None (the default): no record is even built (service.route_log)
        self.route_log = RouteLog(config.route_log) if config.route_log else None

    def close(self) -> None:
        """Release what the servicer holds open (the route log)."""
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

    # --- worker RPCs (service.feed) -------------------------------------------------------

    @_rpc
    async def RegisterWorker(self, req: pb.RegisterWorkerRequest,
                             context: grpc.aio.ServicerContext) -> pb.RegisterWorkerResponse:
        """Register (or re-register) a worker under the fingerprint of the credential it
        presents (``WorkerFeed.register``)."""
        credential = fingerprint(bearer(context.invocation_metadata()))
        return await self.feed.register(req, credential)

    @_rpc
    async def Heartbeat(self, req: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
        return await self.feed.heartbeat(req)

    @_rpc
    async def PublishEvents(self, req: pb.PublishEventsRequest) -> pb.PublishEventsResponse:
        return await self.feed.publish(req)

    @_rpc
    async def SyncWorker(self, req: pb.SyncWorkerRequest) -> pb.SyncWorkerResponse:
        return await self.feed.sync(req)

    # --- router RPCs --------------------------------------------------------------------

    def _live_groups(self, model: str, now: int, degraded: bool) -> dict[str, list[WorkerRecord]]:
        return live_groups(self.table.live(now, degraded), model)

    async def _hashes(self, inp: validate.RouteInput, block_size: int, algo: str) -> list[bytes]:
        def run() -> list[bytes]:
            return self.hash_memo.block_hashes(inp.tokens, block_size, algo=algo,
                                               seed=self.cfg.hash_seed, salt=inp.salt,
                                               lora=inp.lora, mm=inp.mm)

        if hash_in_thread(inp, block_size, self.cfg.hash_thread_work):
            return await asyncio.to_thread(run)
        return run()

    def _answer(self, inp: validate.RouteInput, ranked: list[Ranked], policy: str,
                degraded: bool) -> pb.RouteResponse:
        """The response, counted in the metrics."""
        self.metrics.routes.labels(policy, str(degraded).lower()).inc()
        self.metrics.prompt_tokens.inc(len(inp.tokens))
        if ranked:
            self.metrics.matched_tokens.inc(ranked[0].matched_tokens)
        if degraded:
            self.metrics.degraded.inc()
        return response(inp, ranked, policy, degraded)

    def _degraded(self, inp: validate.RouteInput, now: int) -> pb.RouteResponse:
        """Route from the worker table alone (least loaded first): the index is down."""
        groups = self._live_groups(inp.model, now, degraded=True)
        views = [WorkerView(r.worker_id, r.address, self.table.load(r), BlockMatch(),
                            r.block_size, r.ns) for recs in groups.values() for r in recs]
        ranked = self.policies[LEAST_LOADED].rank(len(inp.tokens), views, self.rng)
        if self.route_log is not None and not inp.dry_run:
            self.route_log.write(decision(self.clock(), self.policies[LEAST_LOADED],
                                          len(inp.tokens), ranked, self.table, degraded=True))
        return self._answer(inp, ranked, LEAST_LOADED, degraded=True)

    @_rpc
    async def Route(self, req: pb.RouteRequest) -> pb.RouteResponse:
        t0 = time.perf_counter()
        inp = validate.route(req, self.cfg)
        out = await self._route(inp, self.clock())
        self.metrics.route_latency.observe(time.perf_counter() - t0)
        return out

    async def _route(self, inp: validate.RouteInput, now: int) -> pb.RouteResponse:
        """Live workers by namespace, their cached matches, the policy's ranking, then (not
        on a dry run) the chosen worker's provisional entries and routed load. Whenever the
        index cannot answer, the answer comes from the worker table (degraded)."""
        groups = None if self.index_down else await self._groups(inp.model, now)
        if groups is None:
            return self._degraded(inp, now)
        try:
            views, chains, held = await self._views(inp, groups, now)
        except IndexUnavailable:
            return self._degraded(inp, now)
        policy = self.policies[inp.policy]
        key = prefix_key(inp) if policy.reads_key else b""  # a few us: only for its readers
        ranked = policy.rank(len(inp.tokens), views, self.rng, key=key)
        if self.route_log is not None and not inp.dry_run:
            self.route_log.write(decision(self.clock(), policy, len(inp.tokens), ranked,
                                          self.table))
        if not inp.dry_run:
            best = ranked[0].view
            await self._provisional(best, chains[best.ns], held[best.ns, best.worker_id], now)
            self.table.add_work(best.worker_id, max(len(inp.tokens) - best.matched_tokens, 0))
        return self._answer(inp, ranked, inp.policy, degraded=False)

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
            chain = chains[ns] = await self._hashes(inp, bs, algo)
            matches = await self._lookup(ns, chain, recs, now) if chain else {}
            usable = usable_blocks(len(inp.tokens), bs)
            for r in recs:
                m = matches.get(r.worker_id, BlockMatch())
                held[ns, r.worker_id] = m.blocks
                views.append(WorkerView(r.worker_id, r.address, self.table.load(r),
                                        cap_match(m, usable), bs, ns))
        return views, chains, held

    async def _lookup(self, ns: str, chain: list[bytes], recs: list[WorkerRecord],
                      now: int) -> dict[str, BlockMatch]:
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

    # --- admin RPCs (service.pins) -------------------------------------------------------

    @_rpc
    async def PinPrefix(self, req: pb.PinPrefixRequest) -> pb.PinPrefixResponse:
        return await self.pins.pin(validate.pin(req, self.cfg))

    @_rpc
    async def UnpinPrefix(self, req: pb.UnpinPrefixRequest) -> pb.UnpinPrefixResponse:
        return await self.pins.unpin(validate.unpin(req, self.cfg))

    @_rpc
    async def Stats(self, req: pb.StatsRequest) -> pb.StatsResponse:
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
