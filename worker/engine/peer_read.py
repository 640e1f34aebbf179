"""The source's read of a peer fetch beside the engine's step: it never waits for the step.

A fetch is planned when the holder is busy, so a read queued on the engine thread waits for
the holder's step in progress (seconds on a CPU) and the receiver's deadline runs out.
:func:`read_beside` runs on any thread while the engine steps. It is optimistic, like a
seqlock: it notes each device block's ``uncached`` count (bumped whenever the block's hash
is dropped, which happens before the block can be allocated and written again), copies the
blocks, then checks the counts, and serves the run only up to the first block whose count
moved or whose hash changed. A block is cached when its step schedules it, before that
step's forward writes it (as in vLLM), so a block cached by the step in progress is not
taken (``BlockPool.written_through``); after that, a block is not written while it stays
cached, so a block whose count did not move was copied whole and unchanged: never a torn,
half-written or overwritten block. A block evicted meanwhile shortens the run (the receiver
recomputes the rest), where the engine-thread read would have served it.

Device blocks only: when the run goes on in a host or disk tier, it returns ``None`` and the
caller reads on the engine thread (:func:`worker.engine.peer_blocks.snapshot`). The pool's
dicts are read under the GIL; one changed mid-read counts as a miss. CUDA: the copy to host
is synchronous, so it has ended before the counts are checked (untested here: no GPU).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from worker.engine.peer_blocks import Snapshot, layout

if TYPE_CHECKING:
    from worker.engine.engine import Engine
    from worker.kv_cache.block import KVCacheBlock
    from worker.kv_cache.block_pool import BlockPool


def read_beside(engine: Engine, hashes: Sequence[bytes]) -> Snapshot | None:
    """The longest run of ``hashes`` (block ``i + 1`` the child of block ``i``) that the
    device pool holds, copied to host memory off the engine thread; ``None`` when the run
    continues in a lower tier (read it on the engine thread instead)."""
    kv, cache = engine.kv, engine.kv_cache
    lower = kv.offloader.tiers if kv.offloader is not None else []
    found: list[tuple[KVCacheBlock, int, tuple[int, ...]]] = []
    prev: bytes | None = None
    for i, h in enumerate(hashes):
        hit = _device_block(kv.pool, h, prev, i == 0)
        if hit is None:
            if any(tier.get(h) is not None for tier in lower):
                return None
            break
        found.append(hit)
        prev = h
    out = torch.empty((len(found), *layout(engine).block_shape), dtype=cache.dtype)
    for n, (block, _, _) in enumerate(found):
        copy_block(out[n], cache, block.block_id)
    count = next((n for n, (block, seen, _) in enumerate(found)
                  if block.uncached != seen or block.block_hash != hashes[n]), len(found))
    tokens = [t for _, _, ids in found[:count] for t in ids]
    return Snapshot(out[:count], count, tokens, {"gpu": count} if count else {})


def copy_block(row: torch.Tensor, cache: torch.Tensor, block_id: int) -> None:
    """Copy one block's KV (every layer, K and V) into ``row`` (tests interpose here)."""
    row.copy_(cache[:, :, block_id])


def _device_block(pool: BlockPool, h: bytes, prev: bytes | None, first: bool,
                  ) -> tuple[KVCacheBlock, int, tuple[int, ...]] | None:
    """A device block holding ``h`` as ``prev``'s child whose KV is written (not one the
    step in progress cached when it scheduled it), with its ``uncached`` count as read
    before its hash, and its token ids."""
    try:
        holders = list(pool.cached.get(h, {}).values())
    except RuntimeError:  # the engine thread changed the dict mid-read: not held, for now
        return None
    for block in holders:
        seen = block.uncached  # the engine bumps it, then sets cached_step, then the hash
        content = block.content
        if (content is not None and block.block_hash == h
                and (first or block.parent_hash == prev)
                and block.cached_step <= pool.written_through):
            return block, seen, content.token_ids
    return None
