"""worker/kv_cache/quota_queue.py through the manager: which block quotas make the pool hand
out next, and what they never take."""
from __future__ import annotations

import pytest

from kvmesh.quota import Quota, Quotas
from worker.kv_cache import KVCacheManager, KVRequest

BS = 2


def run(m: KVCacheManager, rid: str, tokens: list[int], tenant: str, free: bool = True,
        prompt: int | None = None) -> tuple[KVRequest, list[int]]:
    """Admit and compute ``tokens`` for ``tenant``; the ids of the new blocks it got."""
    req = KVRequest(rid, list(tokens), tenant=tenant, num_prompt_tokens=prompt)
    hits, n = m.get_computed_blocks(req)
    new = m.allocate_slots(req, req.num_tokens - n, hits, n)
    assert new is not None  # quotas steer eviction; they never refuse an allocation
    req.num_computed_tokens = req.num_tokens
    if free:
        m.free(req)
    return req, [b.block_id for b in new]


def check_lists(m: KVCacheManager) -> None:
    """Each tenant's list is exactly its free cached blocks, in the free queue's order."""
    quota = m.pool.quota
    if quota is None:
        return
    free = [b for b in m.pool.free_queue if b.block_hash is not None]
    for tenant in {b.owner for b in m.pool.blocks} | set(quota._lists):
        assert list(quota.listed(tenant)) == [b for b in free if b.owner == tenant]


def two_tenants(quotas: Quotas, **kw) -> KVCacheManager:
    """8 blocks: a caches blocks 0, 1, then b caches 2, 3; blocks 4-7 hold nothing. The free
    queue is 4 5 6 7 | 1 0 (a's, tail first) | 3 2 (b's)."""
    m = KVCacheManager(8, BS, **kw)
    run(m, "a", [1, 2, 3, 4, 5], "a")
    run(m, "b", [11, 12, 13, 14, 15], "b")
    m.set_quotas(quotas)
    assert [b.block_id for b in m.pool.free_queue] == [4, 5, 6, 7, 1, 0, 3, 2]
    check_lists(m)
    return m


def test_without_quotas_the_order_is_lru_and_there_are_no_lists():
    m = two_tenants(Quotas())
    assert m.pool.quota is None
    assert run(m, "c", [30] * 11, "c")[1] == [4, 5, 6, 7, 1, 0]


def test_blocks_holding_nothing_go_first_then_the_over_quota_tenants_lru():
    m = two_tenants(Quotas(tenants={"b": Quota(gpu=0.125)}))  # b: 1 block, holds 2
    assert list(m.pool.ledger.over) == ["b"]
    # 4 empty blocks, then b's least recently used (3: its chain's tail), then b is at its
    # quota and the ordinary order resumes with a's.
    assert run(m, "c", [30] * 13, "c", free=False)[1] == [4, 5, 6, 7, 3, 1, 0]
    stats = m.tenant_stats()
    assert stats["b"].tiers["gpu"].evicted_blocks == 1
    assert stats["b"].tiers["gpu"].blocks == 1 == stats["b"].tiers["gpu"].quota_blocks
    check_lists(m)


def test_the_tenant_most_over_its_quota_goes_first_ties_by_name():
    m = two_tenants(Quotas(Quota(gpu=0.0)))  # everybody: 0 blocks; a and b both over by 2
    assert run(m, "c", [30] * 13, "c")[1] == [4, 5, 6, 7, 1, 3, 0]  # a, b, then a: by excess
    m = two_tenants(Quotas(Quota(gpu=0.0), {"b": Quota(gpu=1.0)}))
    assert run(m, "c", [30] * 11, "c")[1] == [4, 5, 6, 7, 1, 0]  # only a is over


def test_a_tenant_at_its_quota_evicts_its_own_blocks_first_and_still_runs():
    m = two_tenants(Quotas(tenants={"b": Quota(gpu=0.25)}))  # b: 2 blocks, holds 2
    assert m.pool.ledger.over == {} and m.pool.ledger.at_limit("b")
    _, new = run(m, "b2", [21] * 11, "b", free=False)
    assert new == [4, 5, 6, 7, 3, 2]  # b's own go before a's, which are older
    assert m.tenant_stats()["b"].tiers["gpu"].blocks == 5  # over now, while it runs
    check_lists(m)


def test_referenced_and_pinned_blocks_of_an_over_quota_tenant_are_never_taken():
    m = KVCacheManager(8, BS)
    run(m, "a", [1, 2, 3, 4, 5], "a")
    b, _ = run(m, "b", [11, 12, 13, 14, 15], "b", free=False)  # b still runs
    m.set_quotas(Quotas(tenants={"b": Quota(gpu=0.0)}))
    assert list(m.pool.ledger.over) == ["b"]
    assert run(m, "c", [30] * 9, "c", free=False)[1] == [5, 6, 7, 1, 0]  # a's: b's are held
    m.free(b)
    m.pin(b.block_hashes[:1], ttl_s=60)  # b's block 0 (block 2) is pinned
    _, new = run(m, "d", [40] * 3, "d")
    assert new == [4, 3]  # b's unpinned block; its pinned one stays
    assert m.pool.blocks[2].block_hash == b.block_hashes[0]
    check_lists(m)


def test_quotas_changed_at_run_time_take_effect_at_the_next_eviction():
    m = two_tenants(Quotas())
    assert run(m, "c", [30] * 7, "c")[1] == [4, 5, 6, 7]  # no eviction yet
    # Free queue now: 7 (empty) | 1 0 (a) | 3 2 (b) | 6 5 4 (c).
    m.set_quotas(Quotas(tenants={"b": Quota(gpu=0.125)}))
    assert m.pool.quota is not None
    check_lists(m)
    assert run(m, "d", [40] * 5, "d")[1] == [7, 3, 1]  # plain LRU: [7, 1, 0]
    m.set_quotas(Quotas())  # cleared: the lists go, the plain order is back
    assert m.pool.quota is None and all(b.prev_owned is None for b in m.pool.blocks)
    assert run(m, "e", [50] * 5, "e")[1] == [1, 0, 2]


def test_layered_with_quotas_takes_over_quota_tenants_blocks_in_their_class_order():
    m = KVCacheManager(8, BS, eviction="layered")
    run(m, "a", [1, 2, 3, 4, 5, 6, 7], "a", prompt=3)  # a0 prefill; a1, a2 decoded
    run(m, "b", [11, 12, 13, 14, 15], "b")  # b0, b1 prefill
    queue = m.pool.free_queue
    assert [b.block_id for b in queue.layer(0)] == [5, 6, 7, 2, 1]  # empty, then a2, a1
    assert [b.block_id for b in queue.layer(1)] == [0, 4, 3]
    m.set_quotas(Quotas(tenants={"b": Quota(gpu=0.0), "a": Quota(gpu=0.25)}))
    check_lists(m)
    _, new = run(m, "c", [30] * 11, "c", free=False)
    # Empty blocks first; then b (over by 2: its prefill block 4 although a's decoded ones
    # come first in the layered order), a and b tied at 1 (a by name: its decoded 2), b.
    assert new == [5, 6, 7, 4, 2, 3]  # plain layered: [5, 6, 7, 2, 1, 0]
    check_lists(m)


@pytest.mark.parametrize("eviction", ["lru", "layered"])
def test_a_reset_and_duplicates_keep_the_lists_in_step(eviction):
    m = KVCacheManager(8, BS, eviction=eviction)
    m.set_quotas(Quotas(Quota(gpu=0.25)))
    x = KVRequest("x", [1, 2, 3, 4, 5], tenant="a")
    y = KVRequest("y", [1, 2, 3, 4, 5], tenant="b")
    for req in (x, y):
        m.get_computed_blocks(req)
    for req in (x, y):
        m.allocate_slots(req, 5)
    m.free(x)
    m.free(y)
    check_lists(m)
    assert m.reset_prefix_cache()
    assert m.tenant_stats()["a"].tiers["gpu"].blocks == 0 and m.pool.ledger.over == {}
    check_lists(m)
