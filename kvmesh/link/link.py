"""The index link: keeps the index's copy of one worker's cache in step with its truth.

One link per worker (a kvmesh worker, or one rank of a vLLM engine behind the bridge), over
a :class:`~kvmesh.link.feed.Feed` of that side's events, load and snapshot. It registers
(model, block size, hash algorithm, root hash, a random incarnation: the index refuses what
an earlier process under the same worker id publishes late), heartbeats the load, publishes
the queued events in batches and resyncs with a snapshot whenever the service cannot vouch
for its copy (a new registration, a gap, a restarted service, an overflowed backlog, an
event it refuses): a snapshot at seq S covers every event up to S, so those are dropped and
nothing is applied twice or missed. Replicas are interchangeable: a call that
``kvmesh.rpc.retry.TABLE`` retries elsewhere moves the link to the next address
(:class:`~kvmesh.link.conn.Conn`), after a jittered backoff.

Two tasks: the events task (resyncs, publishes; on the loop that calls :meth:`Link.queue`)
and the beat task (registrations, heartbeats: :mod:`kvmesh.link.beats`), which never waits
on events, so no publish problem takes a healthy worker out of routing. A resync a heartbeat
answer asks for while a publish raced it is rechecked, never obeyed. Details:
``docs/architecture.md``.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, Generic, TypeVar

import grpc
import grpc.aio

from kvmesh.link.backlog import Backlog, BatchLimits
from kvmesh.link.beat_thread import BeatThread, wake
from kvmesh.link.beats import Beats
from kvmesh.link.conn import Conn, Stub
from kvmesh.link.feed import Feed
from kvmesh.link.request import publish_head, publish_request
from kvmesh.rpc.retry import Action, Backoff, Source, decide
from kvmesh.v1 import index_pb2

log = logging.getLogger("kvmesh.link")

# A publish refused for what it carries: sending it again can never succeed.
REFUSED = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INVALID_ARGUMENT)
E = TypeVar("E")
T = TypeVar("T")


class Link(Beats, Generic[E]):
    """Keeps the index in step with one worker until :meth:`close`.

    Batches carry at most ``batch_max`` events and ``batch_max_hashes`` block hashes (below
    the service's ``--max-batch-events`` / ``--max-batch-hashes`` defaults); a batch refused
    as too large (RESOURCE_EXHAUSTED) is halved and retried; a single event refused is
    replaced by a snapshot resync, as is everything dropped when the backlog overflows.
    Subclasses (the adapters) may override :meth:`stale`, :meth:`_acked`, :meth:`_shed`
    and :meth:`_side_tasks`.
    """

    def __init__(self, addresses: list[str], feed: Feed[E], backlog: Backlog[E], *,
                 worker_id: str, address: str, block_size: int, hash_algo: str,
                 root_hash: bytes, token: str | None = None,
                 credentials: grpc.ChannelCredentials | None = None,
                 heartbeat_s: float = 1.0, rpc_timeout_s: float = 3.0, batch_max: int = 512,
                 batch_max_hashes: int = 8192, beats: BeatThread | None = None) -> None:
        self.limits = BatchLimits(batch_max, batch_max_hashes)  # raises for limits < 1
        self.conn = Conn(addresses, credentials, close_grace_s=rpc_timeout_s)
        self.feed = feed
        self.backlog = backlog
        self.worker_id = worker_id
        self.incarnation = secrets.randbits(64) or 1
        self.register_req = index_pb2.RegisterWorkerRequest(
            worker_id=worker_id, address=address, block_size=block_size, hash_algo=hash_algo,
            root_hash=root_hash, incarnation=self.incarnation)
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._publish_head = publish_head(worker_id, self.incarnation)
        self.heartbeat_s = heartbeat_s
        self.timeout = rpc_timeout_s
        self.liveness_s = 3.0  # the service's liveness timeout (its registration answer)
        self.last_seq = 0  # the last event seq the service holds (or a snapshot covered)
        self.registered = False
        self.need_sync = True
        self.connected = False  # the last call reached a service
        self.silent = False  # the feed had no load to tell at the last heartbeat
        self.beats = beats
        self.beat_conn: Conn | None = None  # the beat thread's own (None: ``conn``)
        self.acked_at = time.monotonic()  # when the index last acknowledged events
        self.waiting_since = 0.0  # when the backlog last stopped being empty
        self.counters: collections.Counter[str] = collections.Counter()
        self.drop_next_batch = False  # fault injection for tests: lose one batch in transit
        self._kick = asyncio.Event()       # wakes the events task
        self._beat_kick = asyncio.Event()  # wakes the beat task
        self._loop: asyncio.AbstractEventLoop | None = None       # the events loop
        self._beat_loop: asyncio.AbstractEventLoop | None = None  # the beat task's loop
        self._closed = False
        # Publish/Sync calls in flight, and a counter bumped as each starts and ends: a
        # heartbeat overlapping one may report a last_seq the index has already passed.
        self._inflight = 0
        self._epoch = 0
        self._recheck = False  # a heartbeat's resync answer was deferred: beat again soon
        self._beat_load = index_pb2.WorkerLoad()  # as of the last heartbeat
        self.quota_version = 0  # tenant quotas the feed applies (kvmesh.link.beats)
        self._warned: set[str] = set()

    @property
    def settled(self) -> bool:
        """Nothing owed to the index: no events queued, no resync wanted, no Publish or Sync
        in flight. A call's effects (``counters``, ``last_seq``) are taken in the step that
        ends it, so once settled they count every call the index has answered; before, a
        reader of the index can see a call's writes that the link has not counted yet."""
        return not self.backlog and not self.need_sync and self._inflight == 0

    # --- the events side (its loop) -------------------------------------------------------

    def queue(self, events: list[E]) -> None:
        """Queue the feed's new events (seq order) for the service (on the events loop)."""
        if not events:
            return
        if not self.backlog:
            self.waiting_since = time.monotonic()
        if self.need_sync:
            pass  # the coming snapshot is taken later, so it covers these: keep nothing
        elif not self.backlog.add(events, after=self.last_seq):
            self.overflow("the pending events")
        self._kick.set()

    def overflow(self, where: str) -> None:
        """Events were dropped (``where`` overflowed): resync with a snapshot."""
        self.counters["overflows"] += 1
        log.warning("%s overflowed: events dropped, resyncing %r with a snapshot",
                    where, self.worker_id)
        self.backlog.clear()
        self.need_sync = True
        self._wake()

    def _wake(self) -> None:
        """Wake the events task (any thread)."""
        wake(self._loop, self._kick)

    # --- tasks ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Keep the index in step with the worker until :meth:`close` (or cancellation)."""
        self._loop = asyncio.get_running_loop()
        beats = (asyncio.create_task(self._beats(self.conn)) if self.beats is None
                 else asyncio.ensure_future(asyncio.wrap_future(
                     self.beats.submit(self._beats_apart()))))
        tasks = [beats, asyncio.create_task(self._events()),
                 *(asyncio.create_task(c) for c in self._side_tasks())]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()

    def _side_tasks(self) -> Iterable[Coroutine[Any, Any, None]]:
        """More coroutines to run on the events loop beside the link's own."""
        return ()

    async def _events(self) -> None:
        """Resync when needed and publish the backlog, once registered."""
        backoff = Backoff()
        while not self._closed:
            self._kick.clear()
            if not self.registered or not (self.need_sync or self.backlog):
                await self._kick.wait()
                continue
            await self._attempt(self._sync_and_publish, backoff, self.conn)

    async def _attempt(self, step: Callable[[Stub], Awaitable[None]], backoff: Backoff,
                       conn: Conn) -> bool:
        """Run ``step`` on ``conn``'s replica; on any error account for it (see
        :meth:`_failed`) and wait out ``backoff``. True when ``step`` succeeded."""
        stub = conn.stub()
        try:
            await step(stub)
        except Exception as exc:  # the calling task must outlive any error
            self._failed(exc, stub, conn)
            await backoff.sleep()
            return False
        self.connected = True
        backoff.reset()
        return True

    def _failed(self, err: Exception, stub: Stub, conn: Conn) -> None:
        """Account for a failed call on ``stub``; the caller backs off and retries."""
        self.connected = False
        if isinstance(err, grpc.aio.UsageError):
            return  # its channel was closed by the other task's move to the next address
        if not isinstance(err, grpc.aio.AioRpcError):
            log.error("link of %r: unexpected error", self.worker_id, exc_info=err)
            self.counters["error_unexpected"] += 1
            return
        self.counters[f"error_{err.code().name.lower()}"] += 1
        if decide(Source.SERVICE, err.code()) is Action.NEXT_REPLICA:
            # CANCELLED too: the other task moved on and closed the channel under us
            conn.next_replica(stub)
        elif err.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION):
            log.warning("service refused %r: %r", self.worker_id, err.details())
            self.registered = False
            self._wake_beats()
        else:
            log.warning("%s: service call failed: %s %r", self.worker_id, err.code().name,
                        err.details())

    # --- calls ----------------------------------------------------------------------------

    async def _rpc(self, call: Callable[..., Awaitable[T]], req: object, timeout: float) -> T:
        """A Publish or Sync call, counted as in flight (see :meth:`_heartbeat`)."""
        self._inflight += 1
        self._epoch += 1
        try:
            return await call(req, timeout=timeout, metadata=self.metadata)
        finally:
            self._inflight -= 1
            self._epoch += 1

    async def _sync_and_publish(self, stub: Stub) -> None:
        if self.need_sync:
            await self._sync(stub)
        await self._publish(stub)

    async def _sync(self, stub: Stub) -> None:
        self.need_sync = False  # a request for another resync from now on is kept
        try:
            seq, blocks = await self.feed.snapshot()
            self.backlog.drop_through(seq)  # in the snapshot; later ones queue meanwhile
            await self._rpc(stub.SyncWorker, index_pb2.SyncWorkerRequest(
                worker_id=self.worker_id, seq=seq, blocks=blocks,
                incarnation=self.incarnation), max(self.timeout, 10.0))
        except BaseException:
            self.need_sync = True
            raise
        self.backlog.drop_through(seq)
        self.last_seq = seq
        self.counters["resyncs"] += 1
        self._acked(seq)

    def _shed(self) -> bool:
        """Whether to drop the backlog for a snapshot instead of publishing it."""
        return False

    async def _publish(self, stub: Stub) -> None:
        while self.backlog and not self.need_sync and self.registered:
            if self._shed():
                self.need_sync = True
                return
            batch = self.backlog.batch(self.limits.events, self.limits.hashes)
            if self.drop_next_batch:  # lost in transit: the service must notice the gap
                self.drop_next_batch = False
                self.backlog.drop_through(batch[-1].seq)
                continue
            req = publish_request(self._publish_head, self.feed.wire(batch))
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
            self.backlog.drop_through(batch[-1].seq)
            self.last_seq = batch[-1].seq
            self.counters["events_published"] += len(batch)
            self.counters["publishes"] += 1
            self._acked(self.last_seq)

    def _acked(self, seq: int) -> None:
        """The index holds everything through ``seq``."""
        self.acked_at = time.monotonic()

    def _refused(self, batch: list[E], err: grpc.aio.AioRpcError) -> None:
        """The service will never take ``batch``: halve the batch limits if that can help
        (it refuses batches over its ``--max-batch-events`` / ``--max-batch-hashes``),
        else give its events up for a snapshot."""
        self.counters["refused"] += 1
        if (err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                and self.limits.halve(batch, self.backlog.hashes)):
            log.info("service refused %d events (%r); batches now at most %d events",
                     len(batch), err.details(), self.limits.events)
            return
        log.warning("service refused event %d of %r (%s %r): resyncing with a snapshot",
                    batch[0].seq, self.worker_id, err.code().name, err.details())
        self.need_sync = True

    def _warn(self, key: str, msg: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(msg, *args)

    async def close(self) -> None:
        self._closed = True
        self._wake()
        self._wake_beats()
        await self.conn.close()
