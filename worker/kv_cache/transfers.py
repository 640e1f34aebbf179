"""Copy orders between tiers: what the KV cache manager decided, for the data plane to do.

The manager moves hashes between tiers in its books at once; the bytes follow when the engine
runs these orders, oldest first, once per step after scheduling and before the forward. Orders
must run in the order given (an ``Offload`` reads its device block before anything overwrites
it, the step's forward included, and fills its slot before anything reads the slot; a
``Spill`` precedes the offload reusing its slot). A copy the data plane could not make comes
back as a :class:`Lost`, and the manager forgets its entry.

See docs/architecture.md#worker-kv-cache.
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
