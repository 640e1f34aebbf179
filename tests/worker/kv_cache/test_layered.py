"""Layered eviction: decode-generated blocks go before prefill-computed ones, unhashed blocks
before both, vLLM's order inside each class (the state machine in test_eviction_machine
checks the same rules on random sequences)."""
import pytest

from worker.kv_cache import KVCacheBlock, KVCacheManager, KVRequest, LayeredFreeQueue

BS = 2


def ids(blocks):
    return [b.block_id for b in blocks]


def cached(block_id, decoded):
    b = KVCacheBlock(block_id, block_hash=bytes([block_id]))
    b.decoded = decoded
    return b


def test_queue_classes_order_and_o1_remove():
    blocks = [KVCacheBlock(i) for i in range(3)]
    q = LayeredFreeQueue(blocks)
    assert ids(q) == [0, 1, 2] and len(q) == 3
    a, b, c = q.popleft_n(3)
    p1, d1, p2, d2 = cached(10, False), cached(11, True), cached(12, False), cached(13, True)
    q.append_n([p1, d1, p2, d2])
    q.appendleft(b)  # unhashed: before everything
    q.append(c)      # unhashed appended: still the first class, after the decoded blocks
    assert ids(q) == [1, 11, 13, 2, 10, 12]
    assert ids(q.layer(0)) == [1, 11, 13, 2] and ids(q.layer(1)) == [10, 12]
    q.check()
    p1.block_hash, p1.decoded = None, True  # uncached while free: remove still finds it
    q.remove(p1)
    q.appendleft(p1)
    assert ids(q) == [10, 1, 11, 13, 2, 12]
    assert ids(q.popleft_n(5)) == [10, 1, 11, 13, 2]
    assert q.popleft() is p2 and len(q) == 0
    with pytest.raises(ValueError):
        q.popleft()
    with pytest.raises(ValueError):
        q.popleft_n(1)
    q.check()


def run(m, rid, prompt, decode=()):
    """Prefill ``prompt``, decode ``decode`` one token at a time, free; return the table."""
    req = KVRequest(rid, list(prompt), num_prompt_tokens=len(prompt))
    hits, n = m.get_computed_blocks(req)
    m.allocate_slots(req, req.num_tokens - n, hits, n)
    req.num_computed_tokens = req.num_tokens
    for t in decode:
        req.token_ids.append(t)
        m.allocate_slots(req, 1)
        req.num_computed_tokens += 1
    table = m.get_block_ids(req)
    m.free(req)
    return table


@pytest.mark.parametrize("eviction", ["lru", "layered"])
def test_decode_blocks_are_evicted_before_prompt_blocks(eviction):
    m = KVCacheManager(12, BS, hash_algo="xxhash_cbor", eviction=eviction)
    # A: prompt blocks 0-1, then a block mixing prompt and output (2), one of output (3),
    # and an unfilled one (4). B the same shape, later.
    a = run(m, "a", [1, 2, 3, 4, 5], decode=[6, 7, 8, 9])
    b = run(m, "b", [11, 12, 13, 14, 15], decode=[16, 17, 18, 19])
    free = ids(m.pool.free_queue)
    assert b[0] == a[4]  # B reused A's unfilled block first
    assert free[:4] == [b[4], 9, 10, 11]  # unhashed first: B's unfilled, the unused ones
    if eviction == "lru":  # each request's blocks tail first, older request first
        assert free[4:] == [a[3], a[2], a[1], a[0], b[3], b[2], b[1], b[0]]
    else:  # output blocks (also the mixed ones) of both before any prompt block
        assert free[4:] == [a[3], a[2], b[3], b[2], a[1], a[0], b[1], b[0]]
    m.pool.free_queue.check()


def test_a_decoded_block_hit_by_a_later_prompt_becomes_a_prompt_block():
    m = KVCacheManager(12, BS, hash_algo="xxhash_cbor", eviction="layered")
    a = run(m, "a", [1, 2, 3], decode=[4, 5])  # block 1 = [3, 4]: decoded
    assert m.pool.blocks[a[1]].decoded and not m.pool.blocks[a[0]].decoded
    run(m, "b", [1, 2, 3, 4, 9])  # the next turn: its prompt holds A's output
    assert not m.pool.blocks[a[1]].decoded
    assert m.pool.blocks[a[1]].block_id in ids(m.pool.free_queue.layer(1))


def test_without_prompt_length_every_block_is_a_prompt_block():
    m = KVCacheManager(12, BS, hash_algo="xxhash_cbor", eviction="layered")
    req = KVRequest("r", [1, 2, 3, 4, 5])
    m.allocate_slots(req, 5)
    m.free(req)
    assert len(m.pool.free_queue.layer(1)) == 2


def test_unknown_eviction_is_refused():
    with pytest.raises(ValueError, match="eviction"):
        KVCacheManager(4, BS, eviction="fifo")


@pytest.mark.parametrize("cpu,disk", [(4, 0), (1, 4)])
def test_a_block_keeps_its_class_across_a_tier_round_trip(cpu, disk):
    """Eviction class survives tiers: a decode block of a preempted request, offloaded (to host
    memory,
    or on to disk) and onboarded back, is still a decode block: evicted first when freed,
    exactly as without tiers (the onboard's destination had the other class)."""

    def run(cpu_blocks, disk_blocks):
        m = KVCacheManager(4, BS, cpu_blocks=cpu_blocks, disk_blocks=disk_blocks,
                           eviction="layered")
        r = KVRequest("r", [1, 2, 3, 4, 5], num_prompt_tokens=3)  # block 1 = [3, 4]: decoded
        m.allocate_slots(r, 5)
        m.preempt(r)
        if cpu_blocks:
            # pressure: every block handed out, so both go down; the destinations the
            # onboard takes next hold the prefill class (stale: they are uncached)
            blocks = m.pool.get_new_blocks(m.pool.num_free_blocks)
            for b in blocks:
                b.decoded = False
            m.take_transfers()
            m.pool.free_blocks(blocks)
            if disk_blocks:  # more pressure: the CPU tier's one slot spills to disk
                lower = {e.block_hash for t in m.offloader.tiers for e in t}
                assert len(lower) == 2 and len(m.offloader.disk) == 1
        hits, n = m.get_computed_blocks(r)
        if m.start_onboard(r, hits):
            m.take_transfers()
            m.finish_onboard("r", True)
            hits, n = m.get_computed_blocks(r)
        assert n == 4
        m.allocate_slots(r, 1, hits, n)
        blocks = list(m._blocks["r"])
        m.free(r)
        return [(b.decoded, b.layer) for b in blocks[:2]]

    assert run(0, 0) == [(False, 1), (True, 0)]
    assert run(cpu, disk) == run(0, 0)
