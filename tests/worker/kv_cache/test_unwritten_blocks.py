"""Blocks cached by a step that failed are uncached; written ones stay.

``BlockPool.uncache_blocks`` drops the hashes of blocks whose KV was never written and
reports removal only for hashes no other block holds; ``KVCacheManager.step`` applies it
to exactly the blocks cached inside a failed step.
"""
import pytest

from kvmesh.events.pool import PoolRemoved, PoolStored
from kvmesh.hashing import block_hashes
from worker.kv_cache import BlockPool, KVCacheManager, KVRequest

BS = 4
TOKENS = list(range(10, 23))  # 13 tokens: 3 full blocks


class Boom(Exception):
    pass


def cache(pool, tokens):
    blocks = pool.get_new_blocks(len(tokens) // BS)
    hashes = block_hashes(tokens, BS)
    pool.cache_full_blocks(blocks, hashes, tokens, 0, len(blocks), BS)
    return blocks, hashes


def test_uncache_reports_only_hashes_no_written_block_holds():
    pool = BlockPool(12)
    written, hashes = cache(pool, TOKENS[:12])      # a step that completed
    dup, _ = cache(pool, TOKENS[:8])                # duplicates of blocks 0-1, never written
    new, new_hashes = cache(pool, TOKENS[:8] + [1, 2, 3, 4])  # block 2 differs: new hash
    pool.take_events()
    pool.free_blocks(reversed(new))  # a free uncached block goes to the head
    evictions = pool.evictions

    removed = pool.uncache_blocks(dup + new)
    assert removed == [new_hashes[2]]               # h0, h1 are still held by `written`
    events = pool.take_events()
    assert len(events) == 1 and isinstance(events[0], PoolRemoved)
    assert events[0].block_hashes == [new_hashes[2]]
    assert set(pool.cached) == set(hashes)
    assert all(b.block_hash is None and b.content is None for b in dup + new)
    assert [b.ref_cnt for b in dup] == [1, 1] and pool.evictions == evictions
    head = [b.block_id for b in pool.free_queue][:3]
    assert sorted(head) == sorted(b.block_id for b in new)
    # What stays cached is still a verified hit.
    assert pool.get_cached_block(hashes[0], TOKENS[:4]) is written[0]


def test_failed_step_uncaches_only_its_own_blocks_chunked_prefill():
    m = KVCacheManager(16, BS)
    req = KVRequest("a", list(TOKENS))
    with m.step():                                   # chunk 1: blocks 0-1 written
        hits, n = m.get_computed_blocks(req)
        m.allocate_slots(req, 8, hits, n)
    req.num_computed_tokens = 8
    before = set(m.pool.cached)
    m.take_events()
    with pytest.raises(Boom), m.step():              # chunk 2 fills block 2, then fails
        m.allocate_slots(req, 5)
        raise Boom
    assert set(m.pool.cached) == before
    removed = [e for e in m.take_events() if isinstance(e, PoolRemoved)]
    assert [e.block_hashes for e in removed] == [[req.block_hashes[2]]]
    m.free(req)
    probe = KVRequest("p", list(TOKENS))
    assert m.get_computed_blocks(probe)[1] == 8


def test_failed_step_uncaches_blocks_a_batch_mate_hit():
    m = KVCacheManager(16, BS)
    a, b = KVRequest("a", list(TOKENS)), KVRequest("b", TOKENS[:12] + [7, 7])
    with pytest.raises(Boom), m.step():
        for req in (a, b):
            hits, n = m.get_computed_blocks(req)
            m.allocate_slots(req, req.num_tokens - n, hits, n)
        assert n == 12                               # b hit a's three unwritten blocks
        raise Boom
    assert m.pool.cached == {}
    events = m.take_events()
    stored = {h for e in events if isinstance(e, PoolStored) for h in e.block_hashes}
    assert isinstance(events[-1], PoolRemoved) and set(events[-1].block_hashes) == stored
    m.free(a)
    m.free(b)
    assert m.num_free_blocks == 16 and m.get_computed_blocks(KVRequest("c", TOKENS))[1] == 0


def test_a_duplicate_of_a_written_block_is_dropped_without_removal():
    m = KVCacheManager(16, BS)
    a, b = KVRequest("a", list(TOKENS)), KVRequest("b", list(TOKENS))
    with m.step():
        hits, n = m.get_computed_blocks(a)
        m.allocate_slots(a, 4, hits, n)              # a: block 0 only (chunked)
        a.num_computed_tokens = 4
        hits, n = m.get_computed_blocks(b)           # b: hits block 0, computes 1-2
        m.allocate_slots(b, b.num_tokens - n, hits, n)
    m.take_events()
    with pytest.raises(Boom), m.step():
        m.allocate_slots(a, 4)                       # a's block 1 duplicates b's
        assert len(m.pool.cached[a.block_hashes[1]]) == 2
        raise Boom
    assert list(m.pool.cached[a.block_hashes[1]]) == [m.get_block_ids(b)[1]]
    assert not [e for e in m.take_events() if isinstance(e, PoolRemoved)]


def test_outside_a_step_nothing_is_tracked_and_steps_do_not_nest():
    m = KVCacheManager(8, BS)
    req = KVRequest("a", list(TOKENS))
    hits, n = m.get_computed_blocks(req)
    m.allocate_slots(req, req.num_tokens, hits, n)
    assert m._unwritten is None and len(m.pool.cached) == 3
    with m.step(), pytest.raises(RuntimeError, match="already open"), m.step():
        pass
