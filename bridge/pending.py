"""Index events of one engine waiting to be published (``PublishEvents``), bounded.

The bridge-side twin of the worker's outbox (``worker/outbox.py``, which the bridge may not
import): events are ``index_pb2.KvEvent`` with consecutive seqs, they leave only by seq
(``drop_through``: published, or covered by a snapshot), and past ``max_blocks`` (an event
weighs 1 + its block hashes) the whole backlog is dropped and ``add`` says so, so the link
resyncs with a snapshot instead, which covers every dropped event.
"""
from __future__ import annotations

import collections
from collections.abc import Iterable

from kvmesh.v1 import index_pb2

MAX_BLOCKS = 262_144  # about a second of a busy fleet's events, a few MB


def hashes_of(ev: index_pb2.KvEvent) -> int:
    which = ev.WhichOneof("event")
    if which == "stored":
        return len(ev.stored.block_hashes)
    return len(ev.removed.block_hashes) if which == "removed" else 0


class Pending:
    """FIFO of index events, at most ``max_blocks`` in weight."""

    def __init__(self, max_blocks: int = MAX_BLOCKS) -> None:
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be >= 1, got {max_blocks}")
        self.max_blocks = max_blocks
        self.blocks = 0
        self._events: collections.deque[tuple[index_pb2.KvEvent, int]] = collections.deque()

    def __len__(self) -> int:
        return len(self._events)

    def add(self, events: Iterable[index_pb2.KvEvent], after: int = 0) -> bool:
        """Queue the events with ``seq > after``; ``False`` when the bound was hit (the
        backlog, these events included, is gone: resync)."""
        for ev in events:
            if ev.seq > after:
                n = hashes_of(ev)
                self._events.append((ev, n))
                self.blocks += 1 + n
        if self.blocks > self.max_blocks:
            self.clear()
            return False
        return True

    def clear(self) -> None:
        self._events.clear()
        self.blocks = 0

    def drop_through(self, seq: int) -> None:
        """Forget the events with ``seq <= seq``."""
        events = self._events
        while events and events[0][0].seq <= seq:
            self.blocks -= 1 + events.popleft()[1]

    def batch(self, max_events: int, max_hashes: int) -> list[index_pb2.KvEvent]:
        """The oldest events, at most ``max_events`` and ``max_hashes`` block hashes in all,
        but at least one when any is queued (an event is indivisible)."""
        out: list[index_pb2.KvEvent] = []
        hashes = 0
        for ev, n in self._events:
            if out and (len(out) >= max_events or hashes + n > max_hashes):
                break
            out.append(ev)
            hashes += n
        return out
