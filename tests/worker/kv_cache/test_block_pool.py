"""BlockPool: allocation, caching, eviction, freeing order, reset, events."""
import pytest

from kvmesh.events.pool import PoolCleared, PoolRemoved, PoolStored
from kvmesh.hashing import block_hashes
from worker.kv_cache import BlockPool

BS = 4


def cache_chain(pool, tokens, blocks=None):
    """Allocate blocks for ``tokens`` (if not given) and cache their full blocks."""
    n_full = len(tokens) // BS
    if blocks is None:
        blocks = pool.get_new_blocks(-(-len(tokens) // BS))
    hashes = block_hashes(tokens, BS)
    pool.cache_full_blocks(blocks, hashes, tokens, 0, n_full, BS)
    return blocks, hashes


def state(pool):
    return ([b.block_id for b in pool.free_queue], [b.ref_cnt for b in pool.blocks],
            [b.block_hash for b in pool.blocks],
            {h: list(d) for h, d in pool.cached.items()}, pool.last_seq, pool.evictions)


def test_all_blocks_created_once():
    pool = BlockPool(6)
    assert [b.block_id for b in pool.blocks] == list(range(6))
    assert [b.block_id for b in pool.free_queue] == list(range(6))
    assert pool.num_free_blocks == 6 and pool.usage == 0.0 and pool.cached == {}


def test_bad_arguments():
    with pytest.raises(ValueError):
        BlockPool(0)
    with pytest.raises(ValueError, match="gpu"):
        BlockPool(4, tier="ssd")


def test_get_new_blocks_pops_the_head_with_one_reference():
    pool = BlockPool(5)
    got = pool.get_new_blocks(2)
    assert [b.block_id for b in got] == [0, 1] and [b.ref_cnt for b in got] == [1, 1]
    assert [b.block_id for b in pool.free_queue] == [2, 3, 4] and pool.usage == pytest.approx(0.4)


def test_get_new_blocks_beyond_free_raises_and_changes_nothing():
    pool = BlockPool(3)
    pool.get_new_blocks(2)
    before = state(pool)
    with pytest.raises(ValueError):
        pool.get_new_blocks(2)
    assert state(pool) == before


def test_cache_full_blocks_sets_hash_content_and_emits_stored():
    pool = BlockPool(4)
    tokens = list(range(10))  # 2 full blocks + 2 tokens
    blocks, hashes = cache_chain(pool, tokens)
    assert [b.block_hash for b in blocks] == [hashes[0], hashes[1], None]
    assert blocks[0].token_ids == (0, 1, 2, 3) and blocks[1].token_ids == (4, 5, 6, 7)
    assert blocks[1].content.parent is blocks[0].content
    assert pool.cached == {hashes[0]: {0: blocks[0]}, hashes[1]: {1: blocks[1]}}
    assert pool.take_events() == [PoolStored(1, hashes, None, tokens[:8], "gpu")]
    assert pool.take_events() == []


def test_cache_full_blocks_continues_a_chain_with_its_parent_hash():
    pool = BlockPool(4, tier="cpu")
    tokens = list(range(12))
    blocks = pool.get_new_blocks(3)
    hashes = block_hashes(tokens, BS)
    pool.cache_full_blocks(blocks, hashes, tokens, 0, 1, BS)
    pool.cache_full_blocks(blocks, hashes, tokens, 1, 1, BS)  # nothing new: no event
    pool.cache_full_blocks(blocks, hashes, tokens, 1, 3, BS)
    assert pool.take_events() == [PoolStored(1, hashes[:1], None, tokens[:4], "cpu"),
                                  PoolStored(2, hashes[1:], hashes[0], tokens[4:], "cpu")]
    with pytest.raises(ValueError, match="already cached"):
        pool.cache_full_blocks(blocks, hashes, tokens, 2, 3, BS)


def test_caching_disabled_caches_nothing():
    pool = BlockPool(4, enable_caching=False)
    blocks, _ = cache_chain(pool, list(range(8)))
    assert all(b.block_hash is None for b in blocks)
    assert pool.cached == {} and pool.take_events() == []


def test_duplicates_are_kept_and_share_content():
    pool = BlockPool(4)
    tokens = list(range(4))
    a, hashes = cache_chain(pool, tokens)
    b, _ = cache_chain(pool, tokens)
    assert set(pool.cached[hashes[0]]) == {a[0].block_id, b[0].block_id}
    assert a[0].content is b[0].content  # interned: comparisons stay one `is`
    assert pool.num_cached_blocks == 2


def test_get_cached_block_verifies_tokens_parent_and_extra_keys():
    pool = BlockPool(4)
    tokens = list(range(8))
    blocks, hashes = cache_chain(pool, tokens)
    assert pool.get_cached_block(hashes[0], tokens[:4]) is blocks[0]
    assert pool.get_cached_block(hashes[1], tokens[4:8], blocks[0]) is blocks[1]
    assert pool.get_cached_block(b"nope", tokens[:4]) is None
    # Same hash but other tokens (a collision): refused.
    assert pool.get_cached_block(hashes[0], [9, 9, 9, 9]) is None
    # Right tokens and hash, but not after the right prefix: refused.
    assert pool.get_cached_block(hashes[1], tokens[4:8]) is None
    other = pool.get_new_blocks(1)
    pool.cache_full_blocks(other, [b"x"], [7, 7, 7, 7], 0, 1, BS)
    assert pool.get_cached_block(hashes[1], tokens[4:8], other[0]) is None
    # Right tokens, other extra keys (e.g. another tenant's salt): refused.
    assert pool.get_cached_block(hashes[0], tokens[:4], None, (("cache_salt", "t"),)) is None


def test_touch_takes_free_blocks_off_the_queue():
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(2)
    pool.free_blocks(reversed(blocks))
    pool.touch([pool.blocks[1]])
    assert pool.blocks[1].ref_cnt == 1 and not pool.blocks[1].is_free
    pool.touch([pool.blocks[1]])  # already referenced: only the count moves
    assert pool.blocks[1].ref_cnt == 2
    assert 1 not in [b.block_id for b in pool.free_queue]
    pool.free_queue.check()


def test_free_appends_hashed_blocks_to_the_tail_in_the_given_order():
    pool = BlockPool(5)
    blocks, _ = cache_chain(pool, list(range(12)))  # blocks 0, 1, 2 all full
    pool.free_blocks(reversed(blocks))
    # The chain's tail (block 2) is nearest the head: evicted first.
    assert [b.block_id for b in pool.free_queue] == [3, 4, 2, 1, 0]


def test_free_puts_unhashed_blocks_at_the_head():
    pool = BlockPool(6)
    blocks, _ = cache_chain(pool, list(range(9)))  # 0, 1 cached; 2 partial
    extra = pool.get_new_blocks(1)  # 3, never filled
    pool.free_blocks(reversed(blocks + extra))
    # Unhashed 3 and 2 go to the head (in the order given), cached 1 and 0 to the tail.
    assert [b.block_id for b in pool.free_queue] == [3, 2, 4, 5, 1, 0]
    pool.free_queue.check()


def test_refresh_moves_a_free_chain_to_the_tail_and_changes_nothing_else():
    pool = BlockPool(8)
    a, _ = cache_chain(pool, list(range(8)))         # blocks 0, 1: chain A
    b, _ = cache_chain(pool, list(range(50, 58)))    # blocks 2, 3: chain B, freed later
    pool.free_blocks(reversed(a))
    pool.free_blocks(reversed(b))
    assert [x.block_id for x in pool.free_queue] == [4, 5, 6, 7, 1, 0, 3, 2]
    events, counts = pool.last_seq, (pool.num_free_blocks, pool.num_free_empty_blocks)
    pool.refresh(a)  # a request waiting for A: A is now evicted after B
    assert [x.block_id for x in pool.free_queue] == [4, 5, 6, 7, 3, 2, 1, 0]
    assert (pool.last_seq, pool.num_free_blocks, pool.num_free_empty_blocks) == (events,
                                                                                  *counts)
    held = pool.get_new_blocks(1)                    # a referenced block is not moved
    pool.refresh([*held, *b])
    assert [x.block_id for x in pool.free_queue] == [5, 6, 7, 1, 0, 3, 2]
    pool.free_queue.check()


def test_free_only_releases_at_zero_references():
    pool = BlockPool(3)
    blocks, _ = cache_chain(pool, list(range(4)))
    pool.touch(blocks)
    pool.free_blocks(blocks)
    assert blocks[0].ref_cnt == 1 and [b.block_id for b in pool.free_queue] == [1, 2]


def test_double_free_raises_and_changes_nothing():
    pool = BlockPool(3)
    blocks = pool.get_new_blocks(2)
    pool.free_blocks(blocks[1:])
    before = state(pool)
    with pytest.raises(ValueError, match="freed more often"):
        pool.free_blocks(reversed(blocks))
    assert state(pool) == before


def test_eviction_is_lazy_and_removed_is_emitted_for_the_last_holder():
    pool = BlockPool(3)
    tokens = list(range(4))
    a, hashes = cache_chain(pool, tokens)
    b, _ = cache_chain(pool, tokens)  # a duplicate of the same hash
    pool.free_blocks(a + b)
    pool.take_events()
    assert pool.cached[hashes[0]]  # freed blocks stay cached
    pool.get_new_blocks(2)  # block 2 (never cached) then block 0 (evicted)
    assert a[0].block_hash is None and a[0].content is None and pool.evictions == 1
    assert pool.take_events() == []  # block 1 still holds the hash: the worker still has it
    pool.get_new_blocks(1)
    assert pool.evictions == 2 and pool.cached == {}
    assert pool.take_events() == [PoolRemoved(3, hashes, "gpu")]


def test_reset_refuses_while_any_block_is_referenced():
    pool = BlockPool(3)
    blocks, hashes = cache_chain(pool, list(range(4)))
    before = state(pool)
    assert pool.reset_prefix_cache() is False
    assert state(pool) == before
    pool.free_blocks(blocks)
    assert pool.reset_prefix_cache() is True
    assert pool.cached == {} and all(b.block_hash is None for b in pool.blocks)
    assert pool.num_cached_blocks == 0
    events = pool.take_events()
    assert [e.seq for e in events] == [1, 2] and events[1] == PoolCleared(2)


def test_event_seqs_are_consecutive_from_one_and_snapshot_reflects_them():
    pool = BlockPool(4)
    assert pool.last_seq == 0 and pool.snapshot().block_hashes == []
    blocks, hashes = cache_chain(pool, list(range(8)))
    pool.free_blocks(reversed(blocks))
    pool.get_new_blocks(4)
    snap = pool.snapshot()
    assert snap.seq == pool.last_seq == 2 and snap.tier == "gpu" and snap.block_hashes == []
    assert [e.seq for e in pool.take_events()] == [1, 2]
