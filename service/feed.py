"""RegisterWorker / Heartbeat / PublishEvents / SyncWorker: what workers tell the index.

A worker registers (its record, namespace and credential fingerprint), then heartbeats its
load and last published seq, publishes its KV events in seq order and, when told to
resync, syncs a full snapshot. :class:`WorkerFeed` holds the handlers' bodies; the
servicer's RPC methods call them through its error mapping (``service.servicer._rpc``),
so the error contract stated there holds: malformed input -> INVALID_ARGUMENT
(``RequestError``), unknown worker on Publish/Sync -> NOT_FOUND, root hash mismatch ->
FAILED_PRECONDITION, and the backend's exceptions (``IndexUnavailable``,
``StaleIncarnation``, ``OverCap``, ``WorkerIdInUse``) propagate to it unchanged. A rejected
call changes nothing.

Time: read only from the injected ``clock`` (``service.clock``).
"""
from __future__ import annotations

import logging

import grpc

from kvmesh.contract import DIGEST_BYTES
from kvmesh.hashing import none_hash
from kvmesh.v1 import index_pb2 as pb
from service import validate
from service.clock import Clock
from service.config import ServiceConfig
from service.index.base import (
    ApplyStatus,
    BlockCap,
    IndexBackend,
    IndexUnavailable,
    WorkerRecord,
    namespace,
)
from service.liveness import WorkerTable
from service.metrics import ServiceMetrics
from service.quotas import QuotaBook
from service.validate import RequestError

log = logging.getLogger("kvmesh.service")


class WorkerFeed:
    """The worker calls over one backend, keeping the replica's worker ``table`` in step."""

    def __init__(self, config: ServiceConfig, backend: IndexBackend, table: WorkerTable,
                 block_cap: BlockCap, metrics: ServiceMetrics, clock: Clock,
                 quotas: QuotaBook | None = None) -> None:
        self.cfg = config
        self.quotas = quotas if quotas is not None else QuotaBook(config, backend, clock)
        self.backend = backend
        self.table = table
        self.block_cap = block_cap
        self.metrics = metrics
        self.clock = clock

    async def _record(self, worker_id: str) -> WorkerRecord:
        rec = self.table.get(worker_id) or await self.backend.get_worker(worker_id)
        if rec is None:
            raise RequestError(grpc.StatusCode.NOT_FOUND, f"unknown worker {worker_id!r}: "
                               "register it (RegisterWorker) first")
        return rec

    async def register(self, req: pb.RegisterWorkerRequest,
                       credential: str) -> pb.RegisterWorkerResponse:
        """Register (or re-register) a worker; the record remembers ``credential`` (the
        fingerprint of the credential presented), so a live worker id cannot be taken over
        by another one."""
        validate.register(req)
        expected = none_hash(req.hash_algo, self.cfg.hash_seed)
        if req.root_hash != expected:
            raise RequestError(grpc.StatusCode.FAILED_PRECONDITION, (
                f"root hash mismatch for model {req.model!r} ({req.hash_algo}): the worker's "
                f"none_hash is {req.root_hash.hex()[:16]}..., this service expects "
                f"{expected.hex()[:16]}... (seed {self.cfg.hash_seed!r}). Mismatched hashing "
                "would give 0% cache hits: run workers and service with the same hash seed "
                "(--hash-seed / PYTHONHASHSEED) and hash algo."))
        ns = namespace(req.model, req.block_size, req.hash_algo)
        now = self.clock()
        rec = WorkerRecord(req.worker_id, ns, req.address, req.model, req.block_size,
                           req.hash_algo, validate.load(req.load), heartbeat_ms=now,
                           registered_ms=now, incarnation=req.incarnation,
                           credential=credential)
        had = await self.backend.register(
            rec, live_after_ms=now - int(self.cfg.liveness_timeout_s * 1000))
        self.table.upsert(rec)
        self.metrics.resyncs.labels("register").inc()
        log.info("registered worker %r at %r (ns %r%s)", req.worker_id, req.address, ns,
                 ", replacing earlier state" if had else "")
        return pb.RegisterWorkerResponse(
            namespace=ns, resync=True,
            heartbeat_interval_ms=int(self.cfg.heartbeat_interval_s * 1000),
            liveness_timeout_ms=int(self.cfg.liveness_timeout_s * 1000))

    async def heartbeat(self, req: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
        """Record the worker's load; ask for a snapshot (``resync``) when the index lost
        track of its events or it comes back from the dead, and for a new registration
        when the index does not know it. The answer carries the tenant quotas when they
        differ from the ``quota_version`` the worker applies (``service.quotas``)."""
        validate.worker_id(req.worker_id)
        load = validate.load(req.load)
        now = self.clock()
        prev = self.table.get(req.worker_id)
        # A worker back from the dead (a pause, a partition) rejoins with a snapshot: while it
        # was out its entries may have been purged, or its events lost.
        returning = prev is not None and not self.table.alive(prev, now)
        try:
            res = await self.backend.heartbeat(req.worker_id, load, req.last_seq, now,
                                               req.incarnation)
        except IndexUnavailable:
            # the local table still takes it: degraded routing must see the worker alive
            if prev is not None and prev.incarnation == req.incarnation:
                self.table.heartbeat(req.worker_id, load, now)
            raise
        self.table.heartbeat(req.worker_id, load, now)
        if not res.known:
            self.table.remove(req.worker_id)
            self.metrics.resyncs.labels("unknown_worker").inc()
            return pb.HeartbeatResponse(resync=True, reregister=True)
        # The index is behind what the worker had published a whole heartbeat ago, or ahead
        # of what it says it published: it lost track, ask for a snapshot.
        resync = res.last_seq < res.prev_reported_seq or res.last_seq > req.last_seq
        if resync:
            self.metrics.resyncs.labels("heartbeat_seq").inc()
        elif returning:
            resync = True
            self.metrics.resyncs.labels("returned").inc()
        answer = pb.HeartbeatResponse(resync=resync)
        quotas = await self.quotas.current()
        if quotas is not None and quotas.version != req.quota_version:
            answer.quotas.CopyFrom(quotas)
        return answer

    async def publish(self, req: pb.PublishEventsRequest) -> pb.PublishEventsResponse:
        """Apply the worker's events in seq order; a gap answers ``resync`` (nothing
        applied), an unknown worker NOT_FOUND."""
        validate.worker_id(req.worker_id)
        rec = await self._record(req.worker_id)
        events = validate.events(list(req.events), DIGEST_BYTES[rec.algo], self.cfg)
        res = await self.backend.apply_events(req.worker_id, events, req.incarnation,
                                              self.block_cap)
        if res.status is ApplyStatus.UNKNOWN_WORKER:
            self.table.remove(req.worker_id)
            raise RequestError(grpc.StatusCode.NOT_FOUND, f"unknown worker {req.worker_id!r} "
                               "(purged or the index was emptied): register again")
        if res.status is ApplyStatus.GAP:
            self.metrics.resyncs.labels("gap").inc()
            return pb.PublishEventsResponse(applied=0, resync=True, last_seq=res.last_seq)
        self.metrics.events.inc(res.applied)
        return pb.PublishEventsResponse(applied=res.applied, last_seq=res.last_seq)

    async def sync(self, req: pb.SyncWorkerRequest) -> pb.SyncWorkerResponse:
        """Replace the worker's entries by its snapshot (as of ``req.seq``); an unknown
        worker NOT_FOUND."""
        validate.worker_id(req.worker_id)
        rec = await self._record(req.worker_id)
        blocks = validate.snapshot(req, DIGEST_BYTES[rec.algo], self.cfg)
        n = await self.backend.sync_worker(req.worker_id, req.seq, blocks, req.incarnation,
                                           self.block_cap)
        if n is None:
            self.table.remove(req.worker_id)
            raise RequestError(grpc.StatusCode.NOT_FOUND, f"unknown worker {req.worker_id!r}: "
                               "register again")
        log.info("worker %r synced: %d blocks at seq %d", req.worker_id, n, req.seq)
        return pb.SyncWorkerResponse(indexed_blocks=n)
