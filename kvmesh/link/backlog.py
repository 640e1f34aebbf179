"""KV events of one worker waiting to be published to the index, and the batches they leave in.

Used by both link adapters (the worker's ``Outbox``, the bridge's ``Pending``). Bounded: past
``max_blocks`` the whole backlog is dropped and :meth:`Backlog.add` says so (the link then
resyncs with a snapshot). Ordered: events leave oldest first, only by sequence number
(:meth:`Backlog.drop_through`), so a batch in flight removes only what it carried. One
thread (the link's event loop): no locking.

See docs/architecture.md#the-index-link-kvmeshlink.
"""
from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Sequence
from typing import Generic, Protocol, TypeVar


class Sequenced(Protocol):
    """An event with the pool's sequence number (1, 2, 3, ... without gaps)."""

    @property
    def seq(self) -> int: ...


E = TypeVar("E", bound=Sequenced)


class Backlog(Generic[E]):
    """FIFO of events with consecutive seqs, at most ``max_blocks`` in weight.

    ``hashes(event)`` is how many block hashes an event carries; it is asked once per event,
    when the event is queued (the event must not change while queued).
    Invariant: ``blocks`` is the sum of ``1 + hashes(e)`` over the queued events and never
    exceeds ``max_blocks`` between calls.
    """

    def __init__(self, hashes: Callable[[E], int], max_blocks: int) -> None:
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be >= 1, got {max_blocks}")
        self.hashes = hashes
        self.max_blocks = max_blocks
        self.blocks = 0  # total weight of the queued events
        # each event with its hash count: asked once, as it may not be cheap (a proto oneof)
        self._events: collections.deque[tuple[E, int]] = collections.deque()

    def __len__(self) -> int:
        return len(self._events)

    def add(self, events: Iterable[E], after: int = 0) -> bool:
        """Queue the events with ``seq > after`` (the older ones are covered already).
        ``False`` when the bound was hit: the backlog (these events included) is gone and
        the caller must resync."""
        for ev in events:
            if ev.seq <= after:
                continue
            n = self.hashes(ev)
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
        """Forget the events with ``seq <= seq`` (published, or covered by a snapshot)."""
        events = self._events
        while events and events[0][0].seq <= seq:
            self.blocks -= 1 + events.popleft()[1]

    def batch(self, max_events: int, max_hashes: int) -> list[E]:
        """The oldest events, at most ``max_events`` of them and ``max_hashes`` block hashes
        in all, but always at least one event when any is queued (a single event is
        indivisible: seqs are per event). Nothing leaves: see :meth:`drop_through`."""
        out: list[E] = []
        hashes = 0
        for ev, n in self._events:
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
    Invariant: both limits stay >= 1.
    """

    def __init__(self, max_events: int, max_hashes: int) -> None:
        if max_events < 1 or max_hashes < 1:
            raise ValueError("batch_max and batch_max_hashes must be >= 1")
        self.configured = (max_events, max_hashes)
        self.events, self.hashes = self.configured

    def reset(self) -> None:
        self.events, self.hashes = self.configured

    def halve(self, batch: Sequence[E], hashes: Callable[[E], int]) -> bool:
        """Limits below the refused ``batch``'s size (``hashes(e)``: an event's block
        hashes); False when ``batch`` is one event (indivisible: nothing smaller to try)."""
        if len(batch) <= 1:
            return False
        self.events = max(1, len(batch) // 2)
        self.hashes = max(1, sum(hashes(e) for e in batch) // 2)
        return True
