"""The source side of the zmq and shm planes: one ROUTER socket, one task per pull.

Protocol (every message starts with a :mod:`~kvmesh.transfer.frames` head):

- receiver -> source: CLAIM (key, count, block size in ``extra``, window in ``index``) plus
  the transport name; then one CREDIT per frame it has passed to its sink; CANCEL if it
  gives up (timeout, a bad frame). One connection may carry several pulls at once: every
  message names its offer key.
- source -> receiver: ERROR plus a reason, or the frames: zmq: DATA heads followed by the
  frame's blocks (one part per block, sent zero-copy, or one joined part when blocks are
  small); shm: one OPEN (the segment's path, its size in ``extra``) then a SEGMENT head per
  frame written into it (its offset in ``extra``: the segment is a ring of ``window`` frames,
  so a long pull touches no more memory than its window).

With ``curve`` the socket is a CURVE server under a key pair drawn at start (its public key
goes into every endpoint, :mod:`~kvmesh.transfer.endpoint`): every byte on the wire is
encrypted and authenticated. No ZAP handler: any receiver may complete the handshake, since
what it may read is decided by the offer key it presents, not by who it is.

The source never has more than ``window`` frames in flight to one receiver (credit-based
flow control: the ROUTER has no high-water mark to drop at, and memory stays bounded). A
receiver silent for ``idle_s`` is dropped. Closing the server closes the TCP connections, which
the receivers see as "closed".

See docs/architecture.md#peer-kv-transfer-the-data-plane.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os

import zmq
import zmq.asyncio
from zmq.utils import z85

from kvmesh.transfer import shm_segment
from kvmesh.transfer.frames import (
    CLAIM,
    CREDIT,
    DATA,
    ERROR,
    SEGMENT,
    Head,
    TransferError,
    blocks_per_frame,
    frame_spans,
    unpack,
)
from kvmesh.transfer.offers import Offer, OfferBook

log = logging.getLogger(__name__)

OPEN, CANCEL = 6, 7
MAX_WINDOW = 64
WINDOW_BYTES = 16 << 20  # in flight per pull: enough to keep loopback busy, bounded memory
JOIN_BELOW = 64 * 1024  # blocks smaller than this travel joined: a part costs more than a copy


class ZmqServe:
    """Serves the offers of ``book`` whose transport is "zmq" or "shm"."""

    def __init__(self, book: OfferBook, host: str, frame_bytes: int, idle_s: float,
                 curve: bool = False) -> None:
        self.book, self.host, self.frame_bytes, self.idle_s = book, host, frame_bytes, idle_s
        self.curve = curve
        self.port = 0
        self.public_key = b""  # with curve: the socket's CURVE public key, 32 bytes
        self._sock: zmq.asyncio.Socket | None = None
        self._loop_task: asyncio.Task | None = None
        # (receiver's connection, offer key) -> the task serving that pull, its credits
        self._pulls: dict[tuple[bytes, bytes], tuple[asyncio.Task, asyncio.Queue[int]]] = {}

    async def start(self) -> None:
        sock = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
        sock.linger = 0
        sock.sndhwm = 0  # bounded by the credit window instead; a ROUTER at its HWM drops
        sock.rcvhwm = 0
        if self.curve:
            public, secret = zmq.curve_keypair()
            sock.curve_server = True
            sock.curve_secretkey = secret
            self.public_key = z85.decode(public)
        host = f"[{self.host}]" if ":" in self.host else self.host
        if ":" in self.host:
            sock.ipv6 = True
        self.port = sock.bind_to_random_port(f"tcp://{host}")
        self._sock = sock
        self._loop_task = asyncio.create_task(self._receive())

    async def close(self) -> None:
        # the socket first: libzmq drops what it still queues, so the pulls' zero-copy
        # buffers are free by the time their tasks end (and their offers' leases with them)
        if self._loop_task is not None:
            self._loop_task.cancel()
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
        tasks = [t for t, _ in self._pulls.values()]
        if self._loop_task is not None:
            tasks.append(self._loop_task)
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._pulls.clear()

    async def _receive(self) -> None:
        assert self._sock is not None
        while True:
            msg = await self._sock.recv_multipart()
            if len(msg) < 2:
                continue
            ident = msg[0]
            try:
                head = unpack(msg[1])
            except TransferError:
                continue  # not our protocol: nothing to answer
            pull = self._pulls.get((ident, head.key))
            if head.kind == CREDIT and pull is not None:
                pull[1].put_nowait(head.extra)
            elif head.kind == CANCEL and pull is not None:
                pull[0].cancel()
            elif head.kind == CLAIM and pull is None:
                self._claim(ident, head, msg[2].decode(errors="replace") if len(msg) > 2 else "")
            elif head.kind == CLAIM:  # the same offer again, while its first pull runs
                self._send([ident, Head(ERROR, head.key).pack(), b"refused"])

    def _claim(self, ident: bytes, head: Head, transport: str) -> None:
        try:
            offer = self.book.take(head.key, transport)
        except TransferError as e:
            self._send([ident, Head(ERROR, head.key).pack(), e.reason.encode()])
            return
        if head.count != len(offer.blocks) or head.extra != offer.block_bytes:
            offer.finish("failed")
            self._send([ident, Head(ERROR, head.key).pack(), b"mismatch"])
            return
        credits: asyncio.Queue[int] = asyncio.Queue()
        window = max(1, min(head.index, MAX_WINDOW, max(2, WINDOW_BYTES // self.frame_bytes)))
        task = asyncio.create_task(self._serve(ident, offer, window, credits))
        self._pulls[ident, head.key] = (task, credits)
        task.add_done_callback(lambda _t: self._pulls.pop((ident, head.key), None))

    def _send(self, parts: list) -> None:
        if self._sock is not None:  # never blocks: no HWM, the window bounds what is queued
            self._sock.send_multipart(parts)

    def _send_zero_copy(self, parts: list) -> asyncio.Future | None:
        """Send without copying ``parts``; the future's result tracks when libzmq is done
        reading them (the bytes are in the kernel, or dropped)."""
        if self._sock is None:
            return None
        return self._sock.send_multipart(parts, copy=False, track=True)

    async def _released(self, sends: list[asyncio.Future]) -> None:
        """Wait (at most idle_s) until libzmq reads none of the offer's buffers any more: only
        then may the source reuse them (a zero-copy send reads them until written out)."""
        deadline = asyncio.get_running_loop().time() + self.idle_s
        for fut in sends:
            if not fut.done():  # never handed to libzmq (the socket refused it)
                fut.cancel()
                continue
            tracker = None if fut.cancelled() or fut.exception() else fut.result()
            while (tracker is not None and not tracker.done
                   and asyncio.get_running_loop().time() < deadline):
                await asyncio.sleep(0.002)

    async def _credit(self, credits: asyncio.Queue[int]) -> int:
        # asyncio.timeout, not wait_for: 3.11's wait_for swallows a cancel that meets a result
        async with asyncio.timeout(self.idle_s):
            return max(0, min(MAX_WINDOW, await credits.get()))

    async def _serve(self, ident: bytes, offer: Offer, window: int,
                     credits: asyncio.Queue[int]) -> None:
        bb = offer.block_bytes
        per_frame = blocks_per_frame(bb, self.frame_bytes)
        spans = frame_spans(len(offer.blocks), per_frame)
        # shm: a ring of one slot per frame in flight; slot i % slots is written again only
        # once frame i - slots is credited, i.e. out of the receiver's sink
        slots = min(window, len(spans))
        ring = slots * per_frame * bb
        outcome, sends = "failed", []
        try:
            path, fd = shm_segment.create(ring) if offer.transport == "shm" else ("", -1)
        except OSError:
            log.exception("peer KV pull dropped: cannot create the shm segment")
            self._send([ident, Head(ERROR, offer.key).pack(), b"refused"])
            offer.finish(outcome)
            return
        try:
            if fd >= 0:
                self._send([ident, Head(OPEN, offer.key, extra=ring).pack(), path.encode()])
            credit = window
            for index, (first, n) in enumerate(spans):
                while credit <= 0:
                    credit = min(window, credit + await self._credit(credits))
                credit -= 1
                blocks = offer.blocks[first:first + n]
                if fd >= 0:
                    at = (index % slots) * per_frame * bb
                    shm_segment.write(fd, blocks, at)
                    self._send([ident, Head(SEGMENT, offer.key, index, first, n, at).pack()])
                elif bb < JOIN_BELOW:
                    self._send([ident, Head(DATA, offer.key, index, first, n).pack(),
                                b"".join(blocks)])
                else:
                    sent = self._send_zero_copy(
                        [ident, Head(DATA, offer.key, index, first, n).pack(), *blocks])
                    sends = [f for f in sends if not _released(f)]
                    if sent is not None:
                        sends.append(sent)
            if fd >= 0:  # the receiver has opened (and unlinked) it once all credit is back
                while credit < window:
                    credit = min(window, credit + await self._credit(credits))
            outcome = "sent"
        except TimeoutError:
            log.info("peer KV pull dropped: the receiver sent no credit for %.0f s", self.idle_s)
        finally:
            try:
                await self._released(sends)
            finally:
                offer.finish(outcome)  # releases the source's buffers (and its lease)
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
                shm_segment.unlink(path)



def _released(fut: asyncio.Future) -> bool:
    """A zero-copy send whose buffers libzmq no longer reads."""
    return fut.done() and (fut.cancelled() or fut.exception() is not None or fut.result().done)
