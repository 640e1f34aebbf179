"""One replay request to a vLLM engine's replay ROUTER, its answer held within caps.

A fresh DEALER per request collects replies until the end marker; the answer is cut short
(``complete`` False), never held without limit, on a timeout between replies, a malformed
reply, or past ``max_batches``/``max_bytes``. The subscriber resumes from where it stopped.

See docs/architecture.md#bridge-ingest-and-recovery.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import zmq
import zmq.asyncio

from bridge import caps
from kvmesh.events import vllm as ve


@dataclass
class ReplayStats:
    """What the requests of one subscriber came to (``SubscriberStats`` carries these)."""
    replays: int = 0          # replay requests sent
    replayed: int = 0         # batches received from replays
    replay_failures: int = 0  # replay requests without a complete answer
    replay_capped: int = 0    # answers cut at max_batches / max_bytes
    malformed: int = 0        # replies that did not parse


async def fetch(ctx: zmq.asyncio.Context, endpoint: str, start: int, timeout: float,
                stats: ReplayStats, *, max_batches: int = caps.REPLAY_BATCHES,
                max_bytes: int = caps.REPLAY_BYTES,
                setup: Callable[[zmq.Socket], None] | None = None
                ) -> tuple[list[tuple[int, bytes]], bool]:
    """(buffered batches with ``seq >= start``, in order, whether the end marker came).
    ``setup`` adds the caller's options to the DEALER before it connects (keys, ...)."""
    stats.replays += 1
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    # every reply of a full buffer may queue (the ROUTER drops what does not fit), no more
    dealer.setsockopt(zmq.RCVHWM, max_batches + 1)
    dealer.setsockopt(zmq.MAXMSGSIZE, caps.MAX_MESSAGE_BYTES)
    if setup is not None:
        setup(dealer)
    dealer.connect(endpoint)
    got: list[tuple[int, bytes]] = []
    size = 0
    try:
        await dealer.send_multipart(ve.replay_request(start))
        while True:
            if not await dealer.poll(int(timeout * 1000)):
                stats.replay_failures += 1
                return got, False
            try:
                reply = ve.parse_replay_reply(await dealer.recv_multipart())
            except ValueError:
                stats.malformed += 1
                stats.replay_failures += 1
                return got, False
            if reply is None:
                return got, True
            got.append(reply)
            stats.replayed += 1
            size += len(reply[1])
            if len(got) > max_batches or size > max_bytes:
                stats.replay_capped += 1
                stats.replay_failures += 1
                return got, False
    finally:
        dealer.close(linger=0)
