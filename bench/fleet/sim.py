"""One simulated worker of ``kvmesh bench fleet``: a real KV cache manager fed by a trace, and
the real service link publishing its events.

Nothing runs a model: :class:`FleetWorker` prefills its trace requests in chunks at a set
rate through a real ``KVCacheManager``, and the unchanged ``ServiceLink`` registers,
heartbeats, publishes and resyncs as a worker does. Event lag: events taken to applied.

See docs/architecture.md#replay-and-simulation.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from bench.replay.trace import TokenSynth, TraceRequest
from kvmesh.events.pool import PoolEvent
from worker.index_link import ServiceLink
from worker.kv_cache import KVCacheManager, KVRequest


def entries(ev: PoolEvent) -> int:
    """(block, worker) index entries an event writes: its hashes (1 for a clear)."""
    return len(getattr(ev, "block_hashes", ())) or 1


class _Manager(KVCacheManager):
    """The manager, noting when each batch of events leaves it (``taken``)."""

    taken: Callable[[list[PoolEvent]], None] = staticmethod(lambda events: None)

    def take_events(self) -> list[PoolEvent]:
        events = super().take_events()
        if events:
            self.taken(events)
        return events


class _Engine:
    """What the link reads of ``worker.engine.engine.Engine``."""

    def __init__(self, kv: KVCacheManager) -> None:
        self.kv = kv
        self.block_size = kv.block_size


class _Runner:
    """What the link uses of ``worker.engine.async_engine.AsyncEngine``: the engine, its load, and
    ``call`` (here on the loop itself: there is no engine thread)."""

    def __init__(self, engine: _Engine) -> None:
        self.engine = engine
        self.on_step: Callable[[Any], None] | None = None
        self.load: dict[str, int | float] = {}

    async def call(self, fn: Callable[[_Engine], Any]) -> Any:
        return fn(self.engine)


class FleetWorker:
    """A worker of the fleet (see the module docstring). ``requests``: its share of the
    trace, taken in order and again from the start when exhausted."""

    def __init__(self, worker_id: str, requests: list[TraceRequest], synth: TokenSynth, *,
                 services: list[str], token: str, root_hash: bytes, num_blocks: int,
                 address: str = "127.0.0.1:1", chunk_tokens: int = 2048,
                 running: int = 4) -> None:
        self.worker_id = worker_id
        self.requests, self.synth = requests, synth
        self.chunk_tokens, self.running_cap = chunk_tokens, running
        self.kv = _Manager(num_blocks, synth.block_size, hash_algo=synth.algo,
                           hash_seed=synth.seed)
        self.kv.taken = self._taken
        self.engine = _Engine(self.kv)
        self.runner = _Runner(self.engine)
        self.link = ServiceLink(services, self.runner, worker_id=worker_id,
                                address=address, model="fleet",
                                root_hash=root_hash, token=token)
        applied = self.link.outbox.drop_through
        self.link.outbox.drop_through = lambda seq: (self._applied(seq), applied(seq))[1]
        self._next = 0
        self._current: tuple[KVRequest, int] | None = None  # (request, prompt tokens)
        self._held: deque[KVRequest] = deque()
        self._pending: deque[tuple[int, float, int]] = deque()  # (last seq, taken at, entries)
        self.lags: list[float] = []       # seconds, one per taken batch, once applied
        self.made = 0                     # entries taken from the manager
        self.applied = 0                  # of those, applied by the service
        self.prefilled = 0                # tokens computed (not cache hits)
        self.hit_tokens = 0
        # the last prompts prefilled: still in the pool, so a route of one finds it indexed
        self.prompts: deque[list[int]] = deque(maxlen=2)
        self._set_load()

    # --- lag accounting -----------------------------------------------------------------

    def _taken(self, events: list[PoolEvent]) -> None:
        n = sum(entries(ev) for ev in events)
        self.made += n
        self._pending.append((events[-1].seq, time.monotonic(), n))

    def _applied(self, seq: int) -> None:
        now = time.monotonic()
        while self._pending and self._pending[0][0] <= seq:
            _, taken_at, n = self._pending.popleft()
            self.lags.append(now - taken_at)
            self.applied += n

    # --- prefill ------------------------------------------------------------------------

    def _set_load(self) -> None:
        self.runner.load = {"running": len(self._held), "waiting": 0,
                            "queued_prefill_tokens": 0, "free_blocks": self.kv.num_free_blocks,
                            "total_blocks": self.kv.num_blocks, "decode_tokens": 0}

    def _admit(self) -> None:
        tr = self.requests[self._next % len(self.requests)]
        self._next += 1
        tokens = self.synth.tokens(tr)
        req = KVRequest(f"{self.worker_id}-{self._next}", tokens, salt=tr.salt, lora=tr.lora,
                        block_hashes=list(self.synth.chain(tr)),
                        num_prompt_tokens=tr.input_length)
        if not self.kv.can_ever_fit(len(tokens)):
            return
        hits, n = self.kv.get_computed_blocks(req)
        first = min(self.chunk_tokens, len(tokens) - n)
        while self.kv.allocate_slots(req, first, hits, n) is None:
            self._release()
        req.num_computed_tokens = n + first
        self.hit_tokens += n
        self.prefilled += first
        self._current = (req, len(tokens))
        self.prompts.append(tokens)

    def _release(self) -> None:
        """Free the oldest running request (its blocks stay cached until evicted)."""
        if not self._held:
            raise RuntimeError(f"{self.worker_id}: the pool cannot hold one prompt")
        self.kv.free(self._held.popleft())

    def step(self) -> int:
        """One prefill chunk; returns the tokens it computed. Hands the events to the link."""
        before = self.prefilled
        if self._current is None:
            self._admit()
        else:
            req, total = self._current
            chunk = min(self.chunk_tokens, total - req.num_computed_tokens)
            while self.kv.allocate_slots(req, chunk) is None:
                self._release()
            req.num_computed_tokens += chunk
            self.prefilled += chunk
        if self._current is not None and self._current[0].num_computed_tokens >= \
                self._current[1]:
            self._held.append(self._current[0])
            self._current = None
            while len(self._held) > self.running_cap:
                self._release()
        self._set_load()
        self.link.collect(self.engine)
        return self.prefilled - before

    async def drive(self, tokens_per_s: float, producing: asyncio.Event,
                    stop: asyncio.Event) -> None:
        """Prefill at ``tokens_per_s`` while ``producing`` is set, until ``stop``."""
        while not stop.is_set():
            if not producing.is_set():
                await producing.wait()
                continue
            t0, done = time.monotonic(), 0
            while producing.is_set() and not stop.is_set():
                done += self.step()
                await asyncio.sleep(max(0.0, t0 + done / tokens_per_s - time.monotonic()))
