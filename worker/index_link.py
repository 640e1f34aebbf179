"""The worker's index link: :class:`kvmesh.link.Link` fed by the engine's KV cache.

The worker is the truth; the index is a replica of its cache kept by events, which carry
the pool's sequence numbers (the link's contract is in ``kvmesh.link.link``). This module
only says what a worker feeds it: the pool's events, taken on the engine thread after each
step (``worker.engine.event_tap``) and handed to the event loop; the runner's load, a
change of which (a request finished) sends the next heartbeat early, so the router's cost
model never sees a worker as busy for up to a second after it went idle; and snapshots of
the cache, taken on the engine thread. Events the pool dropped unread, like an overflowing
:class:`~worker.outbox.Outbox`, are replaced by a snapshot. Tenant quotas a heartbeat
answer carries are applied to the pool on the engine thread
(``KVCacheManager.set_quotas``), between steps.
"""
from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc

from kvmesh.events.pool import PoolEvent
from kvmesh.events.to_index import event_to_proto, snapshot_blocks
from kvmesh.link.link import Link
from kvmesh.quota import Quotas
from kvmesh.v1 import index_pb2
from worker.engine.async_engine import AsyncEngine
from worker.engine.engine import Engine
from worker.engine.event_tap import EventTap
from worker.outbox import MAX_BLOCKS, Outbox


class EngineFeed:
    """The :class:`kvmesh.link.Feed` of one engine, through its runner."""

    def __init__(self, runner: AsyncEngine, model: str) -> None:
        self.runner = runner
        self._model = model

    def wire(self, batch: Sequence[PoolEvent]) -> list[index_pb2.KvEvent]:
        return [event_to_proto(e) for e in batch]

    async def load(self) -> index_pb2.WorkerLoad:
        return index_pb2.WorkerLoad(**self.runner.load)

    def load_changed(self, since: index_pb2.WorkerLoad) -> bool:
        load = self.runner.load
        return (load["running"], load["waiting"]) != (since.running, since.waiting)

    def model(self) -> str:
        return self._model

    async def snapshot(self) -> tuple[int, list[index_pb2.BlockStored]]:
        snap = await self.runner.call(lambda e: e.kv.cached_block_hashes())
        return snap.seq, snapshot_blocks(snap)

    async def quotas(self, quotas: index_pb2.TenantQuotas) -> None:
        """Apply ``quotas`` to the pool on the engine thread (``ValueError`` when
        malformed: the pool keeps its own)."""
        new = Quotas.from_proto(quotas)
        await self.runner.call(lambda e: e.kv.set_quotas(new))


class ServiceLink(Link[PoolEvent]):
    """The index link of one worker, on the worker's event loop (beats and events alike)."""

    def __init__(self, addresses: list[str], runner: AsyncEngine, *, worker_id: str,
                 address: str, model: str, root_hash: bytes, token: str | None = None,
                 heartbeat_s: float = 1.0, batch_max: int = 512,
                 batch_max_hashes: int = 8192, max_pending_blocks: int = MAX_BLOCKS,
                 rpc_timeout_s: float = 3.0,
                 credentials: grpc.ChannelCredentials | None = None) -> None:
        engine = runner.engine
        super().__init__(addresses, EngineFeed(runner, model), Outbox(max_pending_blocks),
                         worker_id=worker_id, address=address, block_size=engine.block_size,
                         hash_algo=engine.kv.hash_algo, root_hash=root_hash, token=token,
                         credentials=credentials, heartbeat_s=heartbeat_s,
                         rpc_timeout_s=rpc_timeout_s, batch_max=batch_max,
                         batch_max_hashes=batch_max_hashes)
        self.runner = runner
        self._dropped_seen = engine.kv.events_dropped  # engine thread: as of the last collect

    @property
    def outbox(self) -> Outbox:
        """The events waiting for the service."""
        return self.backlog

    @property
    def pending(self) -> int:
        """Events waiting to be published."""
        return len(self.backlog)

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
        loop = self._loop
        if (events or lost or self.feed.load_changed(self._beat_load)) and loop is not None:
            loop.call_soon_threadsafe(self._receive, events, lost)

    # --- event loop -----------------------------------------------------------------

    def _receive(self, events: list[PoolEvent], lost: bool) -> None:
        if lost:
            self.overflow("the engine's unread events")
        self.queue(events)
        if self.feed.load_changed(self._beat_load):
            self._wake_beats()

    async def run(self) -> None:
        """Keep the index in step with this worker until :meth:`close`."""
        self._loop = asyncio.get_running_loop()
        EventTap.install(self.runner).add(self.deliver)  # other consumers may share the tap
        await super().run()
