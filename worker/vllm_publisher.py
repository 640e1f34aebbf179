"""``kvmesh worker --vllm-events``: publish the worker's KV events on vLLM's ZMQ protocol.

Any consumer built for vLLM's KV events (llm-d, Dynamo, ``kvmesh bridge vllm``) can then index
a kvmesh worker. What goes on the wire is what vLLM's ``ZmqEventPublisher`` sends
(``kvmesh.vllm_events``: the current map encoding):

- a PUB socket on ``endpoint``; one message per engine step that changed the cache,
  ``[topic, seq, payload]``, ``seq`` counting batches from 0 for this process (so it starts
  again at 0 when the worker restarts, as a consumer expects of an engine restart), the
  payload a ``KVEventBatch`` of vLLM's events (``worker.vllm_event_map`` translates);
- a replay ROUTER on ``replay`` (optional): ``[b"", start_seq]`` is answered with every
  buffered batch whose seq is at least ``start_seq``, then the end marker; the last
  ``buffer`` batches (vLLM's 10,000) are kept. As with vLLM there is no snapshot: what left
  the buffer is gone.
- A PUB socket drops what a slow subscriber cannot take (past ``hwm`` messages, vLLM's
  100,000); the subscriber sees the gap in ``seq`` and replays.

Threads: events are translated on the engine thread, right after the step (the block keys
are read from the pool there: ``deliver``, a ``worker.event_tap`` consumer); numbering,
encoding, sending and replay run on the worker's event loop, so the buffer has one owner.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque

import zmq
import zmq.asyncio

from kvmesh import vllm_events as ve
from worker.engine import Engine
from worker.kv_cache import KVEvent
from worker.vllm_event_map import VllmEventMap

log = logging.getLogger("kvmesh.worker.vllm")

HASH_FORMS = ("int", "bytes")
SEND_HWM = 100_000  # vLLM's ZmqEventPublisher default


class VllmPublisher:
    """PUB + replay ROUTER of one worker (``start`` on the loop, ``close`` when done)."""

    def __init__(self, endpoint: str, replay: str | None = None, *, block_size: int,
                 hash_form: str = "int", topic: str = "", buffer: int = ve.REPLAY_BUFFER,
                 hwm: int = SEND_HWM) -> None:
        if hash_form not in HASH_FORMS:
            raise ValueError(f"--vllm-hash-form must be one of {', '.join(HASH_FORMS)}")
        if buffer < 1:
            raise ValueError("the replay buffer needs at least 1 batch")
        self.endpoint = endpoint
        self.replay = replay
        self.map = VllmEventMap(block_size, as_int=hash_form == "int")
        self.topic = topic.encode()
        self.hwm = hwm
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer)
        self.seq = 0
        self.counters: Counter[str] = Counter()
        self.bound: tuple[str, str | None] = ("", None)  # the endpoints really bound
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pub: zmq.Socket | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task | None = None

    def start(self) -> tuple[str, str | None]:
        """Bind both sockets (raises ``zmq.ZMQError`` for an endpoint in use) and serve
        replays; returns the bound endpoints (a ``*`` port resolved). Call on the loop."""
        self._loop = asyncio.get_running_loop()
        pub = zmq.Context.instance().socket(zmq.PUB)
        pub.setsockopt(zmq.SNDHWM, self.hwm)
        pub.setsockopt(zmq.LINGER, 0)
        try:
            pub.bind(self.endpoint)
            router = None
            if self.replay is not None:
                router = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
                router.setsockopt(zmq.LINGER, 0)
                # a whole buffer per request: a ROUTER drops what exceeds its high-water mark
                router.setsockopt(zmq.SNDHWM, 2 * (self.buffer.maxlen or 1) + 2)
                try:
                    router.bind(self.replay)
                except zmq.ZMQError:
                    router.close(linger=0)
                    raise
        except zmq.ZMQError:
            pub.close(linger=0)
            raise
        self._pub, self._router = pub, router
        self.bound = (_endpoint(pub), None if router is None else _endpoint(router))
        if router is not None:
            self._task = self._loop.create_task(self._serve_replay())
        return self.bound

    # --- engine thread --------------------------------------------------------------

    def deliver(self, engine: Engine, events: list[KVEvent], lost: bool) -> None:
        """Translate the events of one step and hand the batch to the loop."""
        if not (events or lost) or self._loop is None:
            return
        out = self.map.translate(engine.kv, events, lost)
        if out:
            self._loop.call_soon_threadsafe(self._publish, time.time(), out)

    # --- event loop -----------------------------------------------------------------

    def _publish(self, ts: float, events: list[ve.Event]) -> None:
        if self._pub is None:
            return  # closed
        seq, self.seq = self.seq, self.seq + 1
        payload = ve.encode_batch(ve.KVEventBatch(ts=ts, events=events, data_parallel_rank=0))
        self.buffer.append((seq, payload))
        self.counters["batches"] += 1
        for ev in events:
            if isinstance(ev, ve.BlockStored):
                self.counters["blocks_stored"] += len(ev.block_hashes)
            elif isinstance(ev, ve.BlockRemoved):
                self.counters["blocks_removed"] += len(ev.block_hashes)
        try:
            self._pub.send_multipart(ve.pack_message(self.topic, seq, payload), zmq.NOBLOCK)
        except zmq.Again:  # past the high-water mark: subscribers replay the gap
            self.counters["dropped"] += 1

    async def _serve_replay(self) -> None:
        router = self._router
        assert router is not None
        while True:
            frames = await router.recv_multipart()
            if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != 8:
                self.counters["bad_replay_requests"] += 1
                continue
            ident, start = frames[0], int.from_bytes(frames[2], "big")
            self.counters["replays"] += 1
            for seq, payload in list(self.buffer):  # a snapshot: batches may arrive meanwhile
                if seq >= start:
                    await router.send_multipart([ident, *ve.replay_reply(self.topic, seq,
                                                                           payload)])
            await router.send_multipart([ident, *ve.replay_end()])

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for sock in (self._router, self._pub):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._router = None


def _endpoint(sock: zmq.Socket) -> str:
    value = sock.getsockopt(zmq.LAST_ENDPOINT)
    return value.decode() if isinstance(value, bytes) else str(value)
