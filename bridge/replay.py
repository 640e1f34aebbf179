"""One replay request to a vLLM engine's replay ROUTER, its answer held within caps.

A fresh DEALER per request sends ``[b"", start]`` and collects ``(seq, payload)`` replies
until the end marker. What comes back is anyone's (``bridge.caps``), so the answer is cut
short (``complete`` False), never held without limit, when:

- ``timeout`` seconds pass between two replies (an engine gone, a ROUTER that dropped the
  rest past its send high-water mark);
- a reply does not parse (``malformed``);
- more than ``max_batches`` replies or ``max_bytes`` of payload came (``capped``): a peer
  that streams replies without the end marker. Real engines buffer ``REPLAY_BUFFER``
  batches; an answer cut by the caps is applied as far as it goes, and the subscriber's
  next round resumes from there, as after replies the ROUTER dropped.

Memory: the kept replies, at most ``max_bytes`` (plus the one that crossed it), and the
socket's queue, at most ``max_batches + 1`` messages of ``caps.MAX_MESSAGE_BYTES`` each
(``ZMQ_MAXMSGSIZE``; the reader drains it as it arrives, and closing the socket frees it).
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
