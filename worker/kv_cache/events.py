"""KV events: how a block pool tells the metadata service what it holds.

Events describe the SET of block hashes a pool holds, per tier, and are meant to be applied
in ``seq`` order:

- ``BlockStored``: these hashes (consecutive blocks of one chain, ``parent_hash`` being the
  hash before the first of them, ``None`` at block 0) are now held. A hash the pool already
  held (a duplicate block) may be stored again; applying it twice is harmless.
- ``BlockRemoved``: these hashes are no longer held. Emitted only when the LAST block holding
  a hash is evicted, so a consumer keeping a plain set stays exact even with duplicates.
- ``AllBlocksCleared``: the pool dropped every cached hash.

``seq`` is per pool, starts at 1 and increases by exactly 1, so a consumer detects a lost
event as a gap and asks for a snapshot. ``tier`` is ``"gpu"`` or ``"cpu"``; the worker
server maps it to the protobuf ``Tier`` enum.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BlockStored:
    seq: int
    block_hashes: list[bytes]
    parent_hash: bytes | None
    token_ids: list[int]  # the tokens of all stored blocks, in order
    tier: str


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    seq: int
    block_hashes: list[bytes]
    tier: str


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    seq: int


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class CacheSnapshot:
    """Every hash a pool holds, as of event ``seq`` (events up to ``seq`` are reflected).

    After sending a snapshot, a worker drops its pending events with ``seq <= snapshot.seq``.
    ``parents`` lets the receiver rebuild the chains. A block whose ancestor was evicted
    (possible: eviction follows LRU, not chain order) can never be reached by a lookup from
    block 0, here or in the index, so a receiver may drop it.
    """

    seq: int
    tier: str
    block_hashes: list[bytes]
    parents: list[bytes | None]  # parents[i]: the hash before block_hashes[i] (None: block 0)
