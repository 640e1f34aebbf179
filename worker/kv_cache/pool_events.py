"""The KV event stream of one block pool: one seq stream for every tier, bounded when unread.

Events are numbered from 1 without gaps; the lower tiers emit theirs through the same stream
(``emit_stored`` / ``emit_removed``), so a reader replays one ordered history. Unread events
are bounded (``max_pending_blocks``): past it the backlog is dropped and counted, and the
reader resyncs from the pool's snapshot. :class:`PoolEvents` is the part of
:class:`~.block_pool.BlockPool` that owns them.

See docs/architecture.md#worker-kv-cache.
"""
from __future__ import annotations

from kvmesh.events.pool import PoolEvent, PoolRemoved, PoolStored

# Bound of the unread event backlog, in blocks (an event weighs 1 + its block hashes, and its
# tokens are proportional to those): with nobody reading events (no service link, or an
# ``Engine`` used directly) they would otherwise grow with traffic forever. A reader taking
# events every step stays far below it (a step touches at most a few thousand blocks).
MAX_PENDING_BLOCKS = 32_768


class PoolEvents:
    """A pool's events since the reader's last :meth:`take_events`, and the seq counter."""

    def __init__(self) -> None:
        self._events: list[PoolEvent] = []
        self._seq = 0
        self.max_pending_blocks = MAX_PENDING_BLOCKS
        self._pending_blocks = 0
        self.events_dropped = 0  # events discarded unread because the backlog overflowed

    @property
    def last_seq(self) -> int:
        """Sequence number of the last event emitted (0 before the first)."""
        return self._seq

    def _emit(self, event: PoolEvent) -> None:
        """Queue ``event``. Past ``max_pending_blocks`` the whole unread backlog is dropped
        (counted in :attr:`events_dropped`); seqs still advance, so a reader sees the loss
        as a gap and resyncs from the pool's snapshot, which covers every seq up to its own."""
        assert event.seq == self._seq + 1
        self._seq = event.seq
        self._events.append(event)
        self._pending_blocks += 1 + len(getattr(event, "block_hashes", ()))
        if self._pending_blocks > self.max_pending_blocks:
            self.events_dropped += len(self._events)
            self._events, self._pending_blocks = [], 0

    def emit_stored(self, block_hashes: list[bytes], parent_hash: bytes | None,
                    token_ids: list[int], tier: str) -> None:
        """Emit a ``PoolStored`` of another tier in this pool's one seq stream."""
        self._emit(PoolStored(self._seq + 1, block_hashes, parent_hash, token_ids, tier))

    def emit_removed(self, block_hashes: list[bytes], tier: str) -> None:
        """Emit a ``PoolRemoved`` of another tier in this pool's one seq stream."""
        self._emit(PoolRemoved(self._seq + 1, block_hashes, tier))

    def take_events(self) -> list[PoolEvent]:
        """Events emitted since the last call, oldest first. If :attr:`events_dropped`
        grew since the reader last looked, events before these were lost."""
        events, self._events, self._pending_blocks = self._events, [], 0
        return events
