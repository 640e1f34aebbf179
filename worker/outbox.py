"""The service link's outbox: the engine's KV events waiting to be published.

A :class:`kvmesh.link.backlog.Backlog` of :class:`~kvmesh.events.pool.PoolEvent` (the
contract, shared with the vLLM bridge, is there: bounded, leaving only by seq, the whole
backlog dropped for a snapshot past ``max_blocks``); this module only says what a worker's
event carries and how much of them it keeps.
"""
from __future__ import annotations

from kvmesh.events.pool import PoolEvent
from kvmesh.link.backlog import Backlog

MAX_BLOCKS = 65_536  # blocks' worth of events kept for the service (tens of seconds of work)


def hashes(ev: PoolEvent) -> int:
    """The block hashes an event carries (a cache reset carries none)."""
    return len(getattr(ev, "block_hashes", ()))


class Outbox(Backlog[PoolEvent]):
    """The worker's backlog: at most ``max_blocks`` in weight (1 + block hashes an event)."""

    def __init__(self, max_blocks: int = MAX_BLOCKS) -> None:
        super().__init__(hashes, max_blocks)
