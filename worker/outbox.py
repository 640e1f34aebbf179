"""The service link's outbox: KV events taken from the engine, waiting to be published.

Bounded: while the service is unreachable (or slower than the engine) events pile up here,
each with its block hashes and tokens. Past ``max_blocks`` (an event weighs 1 + its block
hashes) the whole backlog is dropped and :meth:`add` says so: the link then resyncs with a
snapshot, which covers every dropped event, and carries on with the events after it.

Events leave only by sequence number (:meth:`drop_through`), never by count, so a batch
being published while the backlog is dropped and refilled removes only what it carried.
Used from one thread (the link's event loop).
"""
from __future__ import annotations

import collections
from collections.abc import Iterable

from worker.kv_cache import KVEvent

MAX_BLOCKS = 65_536  # blocks' worth of events kept for the service (tens of seconds of work)


def weight(ev: KVEvent) -> int:
    """What an event costs the outbox: 1 + its block hashes (its tokens are proportional)."""
    return 1 + len(getattr(ev, "block_hashes", ()))


class Outbox:
    """FIFO of events with consecutive seqs, at most ``max_blocks`` in weight."""

    def __init__(self, max_blocks: int = MAX_BLOCKS) -> None:
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be >= 1, got {max_blocks}")
        self.max_blocks = max_blocks
        self.blocks = 0  # total weight of the queued events
        self._events: collections.deque[KVEvent] = collections.deque()

    def __len__(self) -> int:
        return len(self._events)

    def add(self, events: Iterable[KVEvent], after: int = 0) -> bool:
        """Queue the events with ``seq > after``. ``False`` when the bound was hit: the
        backlog (these events included) is gone and the caller must resync."""
        for ev in events:
            if ev.seq <= after:
                continue
            self._events.append(ev)
            self.blocks += weight(ev)
        if self.blocks > self.max_blocks:
            self.clear()
            return False
        return True

    def clear(self) -> None:
        self._events.clear()
        self.blocks = 0

    def drop_through(self, seq: int) -> None:
        """Forget the events with ``seq <= seq`` (published, or covered by a snapshot)."""
        events = self._events
        while events and events[0].seq <= seq:
            self.blocks -= weight(events.popleft())

    def batch(self, max_events: int, max_hashes: int) -> list[KVEvent]:
        """The oldest events, at most ``max_events`` of them and ``max_hashes`` block hashes
        in all, but always at least one event when any is queued (a single event is
        indivisible: seqs are per event)."""
        out: list[KVEvent] = []
        hashes = 0
        for ev in self._events:
            n = len(getattr(ev, "block_hashes", ()))
            if out and (len(out) >= max_events or hashes + n > max_hashes):
                break
            out.append(ev)
            hashes += n
        return out


class BatchLimits:
    """How much one ``PublishEvents`` batch may carry.

    Starts at the configured limits (kept below the service's ``--max-batch-events`` /
    ``--max-batch-hashes`` defaults). A service configured lower refuses a batch as too
    large (RESOURCE_EXHAUSTED): :meth:`halve` learns a smaller limit from it, and
    :meth:`reset` (on every registration: maybe another service) starts over.
    """

    def __init__(self, max_events: int, max_hashes: int) -> None:
        if max_events < 1 or max_hashes < 1:
            raise ValueError("batch_max and batch_max_hashes must be >= 1")
        self.configured = (max_events, max_hashes)
        self.events, self.hashes = self.configured

    def reset(self) -> None:
        self.events, self.hashes = self.configured

    def halve(self, batch: list[KVEvent]) -> bool:
        """Limits below ``batch``'s size; False when ``batch`` is one event (indivisible)."""
        if len(batch) <= 1:
            return False
        self.events = max(1, len(batch) // 2)
        self.hashes = max(1, sum(len(getattr(e, "block_hashes", ())) for e in batch) // 2)
        return True
