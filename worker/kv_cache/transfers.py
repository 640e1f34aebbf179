"""Copy orders between tiers: what the KV cache manager decided, for the data plane to do.

The manager moves block hashes between tiers in its books at once; the bytes follow when the
engine executes these orders (``KVCacheManager.take_transfers``, oldest first, once per step
after scheduling and before the forward). Orders must run in the order given:

- :class:`Offload`: device block -> CPU slot. Must complete before the forward of the step in
  which it was ordered (that step may reuse the device block).
- :class:`Spill`: CPU slot -> the disk file of ``block_hash``. Always ordered before the
  ``Offload`` that reuses the slot: the slot's bytes are copied out before the offload
  overwrites them (the file itself may be written later).
- :class:`Onboard`: lower tier -> device blocks, for one request, asynchronous; the engine
  reports the end with ``KVCacheManager.finish_onboard``. The sources cannot be evicted and
  the destinations are not handed out until then.
- :class:`Drop`: the disk tier forgot ``block_hash`` and no ordered copy reads its file any
  more: delete the file (a missing file is fine).

The other way, the data plane reports each copy it could not make as a :class:`Lost`
(``KVCacheManager.copies_lost``): an ``Offload`` whose slot was not written, a ``Spill``
whose file was not written (refused, or its background write failed). The manager then
forgets the entry that copy was to fill (``PoolRemoved(<tier>)``), so nothing announces,
spills or onboards a block whose bytes do not exist.
"""
from __future__ import annotations

from dataclasses import dataclass

from .block import Extra


@dataclass(frozen=True, slots=True)
class Offload:
    block_id: int     # the device block being evicted
    slot: int         # the CPU slot it goes to
    block_hash: bytes


@dataclass(frozen=True, slots=True)
class Spill:
    cpu_slot: int     # the CPU slot whose bytes go to disk
    block_hash: bytes
    parent_hash: bytes | None  # None: block 0 of its chain
    token_ids: tuple[int, ...]
    extra_keys: Extra


# One copy of an onboard: (tier, source, device block id); the source is a CPU slot (int) for
# tier "cpu" and the block hash (its file) for tier "disk".
Copy = tuple[str, int | bytes, int]


@dataclass(frozen=True, slots=True)
class Onboard:
    request_id: str
    copies: tuple[Copy, ...]  # in chain order


@dataclass(frozen=True, slots=True)
class Drop:
    block_hash: bytes  # the disk file to delete


Transfer = Offload | Spill | Onboard | Drop


@dataclass(frozen=True, slots=True)
class Lost:
    """A copy that did not happen: ``tier`` "cpu" for an ``Offload`` into ``slot``, "disk"
    for a ``Spill`` of ``block_hash`` (``slot`` None: the disk tier has no slots)."""

    tier: str
    block_hash: bytes
    slot: int | None = None
