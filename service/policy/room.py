"""Room: whether a worker can admit a request now, and what waiting for room costs.

Admitting a request takes off the worker's free queue its new blocks (the uncached part) AND
its device hits that are free: a cached block no running request holds sits in the free
queue, and touching it takes it out, so it is no room for new blocks. The router knows the
request's device hits ``h`` and, from the worker's load, its free blocks ``F`` and how many of
them hold no hash (``E``, ``WorkerLoad.free_empty_blocks``). At most ``min(h, F - E)`` hits
can be free, so the room the router is sure of is::

    room = F - min(h, F - E)

It is exact when no free block holds a hash (``E == F``: every hit is in use, or there is
none) and when the request has no hit; otherwise it may under-count the room by the hits
that running requests hold, never by more than ``min(h, F - E)`` blocks. (A worker that does
not report ``E`` reports 0: every free block may be a hit.)

A worker short of room does not refuse the request: it queues it until its running requests
free enough blocks. In steady state a worker frees blocks as fast as it fills them, one per
``block_size`` tokens of work, so the wait for ``deficit`` blocks is about
``deficit * block_size`` tokens of work: the cost model charges that (in prefill-token
units) instead of excluding the worker. The deficit is at most the request's own new
blocks, so a busy holder is never charged more than recomputing the request's uncached
part, while a cold worker's recompute of the whole prompt is charged in full: "does not fit
now" can move a request only when the hit is small. Only a worker whose whole pool is
smaller than the prompt is excluded (it can never admit it).
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
