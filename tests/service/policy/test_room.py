"""The room check (``service.policy.room``): what the router is sure a worker can admit,
checked against a real ``KVCacheManager`` driven through random request histories."""
from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from service.index.base import BlockMatch, WorkerLoad
from service.policy import WorkerView
from service.policy.room import can_ever_fit, deficit, evictions, sure_room
from worker.kv_cache import KVCacheManager, KVRequest

from .views import view

BS = 4


def test_an_idle_holders_free_hits_are_no_room() -> None:
    # 30 cached hit blocks, all free (nobody runs), among 40 free blocks, 10 of them empty:
    # admitting a 63-block prompt takes the 30 hits AND 33 new blocks off the free queue.
    idle = view("idle", 30, free_blocks=40, free_empty_blocks=10, total_blocks=40)
    assert sure_room(idle) == 10
    assert deficit(1000, idle) == 33 - 10


def test_a_busy_holders_hits_in_use_are_not_counted_against_it() -> None:
    # Every free block holds no hash: the 50 hits are held by running requests, so the
    # 13 free blocks are all room for the 13 new blocks (the old guard said no).
    busy = view("busy", 50, free_blocks=13, free_empty_blocks=13, total_blocks=100)
    assert sure_room(busy) == 13 and deficit(1000, busy) == 0


def test_without_the_empty_count_every_free_block_may_be_a_hit() -> None:
    old = view("old", 50, free_blocks=13, total_blocks=100)  # reports no free_empty_blocks
    assert sure_room(old) == 0 and deficit(1000, old) == 13


def test_the_deficit_never_exceeds_the_requests_new_blocks() -> None:
    for hits in range(0, 64):
        for free in (0, 5, 40, 200):
            v = view("w", hits, free_blocks=free, total_blocks=1000)
            assert 0 <= deficit(1000, v) <= 63 - hits


def test_new_blocks_beyond_the_empty_ones_evict_cached_blocks() -> None:
    assert evictions(1000, view("w", 50, free_blocks=40, free_empty_blocks=5,
                                total_blocks=100)) == 13 - 5
    assert evictions(1000, view("w", 50, free_blocks=40, free_empty_blocks=20,
                                total_blocks=100)) == 0
    assert evictions(1000, view("unknown", 0)) == 0   # no capacity reported


def test_unknown_capacity_has_room_and_a_too_small_pool_never_fits() -> None:
    unknown = view("unknown", 0)                      # total_blocks 0: not reported
    assert deficit(1000, unknown) == 0 and can_ever_fit(1000, unknown)
    small = view("small", 0, free_blocks=60, total_blocks=62)
    assert not can_ever_fit(1000, small)              # 63 blocks > 62
    assert can_ever_fit(992, small)


def _router_view(kv: KVCacheManager, req: KVRequest) -> WorkerView:
    """What the router sees of ``kv`` for ``req``: its load and the index's match (the
    longest held prefix, which is what the manager would hit)."""
    hits, _ = kv.get_computed_blocks(req)
    load = WorkerLoad(free_blocks=kv.num_free_blocks, total_blocks=kv.num_blocks,
                      free_empty_blocks=kv.num_free_empty_blocks)
    return WorkerView("w", "w:1", load, BlockMatch(len(hits), len(hits), 0, 0), BS)


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 40))
def test_sure_room_is_never_more_than_the_real_room_and_exact_when_it_says(
        seed: int, steps: int) -> None:
    """Random histories on a small pool (shared prefixes, requests admitted and finished in
    any order), then a probe: the router's room never exceeds what admission really takes,
    equals it when no free block is cached or the probe has no hit, and a zero deficit means
    the real manager admits the probe."""
    rng = random.Random(seed)
    kv = KVCacheManager(48, BS)
    prefixes = [[rng.randrange(50) for _ in range(BS * rng.randint(1, 6))] for _ in range(3)]

    def prompt() -> list[int]:
        return rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randint(1, 9))]

    running: list[KVRequest] = []
    for i in range(steps):
        if running and rng.random() < 0.45:
            kv.free(running.pop(rng.randrange(len(running))))
            continue
        req = KVRequest(f"r{i}", prompt())
        hits, n = kv.get_computed_blocks(req)
        if kv.allocate_slots(req, req.num_tokens - n, hits, n) is not None:
            running.append(req)
    probe = KVRequest("probe", prompt())
    v = _router_view(kv, probe)
    hits, n = kv.get_computed_blocks(probe)
    real_room = kv.num_free_blocks - sum(1 for b in hits if b.ref_cnt == 0)
    assert kv.num_free_empty_blocks == sum(
        1 for b in kv.pool.blocks if b.ref_cnt == 0 and b.block_hash is None)
    assert sure_room(v) <= real_room
    if v.load.free_empty_blocks == v.load.free_blocks or not hits:
        assert sure_room(v) == real_room
    if deficit(probe.num_tokens, v) == 0:
        assert kv.allocate_slots(probe, probe.num_tokens - n, hits, n) is not None
