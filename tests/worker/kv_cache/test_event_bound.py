"""Unread KV events are bounded: an ``Engine`` nobody takes events from
(a worker without ``--service``, or the engine used directly) keeps at most
``max_pending_blocks`` blocks' worth of them, and a reader that missed some resyncs from a
snapshot and is exact again."""
from __future__ import annotations

import tracemalloc

import pytest

from kvmesh.events.pool import PoolCleared, PoolRemoved, PoolStored
from worker import Engine

BOUND = 60  # blocks' worth of events


def prompts(r: int, n: int = 50) -> list[list[int]]:
    """``n`` distinct 9-token prompts (two full blocks of 4 each) of round ``r``."""
    return [[r % 259, i, 5, 6, 7, 8, 9, 10, 11] for i in range(n)]


def engine() -> Engine:
    e = Engine.from_pretrained("tiny", block_size=4, num_blocks=256)
    e.kv.pool.max_pending_blocks = BOUND
    return e


@pytest.mark.slow
def test_an_engine_without_a_reader_keeps_bounded_events():
    e = engine()
    e.generate(prompts(0), max_tokens=1)  # warm up: lazy allocations of the first run
    tracemalloc.start()
    try:
        used = []
        for r in range(1, 41):  # 2000 requests, ~4000 blocks' worth of events
            e.generate(prompts(r), max_tokens=1)
            assert e.kv.pool._pending_blocks <= BOUND
            used.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    assert e.kv.events_dropped > 1000
    # Flat after the start: kept events would cost ~0.5 KB a request, 500 KB over the run.
    assert used[-1] - used[4] < 100_000, used[::5]


def test_a_reader_that_missed_events_resyncs_from_a_snapshot():
    e = engine()
    for r in range(5):
        e.generate(prompts(r), max_tokens=1)
    assert e.kv.events_dropped > 0
    snap = e.kv.cached_block_hashes()
    index = set(snap.block_hashes)
    e.generate(prompts(7, 10), max_tokens=1)  # 10 requests: under the bound
    events = [ev for ev in e.kv.take_events() if ev.seq > snap.seq]
    assert [ev.seq for ev in events] == list(range(snap.seq + 1, e.kv.pool.last_seq + 1))
    for ev in events:
        if isinstance(ev, PoolStored):
            index.update(ev.block_hashes)
        elif isinstance(ev, PoolRemoved):
            index.difference_update(ev.block_hashes)
        else:
            assert isinstance(ev, PoolCleared)
            index.clear()
    assert index == set(e.kv.pool.cached)
