"""One lower tier of the KV cache (host memory or disk): an LRU of block hashes over slots.

A hash lives in at most one entry and an entry in one slot; the victim is the least recently
used entry nobody reads. An entry an in-flight copy reads is never evicted, and one that must
leave anyway keeps its slot until its last reader is done. Each entry keeps its block's
content (hits are verified token by token), eviction class and owner (the tenant charged for
it, ``ledger``); with quotas in force the victim is chosen by the pool's rules
(quota_queue.py) over a per-tenant LRU kept beside the tier's. Pure bookkeeping.

See docs/architecture.md#worker-kv-cache.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from kvmesh.quota import DEFAULT_TENANT

from .block import BlockContent, Extra
from .tenants import TierLedger


@dataclass(eq=False, slots=True)
class TierEntry:
    """One block held by a lower tier."""

    block_hash: bytes
    parent_hash: bytes | None  # the chain's previous hash (None: block 0)
    content: BlockContent
    slot: int
    readers: int = 0        # in-flight copies reading the slot
    dropped: bool = False   # left the tier while read: the slot frees at the last reader
    decoded: bool = False   # the device block's ``decoded`` (layered eviction class)
    owner: str = DEFAULT_TENANT  # the tenant charged for it


class LowerTier:
    """The LRU of one lower tier (``name`` is ``"cpu"`` or ``"disk"``).

    Counters (cumulative, for ``tier_stats``): ``stored`` entries added, ``evictions``
    entries dropped (not moved down), ``offloads`` entries moved down to the next tier,
    ``onboard_blocks`` blocks copied back to the device.
    """

    def __init__(self, name: str, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"a {name} tier needs at least 1 slot, got {num_slots}")
        self.name = name
        self.num_slots = num_slots
        self._entries: OrderedDict[bytes, TierEntry] = OrderedDict()  # LRU first
        # The same entries per owner, each in the tier's order (quota-first victims).
        self._owned: dict[str, OrderedDict[bytes, TierEntry]] = {}
        self.ledger = TierLedger(name, num_slots)
        self._free_slots = list(range(num_slots - 1, -1, -1))  # a stack: slot 0 first
        self._num_dropped_read = 0  # entries dropped while read: their slots are still busy
        self.stored = 0
        self.evictions = 0
        self.offloads = 0
        self.onboard_blocks = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self._entries

    def __iter__(self) -> Iterator[TierEntry]:
        """Entries from least to most recently used."""
        return iter(self._entries.values())

    @property
    def num_free_slots(self) -> int:
        return len(self._free_slots)

    def get(self, block_hash: bytes) -> TierEntry | None:
        return self._entries.get(block_hash)

    def lookup(self, block_hash: bytes, parent: BlockContent | None,
               token_ids: Sequence[int], extra_keys: Extra) -> TierEntry | None:
        """The entry of ``block_hash`` if its content is ``parent`` followed by
        ``token_ids`` / ``extra_keys``; ``None`` otherwise (a miss or a collision)."""
        entry = self._entries.get(block_hash)
        if entry is not None and entry.content.extends(parent, token_ids, extra_keys):
            return entry
        return None

    def touch(self, entry: TierEntry) -> None:
        """Make ``entry`` the most recently used."""
        self._entries.move_to_end(entry.block_hash)
        self._owned[entry.owner].move_to_end(entry.block_hash)

    def victim(self, tenant: str | None = None) -> TierEntry | None:
        """The entry to evict to store one of ``tenant``'s (``None``: anybody's): among the
        entries nobody reads, with quotas in force ``tenant``'s own least recently used if
        it is at its quota, else the least recently used of the tenant most over its quota
        (ties: the smaller name); otherwise, or when none of those is free to go, the least
        recently used. ``None`` if every entry is read."""
        ledger = self.ledger
        if ledger.limited:
            if tenant is not None and ledger.at_limit(tenant):
                own = self._unread(self._owned.get(tenant))
                if own is not None:
                    return own
            best: tuple[int, str] | None = None
            found: TierEntry | None = None
            for name in ledger.over:
                entry = self._unread(self._owned.get(name))
                key = (-ledger.excess(name), name)
                if entry is not None and (best is None or key < best):
                    best, found = key, entry
            if found is not None:
                return found
        return self._unread(self._entries)

    @staticmethod
    def _unread(entries: OrderedDict[bytes, TierEntry] | None) -> TierEntry | None:
        if not entries:
            return None
        return next((e for e in entries.values() if e.readers == 0), None)

    def evicted(self, entry: TierEntry) -> None:
        """Count ``entry`` as evicted (dropped, not moved down): for the tier and its owner."""
        self.evictions += 1
        self.ledger.evicted(entry.owner)

    def add(self, block_hash: bytes, parent_hash: bytes | None, content: BlockContent,
            decoded: bool = False, owner: str = DEFAULT_TENANT) -> TierEntry:
        """Store a hash not held yet, as the most recently used, in a free slot, charged to
        ``owner``. Raises ``ValueError`` when the hash is held or no slot is free (make
        room first)."""
        if block_hash in self._entries:
            raise ValueError(f"{self.name} tier already holds {block_hash.hex()[:8]}")
        if not self._free_slots:
            raise ValueError(f"{self.name} tier is full")
        entry = TierEntry(block_hash, parent_hash, content, self._free_slots.pop(),
                          decoded=decoded, owner=owner)
        self._entries[block_hash] = entry
        self._owned.setdefault(owner, OrderedDict())[block_hash] = entry
        self.ledger.charge(owner)
        self.stored += 1
        return entry

    def remove(self, entry: TierEntry) -> None:
        """Forget ``entry`` (it must be this tier's entry for its hash). Its slot is free
        at once, or when its last reader is done."""
        if self._entries.get(entry.block_hash) is not entry:
            raise ValueError(f"{self.name} tier does not hold this entry")
        del self._entries[entry.block_hash]
        del self._owned[entry.owner][entry.block_hash]
        self.ledger.uncharge(entry.owner)
        if entry.readers:
            entry.dropped = True
            self._num_dropped_read += 1
        else:
            self._free_slots.append(entry.slot)

    def read(self, entry: TierEntry) -> None:
        """A copy starts reading ``entry``: it cannot be evicted until :meth:`release`."""
        entry.readers += 1

    def release(self, entry: TierEntry) -> bool:
        """A copy reading ``entry`` is done. Returns whether that freed the slot of an entry
        that had left the tier (its last reader is gone)."""
        if entry.readers <= 0:
            raise ValueError(f"{self.name} entry released more often than read")
        entry.readers -= 1
        if entry.dropped and entry.readers == 0:
            self._num_dropped_read -= 1
            self._free_slots.append(entry.slot)
            return True
        return False

    def clear(self) -> list[TierEntry]:
        """Forget every entry (none may be read); return them."""
        if self._num_dropped_read or any(e.readers for e in self._entries.values()):
            raise ValueError(f"{self.name} tier has entries being read")
        entries = list(self._entries.values())
        self._entries.clear()
        self._owned.clear()
        self.ledger.clear()
        self._free_slots = list(range(self.num_slots - 1, -1, -1))
        return entries

