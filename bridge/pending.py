"""Index events of one engine waiting to be published (``PublishEvents``), bounded.

A :class:`kvmesh.link.backlog.Backlog` of ``index_pb2.KvEvent`` (or the same events as
``kvmesh.events.wire.Wire``), the same one a kvmesh worker's
outbox is (the contract is there: consecutive seqs, leaving only by seq, the whole backlog
dropped for a snapshot past ``max_blocks``); this module only says what an index event
carries and how much of them the bridge keeps.
"""
from __future__ import annotations

from kvmesh.events.wire import Wire
from kvmesh.link.backlog import Backlog
from kvmesh.v1 import index_pb2

MAX_BLOCKS = 262_144  # about a second of a busy fleet's events, a few MB


def hashes_of(ev: index_pb2.KvEvent | Wire) -> int:
    """The block hashes an index event carries (a cache reset carries none)."""
    if type(ev) is Wire:
        return ev.hashes
    which = ev.WhichOneof("event")
    if which == "stored":
        return len(ev.stored.block_hashes)
    return len(ev.removed.block_hashes) if which == "removed" else 0


class Pending(Backlog[index_pb2.KvEvent | Wire]):
    """The bridge's backlog: at most ``max_blocks`` in weight (1 + block hashes an event)."""

    def __init__(self, max_blocks: int = MAX_BLOCKS) -> None:
        super().__init__(hashes_of, max_blocks)
