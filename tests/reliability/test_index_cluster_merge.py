"""Merged waves under attack on a real 3-primary Redis Cluster (``group_commit.py``): six
workers send random batches all at once (stores with and without their parent held,
removals of held and unheld blocks, cleared caches), every wave merging what waits (limit
1), and each worker ends exactly as the memory backend says, fed the same batches one
worker at a time."""
from __future__ import annotations

import asyncio
import random

import pytest

from service.index.base import (
    ApplyStatus,
    IndexCleared,
    IndexEvent,
    IndexRemoved,
    IndexStored,
)
from service.index.cluster import ClusterBackend
from service.index.memory import MemoryBackend
from tests.reliability.test_index_cluster_split import run
from tests.service.index.test_base import NS, T0, H, rec

pytestmark = [pytest.mark.integration, pytest.mark.cluster_layout]

POOL = H(*range(120))  # one chain: every worker stores runs of it, so values are shared


def _batches(rng: random.Random) -> list[list[IndexEvent]]:
    """A worker's batches: most stores extend a run it holds (so they land), some start
    where it holds no parent (orphans, skipped by both backends); removals of held and
    unheld blocks; now and then its cache cleared."""
    out, seq, held = [], 0, set()
    for _ in range(8):
        evs = []
        for _ in range(rng.randint(1, 3)):
            seq += 1
            r = rng.random()
            if r < 0.6:
                starts = [0, *(p + 1 for p in held if p + 1 < 100)]
                start = rng.choice(starts) if rng.random() < 0.9 else rng.randrange(100)
                n = rng.randint(1, 20)
                evs.append(IndexEvent(seq, IndexStored(
                    tuple(POOL[start:start + n]), parent=POOL[start - 1] if start else None)))
                if start in starts:
                    held |= set(range(start, min(start + n, len(POOL))))
            elif r < 0.95:
                gone = rng.sample(range(len(POOL)), 10)
                evs.append(IndexEvent(seq, IndexRemoved(tuple(POOL[i] for i in gone))))
                held -= set(gone)
            else:
                evs.append(IndexEvent(seq, IndexCleared()))
                held = set()
        out.append(evs)
    return out


def test_random_batches_of_six_workers_merged_end_as_the_memory_backend_says(
        redis_cluster_url: str) -> None:
    rng = random.Random(11)
    names = [f"w{i}" for i in range(6)]
    plans = {n: _batches(rng) for n in names}

    async def body(b: ClusterBackend) -> None:
        model = MemoryBackend()
        for n in names:
            await b.register(rec(n))
            await model.register(rec(n))
            for evs in plans[n]:
                assert (await model.apply_events(n, evs)).status is ApplyStatus.OK
        b.writes.limit = 1  # every batch that arrives while a wave flies waits to merge

        async def worker(n: str) -> None:
            for evs in plans[n]:
                res = await b.apply_events(n, evs)
                assert res.status is ApplyStatus.OK and res.last_seq == evs[-1].seq, res

        await asyncio.gather(*(worker(n) for n in names))
        assert b.writes.merged > 0
        got = {w.worker_id: w.indexed_blocks for w in await b.workers(with_blocks=True)}
        want = {w.worker_id: w.indexed_blocks for w in await model.workers(with_blocks=True)}
        assert got == want and sum(want.values()) > 100  # most stores landed
        for start in range(0, 120, 3):
            chain = POOL[start:]
            assert await b.lookup(NS, chain, T0) == await model.lookup(NS, chain, T0), start

    run(redis_cluster_url, body)
