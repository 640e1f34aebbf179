"""Quota-first eviction in the device pool: per-tenant free lists beside the free queue.

While quotas are in force, :class:`QuotaQueue` keeps each tenant's free cached blocks in
intrusive doubly-linked lists (``prev_owned`` / ``next_owned``, a second link pair in
:class:`~.block.KVCacheBlock`), one per eviction class of the free queue, each in the free
queue's own order. Invariant: a block is in its owner's list (of class ``block.layer``) iff
it is in the free queue and holds a hash; so a tenant's list head is its least recently used
free cached block (under ``layered``: its decode-generated ones first). The pool keeps the
lists in step at each transition (free, touch, refresh, drop of a hash); all O(1).

:meth:`QuotaQueue.pop` decides the next block to hand out:

1. a free block holding no hash (evicts nothing; these form the free queue's head);
2. when the allocating tenant is at or over its quota (counting the blocks this allocation
   already got: it will cache them): its own least recently used free cached block (its
   quota steers eviction to itself, it never refuses an allocation);
3. else the least recently used free cached block of the tenant over quota by the most
   blocks (ties: the smaller name), skipping over-quota tenants with no free block;
4. else the free queue's head: the ordinary order (LRU, or layered).

Referenced blocks (running requests, onboard holds, pins) are not free, so never taken.
Cost per block: O(1) plus O(#tenants over quota). Without quotas the pool has no
``QuotaQueue`` at all and hands out exactly as vLLM's.

See docs/architecture.md#per-tenant-quotas-the-pool.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

from .block import FreeBlockQueue, KVCacheBlock, LayeredFreeQueue
from .tenants import TierLedger


class _Owned:
    """One tenant's free cached blocks of one eviction class, oldest first."""

    __slots__ = ("head", "tail")

    def __init__(self) -> None:
        self.head = KVCacheBlock(-1)
        self.tail = KVCacheBlock(-1)
        self.head.next_owned = self.tail
        self.tail.prev_owned = self.head

    def first(self) -> KVCacheBlock | None:
        block = self.head.next_owned
        return None if block is self.tail else block

    def __iter__(self) -> Iterator[KVCacheBlock]:
        node = self.head.next_owned
        while node is not self.tail:
            assert node is not None
            yield node
            node = node.next_owned


class QuotaQueue:
    """The per-tenant free lists of one pool's ``free_queue`` and the quota-first choice."""

    def __init__(self, free_queue: FreeBlockQueue | LayeredFreeQueue,
                 ledger: TierLedger) -> None:
        self.free_queue = free_queue
        self.ledger = ledger
        self._lists: dict[str, tuple[_Owned, _Owned]] = {}  # tenant -> its lists per class
        for block in free_queue:  # in hand-out order: each list ends in the queue's order
            if block.block_hash is not None:
                self.append(block)

    def _of(self, tenant: str) -> tuple[_Owned, _Owned]:
        lists = self._lists.get(tenant)
        if lists is None:
            lists = self._lists[tenant] = (_Owned(), _Owned())
        return lists

    def append(self, block: KVCacheBlock) -> None:
        """``block`` (cached) was just appended to the free queue: the tail of its list."""
        tail = self._of(block.owner)[block.layer].tail
        prev = tail.prev_owned
        assert prev is not None
        block.prev_owned, block.next_owned = prev, tail
        prev.next_owned = block
        tail.prev_owned = block

    def remove(self, block: KVCacheBlock) -> None:
        """``block`` leaves the free queue or loses its hash: out of its list."""
        prev, nxt = block.prev_owned, block.next_owned
        assert prev is not None and nxt is not None, f"block {block.block_id} not listed"
        prev.next_owned = nxt
        nxt.prev_owned = prev
        block.prev_owned = block.next_owned = None

    def first(self, tenant: str) -> KVCacheBlock | None:
        """``tenant``'s next free cached block in the free queue's order; ``None``: none."""
        lists = self._lists.get(tenant)
        if lists is None:
            return None
        return lists[0].first() or lists[1].first()

    def listed(self, tenant: str) -> Iterable[KVCacheBlock]:
        """``tenant``'s free cached blocks in order (O(n); for tests)."""
        lists = self._lists.get(tenant)
        return () if lists is None else (*lists[0], *lists[1])

    def victim(self, tenant: str | None, pending: int = 0) -> KVCacheBlock | None:
        """The cached block quotas say to evict next for ``tenant``, which already got
        ``pending`` blocks in this allocation (rules 2 and 3 of the module); ``None``: the
        ordinary order decides."""
        ledger = self.ledger
        if tenant is not None and ledger.at_limit(tenant, pending):
            own = self.first(tenant)
            if own is not None:
                return own
        best: tuple[int, str] | None = None
        found: KVCacheBlock | None = None
        for name in ledger.over:
            block = self.first(name)
            if block is None:
                continue
            key = (-ledger.excess(name), name)
            if best is None or key < best:
                best, found = key, block
        return found

    def pop(self, tenant: str | None, num_free_empty: int, pending: int = 0) -> KVCacheBlock:
        """Take the next block to hand out from the free queue (see the module), for an
        allocation of ``tenant`` (``None``: nobody's own blocks go first) that already got
        ``pending`` blocks, when the pool has ``num_free_empty`` free blocks holding no
        hash. The caller then evicts its hash, which takes it out of its list.
        ``ValueError`` when the queue is empty."""
        if not num_free_empty:
            block = self.victim(tenant, pending)
            if block is not None:
                self.free_queue.remove(block)
                return block
        return self.free_queue.popleft()
