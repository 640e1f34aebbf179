"""The worker's side of the index: register, heartbeat load, publish KV events, resync.

The worker is the truth; the index is a replica of its cache kept by events. Events carry
the pool's sequence numbers (1, 2, 3, ... without gaps), so the service can tell when one
was lost. Whenever the service cannot vouch for its copy (new registration, a gap, a
restarted service, an emptied Redis) the worker sends a full snapshot and continues with
the events after it: the snapshot reflects every event up to ``snapshot.seq``, so those are
dropped and nothing is applied twice or missed.

Service replicas are interchangeable (all state is in Redis): when a call fails in a way
the retry table (``kvmesh.rpc.retry.TABLE``) retries on another replica, the link moves to the
next address (:mod:`worker.service_conn`) and carries on after a jittered backoff
(``kvmesh.rpc.retry.Backoff``).

Nothing grows without bound: events wait in a bounded :class:`~worker.outbox.Outbox` (and
the pool bounds its unread ones); whatever a bound drops is replaced by a snapshot.
Heartbeats run in their own task, so no publish problem can take a healthy worker out of
routing.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from kvmesh.events.pool import PoolEvent
from kvmesh.events.to_index import event_to_proto, snapshot_blocks
from kvmesh.link.backlog import BatchLimits
from kvmesh.rpc.retry import Action, Backoff, Source, decide
from kvmesh.v1 import index_pb2, index_pb2_grpc
from worker.engine.async_engine import AsyncEngine
from worker.engine.engine import Engine
from worker.engine.event_tap import EventTap
from worker.outbox import MAX_BLOCKS, Outbox
from worker.service_conn import ServiceConn

log = logging.getLogger("kvmesh.worker.link")

# A publish refused for what it carries: sending it again can never succeed.
REFUSED = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INVALID_ARGUMENT)
T = TypeVar("T")
EAGER_BEAT_S = 0.1


class ServiceLink:
    """Keeps the index in step with one worker: two tasks on the worker's event loop.

    - the beat task registers and heartbeats; it never waits on events, so a worker whose
      publishes fail (a refused batch, a slow index) stays live and routable;
    - the event task resyncs and publishes the outbox, in batches of at most ``batch_max``
      events and ``batch_max_hashes`` block hashes (below the service's defaults,
      ``--max-batch-events`` / ``--max-batch-hashes``). A batch refused as too large
      (RESOURCE_EXHAUSTED) is halved and retried; a single event refused is replaced by a
      snapshot resync, as is everything dropped when the outbox overflows.
    """

    def __init__(self, addresses: list[str], runner: AsyncEngine, *, worker_id: str,
                 address: str, model: str, root_hash: bytes, token: str | None = None,
                 heartbeat_s: float = 1.0, batch_max: int = 512,
                 batch_max_hashes: int = 8192, max_pending_blocks: int = MAX_BLOCKS,
                 rpc_timeout_s: float = 3.0,
                 credentials: grpc.ChannelCredentials | None = None) -> None:
        self.limits = BatchLimits(batch_max, batch_max_hashes)  # raises for limits < 1
        self.conn = ServiceConn(addresses, credentials, close_grace_s=rpc_timeout_s)
        self.runner = runner
        engine = runner.engine
        # A random epoch of this process: the index refuses what an earlier process under
        # the same worker id publishes late.
        self.incarnation = secrets.randbits(64) or 1
        self.register_req = index_pb2.RegisterWorkerRequest(
            worker_id=worker_id, address=address, model=model, block_size=engine.block_size,
            hash_algo=engine.kv.hash_algo, root_hash=root_hash, incarnation=self.incarnation)
        self.worker_id = worker_id
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.heartbeat_s = heartbeat_s
        self.timeout = rpc_timeout_s
        self.outbox = Outbox(max_pending_blocks)
        self.last_seq = 0  # last event seq the service has applied (or a snapshot covered)
        self.registered = False
        self.need_sync = True
        self.connected = False  # the last call reached a service
        self.counters = collections.Counter()
        self._kick = asyncio.Event()       # wakes the event task
        self._beat_kick = asyncio.Event()  # wakes the beat task
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._dropped_seen = engine.kv.events_dropped  # engine thread: as of the last collect
        # Publish/Sync calls in flight, and a counter bumped as each starts and ends: a
        # heartbeat overlapping one may report a last_seq the index has already passed.
        self._inflight = 0
        self._epoch = 0
        self._recheck = False  # a heartbeat's resync answer was deferred: beat again soon
        self.drop_next_batch = False  # fault injection for tests: lose one batch in transit
        # (running, waiting) as of the last heartbeat. A change (a request finished) sends
        # the next heartbeat early, at most every EAGER_BEAT_S: the router's cost model must
        # not see a worker as busy for up to a second after it went idle.
        self._beat_key = (0, 0)

    @property
    def pending(self) -> int:
        """Events waiting to be published."""
        return len(self.outbox)

    # --- engine thread --------------------------------------------------------------

    def collect(self, engine: Engine) -> None:
        """Take the pool's new events (and whether the pool dropped some unread) and
        :meth:`deliver` them (runs on the engine thread)."""
        events = engine.kv.take_events()
        dropped = engine.kv.events_dropped
        lost, self._dropped_seen = dropped != self._dropped_seen, dropped
        self.deliver(engine, events, lost)

    def deliver(self, engine: Engine, events: list[PoolEvent], lost: bool) -> None:
        """Hand events taken after a step to the event loop, and notice load changes
        (runs on the engine thread; a ``worker.engine.event_tap`` consumer)."""
        if (events or lost or self._load_key() != self._beat_key) and self._loop is not None:
            self._loop.call_soon_threadsafe(self._receive, events, lost)

    def _load_key(self) -> tuple[int, int]:
        load = self.runner.load
        return load["running"], load["waiting"]

    # --- event loop -----------------------------------------------------------------

    def _receive(self, events: list[PoolEvent], lost: bool) -> None:
        if lost:
            self._overflow("the engine's unread events")
        if self.need_sync:
            pass  # the coming snapshot is taken later, so it covers these: keep nothing
        elif events and not self.outbox.add(events, after=self.last_seq):
            self._overflow("the outbox")
        if events or lost:
            self._kick.set()
        if self._load_key() != self._beat_key:
            self._beat_kick.set()

    def _overflow(self, where: str) -> None:
        self.counters["overflows"] += 1
        log.warning("%s overflowed: events dropped, resyncing %r with a snapshot",
                    where, self.worker_id)
        self.outbox.clear()
        self.need_sync = True

    def _failed(self, err: Exception, stub: index_pb2_grpc.IndexServiceStub) -> None:
        """Account for a failed call on ``stub``; the caller backs off and retries."""
        self.connected = False
        if isinstance(err, grpc.aio.UsageError):
            return  # its channel was closed by the other task's move to the next address
        if not isinstance(err, grpc.aio.AioRpcError):
            log.error("service link of %r: unexpected error", self.worker_id, exc_info=err)
            self.counters["error_unexpected"] += 1
            return
        self.counters[f"error_{err.code().name.lower()}"] += 1
        if decide(Source.SERVICE, err.code()) is Action.NEXT_REPLICA:
            # CANCELLED too: the other task moved on and closed the channel under us
            self.conn.next_replica(stub)
        elif err.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION):
            log.warning("service refused %r: %r", self.worker_id, err.details())
            self.registered = False
            self._beat_kick.set()
        else:
            log.warning("service call failed: %s %r", err.code().name, err.details())

    async def run(self) -> None:
        """Keep the index in step with this worker until :meth:`close`."""
        self._loop = asyncio.get_running_loop()
        EventTap.install(self.runner).add(self.deliver)  # other consumers may share the tap
        tasks = [asyncio.create_task(self._beats()), asyncio.create_task(self._events())]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()

    async def _beats(self) -> None:
        """Register when needed and heartbeat every ``heartbeat_s`` (early on a load
        change); nothing here waits on events."""
        backoff = Backoff()
        next_beat = last_beat = 0.0
        while not self._closed:
            now = time.monotonic()
            eager = ((self._recheck or self._load_key() != self._beat_key)
                     and now - last_beat >= EAGER_BEAT_S)
            if not self.registered or now >= next_beat or eager:
                step = self._heartbeat if self.registered else self._register
                if not await self._attempt(step, backoff):
                    continue
                last_beat = time.monotonic()
                next_beat = last_beat + self.heartbeat_s
            wait = max(0.0, next_beat - time.monotonic())
            if self._recheck or self._load_key() != self._beat_key:
                wait = min(wait, max(0.0, last_beat + EAGER_BEAT_S - time.monotonic()))
            self._beat_kick.clear()
            try:
                await asyncio.wait_for(self._beat_kick.wait(), timeout=wait)
            except TimeoutError:
                pass

    async def _events(self) -> None:
        """Resync when needed and publish the outbox, once registered."""
        backoff = Backoff()
        while not self._closed:
            self._kick.clear()
            if not self.registered or not (self.need_sync or self.outbox):
                await self._kick.wait()
                continue
            await self._attempt(self._sync_and_publish, backoff)

    async def _sync_and_publish(self, stub: index_pb2_grpc.IndexServiceStub) -> None:
        if self.need_sync:
            await self._sync(stub)
        await self._publish(stub)

    async def _attempt(self, step: Callable[[index_pb2_grpc.IndexServiceStub], Awaitable[None]],
                       backoff: Backoff) -> bool:
        """Run ``step`` on the current replica; on any error account for it (see
        :meth:`_failed`) and wait out ``backoff``. True when ``step`` succeeded."""
        stub = self.conn.stub()
        try:
            await step(stub)
        except Exception as exc:  # the calling task must outlive any error
            self._failed(exc, stub)
            await backoff.sleep()
            return False
        self.connected = True
        backoff.reset()
        return True

    async def _register(self, stub: index_pb2_grpc.IndexServiceStub) -> None:
        self.register_req.load.CopyFrom(index_pb2.WorkerLoad(**self.runner.load))
        resp = await stub.RegisterWorker(self.register_req, timeout=self.timeout,
                                         metadata=self.metadata)
        if resp.heartbeat_interval_ms:
            self.heartbeat_s = resp.heartbeat_interval_ms / 1000
        self.limits.reset()
        self.registered = True
        self.need_sync = True  # a snapshot after every registration: never trust old state
        self.counters["registrations"] += 1
        self._kick.set()

    async def _rpc(self, call: Callable[..., Awaitable[T]], req: object,
                   timeout: float) -> T:
        """A Publish or Sync call, counted as in flight (see :meth:`_heartbeat`)."""
        self._inflight += 1
        self._epoch += 1
        try:
            return await call(req, timeout=timeout, metadata=self.metadata)
        finally:
            self._inflight -= 1
            self._epoch += 1

    async def _sync(self, stub: index_pb2_grpc.IndexServiceStub) -> None:
        self.need_sync = False  # a request for another resync from now on is kept
        try:
            snap = await self.runner.call(lambda e: e.kv.cached_block_hashes())
            blocks = snapshot_blocks(snap)
            req = index_pb2.SyncWorkerRequest(worker_id=self.worker_id, seq=snap.seq,
                                              blocks=blocks, incarnation=self.incarnation)
            await self._rpc(stub.SyncWorker, req, max(self.timeout, 10.0))
        except BaseException:
            self.need_sync = True
            raise
        self.outbox.drop_through(snap.seq)
        self.last_seq = snap.seq
        self.counters["resyncs"] += 1

    async def _publish(self, stub: index_pb2_grpc.IndexServiceStub) -> None:
        while self.outbox and not self.need_sync and self.registered:
            batch = self.outbox.batch(self.limits.events, self.limits.hashes)
            if self.drop_next_batch:  # lost in transit: the service must notice the gap
                self.drop_next_batch = False
                self.outbox.drop_through(batch[-1].seq)
                continue
            req = index_pb2.PublishEventsRequest(
                worker_id=self.worker_id, events=[event_to_proto(e) for e in batch],
                incarnation=self.incarnation)
            try:
                resp = await self._rpc(stub.PublishEvents, req, self.timeout)
            except grpc.aio.AioRpcError as err:
                if err.code() not in REFUSED:
                    raise
                self._refused(batch, err)
                continue
            if resp.resync:
                self.need_sync = True
                self.counters["gaps"] += 1
                return
            self.outbox.drop_through(batch[-1].seq)
            self.last_seq = batch[-1].seq
            self.counters["events_published"] += len(batch)

    def _refused(self, batch: list[PoolEvent], err: grpc.aio.AioRpcError) -> None:
        """The service will never take ``batch``: halve the batch limits if that can help
        (it refuses batches over its ``--max-batch-events`` / ``--max-batch-hashes``),
        else give its events up for a snapshot."""
        self.counters["refused"] += 1
        if (err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                and self.limits.halve(batch, self.outbox.hashes)):
            log.info("service refused %d events (%r); batches now at most %d events",
                     len(batch), err.details(), self.limits.events)
            return
        log.warning("service refused event %d of %r (%s %r): resyncing with a snapshot",
                    batch[0].seq, self.worker_id, err.code().name, err.details())
        self.need_sync = True

    async def _heartbeat(self, stub: index_pb2_grpc.IndexServiceStub) -> None:
        load = self.runner.load
        self._beat_key = (load["running"], load["waiting"])
        self._recheck = False
        quiet, epoch = self._inflight == 0, self._epoch
        resp = await stub.Heartbeat(index_pb2.HeartbeatRequest(
            worker_id=self.worker_id, load=index_pb2.WorkerLoad(**load),
            last_seq=self.last_seq, incarnation=self.incarnation),
            timeout=self.timeout, metadata=self.metadata)
        self.counters["heartbeats"] += 1
        if resp.reregister:
            self.registered = False
        elif resp.resync and not (quiet and epoch == self._epoch):
            # A publish or sync overlapped this beat: the index may be ahead of the
            # last_seq it carried. Not evidence of a lost index: ask again soon instead.
            self.counters["beat_resync_deferred"] += 1
            self._recheck = True
            return
        if resp.resync:
            self.need_sync = True
            self._kick.set()

    async def close(self) -> None:
        self._closed = True
        self._kick.set()
        self._beat_kick.set()
        await self.conn.close()
