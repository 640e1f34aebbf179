"""The per-block pipelined lookup (what llm-d's Redis index does), on kvmesh's Redis layout.

One ``GET`` per block key of the chain, all sent in ONE pipeline (one round trip, but one
command per block for the server to parse and answer, and every block's holders shipped back
to the client), then the chain walk in Python. Compared with the Lua ``LOOKUP`` script, which
walks the chain inside Redis and stops as soon as no candidate is left.

Contract: on an index without provisional entries (the benchmark's), ``lookup`` returns
exactly what ``RedisBackend.lookup`` returns for the same ``(ns, hashes, workers)``: per
worker, the consecutive blocks from block 0 it holds, split by tier. Provisional entries are
not read (they are kvmesh's own addition, not part of the per-block design).
"""
from __future__ import annotations

import re
from collections.abc import Collection, Sequence

import redis.asyncio as aioredis

from service.index.base import BlockMatch
from service.index.redis import chain_keys

_HOLDER = re.compile(r";([^=;]+)=(\d)")


def _tally(c: list[int], mask: int) -> None:
    c[0] += 1
    c[1 if mask & 1 else 2 if mask & 2 else 3] += 1


def walk(values: Sequence[str | None], workers: Collection[str] | None) -> dict[str, BlockMatch]:
    """The chain walk over each block's holder string (``;worker=mask...`` or None)."""
    active: dict[str, list[int]] = {}
    done: dict[str, BlockMatch] = {}
    for i, v in enumerate(values):
        here = {w: int(m) for w, m in _HOLDER.findall(v)} if v else {}
        if i == 0:
            active = {w: [0, 0, 0, 0] for w in here if workers is None or w in workers}
        for w in list(active):
            m = here.get(w, 0)
            if m:
                _tally(active[w], m)
            else:
                done[w] = BlockMatch(*active.pop(w))
        if not active:
            break
    done.update({w: BlockMatch(*c) for w, c in active.items()})
    return done


async def lookup(client: aioredis.Redis, ns: str, hashes: Sequence[bytes],
                 workers: Collection[str] | None = None) -> dict[str, BlockMatch]:
    """Pipelined ``GET`` of every block of the chain, then :func:`walk`."""
    if not hashes:
        return {}
    kp = chain_keys(ns, hashes[0])
    pipe = client.pipeline(transaction=False)
    for h in hashes:
        pipe.get(f"{kp}b:{h.hex()}")
    values = await pipe.execute()
    allowed = None if workers is None else set(workers)
    return walk(values, allowed)
