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
and the beat task (registrations, heartbeats), which never waits on events, so no publish
problem takes a healthy worker out of routing. With ``beats`` (a ``BeatThread``) the beat
task runs on that thread's loop with a channel of its own, so a busy events loop never
starves it; it only reads the events side's numbers, raises its flags (``registered``,
``need_sync``: set after the service answered) and wakes it thread-safely. A heartbeat whose
resync answer raced a publish or snapshot (the index may be ahead of the ``last_seq`` it
carried) is no evidence of a lost index: it is rechecked by a heartbeat soon after, never
obeyed. Details: ``docs/architecture.md``.
"""
from __future__ import annotations

import asyncio
import collections
import functools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, Generic, TypeVar

import grpc
import grpc.aio

from kvmesh.link.backlog import Backlog, BatchLimits
from kvmesh.link.beat_thread import BeatThread
from kvmesh.link.conn import Conn, Stub
from kvmesh.link.feed import Feed
from kvmesh.link.request import publish_head, publish_request
from kvmesh.rpc.retry import Action, Backoff, Source, decide
from kvmesh.v1 import index_pb2

log = logging.getLogger("kvmesh.link")

# A publish refused for what it carries: sending it again can never succeed.
REFUSED = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INVALID_ARGUMENT)
EAGER_BEAT_S = 0.1  # the soonest a heartbeat follows another (a load change, a recheck)
E = TypeVar("E")
T = TypeVar("T")


def _set(loop: asyncio.AbstractEventLoop | None, event: asyncio.Event) -> None:
    """Set ``event`` of ``loop`` from any thread (nothing once the loop is gone)."""
    if loop is None or loop.is_closed():
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        event.set()
        return
    try:
        loop.call_soon_threadsafe(event.set)
    except RuntimeError:
        pass  # closed meanwhile: nobody waits any more


class Link(Generic[E]):
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
        self._warned: set[str] = set()

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
        _set(self._loop, self._kick)

    def _wake_beats(self) -> None:
        """Wake the beat task (any thread): a registration or a load change to tell."""
        _set(self._beat_loop, self._beat_kick)

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

    async def _beats_apart(self) -> None:
        """The beat task on the beat thread, through a channel of its own."""
        self.beat_conn = self.conn.twin()
        try:
            await self._beats(self.beat_conn)
        finally:
            await self.beat_conn.close()

    def _eager(self) -> bool:
        return self._recheck or self.feed.load_changed(self._beat_load)

    async def _beats(self, conn: Conn) -> None:
        """Register when needed and heartbeat every ``heartbeat_s`` (early on a load change
        or a recheck, at most every ``EAGER_BEAT_S``); nothing here waits on events."""
        self._beat_loop = asyncio.get_running_loop()
        backoff = Backoff()
        due = last = hold = 0.0
        while not self._closed:
            now = time.monotonic()
            eager = self._eager() and now - last >= EAGER_BEAT_S
            if now >= hold and (not self.registered or now >= due or eager):
                sent = await self._beat(conn, backoff)
                if sent is False:
                    continue
                if sent is None:  # nothing true to tell now: look again in a heartbeat
                    hold = due = now + self.heartbeat_s
                else:
                    last = time.monotonic()
                    due = last + self.heartbeat_s
            wait = max(0.0, due - time.monotonic())
            if self._eager():
                wait = min(wait, max(0.0, last + EAGER_BEAT_S - time.monotonic()))
            self._beat_kick.clear()
            try:
                await asyncio.wait_for(self._beat_kick.wait(), timeout=wait)
            except TimeoutError:
                pass

    async def _beat(self, conn: Conn, backoff: Backoff) -> bool | None:
        """One registration or heartbeat: True when answered, False when it failed, None
        when none was sent (no load, a stale worker, no model to register with)."""
        load = await self._sample()
        if load is None:
            return None
        why = self.stale()
        if why is not None:
            self.counters["stale_beats"] += 1
            self._warn("stale", "%s: no heartbeat while %s (it leaves routing after the "
                       "liveness timeout)", self.worker_id, why)
            return None
        if self.registered:
            return await self._attempt(functools.partial(self._heartbeat, load=load),
                                       backoff, conn)
        model = self.feed.model()
        if not model:
            self._warn("model", "%s: no model known (none given, none reported); not "
                       "registering", self.worker_id)
            return None
        return await self._attempt(functools.partial(self._register, load=load, model=model),
                                   backoff, conn)

    async def _sample(self) -> index_pb2.WorkerLoad | None:
        load = await self.feed.load()
        if load is None:
            self.counters["silent_beats"] += 1
            if not self.silent:
                log.warning("%s: no load to tell (the engine does not answer); no heartbeat "
                            "until there is (it leaves routing after the liveness timeout)",
                            self.worker_id)
        elif self.silent:
            log.info("%s: the engine answers again", self.worker_id)
        self.silent = load is None
        return load

    def stale(self) -> str | None:
        """Why a heartbeat now would not tell the truth about the worker, or None."""
        return None

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

    async def _register(self, stub: Stub, *, load: index_pb2.WorkerLoad, model: str) -> None:
        self.register_req.model = model
        self.register_req.load.CopyFrom(load)
        resp = await stub.RegisterWorker(self.register_req, timeout=self.timeout,
                                         metadata=self.metadata)
        if resp.heartbeat_interval_ms:
            self.heartbeat_s = resp.heartbeat_interval_ms / 1000
        if resp.liveness_timeout_ms:
            self.liveness_s = resp.liveness_timeout_ms / 1000
        self.limits.reset()
        self.acked_at = time.monotonic()  # a fresh index: nothing was waiting for it
        self.need_sync = True  # a snapshot after every registration (set first: see above)
        self.registered = True
        self.counters["registrations"] += 1
        self._wake()

    async def _heartbeat(self, stub: Stub, *, load: index_pb2.WorkerLoad) -> None:
        self._beat_load = load
        self._recheck = False
        quiet, epoch = self._inflight == 0, self._epoch
        resp = await stub.Heartbeat(index_pb2.HeartbeatRequest(
            worker_id=self.worker_id, load=load, last_seq=self.last_seq,
            incarnation=self.incarnation), timeout=self.timeout, metadata=self.metadata)
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
            self._wake()

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
