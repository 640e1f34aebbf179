"""One engine (one data-parallel rank) as a worker of the index: :class:`kvmesh.link.Link`
fed by the rank's ``EngineState``.

Registration carries the bridge's hash algorithm and root hash (it rehashes every block) and
the model given, else the engine's. Every heartbeat first scrapes the engine's ``/metrics``
(a failed scrape sends none: a silent engine leaves routing); none is sent while the ingest
loop is hung or the path to the index is wedged. Past capacity the pending events are shed
for a snapshot, at most once per ``shed_interval_s``. Tenant quotas are acknowledged, never
applied: vLLM's own pool evicts by its own rules, which a bridge cannot change.

See docs/architecture.md#the-index-link-kvmeshlink.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any

import grpc

from bridge.engine_load import EngineLoad, LoadSource
from bridge.engine_state import EngineState
from bridge.pending import MAX_BLOCKS, Pending
from kvmesh.events.wire import Wire
from kvmesh.link.beat_thread import BeatThread
from kvmesh.link.link import Link
from kvmesh.v1 import index_pb2

log = logging.getLogger("kvmesh.bridge.link")
Event = index_pb2.KvEvent | Wire


class StateFeed:
    """The :class:`kvmesh.link.Feed` of one rank: its state, its engine's metrics."""

    def __init__(self, state: EngineState, load: LoadSource | None, model: str | None,
                 worker_id: str) -> None:
        self.state = state
        self.source = load
        self._model = model
        self._sampled: EngineLoad | None = None  # the last answered scrape
        self._worker_id = worker_id
        self._warned = False
        self._quotas_told = False  # warned once that quotas are set but not enforced here
        self.max_age = 0.5  # how old a scrape may be (half the heartbeat interval)

    def wire(self, batch: Sequence[Event]) -> Sequence[Event]:
        return batch  # the state's events are messages or wire entries already

    async def load(self) -> index_pb2.WorkerLoad | None:
        if self.source is None:
            return index_pb2.WorkerLoad()
        load = await self.source.sample(max_age=self.max_age)
        if load is None:
            return None
        self._sampled = load
        if load.block_size not in (None, self.state.block_size) and not self._warned:
            self._warned = True
            log.warning("%s: the engine's block size is %d, the bridge's %d: its blocks will "
                        "not be indexed", self._worker_id, load.block_size,
                        self.state.block_size)
        return load.proto()

    def load_changed(self, since: index_pb2.WorkerLoad) -> bool:
        return False  # known only by a scrape, at each heartbeat

    def model(self) -> str | None:
        return self._model or (self._sampled.model if self._sampled is not None else None)

    async def snapshot(self) -> tuple[int, list[index_pb2.BlockStored]]:
        return self.state.snapshot()

    async def quotas(self, quotas: index_pb2.TenantQuotas) -> None:
        """Acknowledge ``quotas`` without applying them (vLLM cannot enforce them), so the
        service stops sending them with every heartbeat answer."""
        if quotas.version and not self._quotas_told:
            self._quotas_told = True
            log.warning("%s: tenant quotas are set on the service, but a vLLM engine cannot "
                        "enforce them: this rank evicts as vLLM does", self._worker_id)


class EngineLink(Link[Event]):
    """Keeps the index in step with one engine rank."""

    def __init__(self, addresses: list[str], state: EngineState, load: LoadSource | None, *,
                 worker_id: str, address: str, model: str | None, root_hash: bytes,
                 token: str | None = None, credentials: grpc.ChannelCredentials | None = None,
                 heartbeat_s: float = 1.0, rpc_timeout_s: float = 3.0, batch_max: int = 512,
                 batch_max_hashes: int = 8192, max_pending: int = MAX_BLOCKS,
                 beats: BeatThread | None = None, shed_interval_s: float = 1.0) -> None:
        super().__init__(addresses, StateFeed(state, load, model, worker_id),
                         Pending(max_pending), worker_id=worker_id, address=address,
                         block_size=state.block_size, hash_algo=state.algo,
                         root_hash=root_hash, token=token, credentials=credentials,
                         heartbeat_s=heartbeat_s, rpc_timeout_s=rpc_timeout_s,
                         batch_max=batch_max, batch_max_hashes=batch_max_hashes, beats=beats)
        self.state = state
        self.pending = self.backlog
        self.shed_interval_s = shed_interval_s
        self._shed_at = -float("inf")
        self.turned = time.monotonic()  # when the ingest loop last ran the ticker
        self.on_lag: Callable[[float], None] | None = None  # publish-to-index lag observer
        # (last index seq of an engine batch, the engine's batch timestamp), oldest first
        self._stamps: collections.deque[tuple[int, float]] = collections.deque(maxlen=65_536)

    def on_events(self, events: list[Event]) -> None:
        """The state's new index events (in seq order): queue them for the service."""
        if not events:
            return
        self._stamps.append((events[-1].seq, self.state.last_ts or time.time()))
        self.queue(events)

    async def _sample(self) -> index_pb2.WorkerLoad | None:
        self.feed.max_age = self.heartbeat_s / 2
        return await super()._sample()

    def _side_tasks(self) -> Iterable[Coroutine[Any, Any, None]]:
        return (self._tick(),)

    async def _tick(self) -> None:
        """Proof that the ingest loop turns (read by the beat side)."""
        while not self._closed:
            self.turned = time.monotonic()
            await asyncio.sleep(0.1)

    def stale(self) -> str | None:
        """Why a heartbeat (or registration) now would not tell the truth about this bridge,
        or None. A registration is not held back for waiting events: it resets the index."""
        now = time.monotonic()
        if self.beats is not None and now - self.turned > self.liveness_s:
            return "the ingest loop has not turned"
        if (self.registered and self.pending
                and now - max(self.acked_at, self.waiting_since) > self.liveness_s):
            return "events wait and the index acknowledged none"
        return None

    def _acked(self, seq: int) -> None:
        """The index holds everything through ``seq``: observe the lag of those batches."""
        super()._acked(seq)
        now = time.time()
        while self._stamps and self._stamps[0][0] <= seq:
            _, ts = self._stamps.popleft()
            if self.on_lag is not None:
                self.on_lag(max(0.0, now - ts))

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
