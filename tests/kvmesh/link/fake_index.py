"""An ``IndexService`` that keeps one worker's view as the real one does, and misbehaves on
demand: the link's tests see every call it gets and decide its answers.

The view follows the index's rules: a snapshot replaces it and sets ``last_seq``; a batch
applies only when its first seq follows ``last_seq`` (else: resync, nothing applied); a
heartbeat whose ``last_seq`` differs from the view's asks for a resync.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
import grpc.aio

from kvmesh.v1 import index_pb2 as pb
from kvmesh.v1 import index_pb2_grpc as pb_grpc
from tests.ports import free_port


@dataclass
class Misbehave:
    """What the fake does wrong (the tests set these while it runs)."""

    max_batch_events: int = 0       # > 0: a larger batch is refused (RESOURCE_EXHAUSTED)
    publish_delay_s: float = 0.0    # each PublishEvents waits this long before it applies
    beat_resync_in_flight: bool = False  # a heartbeat during a publish asks for a resync
    reregister_next_beat: bool = False   # the next heartbeat is told to register again
    resync_next_beat: bool = False       # the next heartbeat is told to resync


@dataclass
class FakeIndex(pb_grpc.IndexServiceServicer):
    """One worker's view, every request kept (``calls``: (method, time, request))."""

    heartbeat_ms: int = 200
    bad: Misbehave = field(default_factory=Misbehave)
    calls: list[tuple[str, float, object]] = field(default_factory=list)
    view: set[tuple[bytes, int]] = field(default_factory=set)  # (hash, tier)
    last_seq: int = 0
    in_flight: int = 0
    quotas: pb.TenantQuotas | None = None  # answered to a heartbeat of another version

    def of(self, method: str) -> list:
        return [req for m, _, req in self.calls if m == method]

    def times(self, method: str) -> list[float]:
        return [t for m, t, _ in self.calls if m == method]

    def _note(self, method: str, req: object) -> None:
        self.calls.append((method, time.monotonic(), req))

    async def RegisterWorker(self, req, context):  # noqa: N802 - gRPC's name
        self._note("RegisterWorker", req)
        return pb.RegisterWorkerResponse(heartbeat_interval_ms=self.heartbeat_ms,
                                         liveness_timeout_ms=3 * self.heartbeat_ms)

    async def Heartbeat(self, req, context):  # noqa: N802
        self._note("Heartbeat", req)
        bad = self.bad
        if bad.reregister_next_beat:
            bad.reregister_next_beat = False
            return pb.HeartbeatResponse(reregister=True)
        if bad.resync_next_beat:
            bad.resync_next_beat = False
            return pb.HeartbeatResponse(resync=True)
        ahead = bad.beat_resync_in_flight and self.in_flight > 0
        resp = pb.HeartbeatResponse(resync=ahead or req.last_seq != self.last_seq)
        if self.quotas is not None and self.quotas.version != req.quota_version:
            resp.quotas.CopyFrom(self.quotas)
        return resp

    async def SyncWorker(self, req, context):  # noqa: N802
        self._note("SyncWorker", req)
        self.view = {(h, run.tier) for run in req.blocks for h in run.block_hashes}
        self.last_seq = req.seq
        return pb.SyncWorkerResponse(indexed_blocks=len(self.view))

    async def PublishEvents(self, req, context):  # noqa: N802
        self._note("PublishEvents", req)
        if 0 < self.bad.max_batch_events < len(req.events):
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "batch too large")
        self.in_flight += 1
        try:
            await asyncio.sleep(self.bad.publish_delay_s)
        finally:
            self.in_flight -= 1
        if req.events and req.events[0].seq != self.last_seq + 1:
            return pb.PublishEventsResponse(resync=True, last_seq=self.last_seq)
        for ev in req.events:
            self._apply(ev)
        return pb.PublishEventsResponse(applied=len(req.events), last_seq=self.last_seq)

    def _apply(self, ev: pb.KvEvent) -> None:
        which = ev.WhichOneof("event")
        if which == "stored":
            self.view |= {(h, ev.stored.tier) for h in ev.stored.block_hashes}
        elif which == "removed":
            self.view -= {(h, ev.removed.tier) for h in ev.removed.block_hashes}
        else:
            self.view.clear()
        self.last_seq = ev.seq


@contextlib.asynccontextmanager
async def serving(index: FakeIndex) -> AsyncIterator[str]:
    """``index`` served on a free loopback port; yields its address."""
    server = grpc.aio.server()
    pb_grpc.add_IndexServiceServicer_to_server(index, server)
    address = f"127.0.0.1:{free_port()}"
    server.add_insecure_port(address)
    await server.start()
    try:
        yield address
    finally:
        await server.stop(None)
