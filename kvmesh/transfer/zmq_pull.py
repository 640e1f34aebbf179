"""The receiver side of the zmq and shm planes (protocol in :mod:`kvmesh.transfer.zmq_serve`),
over a shared connection to the source (:mod:`kvmesh.transfer.zmq_link`).

See docs/architecture.md#peer-kv-transfer-the-data-plane.
"""
from __future__ import annotations

import asyncio
import contextlib
import mmap
from collections.abc import Callable

from kvmesh.transfer import shm_segment, zmq_link
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
from kvmesh.transfer.zmq_serve import CANCEL, OPEN

WINDOW = 64  # frames the receiver lets the source send ahead; the source caps it

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
            size = min(head.extra, self.check.count * self.bb)  # a ring, or the whole pull
            self.segment = shm_segment.open_for_read(path, size, self.check.landed)
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
        self.check.check(head, None)
        bb, at = self.bb, head.extra
        if at % bb or at + head.count * bb > len(self.segment):
            raise TransferError("oversized", self.check.landed, f"frame {head.index} lies at "
                                f"{at}, outside the {len(self.segment)}-byte segment")
        view = memoryview(self.segment)
        for j in range(head.count):
            self.sink(head.first + j, view[at + j * bb:at + (j + 1) * bb])
        self.check.advance(head)

    def close(self) -> None:
        if self.segment is not None:
            with contextlib.suppress(BufferError):  # a sink kept a view: the GC unmaps it
                self.segment.close()
            self.segment = None


async def pull(ep: Endpoint, block_bytes: int, count: int, sink: Sink, timeout_s: float) -> int:
    """Pull over zmq or shm; the contract is :func:`kvmesh.transfer.transports.pull`'s."""
    rx = _Receiver(ep, block_bytes, count, sink)
    conn = zmq_link.link(ep.address, ep.server_key)
    inbox = conn.open(ep.key)
    try:
        async with asyncio.timeout(timeout_s):
            conn.send([Head(CLAIM, ep.key, WINDOW, 0, count, block_bytes).pack(),
                       ep.transport.encode()])
            credit = Head(CREDIT, ep.key, extra=1).pack()
            while not rx.check.done:
                msg = await inbox.get()
                if isinstance(msg, str):
                    raise TransferError(msg, rx.check.landed, f"the connection to the source "
                                        f"at {ep.address} ended: {msg}")
                before = rx.check.index
                rx.on_message(msg)
                if rx.check.index > before:
                    conn.send([credit])
        return count
    except TimeoutError:
        raise TransferError("timeout", rx.check.landed,
                            f"the pull did not finish within {timeout_s} s") from None
    finally:
        if not rx.check.done:
            conn.send([Head(CANCEL, ep.key).pack()])  # the source stops and releases the offer
        conn.release(ep.key)
        rx.close()
