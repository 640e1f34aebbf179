"""Frames of the peer-KV data plane: the head every message carries, and how it is checked.

A pull moves ``count`` blocks of ``block_bytes`` each, in frames of whole blocks (about
``frame_bytes`` each). Every message starts with a fixed head::

    magic "KV" | kind (u8) | offer key (16 bytes) | index (u32) | first (u32) | count (u32)
    | extra (u64)

``index`` numbers the frames of one pull from 0; ``first`` is the first block the frame
carries and ``count`` how many. ``extra`` is the block size in a claim and the credit in a
credit message. The receiver accepts a frame only if its key is the one it claimed, its
index is the next one, its first block is the next block and its payload is exactly
``count * block_bytes``: a frame out of order, of the wrong size or for another offer ends
the pull with :class:`TransferError`, and nothing of that frame reaches the sink.

See docs/architecture.md#peer-kv-transfer-the-data-plane.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

HEAD = struct.Struct("<2sB16sIIIQ")
MAGIC = b"KV"
KEY_BYTES = 16
DEFAULT_FRAME_BYTES = 1 << 20
MAX_BLOCK_BYTES = 1 << 30

CLAIM, DATA, ERROR, CREDIT, SEGMENT = 1, 2, 3, 4, 5
# what a source may say in an ERROR; anything else reads "refused" (labels stay a known set)
SOURCE_REASONS = frozenset({"refused", "expired", "mismatch", "malformed"})


class TransferError(Exception):
    """A pull that did not deliver every block. ``reason`` is a short metric label
    ("timeout", "closed", "unreachable", "truncated", "oversized", "out_of_order",
    "malformed", "refused", "expired", "mismatch"); ``landed`` is how many whole blocks
    reached the sink before the failure (blocks ``0 .. landed-1``, in order)."""

    def __init__(self, reason: str, landed: int = 0, message: str = "") -> None:
        super().__init__(message or f"peer KV transfer failed: {reason} after {landed} blocks")
        self.reason = reason
        self.landed = landed


@dataclass(frozen=True, slots=True)
class Head:
    kind: int
    key: bytes
    index: int = 0
    first: int = 0
    count: int = 0
    extra: int = 0

    def pack(self) -> bytes:
        return HEAD.pack(MAGIC, self.kind, self.key, self.index, self.first, self.count,
                         self.extra)


def unpack(buf: bytes | memoryview, landed: int = 0) -> Head:
    """The head at the start of ``buf``; TransferError("malformed") if there is none."""
    if len(buf) < HEAD.size:
        raise TransferError("malformed", landed, "a data-plane message shorter than its head")
    magic, kind, key, index, first, count, extra = HEAD.unpack_from(buf)
    if magic != MAGIC:
        raise TransferError("malformed", landed, "a data-plane message without the KV magic")
    return Head(kind, key, index, first, count, extra)


def blocks_per_frame(block_bytes: int, frame_bytes: int) -> int:
    """Whole blocks per frame: as many as fit in ``frame_bytes``, at least one."""
    return max(1, frame_bytes // max(1, block_bytes))


def frame_spans(count: int, per_frame: int) -> list[tuple[int, int]]:
    """``(first, n)`` of each frame of a pull of ``count`` blocks."""
    return [(f, min(per_frame, count - f)) for f in range(0, count, per_frame)]


class FrameCheck:
    """The receiver's side of the frame contract for one pull: feed it each frame's head and
    payload length; it raises TransferError for anything but the next frame, whole."""

    def __init__(self, key: bytes, block_bytes: int, count: int) -> None:
        self.key, self.block_bytes, self.count = key, block_bytes, count
        self.index = 0
        self.landed = 0

    def check(self, head: Head, payload_bytes: int | None) -> None:
        """Accept ``head`` (a DATA or SEGMENT head) whose payload is ``payload_bytes`` long
        (``None``: the payload lies elsewhere, in a segment checked by its reader)."""
        if head.kind == ERROR:
            raise TransferError("refused", self.landed, "the source refused the pull")
        if head.kind not in (DATA, SEGMENT) or head.key != self.key:
            raise TransferError("malformed", self.landed,
                                f"a frame of kind {head.kind} or for another offer")
        if head.index != self.index or head.first != self.landed:
            raise TransferError("out_of_order", self.landed,
                                f"frame {head.index} starting at block {head.first}, expected "
                                f"frame {self.index} starting at block {self.landed}")
        if head.count < 1 or head.first + head.count > self.count:
            raise TransferError("oversized", self.landed,
                                f"frame {head.index} claims blocks {head.first}.."
                                f"{head.first + head.count} of {self.count}")
        if payload_bytes is not None:
            want = head.count * self.block_bytes
            if payload_bytes < want:
                raise TransferError("truncated", self.landed,
                                    f"frame {head.index} carries {payload_bytes} of {want} bytes")
            if payload_bytes > want:
                raise TransferError("oversized", self.landed,
                                    f"frame {head.index} carries {payload_bytes} > {want} bytes")

    def advance(self, head: Head) -> None:
        self.index += 1
        self.landed += head.count

    @property
    def done(self) -> bool:
        return self.landed >= self.count
