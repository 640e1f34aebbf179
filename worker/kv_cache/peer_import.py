"""Peer import: blocks pulled from another worker become ordinary cached device blocks here.

The engine thread, between steps, calls :meth:`PeerImports.reserve` (fresh device blocks
for the fetched blocks this pool does not hold yet), writes their KV into them, then
:meth:`PeerImports.commit` (cached under this worker's own chain hashes, tokens, parent and
extra keys: the pool's ordinary ``PoolStored`` announces them; then released to the free
queue's tail as cached, charged to the importing request's tenant) or
:meth:`PeerImports.abort` (freed uncached). Invariants: a block is never a hit before its
KV is written (it is cached only at ``commit``); an import only continues a chain this pool
holds (on the device or a lower tier) up to the fetched range, else imported blocks could
never be hit. The request is enqueued in the same engine-thread
call, so its admission finds them; :meth:`admit` counts the hits on blocks imported for it
(its ``"peer"`` tokens). Not thread-safe: engine thread only.

See docs/architecture.md#peer-kv-transfer-the-worker-side.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .block import BlockContent, KVCacheBlock
from .onboard import Read
from .request import KVRequest

if TYPE_CHECKING:
    from .manager import KVCacheManager


@dataclass(eq=False)
class Reservation:
    """Fresh device blocks for chain blocks ``[first, first + len(blocks))`` of ``req``."""

    req: KVRequest
    first: int
    blocks: list[KVCacheBlock]
    parent: BlockContent | None  # the content of chain block ``first - 1`` (None: block 0)


class PeerImports:
    """The imports of one manager, and which blocks each waiting request got from a peer."""

    def __init__(self, kv: KVCacheManager) -> None:
        self.kv = kv
        self._imported: dict[str, dict[int, bytes]] = {}  # request id -> block id -> hash
        self.blocks = 0  # blocks imported (cumulative)

    def held(self, req: KVRequest) -> tuple[list[KVCacheBlock], list[Read]]:
        """The leading chain blocks of ``req`` this pool holds: device hits, then the lower
        tiers' continuation (the manager's own verified walk)."""
        hits, _ = self.kv.get_computed_blocks(req)
        return hits, self.kv._tiers.match(req, hits)

    def reserve(self, req: KVRequest, start: int, count: int) -> Reservation | None:
        """Fresh blocks for the fetched chain blocks ``[start, start + count)`` of ``req``
        that this pool does not hold, within what admission can hit (never its last token's
        block) and what is free; ``None`` when there is nothing to import: all held, a gap
        before ``start`` (blocks neither here nor fetched), caching off, or no free block.
        Evictions this causes are ordinary (their offload orders are queued)."""
        kv = self.kv
        if not kv.enable_caching or count <= 0:
            return None
        kv._update_hashes(req)
        stop = min(start + count, (req.num_tokens - 1) // kv.block_size, len(req.block_hashes))
        hits, reads = self.held(req)
        first = len(hits) + len(reads)
        if first < start or first >= stop:
            return None
        parent = reads[-1][1].content if reads else hits[-1].content if hits else None
        # The chain held here must survive the evictions taking fresh blocks causes, or
        # the imported blocks could never be reached: hold it meanwhile.
        kv.pool.touch(hits)
        for tier, entry in reads:
            tier.read(entry)
        try:
            n = min(stop - first, kv.pool.num_free_blocks)
            blocks = kv.pool.get_new_blocks(n, req.tenant) if n > 0 else []
        finally:
            kv.pool.free_blocks(reversed(hits))  # back as cached, most recently used
            for tier, entry in reads:
                kv.offloader.release(tier, entry)
        return Reservation(req, first, blocks, parent) if blocks else None

    def commit(self, res: Reservation) -> int:
        """The KV of ``res``'s blocks is written: cache them (one ``PoolStored``), release
        them as cached, and remember them for ``res.req``'s admission. Returns the blocks."""
        kv, req = self.kv, res.req
        end = res.first + len(res.blocks)
        extras = ([kv._extra(req, i) for i in range(res.first, end)]
                  if req.has_extra_keys else None)
        stub = KVCacheBlock(-1, content=res.parent)  # only its content is read: the parent
        table = [stub] * res.first + res.blocks
        kv.pool.cache_full_blocks(table, req.block_hashes, req.token_ids, res.first, end,
                                  kv.block_size, extras, req.tenant)
        for block in res.blocks:
            block.decoded = False  # prompt blocks: the layered order keeps them longest
        kv.pool.free_blocks(reversed(res.blocks))
        mine = self._imported.setdefault(req.request_id, {})
        mine.update((b.block_id, b.block_hash) for b in res.blocks)
        self.blocks += len(res.blocks)
        return len(res.blocks)

    def abort(self, res: Reservation) -> None:
        """Writing failed: the blocks go back uncached (handed out first)."""
        self.kv.pool.free_blocks(res.blocks)

    def admit(self, request_id: str, hits: Sequence[KVCacheBlock]) -> int:
        """Tokens of ``hits`` (an admission's) that were imported for ``request_id`` and
        still hold the hash they were imported with; forgets the request's imports."""
        mine = self._imported.pop(request_id, None)
        if not mine:
            return 0
        n = sum(1 for b in hits if mine.get(b.block_id) == b.block_hash)
        return n * self.kv.block_size

    def forget(self, request_id: str) -> None:
        """The request is gone before its admission."""
        self._imported.pop(request_id, None)
