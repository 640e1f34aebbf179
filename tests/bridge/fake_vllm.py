"""An in-test stand-in for vLLM's ZmqEventPublisher: PUB + replay ROUTER on loopback ports.

Behaves as vLLM's publisher does: ``seq`` counts batches from 0 per instance (a new instance on
the same ports is a restarted engine), every published batch is kept in a replay buffer of
``buffer`` batches (vLLM's default: 10,000), and the ROUTER answers ``[b"", start_seq]`` with
every buffered batch whose seq is at least ``start_seq``, then the end marker. ``drop=True``
buffers a batch without sending it (a message lost on the way); ``drop_replies`` leaves
batches out of the next replay.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable

import zmq
import zmq.asyncio

from kvmesh.events import vllm as ve


class FakeEngine:
    def __init__(self, pub_port: int, replay_port: int | None, *, buffer: int = ve.REPLAY_BUFFER,
                 topic: bytes = b"", old_framing: bool = False) -> None:
        self.ctx = zmq.asyncio.Context.instance()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(f"tcp://127.0.0.1:{pub_port}")
        self.router: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task | None = None
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer)
        self.topic = topic
        self.old_framing = old_framing
        self.seq = 0
        self.requests: list[int] = []  # start seqs asked for
        self.before_reply: Callable[[], None] | None = None  # runs as a request arrives
        self.drop_replies: set[int] = set()  # seqs the next replay leaves out (vLLM's ROUTER
        # drops replies past its send high-water mark), each once
        if replay_port is not None:
            self.serve_replay(replay_port)

    def serve_replay(self, port: int) -> None:
        """Bind the replay ROUTER (an engine may bind it after its PUB socket)."""
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind(f"tcp://127.0.0.1:{port}")
        self._task = asyncio.get_running_loop().create_task(self._serve())

    def publish(self, *events: ve.VllmEvent, drop: bool = False) -> int:
        seq, self.seq = self.seq, self.seq + 1
        payload = ve.encode_batch(ve.KVEventBatch(ts=time.time(), events=list(events),
                                                  data_parallel_rank=0))
        self.buffer.append((seq, payload))
        if not drop:
            self.pub.send_multipart(ve.pack_message(self.topic, seq, payload))
        return seq

    async def _serve(self) -> None:
        assert self.router is not None
        while True:
            frames = await self.router.recv_multipart()
            if len(frames) != 3:
                continue
            ident, _, start = frames
            self.requests.append(int.from_bytes(start, "big"))
            if self.before_reply is not None:
                self.before_reply()
            for seq, payload in list(self.buffer):
                if seq in self.drop_replies:
                    self.drop_replies.discard(seq)
                elif seq >= self.requests[-1]:
                    if self.old_framing:
                        reply = [b"", seq.to_bytes(8, "big"), payload]
                    else:
                        reply = ve.replay_reply(self.topic, seq, payload)
                    await self.router.send_multipart([ident, *reply])
            end = [b"", ve.END_SEQ, b""] if self.old_framing else ve.replay_end()
            await self.router.send_multipart([ident, *end])

    async def close(self) -> None:
        if self._task is not None and self.router is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self.router.close(linger=0)
        self.pub.close(linger=0)
