"""One engine (one data-parallel rank) as a worker of the index, over ``IndexService``.

Exactly what a kvmesh worker's link does (``worker/service_link.py``; the bridge may not
import ``worker/``, so this is its smallest bridge-side twin): ``RegisterWorker`` with the
model, block size, this bridge's hash algorithm and root hash (the bridge rehashes every
block, so those are kvmesh's, not the engine's) and a random incarnation; heartbeats at the
interval the service answers; ``PublishEvents`` of the ``EngineState``'s index events (fed by
the subscriber through :meth:`EngineLink.on_events`; each serialized once, straight into the
request: ``service_conn.publish_request``); a ``SyncWorker`` of the state's snapshot
whenever the service asks for one, after every registration, and when the pending events
overflow; registration again when the service says it lost the worker; the next service
address (``kvmesh.rpc.retry``'s table) when one fails, with a jittered backoff.

Liveness follows the engine's metrics: every heartbeat first scrapes the engine
(``bridge.engine_load``); a heartbeat whose scrape fails is not sent, so an engine whose
``/metrics`` stops answering leaves routing after the service's liveness timeout, exactly
like a silent worker, and comes back (a heartbeat, a resync or a new registration) once it
answers again. Without a load source the link heartbeats an empty load.

Threads: the events side (the subscriber, ``on_events``, publishes and snapshots) runs on
the ingest loop: a snapshot taken at seq S covers every event up to S, so the pending ones
up to S are dropped and nothing is applied twice or missed. The beat side (scrapes,
heartbeats, registrations) runs on a ``BeatThread`` when one is given (``beats``; the
bridge process gives one), with its own channel, so that a busy ingest loop never starves
it; without one it runs on the ingest loop too. The beat side only reads the events side's
numbers and raises its flags (``registered``, ``need_sync``: plain attributes, set after
the service answered) and wakes it thread-safely. A heartbeat still tells the truth about
the bridge: none is sent while the ingest loop has not turned for a liveness timeout (a
hung bridge), nor while events wait and no publish or snapshot has been acknowledged for a
liveness timeout (a wedged path to the index): the engine then leaves routing.

Past capacity the events side sheds instead of queueing: when the pending events outweigh
a snapshot of the state (plus one batch), they are dropped for a snapshot, at most once per
``shed_interval_s``; and each wake publishes what queued meanwhile in batches as large as
the limits allow, so the lag is a few RPCs, not a queue. Load never causes a registration.
"""
from __future__ import annotations

import asyncio
import collections
import functools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable

import grpc
import grpc.aio

from bridge.beat_thread import BeatThread
from bridge.engine_load import EngineLoad, LoadSource
from bridge.engine_state import EngineState
from bridge.pending import MAX_BLOCKS, Pending
from bridge.service_conn import Conn, Stub, publish_head, publish_request
from kvmesh.link.backlog import BatchLimits
from kvmesh.rpc.retry import Action, Backoff, Source, decide
from kvmesh.v1 import index_pb2

log = logging.getLogger("kvmesh.bridge.link")
REFUSED = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INVALID_ARGUMENT)


class EngineLink:
    """Keeps the index in step with one engine rank: a beat task and an event task."""

    def __init__(self, addresses: list[str], state: EngineState, load: LoadSource | None, *,
                 worker_id: str, address: str, model: str | None, root_hash: bytes,
                 token: str | None = None, credentials: grpc.ChannelCredentials | None = None,
                 heartbeat_s: float = 1.0, rpc_timeout_s: float = 3.0, batch_max: int = 512,
                 batch_max_hashes: int = 8192, max_pending: int = MAX_BLOCKS,
                 beats: BeatThread | None = None, shed_interval_s: float = 1.0) -> None:
        self.conn = Conn(addresses, credentials)
        self.state = state
        self.load = load
        self.worker_id = worker_id
        self.model = model
        self.incarnation = secrets.randbits(64) or 1
        self.register_req = index_pb2.RegisterWorkerRequest(
            worker_id=worker_id, address=address, block_size=state.block_size,
            hash_algo=state.algo, root_hash=root_hash, incarnation=self.incarnation)
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._publish_head = publish_head(worker_id, self.incarnation)
        self.heartbeat_s = heartbeat_s
        self.timeout = rpc_timeout_s
        self.limits = BatchLimits(batch_max, batch_max_hashes)  # raises for limits < 1
        self.pending = Pending(max_pending)
        self.last_seq = 0  # the last index event seq the service holds (or a snapshot covered)
        self.registered = False
        self.need_sync = True
        self.silent = False  # the last scrape of the engine's metrics failed
        self.beats = beats
        self.beat_conn: Conn | None = None  # the beat thread's own (None: ``conn``)
        self.liveness_s = 3.0  # the service's liveness timeout (its registration answer)
        self.shed_interval_s = shed_interval_s
        self._shed_at = -float("inf")
        self._loop: asyncio.AbstractEventLoop | None = None  # the ingest loop
        self.turned = time.monotonic()  # when the ingest loop last ran the ticker
        self.acked_at = time.monotonic()  # when the index last acknowledged events
        self._waiting_since = 0.0  # when the pending events last stopped being empty
        self.counters: collections.Counter[str] = collections.Counter()
        self.on_lag: Callable[[float], None] | None = None  # publish-to-index lag observer
        # (last index seq of an engine batch, the engine's batch timestamp), oldest first
        self._stamps: collections.deque[tuple[int, float]] = collections.deque(maxlen=65_536)
        self._kick = asyncio.Event()
        self._closed = False
        self._inflight = 0  # Publish/Sync calls in flight; _epoch moves as each starts/ends
        self._epoch = 0
        self._warned: set[str] = set()

    # --- from the subscriber --------------------------------------------------------------

    def on_events(self, events: list[index_pb2.KvEvent]) -> None:
        """The state's new index events (in seq order): queue them for the service."""
        if not events:
            return
        self._stamps.append((events[-1].seq, self.state.last_ts or time.time()))
        if not self.pending:
            self._waiting_since = time.monotonic()
        if not self.need_sync and not self.pending.add(events, after=self.last_seq):
            self.counters["overflows"] += 1
            log.warning("%s: pending index events overflowed; resyncing with a snapshot",
                        self.worker_id)
            self.need_sync = True
        self._kick.set()

    def _acked(self, seq: int) -> None:
        """The index holds everything through ``seq``: observe the lag of those batches."""
        now = time.time()
        while self._stamps and self._stamps[0][0] <= seq:
            _, ts = self._stamps.popleft()
            if self.on_lag is not None:
                self.on_lag(max(0.0, now - ts))

    # --- tasks ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Keep the index in step with the engine until :meth:`close` (or cancellation)."""
        self._loop = asyncio.get_running_loop()
        beats = (asyncio.create_task(self._beats()) if self.beats is None
                 else asyncio.ensure_future(asyncio.wrap_future(
                     self.beats.submit(self._beats_apart()))))
        tasks = [beats, asyncio.create_task(self._events()), asyncio.create_task(self._tick())]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()

    async def _tick(self) -> None:
        """Proof that the ingest loop turns (read by the beat side)."""
        while not self._closed:
            self.turned = time.monotonic()
            await asyncio.sleep(0.1)

    async def _beats_apart(self) -> None:
        """``_beats`` on the beat thread, through a channel of its own."""
        self.beat_conn = Conn(self.conn.ring.addresses, self.conn.credentials)
        try:
            await self._beats()
        finally:
            await self.beat_conn.close()

    def _wake(self) -> None:
        """Wake the events task, from either thread."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._kick.set()
        else:
            loop.call_soon_threadsafe(self._kick.set)

    def stale(self) -> str | None:
        """Why a heartbeat (or registration) now would not tell the truth about this bridge,
        or None. A registration is not held back for waiting events: it resets the index."""
        now = time.monotonic()
        if self.beats is not None and now - self.turned > self.liveness_s:
            return "the ingest loop has not turned"
        if (self.registered and self.pending
                and now - max(self.acked_at, self._waiting_since) > self.liveness_s):
            return "events wait and the index acknowledged none"
        return None

    async def _beats(self) -> None:
        backoff = Backoff()
        conn = self.beat_conn or self.conn
        while not self._closed:
            started = time.monotonic()
            load = await self._sample()
            why = self.stale()
            if why is not None:
                self.counters["stale_beats"] += 1
                self._warn("stale", "%s: no heartbeat while %s (the engine leaves routing "
                           "after the liveness timeout)", self.worker_id, why)
            elif load is not None:
                step = self._heartbeat if self.registered else self._register
                if not await self._attempt(functools.partial(step, load=load), backoff,
                                           conn):
                    continue
            await asyncio.sleep(max(0.0, started + self.heartbeat_s - time.monotonic()))

    async def _sample(self) -> EngineLoad | None:
        if self.load is None:
            return EngineLoad()
        load = await self.load.sample(max_age=self.heartbeat_s / 2)
        if load is None:
            self.counters["silent_beats"] += 1
            if not self.silent:
                log.warning("%s: the engine's metrics do not answer; no heartbeat until they "
                            "do (it leaves routing after the liveness timeout)", self.worker_id)
        elif self.silent:
            log.info("%s: the engine's metrics answer again", self.worker_id)
        self.silent = load is None
        if load is not None and load.block_size not in (None, self.state.block_size):
            self._warn("block_size", "%s: the engine's block size is %d, the bridge's %d: its "
                       "blocks will not be indexed", self.worker_id, load.block_size,
                       self.state.block_size)
        return load

    async def _events(self) -> None:
        backoff = Backoff()
        while not self._closed:
            self._kick.clear()
            if not self.registered or not (self.need_sync or self.pending):
                await self._kick.wait()
                continue
            await self._attempt(self._sync_and_publish, backoff, self.conn)

    async def _attempt(self, step: Callable[[Stub], Awaitable[None]], backoff: Backoff,
                       conn: Conn) -> bool:
        stub = conn.stub()
        try:
            await step(stub)
        except Exception as exc:  # the task must outlive any error
            self._failed(exc, stub, conn)
            await backoff.sleep()
            return False
        backoff.reset()
        return True

    def _failed(self, err: Exception, stub: Stub, conn: Conn) -> None:
        if isinstance(err, grpc.aio.UsageError):
            return  # its channel was closed by the other task's move to the next address
        if not isinstance(err, grpc.aio.AioRpcError):
            log.error("%s: unexpected error", self.worker_id, exc_info=err)
            self.counters["error_unexpected"] += 1
            return
        self.counters[f"error_{err.code().name.lower()}"] += 1
        if decide(Source.SERVICE, err.code()) is Action.NEXT_REPLICA:
            conn.next_replica(stub)
        elif err.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION):
            log.warning("service refused %r: %r", self.worker_id, err.details())
            self.registered = False
        else:
            log.warning("%s: service call failed: %s %r", self.worker_id, err.code().name,
                        err.details())

    # --- calls ----------------------------------------------------------------------------

    async def _register(self, stub: Stub, *, load: EngineLoad) -> None:
        model = self.model or load.model
        if not model:
            self._warn("model", "%s: no --model and the engine's metrics name none; not "
                       "registering", self.worker_id)
            return
        self.register_req.model = model
        self.register_req.load.CopyFrom(load.proto())
        resp = await stub.RegisterWorker(self.register_req, timeout=self.timeout,
                                         metadata=self.metadata)
        if resp.heartbeat_interval_ms:
            self.heartbeat_s = resp.heartbeat_interval_ms / 1000
        if resp.liveness_timeout_ms:
            self.liveness_s = resp.liveness_timeout_ms / 1000
        self.limits.reset()
        self.acked_at = time.monotonic()  # a fresh index: nothing was waiting for it
        self.need_sync = True  # a snapshot after every registration
        self.registered = True
        self.counters["registrations"] += 1
        self._wake()

    async def _heartbeat(self, stub: Stub, *, load: EngineLoad) -> None:
        quiet, epoch = self._inflight == 0, self._epoch
        resp = await stub.Heartbeat(index_pb2.HeartbeatRequest(
            worker_id=self.worker_id, load=load.proto(), last_seq=self.last_seq,
            incarnation=self.incarnation), timeout=self.timeout, metadata=self.metadata)
        self.counters["heartbeats"] += 1
        if resp.reregister:
            self.registered = False
        elif resp.resync and quiet and epoch == self._epoch:
            # (a publish or sync that overlapped the beat may have moved the index past the
            # last_seq it carried: not evidence of a lost index; the next beat asks again)
            self.need_sync = True
            self._wake()

    async def _rpc(self, call: Callable[..., Awaitable], req: object, timeout: float):
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
        seq, blocks = self.state.snapshot()
        self.pending.clear()  # events up to seq are in the snapshot; later ones queue again
        try:
            await self._rpc(stub.SyncWorker, index_pb2.SyncWorkerRequest(
                worker_id=self.worker_id, seq=seq, blocks=blocks,
                incarnation=self.incarnation), max(self.timeout, 10.0))
        except BaseException:
            self.need_sync = True
            raise
        self.pending.drop_through(seq)
        self.last_seq = seq
        self.acked_at = time.monotonic()
        self.counters["resyncs"] += 1
        self._acked(seq)

    def _shed(self) -> bool:
        """Whether to drop the pending events for a snapshot: they outweigh the snapshot
        (the state's blocks) and one batch, and no shed happened within the interval."""
        now = time.monotonic()
        if (self.pending.blocks <= self.limits.hashes + 2 * self.state.indexed_blocks
                or now - self._shed_at < self.shed_interval_s):
            return False
        self._shed_at = now
        self.counters["sheds"] += 1
        return True

    async def _publish(self, stub: Stub) -> None:
        while self.pending and not self.need_sync and self.registered:
            if self._shed():
                self.need_sync = True
                return
            batch = self.pending.batch(self.limits.events, self.limits.hashes)
            req = publish_request(self._publish_head, batch)
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
            self.pending.drop_through(batch[-1].seq)
            self.last_seq = batch[-1].seq
            self.acked_at = time.monotonic()
            self.counters["events_published"] += len(batch)
            self.counters["publishes"] += 1
            self._acked(self.last_seq)

    def _refused(self, batch: list[index_pb2.KvEvent], err: grpc.aio.AioRpcError) -> None:
        """Halve the batch limits when that can help (a service configured below them),
        else give the events up for a snapshot."""
        self.counters["refused"] += 1
        if (err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                and self.limits.halve(batch, self.pending.hashes)):
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
        self._kick.set()
        await self.conn.close()
