"""The receiver side of the zmq and shm planes (protocol in :mod:`kvmesh.transfer.zmq_serve`).

One DEALER per pull, with a socket monitor: a source that goes away mid-pull (its process
closed or killed: the TCP connection ends) is "closed" at once rather than a timeout, and a
source not listening at all is "unreachable" at once (the caller falls back to recompute
without waiting out its deadline).
"""
from __future__ import annotations

import asyncio
import contextlib
import mmap
from collections.abc import Callable

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from kvmesh.transfer import shm_segment
from kvmesh.transfer.endpoint import Endpoint
from kvmesh.transfer.frames import (
    CLAIM,
    CREDIT,
    ERROR,
    SOURCE_REASONS,
    FrameCheck,
    Head,
    TransferError,
    unpack,
)
from kvmesh.transfer.zmq_serve import OPEN

WINDOW = 64  # frames the receiver lets the source send ahead; the source caps it
_LINGER_MS = 1000
_GRACE_S = 0.02  # after a disconnect, frames already received still land
_EVENTS = zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED

Sink = Callable[[int, memoryview], None]


class _Receiver:
    def __init__(self, ep: Endpoint, block_bytes: int, count: int, sink: Sink) -> None:
        self.ep, self.bb, self.sink = ep, block_bytes, sink
        self.check = FrameCheck(ep.key, block_bytes, count)
        self.segment: mmap.mmap | None = None

    def on_message(self, parts: list) -> None:
        """Take one message from the source: pass its blocks to the sink or raise."""
        head = unpack(parts[0].buffer, self.check.landed)
        if head.kind == ERROR:
            said = bytes(parts[1].buffer[:32]).decode(errors="replace") if len(parts) > 1 else ""
            reason = said if said in SOURCE_REASONS else "refused"  # labels stay a known set
            raise TransferError(reason, self.check.landed,
                                f"the source refused the pull: {said!r}")
        if head.kind == OPEN:
            if self.ep.transport != "shm" or self.segment is not None or len(parts) != 2:
                raise TransferError("malformed", self.check.landed, "an unexpected OPEN")
            path = bytes(parts[1].buffer).decode(errors="replace")
            self.segment = shm_segment.open_for_read(path, self.check.count * self.bb,
                                                     self.check.landed)
            return
        if self.ep.transport == "shm":
            self._segment_frame(head, len(parts))
        else:
            self._data_frame(head, parts[1:])

    def _data_frame(self, head: Head, payload: list) -> None:
        sizes = [len(p.buffer) for p in payload]
        self.check.check(head, sum(sizes))
        bb, first = self.bb, head.first
        if len(payload) == 1:
            view = payload[0].buffer
            for j in range(head.count):
                self.sink(first + j, view[j * bb:(j + 1) * bb])
        elif len(payload) == head.count and all(s == bb for s in sizes):
            for j, part in enumerate(payload):
                self.sink(first + j, part.buffer)
        else:
            raise TransferError("malformed", self.check.landed,
                                f"frame {head.index}: {len(payload)} parts for {head.count} blocks")
        self.check.advance(head)

    def _segment_frame(self, head: Head, nparts: int) -> None:
        if self.segment is None or nparts != 1:
            raise TransferError("malformed", self.check.landed, "a segment frame before OPEN")
        self.check.check(head, None)  # bounds: first + count <= the pull's count = the map's
        bb = self.bb
        view = memoryview(self.segment)
        for j in range(head.first, head.first + head.count):
            self.sink(j, view[j * bb:(j + 1) * bb])
        self.check.advance(head)

    def close(self) -> None:
        if self.segment is not None:
            with contextlib.suppress(BufferError):  # a sink kept a view: the GC unmaps it
                self.segment.close()
            self.segment = None


async def pull(ep: Endpoint, block_bytes: int, count: int, sink: Sink, timeout_s: float) -> int:
    """Pull over zmq or shm; the contract is :func:`kvmesh.transfer.transports.pull`'s."""
    rx = _Receiver(ep, block_bytes, count, sink)
    sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.rcvhwm = 0
    mon = sock.get_monitor_socket(_EVENTS)
    pending: list[asyncio.Future] = []
    try:
        async with asyncio.timeout(timeout_s):
            sock.connect(f"tcp://{ep.address}")
            claim = Head(CLAIM, ep.key, WINDOW, 0, count, block_bytes).pack()
            await sock.send_multipart([claim, ep.transport.encode()])
            await _receive(sock, mon, rx, pending)
        sock.linger = _LINGER_MS  # the last credit still leaves: the source waits for it
        return count
    except TimeoutError:
        raise TransferError("timeout", rx.check.landed,
                            f"the pull did not finish within {timeout_s} s") from None
    finally:
        for fut in pending:
            fut.cancel()
        rx.close()
        sock.disable_monitor()
        mon.close(linger=0)
        sock.close()


async def _receive(sock: zmq.asyncio.Socket, mon: zmq.asyncio.Socket, rx: _Receiver,
                   pending: list[asyncio.Future]) -> None:
    credit = Head(CREDIT, rx.ep.key, extra=1).pack()
    recv, event = sock.recv_multipart(copy=False), mon.recv_multipart()
    pending[:] = [recv, event]
    connected = False
    while not rx.check.done:
        done, _ = await asyncio.wait((recv, event), return_when=asyncio.FIRST_COMPLETED)
        if recv in done:
            before = rx.check.index
            rx.on_message(recv.result())
            if rx.check.index > before:
                sock.send(credit)
            recv = sock.recv_multipart(copy=False)
            pending[0] = recv
            continue
        kind = parse_monitor_message(event.result())["event"]
        if kind == zmq.EVENT_CONNECTED:
            connected = True
        elif kind == zmq.EVENT_CONNECT_RETRIED and not connected:
            raise TransferError("unreachable", 0, f"nothing listens at {rx.ep.address}")
        elif kind == zmq.EVENT_DISCONNECTED:
            while not rx.check.done:  # what arrived before the connection ended still lands
                got, _ = await asyncio.wait((recv,), timeout=_GRACE_S)
                if not got:
                    break
                rx.on_message(recv.result())
                recv = sock.recv_multipart(copy=False)
                pending[0] = recv
            if not rx.check.done:
                raise TransferError("closed", rx.check.landed,
                                    "the source went away mid-transfer")
        event = mon.recv_multipart()
        pending[1] = event
