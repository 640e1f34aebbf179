"""Pool events: how a worker's block pool tells the metadata service what it holds.

They describe the SET of hashes a pool holds per tier, applied in ``seq`` order (per pool,
from 1, no gaps: a gap means a lost event, answered by a snapshot). ``PoolRemoved`` is emitted
only when the LAST block holding a hash goes; a block moving down a tier is stored below
before it is removed above, so it is never held nowhere.

See docs/architecture.md#event-forms-and-wire-formats.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class PoolStored:
    seq: int
    block_hashes: list[bytes]
    parent_hash: bytes | None
    token_ids: list[int]  # the tokens of all stored blocks, in order
    tier: str


@dataclass(frozen=True, slots=True)
class PoolRemoved:
    seq: int
    block_hashes: list[bytes]
    tier: str


@dataclass(frozen=True, slots=True)
class PoolCleared:
    seq: int


PoolEvent = PoolStored | PoolRemoved | PoolCleared


@dataclass(frozen=True, slots=True)
class CacheSnapshot:
    """Every hash a worker holds, per tier, as of event ``seq`` (events up to ``seq`` are
    reflected).

    ``tier`` is the device pool's tier; ``tiers[i]`` the tier holding ``block_hashes[i]``. A
    hash held by several tiers appears once per tier.

    After sending a snapshot, a worker drops its pending events with ``seq <= snapshot.seq``.
    ``parents`` lets the receiver rebuild the chains. A block whose ancestor was evicted
    (possible: eviction follows LRU, not chain order) can never be reached by a lookup from
    block 0, here or in the index, so a receiver may drop it.
    """

    seq: int
    tier: str
    block_hashes: list[bytes]
    parents: list[bytes | None]  # parents[i]: the hash before block_hashes[i] (None: block 0)
    tiers: list[str] = field(default_factory=list)  # tiers[i]: the tier of block_hashes[i]

    def by_tier(self) -> dict[str, tuple[list[bytes], list[bytes | None]]]:
        """The (hashes, parents) of each tier, tiers in order of first appearance (an empty
        ``tiers`` means every hash is in ``tier``)."""
        if not self.tiers:
            return {self.tier: (list(self.block_hashes), list(self.parents))}
        out: dict[str, tuple[list[bytes], list[bytes | None]]] = {}
        for h, parent, tier in zip(self.block_hashes, self.parents, self.tiers, strict=True):
            hashes, parents = out.setdefault(tier, ([], []))
            hashes.append(h)
            parents.append(parent)
        return out
