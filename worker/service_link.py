"""The worker's side of the index: register, heartbeat load, publish KV events, resync.

The worker is the truth; the index is a replica of its cache kept by events. Events carry
the pool's sequence numbers (1, 2, 3, ... without gaps), so the service can tell when one
was lost. Whenever the service cannot vouch for its copy (new registration, a gap, a
restarted service, an emptied Redis) the worker sends a full snapshot and continues with
the events after it: the snapshot reflects every event up to ``snapshot.seq``, so those are
dropped and nothing is applied twice or missed.

Service replicas are interchangeable (all state is in Redis): on UNAVAILABLE the link moves
to the next address and carries on.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import secrets
import time

import grpc

from kvmesh.v1 import index_pb2, index_pb2_grpc
from worker.async_engine import AsyncEngine
from worker.engine import Engine
from worker.kv_cache import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

log = logging.getLogger("kvmesh.worker.link")

TIERS = {"gpu": index_pb2.TIER_GPU, "cpu": index_pb2.TIER_CPU}
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
EAGER_BEAT_S = 0.1


def event_to_proto(ev: KVEvent) -> index_pb2.KvEvent:
    if isinstance(ev, BlockStored):
        return index_pb2.KvEvent(seq=ev.seq, stored=index_pb2.BlockStored(
            block_hashes=ev.block_hashes, parent_hash=ev.parent_hash or b"",
            tier=TIERS[ev.tier]))
    if isinstance(ev, BlockRemoved):
        return index_pb2.KvEvent(seq=ev.seq, removed=index_pb2.BlockRemoved(
            block_hashes=ev.block_hashes, tier=TIERS[ev.tier]))
    assert isinstance(ev, AllBlocksCleared)
    return index_pb2.KvEvent(seq=ev.seq, cleared=index_pb2.AllBlocksCleared())


def snapshot_chains(hashes: list[bytes], parents: list[bytes | None],
                    tier: int) -> list[index_pb2.BlockStored]:
    """Group a snapshot's (hash, parent) pairs into runs of consecutive chain blocks."""
    out: list[index_pb2.BlockStored] = []
    run: list[bytes] = []
    for h, parent in zip(hashes, parents, strict=True):
        if run and parent == run[-1]:
            run.append(h)
            continue
        if run:
            out[-1].block_hashes.extend(run)
        out.append(index_pb2.BlockStored(parent_hash=parent or b"", tier=tier))
        run = [h]
    if run:
        out[-1].block_hashes.extend(run)
    return out


class ServiceLink:
    def __init__(self, addresses: list[str], runner: AsyncEngine, *, worker_id: str,
                 address: str, model: str, root_hash: bytes, token: str | None = None,
                 heartbeat_s: float = 1.0, batch_max: int = 512, rpc_timeout_s: float = 3.0,
                 credentials: grpc.ChannelCredentials | None = None) -> None:
        if not addresses:
            raise ValueError("at least one service address is needed")
        self.addresses = addresses
        self.runner = runner
        engine = runner.engine
        # This process's incarnation: random, non-zero, sent on every call, so the index
        # refuses a delayed call of a dead predecessor that had the same worker id.
        self.incarnation = secrets.randbits(64) or 1
        self.register_req = index_pb2.RegisterWorkerRequest(
            worker_id=worker_id, address=address, model=model, block_size=engine.block_size,
            hash_algo=engine.kv.hash_algo, root_hash=root_hash, incarnation=self.incarnation)
        self.worker_id = worker_id
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.heartbeat_s = heartbeat_s
        self.batch_max = batch_max
        self.timeout = rpc_timeout_s
        self.credentials = credentials
        self.pending: collections.deque[KVEvent] = collections.deque()
        self.last_seq = 0  # last event seq the service has applied (or a snapshot covered)
        self.registered = False
        self.need_sync = True
        self.connected = False  # the last call reached a service
        self.counters = collections.Counter()
        self._idx = 0
        self._channel: grpc.aio.Channel | None = None
        self._stub: index_pb2_grpc.IndexServiceStub | None = None
        self._kick = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self.drop_next_batch = False  # fault injection for tests: lose one batch in transit
        # (running, waiting) as of the last heartbeat. A change (a request finished) sends
        # the next heartbeat early, at most every EAGER_BEAT_S: the router's cost model must
        # not see a worker as busy for up to a second after it went idle.
        self._beat_key = (0, 0)

    # --- engine thread --------------------------------------------------------------

    def collect(self, engine: Engine) -> None:
        """Move the pool's new events into the outbox and notice load changes (runs on the
        engine thread)."""
        events = engine.kv.take_events()
        if events:
            self.pending.extend(events)  # deque.extend is atomic under the GIL
        if (events or self._load_key() != self._beat_key) and self._loop is not None:
            self._loop.call_soon_threadsafe(self._kick.set)

    def _load_key(self) -> tuple[int, int]:
        load = self.runner.load
        return load["running"], load["waiting"]

    # --- event loop -----------------------------------------------------------------

    def _connect(self) -> index_pb2_grpc.IndexServiceStub:
        if self._stub is None:
            target = self.addresses[self._idx % len(self.addresses)]
            self._channel = (grpc.aio.secure_channel(target, self.credentials)
                             if self.credentials else grpc.aio.insecure_channel(target))
            self._stub = index_pb2_grpc.IndexServiceStub(self._channel)
        return self._stub

    async def _next_service(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        self._channel = self._stub = None
        self._idx += 1

    async def run(self) -> None:
        """Keep the index in step with this worker until :meth:`close`."""
        self._loop = asyncio.get_running_loop()
        self.runner.on_step = self.collect
        backoff = 0.1
        next_beat = last_beat = 0.0
        while not self._closed:
            try:
                if not self.registered:
                    await self._register()
                if self.need_sync:
                    await self._sync()
                await self._publish()
                now = time.monotonic()
                if now >= next_beat or (self._load_key() != self._beat_key
                                        and now - last_beat >= EAGER_BEAT_S):
                    await self._heartbeat()
                    last_beat = time.monotonic()
                    next_beat = last_beat + self.heartbeat_s
                self.connected = True
                backoff = 0.1
            except grpc.aio.AioRpcError as err:
                self.connected = False
                self.counters[f"error_{err.code().name.lower()}"] += 1
                if err.code() in RETRYABLE:
                    await self._next_service()
                elif err.code() in (grpc.StatusCode.NOT_FOUND,
                                    grpc.StatusCode.FAILED_PRECONDITION):
                    log.warning("service refused %s: %s", self.worker_id, err.details())
                    self.registered = False
                else:
                    log.warning("service call failed: %s %s", err.code().name, err.details())
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            wait = max(0.0, next_beat - time.monotonic())
            if self._load_key() != self._beat_key:
                wait = min(wait, max(0.0, last_beat + EAGER_BEAT_S - time.monotonic()))
            if not self.pending:
                try:
                    await asyncio.wait_for(self._kick.wait(), timeout=wait)
                except TimeoutError:
                    pass
            self._kick.clear()

    async def _register(self) -> None:
        self.register_req.load.CopyFrom(index_pb2.WorkerLoad(**self.runner.load))
        resp = await self._connect().RegisterWorker(self.register_req, timeout=self.timeout,
                                                    metadata=self.metadata)
        if resp.heartbeat_interval_ms:
            self.heartbeat_s = resp.heartbeat_interval_ms / 1000
        self.registered = True
        self.need_sync = True  # a snapshot after every registration: never trust old state
        self.counters["registrations"] += 1

    async def _sync(self) -> None:
        snap = await self.runner.call(lambda e: e.kv.cached_block_hashes())
        blocks = snapshot_chains(snap.block_hashes, snap.parents, TIERS[snap.tier])
        req = index_pb2.SyncWorkerRequest(worker_id=self.worker_id, seq=snap.seq, blocks=blocks,
                                          incarnation=self.incarnation)
        await self._connect().SyncWorker(req, timeout=max(self.timeout, 10.0),
                                         metadata=self.metadata)
        while self.pending and self.pending[0].seq <= snap.seq:
            self.pending.popleft()
        self.last_seq = snap.seq
        self.need_sync = False
        self.counters["resyncs"] += 1

    async def _publish(self) -> None:
        while self.pending and not self.need_sync:
            batch = [self.pending[i] for i in range(min(self.batch_max, len(self.pending)))]
            if self.drop_next_batch:  # lost in transit: the service must notice the gap
                self.drop_next_batch = False
                for _ in batch:
                    self.pending.popleft()
                continue
            req = index_pb2.PublishEventsRequest(
                worker_id=self.worker_id, events=[event_to_proto(e) for e in batch],
                incarnation=self.incarnation)
            resp = await self._connect().PublishEvents(req, timeout=self.timeout,
                                                       metadata=self.metadata)
            if resp.resync:
                self.need_sync = True
                self.counters["gaps"] += 1
                return
            for _ in batch:
                self.pending.popleft()
            self.last_seq = batch[-1].seq
            self.counters["events_published"] += len(batch)

    async def _heartbeat(self) -> None:
        load = self.runner.load
        self._beat_key = (load["running"], load["waiting"])
        resp = await self._connect().Heartbeat(index_pb2.HeartbeatRequest(
            worker_id=self.worker_id, load=index_pb2.WorkerLoad(**load),
            last_seq=self.last_seq, incarnation=self.incarnation), timeout=self.timeout,
            metadata=self.metadata)
        if resp.reregister:
            self.registered = False
        if resp.resync:
            self.need_sync = True

    async def close(self) -> None:
        self._closed = True
        self._kick.set()
        if self._channel is not None:
            await self._channel.close()
