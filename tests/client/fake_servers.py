"""In-test gRPC servers for the client tests: a scripted IndexService and WorkerService.

The client is the unit under test, so these fakes only do what each test scripts: answer a
fixed route, stream a fixed generation, fail in a chosen way, and record what they received.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager

import grpc

from client.convert import route_tokens
from kvmesh.v1 import index_pb2, index_pb2_grpc, worker_pb2, worker_pb2_grpc
from tests.ports import closed_port_address  # noqa: F401  (the client tests import it here)

AFTER_FINAL = -1  # FakeWorker.fail_after: fail once the final message went out


def start_server(servicer: object, add) -> tuple[grpc.Server, str]:
    """Serve ``servicer`` on a free loopback port; returns the server and its address."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    add(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


@contextmanager
def heartbeating(stub: index_pb2_grpc.IndexServiceStub, worker_id: str, incarnation: int,
                 metadata: tuple[tuple[str, str], ...], total_blocks: int = 64) -> Iterator[None]:
    """Heartbeats for a fake registered at a real service, every 0.3 s until exit.

    A fake that only registers leaves routing after the liveness timeout (3 s by default);
    on a loaded host that can pass before the test routes to it (CI saw it once)."""
    stop = threading.Event()
    load = index_pb2.WorkerLoad(free_blocks=total_blocks, total_blocks=total_blocks)

    def beat() -> None:
        while True:
            stub.Heartbeat(index_pb2.HeartbeatRequest(
                worker_id=worker_id, incarnation=incarnation, load=load),
                metadata=metadata, timeout=5)
            if stop.wait(0.3):
                return

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)


def _check_token(context: grpc.ServicerContext, token: str | None) -> None:
    if token is None:
        return
    md = dict(context.invocation_metadata())
    if md.get("authorization") != f"Bearer {token}":
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")


class FakeIndex(index_pb2_grpc.IndexServiceServicer):
    """Answers Route with ``candidates`` and Stats with ``stats``; records requests."""

    def __init__(self, candidates: list[index_pb2.Candidate] | None = None,
                 token: str | None = None) -> None:
        self.candidates = candidates or []
        self.token = token
        self.degraded = False
        self.error: tuple[grpc.StatusCode, str] | None = None
        self.hang = False  # answer nothing until the caller gives up (its deadline)
        self.routes: list[index_pb2.RouteRequest] = []
        self.metadata: list[dict[str, str]] = []
        self.stats = index_pb2.StatsResponse()
        self.pins: list[index_pb2.PinPrefixRequest | index_pb2.UnpinPrefixRequest] = []
        self.pinned: list[index_pb2.PinnedWorker] = []  # the answer to PinPrefix/UnpinPrefix

    def _enter(self, context: grpc.ServicerContext) -> None:
        self.metadata.append(dict(context.invocation_metadata()))
        _check_token(context, self.token)
        if self.hang:
            while context.is_active():
                time.sleep(0.01)
        if self.error is not None:
            context.abort(*self.error)

    def Route(self, request, context):
        self._enter(context)
        if request.token_ids_packed:  # read the prompt as the service does: either field
            request.token_ids.extend(route_tokens(request))
        self.routes.append(request)
        return index_pb2.RouteResponse(candidates=self.candidates, degraded=self.degraded,
                                       prompt_tokens=len(request.token_ids), policy="kvmesh")

    def Stats(self, request, context):
        self._enter(context)
        return self.stats

    def PinPrefix(self, request, context):
        self._enter(context)
        self.pins.append(request)
        return index_pb2.PinPrefixResponse(chain_blocks=len(request.prefix.token_ids) // 4,
                                           workers=self.pinned)

    def UnpinPrefix(self, request, context):
        self._enter(context)
        self.pins.append(request)
        return index_pb2.UnpinPrefixResponse(workers=self.pinned)


class FakeWorker(worker_pb2_grpc.WorkerServiceServicer):
    """Streams ``max_tokens`` tokens (100, 101, ...) in chunks of 2, then the final facts.

    ``mode``: ``ok``; ``abort`` (one chunk, then UNAVAILABLE); ``truncate`` (one chunk, then a
    clean end without the final message); ``hang`` (no answer until cancelled);
    ``invalid`` (INVALID_ARGUMENT at once); ``fail`` (abort with ``failure``, a
    ``(code, message)``, after ``fail_after`` token chunks, or after the final message when
    ``fail_after`` is ``AFTER_FINAL``).
    """

    def __init__(self, worker_id: str, mode: str = "ok", cached: int = 0,
                 token: str | None = None) -> None:
        self.worker_id = worker_id
        self.mode = mode
        self.cached = cached
        self.cached_by_tier: dict[str, int] = {}  # the final message's split, if any
        self.token = token
        self.failure: tuple[grpc.StatusCode, str] = (grpc.StatusCode.INTERNAL, "scripted")
        self.fail_after = 0
        # set: each Generate waits for a permit before answering (a test paces the worker)
        self.permits: threading.Semaphore | None = None
        self.requests: list[worker_pb2.GenerateRequest] = []
        self.metadata: list[dict[str, str]] = []
        self.peer: worker_pb2.PeerStats | None = None  # Stats' peer counters (None: unset)
        self.tenants: list[worker_pb2.TenantStats] = []  # Stats' tenant rows (none: old)

    def _fail_at(self, context: grpc.ServicerContext, point: int) -> None:
        if self.mode == "fail" and self.fail_after == point:
            context.abort(*self.failure)

    def Generate(self, request, context):
        self.metadata.append(dict(context.invocation_metadata()))
        _check_token(context, self.token)
        self.requests.append(request)
        if self.permits is not None:
            self.permits.acquire(timeout=10)
        if self.mode == "invalid":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "prompt longer than the model")
        if self.mode == "hang":
            while context.is_active():
                time.sleep(0.02)
            return
        self._fail_at(context, 0)
        tokens = [100 + i for i in range(request.sampling.max_tokens)]
        for i in range(0, len(tokens), 2):
            yield worker_pb2.GenerateResponse(token_ids=tokens[i:i + 2])
            self._fail_at(context, i // 2 + 1)
            if self.mode == "abort":
                context.abort(grpc.StatusCode.UNAVAILABLE, "worker shutting down")
            if self.mode == "truncate":
                return
        yield worker_pb2.GenerateResponse(
            finished=True, finish_reason="length", num_cached_tokens=self.cached,
            prompt_tokens=len(request.token_ids), ttft_s=0.0125, e2e_s=0.05,
            worker_id=self.worker_id, cached_tokens_by_tier=self.cached_by_tier)
        self._fail_at(context, AFTER_FINAL)

    def Stats(self, request, context):
        self.metadata.append(dict(context.invocation_metadata()))
        _check_token(context, self.token)
        return worker_pb2.WorkerStatsResponse(
            worker_id=self.worker_id, model="tiny",
            load=index_pb2.WorkerLoad(running=1, free_blocks=90, total_blocks=128),
            cache=worker_pb2.CacheStats(queries=100, hits=75, hit_rate=0.75, cached_blocks=30,
                                        used_blocks=8, free_blocks=90, total_blocks=128),
            requests_done=7, index_promised_tokens=64, index_served_tokens=48,
            peer=self.peer, tenants=self.tenants)


def candidate(worker_id: str, address: str, matched: int = 0, cost: float = 1.0,
              tier: int = index_pb2.TIER_GPU,
              by_tier: dict[str, int] | None = None) -> index_pb2.Candidate:
    """A route candidate with a small load (``by_tier``: its matched tokens per tier)."""
    return index_pb2.Candidate(worker_id=worker_id, address=address, matched_tokens=matched,
                               tier=tier, cost=cost, matched_tokens_by_tier=by_tier or {},
                               load=index_pb2.WorkerLoad(running=1, waiting=2, free_blocks=10,
                                                         total_blocks=16))
