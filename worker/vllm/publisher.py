"""``kvmesh worker --vllm-events``: publish the worker's KV events on vLLM's ZMQ protocol.

What goes on the wire is what vLLM's ``ZmqEventPublisher`` sends (PUB batches numbered from
0 per process, an optional replay ROUTER over the last batches, no snapshot), so any consumer
of vLLM's events can index a kvmesh worker. Non-local endpoints need CURVE (the events carry
token ids and salts). Events are translated on the engine thread; numbering, sending and
replay run on the worker's event loop.

See docs/architecture.md#worker-vllm-face.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque

import zmq
import zmq.asyncio

from kvmesh.events import vllm as ve
from kvmesh.events.pool import PoolEvent
from kvmesh.events.zmq_curve import CurveServer
from kvmesh.ops.loopback import is_local
from worker.engine.engine import Engine
from worker.vllm.event_map import VllmEventMap
from worker.vllm.replay_budget import ReplayBudget, caller_of

log = logging.getLogger("kvmesh.worker.vllm")

HASH_FORMS = ("int", "bytes")
SEND_HWM = 100_000  # vLLM's ZmqEventPublisher default
REPLAY_MAX_BYTES = 64 << 20  # payload bytes of one replay answer
REPLAY_REFILL_S = 60.0  # a caller's budget of two buffers refills one buffer in this time
MAX_REQUEST_BYTES = 4096  # incoming: a request is 8 bytes, a subscription a topic (a CURVE
# handshake's messages count too: 64 bytes stopped them)


class VllmPublisher:
    """PUB + replay ROUTER of one worker (``start`` on the loop, ``close`` when done)."""

    def __init__(self, endpoint: str, replay: str | None = None, *, block_size: int,
                 hash_form: str = "int", topic: str = "", buffer: int = ve.REPLAY_BUFFER,
                 hwm: int = SEND_HWM, curve: CurveServer | None = None,
                 replay_max_batches: int | None = None,
                 replay_max_bytes: int = REPLAY_MAX_BYTES,
                 replay_budget: ReplayBudget | None = None) -> None:
        if hash_form not in HASH_FORMS:
            raise ValueError(f"--vllm-hash-form must be one of {', '.join(HASH_FORMS)}")
        if buffer < 1:
            raise ValueError("the replay buffer needs at least 1 batch")
        check_endpoints(endpoint, replay, curve)
        self.endpoint = endpoint
        self.replay = replay
        self.curve = curve
        self.map = VllmEventMap(block_size, as_int=hash_form == "int")
        self.topic = topic.encode()
        self.hwm = hwm
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer)
        self.replay_max_batches = replay_max_batches or buffer
        self.replay_max_bytes = replay_max_bytes
        self.budget = replay_budget or ReplayBudget(
            burst=2 * buffer, rate=buffer / REPLAY_REFILL_S)
        self.seq = 0
        self.counters: Counter[str] = Counter()
        self.bound: tuple[str, str | None] = ("", None)  # the endpoints really bound
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ctx: zmq.Context | None = None
        self._auth = None  # the ZAP handler's thread (CURVE only)
        self._pub: zmq.Socket | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task | None = None

    def start(self) -> tuple[str, str | None]:
        """Bind both sockets (raises ``zmq.ZMQError`` for an endpoint in use) and serve
        replays; returns the bound endpoints (a ``*`` port resolved). Call on the loop."""
        self._loop = asyncio.get_running_loop()
        # an own context: the ZAP handler of CURVE serves every socket of its context
        ctx = self._ctx = zmq.Context()
        if self.curve is not None:
            self._auth = self.curve.authenticator(ctx)
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.SNDHWM, self.hwm)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.MAXMSGSIZE, MAX_REQUEST_BYTES + len(self.topic))
        router = None
        try:
            if self.curve is not None:
                self.curve.apply(pub)
            pub.bind(self.endpoint)
            if self.replay is not None:
                router = zmq.asyncio.Context.shadow(ctx).socket(zmq.ROUTER)
                router.setsockopt(zmq.LINGER, 0)
                router.setsockopt(zmq.MAXMSGSIZE, MAX_REQUEST_BYTES)
                # one whole answer: a ROUTER drops what exceeds its high-water mark
                router.setsockopt(zmq.SNDHWM, 2 * self.replay_max_batches + 2)
                if self.curve is not None:
                    self.curve.apply(router)
                router.bind(self.replay)
        except zmq.ZMQError:
            for sock in (router, pub):
                if sock is not None:
                    sock.close(linger=0)
            self._stop_context()
            raise
        self._pub, self._router = pub, router
        self.bound = (_endpoint(pub), None if router is None else _endpoint(router))
        if router is not None:
            self._task = self._loop.create_task(self._serve_replay())
        return self.bound

    # --- engine thread --------------------------------------------------------------

    def deliver(self, engine: Engine, events: list[PoolEvent], lost: bool) -> None:
        """Translate the events of one step and hand the batch to the loop."""
        if not (events or lost) or self._loop is None:
            return
        out = self.map.translate(engine.kv, events, lost)
        if out:
            self._loop.call_soon_threadsafe(self._publish, time.time(), out)

    # --- event loop -----------------------------------------------------------------

    def _publish(self, ts: float, events: list[ve.VllmEvent]) -> None:
        if self._pub is None:
            return  # closed
        seq, self.seq = self.seq, self.seq + 1
        payload = ve.encode_batch(ve.KVEventBatch(ts=ts, events=events, data_parallel_rank=0))
        self.buffer.append((seq, payload))
        self.counters["batches"] += 1
        for ev in events:
            if isinstance(ev, ve.VllmStored):
                self.counters["blocks_stored"] += len(ev.block_hashes)
            elif isinstance(ev, ve.VllmRemoved):
                self.counters["blocks_removed"] += len(ev.block_hashes)
        try:
            self._pub.send_multipart(ve.pack_message(self.topic, seq, payload), zmq.NOBLOCK)
        except zmq.Again:  # past the high-water mark: subscribers replay the gap
            self.counters["dropped"] += 1

    async def _serve_replay(self) -> None:
        router = self._router
        assert router is not None
        while True:
            frames = await router.recv_multipart(copy=False)
            if len(frames) != 3 or frames[1].bytes != b"" or len(frames[2].bytes) != 8:
                self.counters["bad_replay_requests"] += 1
                continue
            caller = caller_of(frames[2])
            allowed = self.budget.allowance(caller)
            if allowed is None:  # this caller pulled its share: no answer (replay_budget)
                self.counters["replays_refused"] += 1
                continue
            ident, start = frames[0].bytes, int.from_bytes(frames[2].bytes, "big")
            self.counters["replays"] += 1
            limit, room, sent = min(allowed, self.replay_max_batches), self.replay_max_bytes, 0
            for seq, payload in list(self.buffer):  # a snapshot: batches may arrive meanwhile
                if seq < start:
                    continue
                if sent >= limit or len(payload) > room:
                    self.counters["replays_capped"] += 1
                    break
                await router.send_multipart([ident, *ve.replay_reply(self.topic, seq,
                                                                       payload)])
                sent, room = sent + 1, room - len(payload)
            self.budget.spend(caller, sent)
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
        self._stop_context()

    def _stop_context(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None


def check_endpoints(events: str, replay: str | None, curve: CurveServer | None) -> None:
    """``ValueError`` unless both endpoints are local or ``curve`` is given (module
    contract): what they serve is every tenant's prompt ids and salts."""
    if curve is not None:
        return
    for flag, endpoint in (("--vllm-events", events), ("--vllm-replay", replay)):
        if endpoint is not None and not is_local(endpoint):
            raise ValueError(
                f"{flag} {endpoint}: only loopback (tcp://127.0.0.1:PORT) or ipc:// may be "
                "served without CURVE (the events carry every tenant's prompt ids and "
                "salts); give --vllm-curve-key and --vllm-curve-clients to serve other "
                "interfaces (docs/vllm.md)")


def _endpoint(sock: zmq.Socket) -> str:
    value = sock.getsockopt(zmq.LAST_ENDPOINT)
    return value.decode() if isinstance(value, bytes) else str(value)
