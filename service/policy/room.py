"""Room: whether a worker can admit a request now, and what waiting for room costs.

The room the router is sure of is ``F - min(h, F - E)`` (free blocks ``F``, of them ``E``
without a hash, device hits ``h``): exact when no free block holds a hash or there is no hit,
else short by at most the hits running requests hold. A short worker queues the request, so
the deficit is a cost (never more than the request's own new blocks), not an exclusion; only
a worker whose whole pool is smaller than the prompt is excluded.

See docs/architecture.md#the-cost-model-servicepolicycostpy.
"""
from __future__ import annotations

from service.policy.base import WorkerView


def blocks_needed(prompt_tokens: int, block_size: int) -> int:
    """Blocks a prompt of ``prompt_tokens`` occupies (its last, partial block too)."""
    return -(-prompt_tokens // max(block_size, 1))


def sure_room(v: WorkerView) -> int:
    """Free blocks of ``v`` that are room for new blocks whatever its free hits are."""
    load = v.load
    free = load.free_blocks
    free_cached = max(free - min(load.free_empty_blocks, free), 0)
    return free - min(v.match.gpu, free_cached)


def deficit(prompt_tokens: int, v: WorkerView) -> int:
    """Blocks ``v`` must free before it can admit the request (0: it can now). A worker that
    reports no capacity (``total_blocks == 0``, e.g. an engine behind the vLLM bridge) is
    taken to have room."""
    if v.load.total_blocks == 0:
        return 0
    new = blocks_needed(prompt_tokens, v.block_size) - v.match.gpu
    return max(new - sure_room(v), 0)


def evictions(prompt_tokens: int, v: WorkerView) -> int:
    """Cached blocks ``v`` evicts to admit the request: its new blocks beyond the free
    blocks that hold no hash (those are handed out first; the rest come off the LRU end of
    the cached ones, now or as running requests free them). 0 for a worker that reports no
    capacity."""
    if v.load.total_blocks == 0:
        return 0
    new = blocks_needed(prompt_tokens, v.block_size) - v.match.gpu
    return max(new - v.load.free_empty_blocks, 0)


def can_ever_fit(prompt_tokens: int, v: WorkerView) -> bool:
    """Whether ``v``'s whole pool can hold the prompt (unknown capacity: yes)."""
    total = v.load.total_blocks
    return total == 0 or blocks_needed(prompt_tokens, v.block_size) <= total
