"""Lookups that walk the chain in the service instead of in Lua, on kvmesh's Redis layout.

Two ways to read the blocks, both ONE pipelined round trip with the namespace's live
handles (``HGETALL``, to turn handles into worker ids):

- ``per_block``: one ``GET`` per block key (what llm-d's Redis index does): one command
  per block for the server to parse and answer;
- ``per_tag``: one ``MGET`` per cluster tag of the chain's blocks (at most 64): what a
  lookup on a Redis Cluster sends, since the keys of one ``MGET`` must share a slot.

Every block's holders are shipped back to the service, which walks the chain. Contract:
on an index without provisional entries (the benchmark's), ``lookup`` returns exactly what
``RedisBackend.lookup`` returns for the same ``(ns, hashes, workers)``. Provisional entries
are not read. ``client`` must not decode responses (keys and values are raw bytes).
"""
from __future__ import annotations

from collections.abc import Collection, Sequence

import redis.asyncio as aioredis

from service.index.base import BlockMatch
from service.index.testing import block_key, entries, live_key, live_map, tag


def _tally(c: list[int], mask: int) -> None:
    c[0] += 1
    c[1 if mask & 1 else 2 if mask & 2 else 3] += 1


def walk(values: Sequence[bytes | None], live: dict[int, str],
         workers: Collection[str] | None) -> dict[str, BlockMatch]:
    """The chain walk over each block's value (sorted 4-byte entries, or None); ``live``
    maps the namespace's live handles to worker ids."""
    active: dict[int, list[int]] = {}
    done: dict[str, BlockMatch] = {}
    for i, v in enumerate(values):
        here = entries(v)
        if i == 0:
            active = {h: [0, 0, 0, 0] for h in here
                      if h in live and (workers is None or live[h] in workers)}
        for h in list(active):
            m = here.get(h, 0)
            if m:
                _tally(active[h], m)
            else:
                done[live[h]] = BlockMatch(*active.pop(h))
        if not active:
            break
    done.update({live[h]: BlockMatch(*c) for h, c in active.items()})
    return done


async def lookup(client: aioredis.Redis, ns: str, hashes: Sequence[bytes],
                 workers: Collection[str] | None = None,
                 per_tag: bool = False) -> dict[str, BlockMatch]:
    """Pipelined reads of every block of the chain (see the module docstring), then
    :func:`walk`."""
    if not hashes:
        return {}
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(live_key(ns))
    if per_tag:
        groups: dict[int, list[int]] = {}
        for i, h in enumerate(hashes):
            groups.setdefault(tag(h), []).append(i)
        for idx in groups.values():
            pipe.mget([block_key(hashes[i]) for i in idx])
    else:
        for h in hashes:
            pipe.get(block_key(h))
    res = await pipe.execute()
    live = live_map(res[0])[1]
    if per_tag:
        values: list[bytes | None] = [None] * len(hashes)
        for idx, vals in zip(groups.values(), res[1:], strict=True):
            for i, v in zip(idx, vals, strict=True):
                values[i] = v
    else:
        values = res[1:]
    allowed = None if workers is None else set(workers)
    return walk(values, live, allowed)
