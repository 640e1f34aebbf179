"""IndexService handlers. Stateless: all durable state is in the backend; what a replica keeps
(the worker table, metrics, round-robin counter) is a cache or per-replica statistics.

A dispatcher only: each handler validates and hands its request to ``WorkerFeed`` (worker
calls), ``Router`` (Route, Stats), ``PinService`` (pins) or ``QuotaBook`` (tenant quotas).
Error contract: malformed -> INVALID_ARGUMENT, over a limit -> RESOURCE_EXHAUSTED, unknown
worker -> NOT_FOUND, root hash or incarnation mismatch -> FAILED_PRECONDITION, a live
worker's id from another address or credential -> ALREADY_EXISTS, backend down on a worker
call -> UNAVAILABLE; anything else is a bug answered INTERNAL (:func:`_rpc`: never UNKNOWN).
Route and Stats never fail because of the backend (degraded answers). A rejected request
changes nothing. Time: the injected ``clock`` only.

See docs/architecture.md#the-service-process.
"""
from __future__ import annotations

import functools
import inspect
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from kvmesh.rpc.auth import bearer
from kvmesh.v1 import index_pb2 as pb
from kvmesh.v1 import index_pb2_grpc as pb_grpc
from service import validate
from service.auth import fingerprint
from service.clock import Clock, wall_ms
from service.config import ServiceConfig
from service.feed import WorkerFeed
from service.index.base import (
    BlockCap,
    IndexBackend,
    IndexUnavailable,
    OverCap,
    StaleIncarnation,
    WorkerIdInUse,
)
from service.liveness import WorkerTable
from service.metrics import ServiceMetrics
from service.pins import PinService
from service.policy import make_policies
from service.quotas import QuotaBook
from service.route import Router
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
            self.router.mark_down()
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"index backend unreachable: {e}")
        except Exception as e:
            log.exception("%s failed", fn.__name__)
            await context.abort(grpc.StatusCode.INTERNAL,
                                f"{fn.__name__}: internal error: {type(e).__name__}: {e}")
        raise AssertionError("unreachable")

    return wrapper


class IndexServicer(pb_grpc.IndexServiceServicer):
    """The ten RPCs over one backend; see the module docstring for the error contract."""

    def __init__(self, config: ServiceConfig, backend: IndexBackend,
                 clock: Clock = wall_ms) -> None:
        self.cfg = config
        self.clock = clock  # every time the servicer reads (see service.clock)
        self.backend = backend
        self.table = WorkerTable(int(config.liveness_timeout_s * 1000))
        self.metrics = ServiceMetrics()
        if hasattr(backend, "writes"):  # the cluster backend merges batches' writes
            self.metrics.count_merges(backend.writes)
        policies = make_policies(config.weights, config.fetch_costs)
        rng = random.Random()
        self.router = Router(config, backend, self.table, self.metrics, policies, rng, clock)
        self.pins = PinService(config, self.table, self.router.lookup, self.router.hashes,
                               policies["kvmesh"], rng, clock)
        block_cap = BlockCap(config.indexed_blocks_per_pool, config.min_indexed_cap)
        self.quotas = QuotaBook(config, backend, clock)
        self.feed = WorkerFeed(config, backend, self.table, block_cap, self.metrics, clock,
                               self.quotas)

    def close(self) -> None:
        """Release what the servicer holds open (the router's route log)."""
        self.router.close()

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

    # --- router RPCs (service.route) -------------------------------------------------------

    @_rpc
    async def Route(self, req: pb.RouteRequest) -> pb.RouteResponse:
        t0 = time.perf_counter()
        out = await self.router.route(validate.route(req, self.cfg))
        self.metrics.route_latency.observe(time.perf_counter() - t0)
        return out

    @_rpc
    async def Stats(self, req: pb.StatsRequest) -> pb.StatsResponse:
        return await self.router.stats()

    # --- admin RPCs (service.pins) -------------------------------------------------------

    @_rpc
    async def PinPrefix(self, req: pb.PinPrefixRequest) -> pb.PinPrefixResponse:
        return await self.pins.pin(validate.pin(req, self.cfg))

    @_rpc
    async def UnpinPrefix(self, req: pb.UnpinPrefixRequest) -> pb.UnpinPrefixResponse:
        return await self.pins.unpin(validate.unpin(req, self.cfg))

    # --- admin RPCs (service.quotas) -----------------------------------------------------

    @_rpc
    async def SetTenantQuota(self, req: pb.SetTenantQuotaRequest) -> pb.SetTenantQuotaResponse:
        return await self.quotas.set(req)

    @_rpc
    async def GetTenantQuotas(self, req: pb.GetTenantQuotasRequest
                              ) -> pb.GetTenantQuotasResponse:
        return await self.quotas.get()
