"""KV-cache blocks and the intrusive free queue that orders them for reuse and eviction.

Blocks are created once; the queue threads its links through them, so a touch (taking a
free block out of the middle) is O(1). Invariant: a block is queued iff both its links are
set, and walking from the head visits exactly ``num_free_blocks`` blocks (the tail walk the
same, reversed). The head is the next block handed out (evicted if cached).
:class:`LayeredFreeQueue` keeps two such queues: decode-generated blocks go before prefill ones.

See docs/architecture.md#worker-kv-cache.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from kvmesh.quota import DEFAULT_TENANT

Extra = tuple[tuple[Any, ...], ...] | None


class BlockContent:
    """What a cached block's KV was computed from: its own tokens and extra keys, and (by
    reference) the content of the block before it in the chain.

    Contents form a persistent trie of real token ids, independent of hashes: two contents
    are equal only if their whole prefixes are equal token for token, so a hash collision can
    never make a lookup accept a block computed from other tokens. Equal contents are shared
    (interned) by the pool whenever it can, so comparisons are usually a single ``is`` check.
    """

    __slots__ = ("parent", "token_ids", "extra_keys")

    def __init__(self, parent: BlockContent | None, token_ids: tuple[int, ...],
                 extra_keys: Extra) -> None:
        self.parent = parent
        self.token_ids = token_ids
        self.extra_keys = extra_keys

    def same_as(self, other: BlockContent | None) -> bool:
        """Whether ``other`` describes the same prefix; iterative, stops at a shared node."""
        a: BlockContent | None = self
        b = other
        walked: list[BlockContent] = []
        while a is not b:
            if a is None or b is None:
                return False
            if a.token_ids != b.token_ids or a.extra_keys != b.extra_keys:
                return False
            walked.append(b)
            a, b = a.parent, b.parent
        x = self
        for node in walked:  # equal prefixes: share one, so the next comparison is ``is``
            node.parent = x.parent
            x = x.parent
        return True

    def extends(self, parent: BlockContent | None, token_ids: Iterable[int],
                extra_keys: Extra) -> bool:
        """Whether this content is ``parent`` followed by ``token_ids`` / ``extra_keys``."""
        if self.extra_keys != extra_keys or self.token_ids != tuple(token_ids):
            return False
        return self.parent is parent or (
            self.parent is not None and self.parent.same_as(parent))


class KVCacheBlock:
    """One block of the paged KV tensor.

    ``block_hash`` and ``content`` are set together when the block becomes full and is
    cached, and cleared together when it is evicted or the cache is reset. ``ref_cnt`` is the
    number of running requests whose block table holds this block; a block with
    ``ref_cnt == 0`` is in the free queue (it may still be cached, and then it can be hit).
    """

    __slots__ = ("block_id", "block_hash", "ref_cnt", "prev_free", "next_free", "content",
                 "parent_hash", "decoded", "layer", "owner", "prev_owned", "next_owned",
                 "uncached", "cached_step")

    def __init__(self, block_id: int, block_hash: bytes | None = None, ref_cnt: int = 0,
                 prev_free: KVCacheBlock | None = None, next_free: KVCacheBlock | None = None,
                 content: BlockContent | None = None) -> None:
        self.block_id = block_id
        self.block_hash = block_hash
        self.ref_cnt = ref_cnt
        self.prev_free = prev_free
        self.next_free = next_free
        self.content = content
        self.parent_hash: bytes | None = None  # the chain's previous hash (None at block 0)
        # Eviction class under ``eviction="layered"`` (ignored otherwise): set by the manager
        # when the block is cached or hit, read only while the block is cached.
        self.decoded = False
        self.layer = 0  # which queue of a LayeredFreeQueue the block is linked into
        # The tenant charged for the block while it is cached (set with its hash; see
        # tenants.py), and its links in that tenant's free list (quota_queue.py, quotas on).
        self.owner = DEFAULT_TENANT
        self.prev_owned: KVCacheBlock | None = None
        self.next_owned: KVCacheBlock | None = None
        # How many times the block's hash was dropped: bumped before the block can be
        # allocated (and written) again, so a reader off the engine thread that sees the same
        # count before and after copying the block copied cached KV (worker.engine.peer_read).
        self.uncached = 0
        self.cached_step = 0  # the pool's step_no when it was cached (written once that
        #                       step is: BlockPool.written_through)

    @property
    def token_ids(self) -> tuple[int, ...] | None:
        """The token ids this block was cached with (``None`` while it is not cached)."""
        return None if self.content is None else self.content.token_ids

    @property
    def is_free(self) -> bool:
        """Whether the block is linked into a free queue."""
        return self.prev_free is not None and self.next_free is not None

    def __repr__(self) -> str:
        h = self.block_hash.hex()[:8] if self.block_hash is not None else None
        return f"KVCacheBlock(id={self.block_id}, ref={self.ref_cnt}, hash={h})"


class FreeBlockQueue:
    """Doubly-linked list of free blocks with O(1) popleft, append, appendleft and remove.

    Built once over all blocks of a pool, in block-id order. The links live in the blocks;
    the queue only owns two sentinels and a count.
    """

    def __init__(self, blocks: Iterable[KVCacheBlock]) -> None:
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        prev = self._head
        n = 0
        for block in blocks:
            prev.next_free = block
            block.prev_free = prev
            prev = block
            n += 1
        prev.next_free = self._tail
        self._tail.prev_free = prev
        self.num_free_blocks = n

    def __len__(self) -> int:
        return self.num_free_blocks

    def __iter__(self) -> Iterator[KVCacheBlock]:
        """Blocks from head (next to be handed out) to tail."""
        node = self._head.next_free
        while node is not self._tail:
            assert node is not None
            yield node
            node = node.next_free

    def popleft(self) -> KVCacheBlock:
        """Remove and return the head block. Raises ``ValueError`` when empty."""
        block = self._head.next_free
        if block is self._tail or block is None:
            raise ValueError("no free blocks")
        self.remove(block)
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Remove and return the first ``n`` blocks; all or nothing."""
        if n > self.num_free_blocks:
            raise ValueError(f"asked for {n} blocks, {self.num_free_blocks} free")
        return [self.popleft() for _ in range(n)]

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink ``block`` from wherever it is in the queue (O(1))."""
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        """Put ``block`` at the tail: handed out (and evicted) last."""
        self._link(block, self._tail.prev_free, self._tail)

    def appendleft(self, block: KVCacheBlock) -> None:
        """Put ``block`` at the head: handed out next."""
        self._link(block, self._head, self._head.next_free)

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Append ``blocks`` to the tail in the given order."""
        for block in blocks:
            self.append(block)

    def _link(self, block: KVCacheBlock, prev: KVCacheBlock | None,
              nxt: KVCacheBlock | None) -> None:
        if block.prev_free is not None or block.next_free is not None:
            raise ValueError(f"block {block.block_id} is already in the free queue")
        assert prev is not None and nxt is not None
        block.prev_free, block.next_free = prev, nxt
        prev.next_free = block
        nxt.prev_free = block
        self.num_free_blocks += 1

    def check(self) -> None:
        """Assert that the links are consistent both ways (O(n); for tests)."""
        forward = list(self)
        backward = []
        node = self._tail.prev_free
        while node is not self._head:
            assert node is not None, "broken backward link"
            backward.append(node)
            node = node.prev_free
        assert forward == backward[::-1], "forward and backward walks differ"
        assert len(forward) == self.num_free_blocks, "count differs from the walk"
        for block in forward:
            assert block.prev_free is not None and block.prev_free.next_free is block
            assert block.next_free is not None and block.next_free.prev_free is block


class LayeredFreeQueue:
    """A :class:`FreeBlockQueue` in two classes: ``first`` (blocks without a hash, and cached
    blocks with ``decoded`` set) is handed out entirely before ``second`` (cached prefill
    blocks). Same interface and O(1) operations as :class:`FreeBlockQueue`; iteration is
    ``first`` then ``second``, the overall hand-out order.

    - ``append`` puts a block at the tail of its class: ``first`` when it has no hash or is
      ``decoded``, else ``second``. ``appendleft`` (unhashed blocks) puts it at the head of
      ``first``, so blocks holding nothing go before any cached block, as in the plain queue.
    - The class a block was linked into is kept in ``block.layer``, so ``remove`` stays O(1)
      even when the block's hash or ``decoded`` changed while it was free (``uncache``).
    """

    def __init__(self, blocks: Iterable[KVCacheBlock]) -> None:
        blocks = list(blocks)
        for block in blocks:
            block.layer = 0
        self._layers = (FreeBlockQueue(blocks), FreeBlockQueue(()))

    @property
    def num_free_blocks(self) -> int:
        return self._layers[0].num_free_blocks + self._layers[1].num_free_blocks

    def __len__(self) -> int:
        return self.num_free_blocks

    def __iter__(self) -> Iterator[KVCacheBlock]:
        yield from self._layers[0]
        yield from self._layers[1]

    def layer(self, index: int) -> FreeBlockQueue:
        """One class: 0 is handed out first (for tests and stats)."""
        return self._layers[index]

    def popleft(self) -> KVCacheBlock:
        """Remove and return the next block to hand out. Raises ``ValueError`` when empty."""
        first = self._layers[0]
        return (first if first.num_free_blocks else self._layers[1]).popleft()

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Remove and return the next ``n`` blocks; all or nothing."""
        if n > self.num_free_blocks:
            raise ValueError(f"asked for {n} blocks, {self.num_free_blocks} free")
        return [self.popleft() for _ in range(n)]

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink ``block`` from its class (O(1))."""
        self._layers[block.layer].remove(block)

    def append(self, block: KVCacheBlock) -> None:
        """Put ``block`` at the tail of its class."""
        index = 0 if block.block_hash is None or block.decoded else 1
        self._layers[index].append(block)
        block.layer = index

    def appendleft(self, block: KVCacheBlock) -> None:
        """Put ``block`` at the head of the first class: handed out next."""
        self._layers[0].appendleft(block)
        block.layer = 0

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Append ``blocks``, each to the tail of its class, in the given order."""
        for block in blocks:
            self.append(block)

    def check(self) -> None:
        """Assert both classes' links and each block's ``layer`` (O(n); for tests)."""
        for index, queue in enumerate(self._layers):
            queue.check()
            for block in queue:
                assert block.layer == index, f"block {block.block_id} in the wrong class"
