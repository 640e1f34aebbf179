"""The block pool: every KV block of one tier, the free queue, and the prefix-cache map.

vLLM v1's automatic prefix caching: all blocks exist from start-up; a block is referenced
(``ref_cnt > 0``, never in the free queue) or free (in it); ``cached`` maps a hash to the
blocks holding it (duplicates allowed) and is dropped lazily, on eviction or reset. Freed
blocks go to the tail (a request's in reverse), unhashed ones to the head. A hit is returned
only when its tokens match the caller's (a collision is a miss), and a failed step's blocks
are uncached so an unwritten block is never a hit. Each cached block is charged to a tenant
(``ledger``, tenants.py); with quotas in force the choice of the blocks to evict goes through
a :class:`~.quota_queue.QuotaQueue`, without them the pool is exactly vLLM's.

See docs/architecture.md#worker-kv-cache.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from kvmesh.contract import EVICTIONS
from kvmesh.contract import TIERS as ALL_TIERS
from kvmesh.events.pool import CacheSnapshot, PoolCleared, PoolRemoved, PoolStored
from kvmesh.quota import DEFAULT_TENANT, Quotas

from .block import BlockContent, Extra, FreeBlockQueue, KVCacheBlock, LayeredFreeQueue
from .pool_events import PoolEvents
from .quota_queue import QuotaQueue
from .tenants import TierLedger

TIERS = ALL_TIERS[:2]  # the tiers a pool can be (memory); disk blocks are files, not a pool
# Free-queue orders (EVICTIONS): "lru" is vLLM's; "layered" hands out decode-generated blocks
# before prefill-computed ones (see LayeredFreeQueue).


class Evicted(NamedTuple):
    """A hash whose last device block was just evicted, with what that block held (its
    eviction class included: a tier round trip must not change it)."""

    block_id: int
    block_hash: bytes
    parent_hash: bytes | None
    content: BlockContent
    decoded: bool = False
    owner: str = DEFAULT_TENANT  # the tenant charged for it: a lower tier keeps it


class BlockPool(PoolEvents):
    """All KV blocks of one tier and the map of which prefixes they hold (and the stream of
    their events: :class:`PoolEvents`)."""

    def __init__(self, num_blocks: int, enable_caching: bool = True, tier: str = "gpu",
                 eviction: str = "lru") -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if tier not in TIERS:
            raise ValueError(f"unknown tier {tier!r}; valid: {', '.join(TIERS)}")
        if eviction not in EVICTIONS:
            raise ValueError(f"unknown eviction {eviction!r}; valid: {', '.join(EVICTIONS)}")
        super().__init__()
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.tier = tier
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_queue: FreeBlockQueue | LayeredFreeQueue = (
            LayeredFreeQueue if eviction == "layered" else FreeBlockQueue)(self.blocks)
        self.cached: dict[bytes, dict[int, KVCacheBlock]] = {}
        self.num_cached_blocks = 0
        # Free blocks that hold a hash (cached, ref_cnt 0): the router's room check needs
        # the free blocks that hold none (num_free_empty_blocks); kept at every transition
        # (touch, free, pop, drop) so a heartbeat never walks the queue.
        self.num_free_cached = 0
        self.evictions = 0
        # Steps opened, and the last one whose KV is all written (KVCacheManager.step): a
        # block is cached when scheduled, before the step's forward writes it, so a reader
        # off the engine thread takes only blocks with cached_step <= written_through.
        self.step_no = 0
        self.written_through = 0
        # Called by get_new_blocks with the hashes no block holds any more, before their
        # PoolRemoved (the lower tiers offload them; events it emits come first).
        self.on_evict: Callable[[list[Evicted]], None] | None = None
        self.ledger = TierLedger(tier, num_blocks)  # who each cached block is charged to
        self.quota: QuotaQueue | None = None  # per-tenant free lists while quotas are set

    def set_quotas(self, quotas: Quotas) -> None:
        """Apply ``quotas`` (:mod:`kvmesh.quota`) from the next eviction on. Setting the
        first quota walks the free queue once to build the per-tenant lists; clearing the
        last drops them (the pool is vLLM's again)."""
        self.ledger.set_quotas(quotas)
        if quotas.empty:
            if self.quota is not None:
                for block in self.free_queue:
                    block.prev_owned = block.next_owned = None
            self.quota = None
        elif self.quota is None:
            self.quota = QuotaQueue(self.free_queue, self.ledger)

    # --- lookup -----------------------------------------------------------------------

    def get_cached_block(self, block_hash: bytes, token_ids: Sequence[int],
                         parent: KVCacheBlock | None = None,
                         extra_keys: Extra = None) -> KVCacheBlock | None:
        """A block holding ``block_hash`` whose content is exactly ``parent``'s prefix
        followed by ``token_ids`` (with ``extra_keys``); ``None`` on a miss.

        ``parent`` is the block already matched for the previous position of the chain
        (``None`` for block 0). Blocks holding the hash with other content (a collision)
        are skipped.
        """
        candidates = self.cached.get(block_hash)
        if not candidates:
            return None
        parent_content = None if parent is None else parent.content
        if parent is not None and parent_content is None:
            return None  # the parent is not cached: nothing can follow it
        tokens = tuple(token_ids)
        for block in candidates.values():
            content = block.content
            if content is not None and content.extends(parent_content, tokens, extra_keys):
                return block
        return None

    # --- caching ----------------------------------------------------------------------

    def cache_full_blocks(self, blocks: Sequence[KVCacheBlock], block_hashes: Sequence[bytes],
                          token_ids: Sequence[int], num_cached_blocks: int,
                          num_full_blocks: int, block_size: int,
                          extra_keys: Sequence[Extra] | None = None,
                          owner: str | Sequence[str] = DEFAULT_TENANT) -> None:
        """Cache ``blocks[num_cached_blocks:num_full_blocks]`` of one request.

        ``blocks`` is the request's block table, ``block_hashes`` / ``token_ids`` its chain
        and tokens (covering at least ``num_full_blocks`` blocks), ``extra_keys`` the extra
        keys of the newly cached blocks (``None``: none), ``owner`` the tenant charged for
        them (or one per new block). Blocks before ``num_cached_blocks`` must already be
        cached. Emits one ``PoolStored`` for the new blocks.
        """
        if not self.enable_caching or num_full_blocks <= num_cached_blocks:
            return
        if len(block_hashes) < num_full_blocks or len(token_ids) < num_full_blocks * block_size:
            raise ValueError("block hashes / tokens do not cover the blocks to cache")
        parent = blocks[num_cached_blocks - 1].content if num_cached_blocks else None
        if num_cached_blocks and parent is None:
            raise ValueError(f"block {num_cached_blocks - 1} of the chain is not cached")
        for block in blocks[num_cached_blocks:num_full_blocks]:
            if block.block_hash is not None:
                raise ValueError(f"block {block.block_id} is already cached")
        new_hashes: list[bytes] = []
        one_owner = isinstance(owner, str)
        for n, i in enumerate(range(num_cached_blocks, num_full_blocks)):
            block = blocks[i]
            block_hash = block_hashes[i]
            tokens = tuple(token_ids[i * block_size:(i + 1) * block_size])
            extra = None if extra_keys is None else extra_keys[n]
            holders = self.cached.setdefault(block_hash, {})
            content = next((b.content for b in holders.values() if b.content is not None
                            and b.content.extends(parent, tokens, extra)), None)
            if content is None:  # not a duplicate: a new node of the content trie
                content = BlockContent(parent, tokens, extra)
            block.cached_step = self.step_no  # before the hash: see written_through
            block.block_hash = block_hash
            block.parent_hash = block_hashes[i - 1] if i else None
            block.content = content
            if one_owner:
                block.owner = owner
            else:
                block.owner = owner[n]
                self.ledger.charge(block.owner)
            holders[block.block_id] = block
            self.num_cached_blocks += 1
            new_hashes.append(block_hash)
            parent = content
        if one_owner:
            self.ledger.charge(owner, len(new_hashes))  # type: ignore[arg-type]
        first = num_cached_blocks
        self._emit(PoolStored(
            self._seq + 1, new_hashes, block_hashes[first - 1] if first else None,
            list(token_ids[first * block_size:num_full_blocks * block_size]), self.tier))

    # --- allocation -------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free_blocks

    @property
    def num_free_empty_blocks(self) -> int:
        """Free blocks that hold no hash (taking one evicts nothing)."""
        return self.num_free_blocks - self.num_free_cached

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by running requests (0.0 to 1.0)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def get_new_blocks(self, num_blocks: int, tenant: str | None = None) -> list[KVCacheBlock]:
        """Hand out ``num_blocks`` blocks from the head of the free queue, each with
        ``ref_cnt == 1``, for an allocation of ``tenant`` (with quotas: see
        :meth:`QuotaQueue.pop` for which block goes first). A popped block that still holds
        a hash is evicted (its hash is dropped; ``PoolRemoved`` is emitted once no block
        holds that hash any more). Raises ``ValueError`` (changing nothing) when fewer
        blocks are free.
        """
        quota = self.quota
        if quota is None:
            blocks = self.free_queue.popleft_n(num_blocks)
        elif num_blocks > self.num_free_blocks:
            raise ValueError(f"asked for {num_blocks} blocks, {self.num_free_blocks} free")
        else:
            blocks = []
        removed: list[bytes] = []
        evicted: list[Evicted] = []
        for i in range(num_blocks):
            if quota is None:
                block = blocks[i]
            else:  # one at a time: each eviction changes who is over quota
                block = quota.pop(tenant, self.num_free_empty_blocks, i)
                blocks.append(block)
            if block.block_hash is not None:
                content, parent_hash = block.content, block.parent_hash
                gone = self._evict(block)
                if gone is not None:
                    removed.append(gone)
                    assert content is not None
                    evicted.append(Evicted(block.block_id, gone, parent_hash, content,
                                           block.decoded, block.owner))
            block.ref_cnt = 1
        if removed:
            if self.on_evict is not None:  # before PoolRemoved: never held nowhere
                self.on_evict(evicted)
            self._emit(PoolRemoved(self._seq + 1, removed, self.tier))
        return blocks

    def _evict(self, block: KVCacheBlock) -> bytes | None:
        """Drop ``block``'s hash as an eviction; return the hash if no other block holds it."""
        self.evictions += 1
        return self._drop_hash(block, evicted=True)

    def _drop_hash(self, block: KVCacheBlock, evicted: bool = False) -> bytes | None:
        """Drop ``block``'s hash (to free room if ``evicted``: counted for its owner);
        return the hash if no other block holds it."""
        block_hash = block.block_hash
        assert block_hash is not None
        holders = self.cached[block_hash]
        del holders[block.block_id]
        block.uncached += 1  # first: an off-thread reader must never miss a drop
        block.block_hash = None
        block.content = None
        self.num_cached_blocks -= 1
        self.ledger.uncharge(block.owner, evicted)
        if block.ref_cnt == 0:
            self.num_free_cached -= 1
            if self.quota is not None:
                self.quota.remove(block)
        if holders:
            return None
        del self.cached[block_hash]
        return block_hash

    def uncache_blocks(self, blocks: Iterable[KVCacheBlock]) -> list[bytes]:
        """Forget the hashes of ``blocks`` whose KV was never written (a failed step).

        Blocks without a hash are skipped. Each block keeps its references; a free one
        moves to the head of the free queue (it holds nothing reusable now). One
        ``PoolRemoved`` lists the hashes no block holds any more: a hash also held by
        another block (a duplicate computed earlier, so written) stays cached and is not
        reported, so the index's set stays exactly this pool's. Returns those hashes.
        """
        removed: list[bytes] = []
        for block in blocks:
            if block.block_hash is None:
                continue
            gone = self._drop_hash(block)
            if gone is not None:
                removed.append(gone)
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
                self.free_queue.appendleft(block)
        if removed:
            self._emit(PoolRemoved(self._seq + 1, removed, self.tier))
        return removed

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on each block (cache hits); a free block leaves the free queue
        so it can no longer be evicted."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
                if block.block_hash is not None:
                    self.num_free_cached -= 1
                    if self.quota is not None:
                        self.quota.remove(block)
            block.ref_cnt += 1

    def refresh(self, chain: Sequence[KVCacheBlock]) -> None:
        """Move the free blocks of ``chain`` (a request's hits, in chain order) to the tail
        of the free queue, the chain's tail nearest the head, as if just freed: the LRU
        order then evicts them after every block no waiting request will hit. References,
        hashes and events are unchanged; the engine calls it as a request joins the queue
        (vLLM has no such step: its order is the same as long as nobody calls this)."""
        for block in reversed(chain):
            if block.ref_cnt == 0 and block.block_hash is not None:
                self.free_queue.remove(block)
                self.free_queue.append(block)
                if self.quota is not None:
                    self.quota.remove(block)
                    self.quota.append(block)

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference on each block. Blocks reaching zero become free: hashed ones
        are appended to the tail in the given order (pass a request's blocks in reverse so
        the chain's tail is evicted first); unhashed ones go to the head, in the given
        order, so they are reused before any cached block. Raises ``ValueError`` (changing
        nothing) on a block that is not referenced.
        """
        blocks = list(ordered_blocks)
        for block in blocks:
            if block.ref_cnt <= 0:
                raise ValueError(f"block {block.block_id} freed more often than referenced")
        unhashed: list[KVCacheBlock] = []
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.block_hash is None:
                    unhashed.append(block)
                else:
                    self.free_queue.append(block)
                    self.num_free_cached += 1
                    if self.quota is not None:
                        self.quota.append(block)
        for block in reversed(unhashed):
            self.free_queue.appendleft(block)

    def reset_prefix_cache(self) -> bool:
        """Drop every cached hash and emit ``PoolCleared``. Refused (``False``, nothing
        changed) while any block is referenced: running requests would keep blocks whose
        hashes the index no longer knows."""
        if self.num_free_blocks != self.num_blocks:
            return False
        for holders in self.cached.values():
            for block in holders.values():
                block.uncached += 1
                block.block_hash = None
                block.content = None
                block.prev_owned = block.next_owned = None
        self.cached.clear()
        self.ledger.clear()
        if self.quota is not None:
            self.quota = QuotaQueue(self.free_queue, self.ledger)
        self.num_cached_blocks = 0
        self.num_free_cached = 0
        self._emit(PoolCleared(self._seq + 1))
        return True

    # --- events (PoolEvents: the stream) --------------------------------------------

    def snapshot(self) -> CacheSnapshot:
        """Every hash held now with its chain parent, valid as of :attr:`last_seq`."""
        hashes = list(self.cached)
        parents = [next(iter(self.cached[h].values())).parent_hash for h in hashes]
        return CacheSnapshot(self._seq, self.tier, hashes, parents, [self.tier] * len(hashes))
