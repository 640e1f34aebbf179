"""KVCacheManager: vLLM v1 prefix-caching semantics, verification, stats, events."""
import pytest

import worker.kv_cache.manager as manager_module
from kvmesh.events.pool import PoolCleared, PoolRemoved, PoolStored
from kvmesh.hashing import block_hashes
from worker.kv_cache import KVCacheManager, KVRequest


def admit(m, req, chunk=None):
    """What the scheduler does for a waiting request; returns (new blocks or None, hits)."""
    hits, n = m.get_computed_blocks(req)
    num_new = req.num_tokens - n if chunk is None else min(chunk, req.num_tokens - n)
    new = m.allocate_slots(req, num_new, hits, n)
    if new is not None:
        req.num_computed_tokens = n + num_new
    return new, n


def decode(m, req, token):
    """One decode step: the sampled token is appended, then its slot allocated."""
    req.token_ids.append(token)
    new = m.allocate_slots(req, req.num_tokens - req.num_computed_tokens)
    if new is not None:
        req.num_computed_tokens = req.num_tokens
    return new


def ids(blocks):
    return [b.block_id for b in blocks]


def pool_state(m):
    p = m.pool
    return ([b.block_id for b in p.free_queue], [b.ref_cnt for b in p.blocks],
            [b.block_hash for b in p.blocks], {h: list(d) for h, d in p.cached.items()},
            p.last_seq, len(p._events), p.evictions)


def test_seeds_worked_example_block_size_4_ten_blocks():
    m = KVCacheManager(10, 4)
    # Time 1: request 0, 15 prompt tokens -> 4 blocks; 3 full ones cached at once.
    r0 = KVRequest("r0", list(range(15)))
    new, n = admit(m, r0)
    assert n == 0 and ids(new) == [0, 1, 2, 3]
    assert [b.block_hash is not None for b in new] == [True, True, True, False]
    # Time 2: a decoded token fills block 3 (cached as soon as it is full), the next one
    # needs block 4.
    assert decode(m, r0, 100) == [] and m.pool.blocks[3].block_hash is not None
    assert ids(decode(m, r0, 101)) == [4]
    assert [b.block_id for b in m.pool.free_queue] == [5, 6, 7, 8, 9]
    # Time 3: request 1, 14 tokens sharing the first 10: only 2 blocks (8 tokens) hit,
    # the third matches just 2 of its 4 tokens.
    r1 = KVRequest("r1", list(range(10)) + [50, 51, 52, 53])
    new, n = admit(m, r1)
    assert n == 8 and ids(new) == [5, 6] and m.get_block_ids(r1) == [0, 1, 5, 6]
    assert [m.pool.blocks[i].ref_cnt for i in (0, 1)] == [2, 2]
    # Time 4: request 0 is freed, in reverse order. Blocks 0 and 1 stay with request 1.
    # The seeds page shows 7 8 9 4 3 2; block 4 holds a single token (never hashed), and
    # under the rule "unhashed blocks go to the head" it is queued first instead.
    m.free(r0)
    assert [b.block_id for b in m.pool.free_queue] == [4, 7, 8, 9, 3, 2]
    # Time 5: request 1 is freed. The page: 7 8 9 4 3 2 6 5 1 0. By the rule, the
    # unhashed partial block 6 goes to the head too.
    m.free(r1)
    assert [b.block_id for b in m.pool.free_queue] == [6, 4, 7, 8, 9, 3, 2, 5, 1, 0]
    # Time 6: request 2, 29 tokens sharing the first 12 with request 0: blocks 0 1 2 hit
    # and are taken off the queue, which becomes 6 4 7 8 9 3 5.
    r2 = KVRequest("r2", list(range(12)) + list(range(200, 217)))
    hits, n = m.get_computed_blocks(r2)
    assert ids(hits) == [0, 1, 2] and n == 12
    new = m.allocate_slots(r2, r2.num_tokens - n, hits, n)
    # The page allocates 7 8 9 4 3 and evicts cached block 3. With unhashed blocks at the
    # head the 5 new blocks are 6 4 7 8 9 and NOTHING is evicted: blocks 3 and 5 stay
    # cached (block 3 = request 0's tokens 12..15, block 5 = request 1's 8..11).
    assert ids(new) == [6, 4, 7, 8, 9]
    assert m.get_block_ids(r2) == [0, 1, 2, 6, 4, 7, 8, 9]
    assert m.stats.evictions == 0
    assert [b.block_id for b in m.pool.free_queue] == [3, 5]
    assert m.pool.blocks[3].block_hash is not None and m.pool.blocks[5].block_hash is not None
    # One more block now really evicts the LRU cached block: 3 (then 5).
    r3 = KVRequest("r3", [999] * 3)
    assert ids(admit(m, r3)[0]) == [3] and m.stats.evictions == 1
    assert any(isinstance(e, PoolRemoved) for e in m.take_events())


def test_hashes_are_the_shared_contract_and_events_carry_them():
    m = KVCacheManager(8, 4, hash_algo="xxhash", hash_seed="0")
    tokens = list(range(10))
    req = KVRequest("a", list(tokens), salt="s")
    admit(m, req)
    expected = block_hashes(tokens, 4, algo="xxhash", seed="0", salt="s")
    assert req.block_hashes == expected
    assert m.take_events() == [PoolStored(1, expected, None, tokens[:8], "gpu")]
    with pytest.raises(ValueError, match="sha256_cbor"):
        KVCacheManager(8, 4, hash_algo="md5")
    with pytest.raises(ValueError):
        KVCacheManager(8, 0)


def test_last_token_is_never_served_from_cache():
    m = KVCacheManager(8, 4)
    admit(m, KVRequest("a", list(range(8))))
    same = KVRequest("b", list(range(8)))  # exactly 2 full blocks, both cached
    hits, n = m.get_computed_blocks(same)
    assert n == 4 and len(hits) == 1  # at most 7 tokens -> 1 block
    longer = KVRequest("c", list(range(9)))
    assert m.get_computed_blocks(longer)[1] == 8


def test_lookup_stops_at_the_first_miss():
    m = KVCacheManager(8, 4)
    a = KVRequest("a", list(range(13)))
    admit(m, a)
    m.free(a)
    b1 = m.pool.blocks[1]
    m.pool.free_queue.remove(b1)  # move block 1 to the head so the next pop evicts it
    m.pool.free_queue.appendleft(b1)
    admit(m, KVRequest("x", [77]))
    assert b1.block_hash is None and m.pool.blocks[2].block_hash is not None
    hits, n = m.get_computed_blocks(KVRequest("b", list(range(13))))
    assert ids(hits) == [0] and n == 4  # block 2 is cached but unreachable


def test_batch_mates_reuse_blocks_cached_at_admission():
    m = KVCacheManager(8, 4)
    a = KVRequest("a", list(range(9)))
    admit(m, a)  # same step, before any model run
    new, n = admit(m, KVRequest("b", list(range(9)) + [5]))
    assert n == 8 and m.get_block_ids(a)[:2] == [0, 1]
    assert [m.pool.blocks[i].ref_cnt for i in (0, 1)] == [2, 2]


def test_decode_filled_blocks_are_cached_and_reused():
    m = KVCacheManager(8, 4)
    a = KVRequest("a", [1, 2, 3, 4, 5])
    admit(m, a)
    m.take_events()
    for tok in (6, 7, 8):
        decode(m, a, tok)
    block1 = m.pool.blocks[m.get_block_ids(a)[1]]
    assert block1.token_ids == (5, 6, 7, 8)
    [ev] = m.take_events()
    assert ev.block_hashes == a.block_hashes[1:2] and ev.parent_hash == a.block_hashes[0]
    assert ev.token_ids == [5, 6, 7, 8]
    m.free(a)
    hits, n = m.get_computed_blocks(KVRequest("b", [1, 2, 3, 4, 5, 6, 7, 8, 9]))
    assert n == 8


def test_chunked_prefill_caches_each_chunk():
    m = KVCacheManager(8, 4)
    a = KVRequest("a", list(range(14)))
    new, _ = admit(m, a, chunk=6)
    assert len(new) == 2 and m.pool.num_cached_blocks == 1
    new = m.allocate_slots(a, 8)
    a.num_computed_tokens += 8
    assert len(new) == 2 and m.pool.num_cached_blocks == 3


def test_hash_collision_is_never_served(monkeypatch):
    # Every request's block i hashes to b"H<i>", whatever its tokens: all chains collide.
    def colliding(hashes, token_ids, block_size, **_):
        new = [b"H%d" % i for i in range(len(hashes), len(token_ids) // block_size)]
        hashes.extend(new)
        return new

    monkeypatch.setattr(manager_module, "extend_block_hashes", colliding)
    m = KVCacheManager(16, 4)
    a = KVRequest("a", [1, 1, 1, 1, 2, 2, 2, 2, 3])
    admit(m, a)
    b = KVRequest("b", [9, 9, 9, 9, 2, 2, 2, 2, 3])
    new, n = admit(m, b)
    assert n == 0 and ids(new) == [3, 4, 5]  # block 0's tokens differ: a miss despite the hash
    assert len(m.pool.cached[b"H0"]) == 2  # both kept under the one hash
    # c's block 0 matches b's; its block 1 has a's tokens and hash, but a's block 1 was
    # computed after other tokens ([1,1,1,1]) and b's block 1 is no longer cached.
    m.free(b)
    m.free(a)
    b_block1 = m.pool.blocks[4]  # b's blocks were 3 4 5
    m.pool.free_queue.remove(b_block1)
    m.pool.free_queue.appendleft(b_block1)
    admit(m, KVRequest("x", [0]))  # evicts b's block 1
    assert set(m.pool.cached[b"H1"]) == {1}
    hits, n = m.get_computed_blocks(KVRequest("c", [9, 9, 9, 9, 2, 2, 2, 2, 3]))
    assert ids(hits) == [3] and n == 4
    # And the genuine prefix still hits in full.
    hits, n = m.get_computed_blocks(KVRequest("d", [1, 1, 1, 1, 2, 2, 2, 2, 3]))
    assert ids(hits) == [0, 1] and n == 8


@pytest.mark.parametrize("kw_a, kw_b, shared", [
    ({"salt": "t1"}, {"salt": "t2"}, False),
    ({"salt": "t1"}, {}, False),
    ({"salt": "t1"}, {"salt": "t1"}, True),
    ({"lora": ("x", "/x")}, {"lora": ("y", "/y")}, False),
    ({"lora": ("x", "/x")}, {"lora": ("x", "/x")}, True),
    ({"mm": [("img1", 2, 3)]}, {"mm": [("img2", 2, 3)]}, False),
])
def test_extra_keys_isolate_caches(kw_a, kw_b, shared):
    m = KVCacheManager(16, 4)
    admit(m, KVRequest("a", list(range(13)), **kw_a))
    hits, n = m.get_computed_blocks(KVRequest("b", list(range(13)), **kw_b))
    assert n == (12 if shared else 0)


def test_salt_only_changes_block_0_input_but_isolates_the_whole_chain():
    m = KVCacheManager(16, 4)
    a = KVRequest("a", list(range(9)), salt="s")
    admit(m, a)
    assert m.pool.blocks[0].content.extra_keys == (("cache_salt", "s"),)
    assert m.pool.blocks[1].content.extra_keys is None
    assert m.get_computed_blocks(KVRequest("b", list(range(9))))[1] == 0


def test_allocate_none_leaves_the_pool_unchanged():
    m = KVCacheManager(5, 4)
    a = KVRequest("a", list(range(9)))
    admit(m, a)
    m.free(a)  # blocks 0 and 1 stay cached and free
    admit(m, KVRequest("y", [7]))  # holds block 2: 4 free blocks left
    # 17 tokens = 5 blocks: 2 hits + 3 new. 3 new blocks are free, but the 2 hits are free
    # blocks too and touching takes them off the queue: 5 > 4, so None.
    b = KVRequest("b", list(range(8)) + list(range(100, 109)))
    before = pool_state(m)
    new, n = admit(m, b)
    assert new is None and n == 8 and b.num_computed_tokens == 0
    assert pool_state(m) == before and m.get_block_ids(b) == []
    c = KVRequest("c", list(range(8)) + list(range(100, 107)))  # 15 tokens: 2 hits + 2 new
    new, n = admit(m, c)
    assert n == 8 and len(new) == 2 and m.num_free_blocks == 0
    # A running request that cannot grow: None, nothing changed.
    assert decode(m, c, 200) == []  # token 16 still fits in block 3
    before = pool_state(m)
    c.token_ids.append(201)
    assert m.allocate_slots(c, 1) is None and pool_state(m) == before
    assert (m.stats.requests, m.stats.queries) == (3, 25)  # a, y, c: b waited, not counted


def test_free_returns_blocks_in_reverse_and_unhashed_first():
    m = KVCacheManager(6, 4)
    a = KVRequest("a", list(range(10)))
    admit(m, a)
    m.free(a)
    assert [b.block_id for b in m.pool.free_queue] == [2, 3, 4, 5, 1, 0]
    m.free(a)  # unknown / already freed: no-op
    assert m.num_free_blocks == 6 and m.get_block_ids(a) == []


def test_reset_prefix_cache_refuses_while_blocks_are_in_use():
    m = KVCacheManager(6, 4)
    a = KVRequest("a", list(range(9)))
    admit(m, a)
    assert m.reset_prefix_cache() is False
    m.free(a)
    assert m.reset_prefix_cache() is True
    assert m.take_events()[-1] == PoolCleared(2)
    assert m.get_computed_blocks(KVRequest("b", list(range(9))))[1] == 0
    assert m.cached_block_hashes().block_hashes == []


def test_stats_count_tokens_and_preemptions_apart():
    m = KVCacheManager(8, 4)
    a = KVRequest("a", list(range(9)))
    admit(m, a)
    b = KVRequest("b", list(range(9)) + [1, 2, 3])
    admit(m, b)
    s = m.stats
    assert (s.requests, s.queries, s.hits) == (2, 21, 8)
    assert s.hit_rate == pytest.approx(8 / 21)
    assert (s.blocks_total, s.blocks_used, s.blocks_cached, s.blocks_free) == (8, 4, 3, 4)
    m.preempt(b)
    assert b.num_computed_tokens == 0 and b.num_preemptions == 1 and m.get_block_ids(b) == []
    _, n = admit(m, b)  # its own blocks are still cached
    assert n == 8
    s = m.stats
    assert (s.requests, s.queries, s.hits) == (2, 21, 8)
    assert (s.preempted_requests, s.preempted_queries, s.preempted_hits) == (1, 12, 8)
    assert KVCacheManager(2, 4).stats.hit_rate == 0.0


def test_sizing_helpers():
    m = KVCacheManager(10, 16)
    assert m.num_blocks_needed(1) == 1 and m.num_blocks_needed(16) == 1
    assert m.num_blocks_needed(17) == 2
    assert m.can_ever_fit(160) and not m.can_ever_fit(161)


def test_snapshot_has_tier_seq_and_every_cached_hash():
    m = KVCacheManager(8, 4, tier="cpu")
    a = KVRequest("a", list(range(9)))
    admit(m, a)
    snap = m.cached_block_hashes()
    assert snap.tier == "cpu" and snap.seq == 1 and snap.block_hashes == a.block_hashes


def test_caching_disabled():
    m = KVCacheManager(6, 4, enable_caching=False)
    a = KVRequest("a", list(range(9)))
    admit(m, a)
    m.free(a)
    assert m.get_computed_blocks(KVRequest("b", list(range(9)))) == ([], 0)
    assert m.take_events() == [] and m.pool.num_cached_blocks == 0


def test_inconsistent_calls_raise_without_changes():
    m = KVCacheManager(8, 4)
    a = KVRequest("a", list(range(9)))
    admit(m, a)
    m.free(a)
    b = KVRequest("b", list(range(9)))
    hits, n = m.get_computed_blocks(b)
    with pytest.raises(ValueError, match="tokens"):
        m.allocate_slots(b, 1, hits, n - 1)
    with pytest.raises(ValueError):
        m.allocate_slots(b, 1, (), 4)
    with pytest.raises(ValueError):
        m.allocate_slots(b, 0)
    # Allocating for someone else in between evicts the hits: refused, not corrupted.
    admit(m, KVRequest("x", [5] * 28))  # 7 blocks: the last one popped is hit block 1
    before = pool_state(m)
    with pytest.raises(ValueError, match="stale"):
        m.allocate_slots(b, 1, hits, n)
    assert pool_state(m) == before
    c = KVRequest("c", [5] * 28)
    c_hits, c_n = m.get_computed_blocks(c)
    with pytest.raises(ValueError, match="already has blocks"):
        m.allocate_slots(KVRequest("x", [5] * 28), 1, c_hits, c_n)


def test_duplicate_blocks_count_once_in_hashes_cached():
    m = KVCacheManager(16, 4)
    a, b = KVRequest("a", list(range(8))), KVRequest("b", list(range(8)))
    for r in (a, b):  # the same 8 tokens twice: block 1 is recomputed into a duplicate
        hits, n = m.get_computed_blocks(r)
        assert m.allocate_slots(r, r.num_tokens - n, hits, n) is not None
    st = m.stats
    assert st.blocks_cached == 3 and st.hashes_cached == 2
