"""worker/kv_cache/tenants.py: owners, counts per tier, quotas in blocks, the over-quota set,
and the manager's tenant_stats built from them."""
from __future__ import annotations

from kvmesh.quota import Quota, Quotas
from worker.kv_cache import KVCacheManager, KVRequest
from worker.kv_cache.tenants import TenantLedger, TierLedger

BS = 2


def run(m: KVCacheManager, rid: str, tokens: list[int], tenant: str, free: bool = True):
    """Admit ``tokens`` for ``tenant``, compute them all, free (unless told not to)."""
    req = KVRequest(rid, list(tokens), tenant=tenant)
    hits, n = m.get_computed_blocks(req)
    assert m.allocate_slots(req, req.num_tokens - n, hits, n) is not None
    req.num_computed_tokens = req.num_tokens
    if free:
        m.free(req)
    return req


def test_quota_blocks_floor_the_fraction_and_none_is_no_quota():
    ledger = TierLedger("gpu", 100)
    ledger.set_quotas(Quotas(Quota(gpu=0.29), {"big": Quota(gpu=0.5), "cpuonly": Quota(cpu=1)}))
    assert ledger.limit("anyone") == 29  # 0.29 * 100 is 28.999... in floats
    assert ledger.limit("big") == 50 and ledger.limit("cpuonly") == 29  # gpu from the default
    ledger.set_quotas(Quotas(tenants={"t": Quota(gpu=0.015)}))
    assert ledger.limit("t") == 1 and ledger.limit("other") is None
    assert not ledger.at_limit("other")


def test_the_over_set_follows_every_charge_and_quota_change():
    ledger = TierLedger("gpu", 10)
    for _ in range(4):
        ledger.charge("a")
    ledger.charge("b")
    assert ledger.over == {} and not ledger.limited
    ledger.set_quotas(Quotas(Quota(gpu=0.3)))  # 3 blocks each
    assert list(ledger.over) == ["a"] and ledger.excess("a") == 1
    assert ledger.at_limit("a") and not ledger.at_limit("b")
    ledger.uncharge("a")
    assert ledger.over == {} and ledger.at_limit("a")
    for _ in range(3):
        ledger.charge("b")
    assert list(ledger.over) == ["b"]
    ledger.set_quotas(Quotas())
    assert ledger.over == {} and not ledger.at_limit("b")
    ledger.clear()
    assert ledger.blocks == {"a": 0, "b": 0}


def test_a_block_is_charged_to_the_first_tenant_and_a_hit_does_not_recharge_it():
    m = KVCacheManager(16, BS)
    run(m, "r1", [1, 2, 3, 4, 5, 6, 7], "a")  # 3 full blocks cached by a
    run(m, "r2", [1, 2, 3, 4, 5, 6, 8, 9, 10], "b")  # hits a's 3, caches 1 more
    stats = m.tenant_stats()
    assert stats["a"].tiers["gpu"].blocks == 3 and stats["b"].tiers["gpu"].blocks == 1
    assert stats["b"].tiers["gpu"].hit_blocks == 3 and stats["a"].tiers["gpu"].hit_blocks == 0
    assert (stats["b"].requests, stats["b"].prompt_tokens, stats["b"].cached_tokens) == (1, 9, 6)
    assert [b.owner for b in m.pool.blocks if b.block_hash is not None] == ["a"] * 3 + ["b"]


def test_duplicate_blocks_are_physical_blocks_and_each_is_charged():
    m = KVCacheManager(16, BS)
    x = KVRequest("x", [1, 2, 3, 4, 5], tenant="a")
    y = KVRequest("y", [1, 2, 3, 4, 5], tenant="b")
    for req in (x, y):  # both looked up before either is cached: the same step's batch
        assert m.get_computed_blocks(req) == ([], 0)
    for req in (x, y):
        m.allocate_slots(req, 5)
    assert m.pool.num_cached_blocks == 4 and len(m.pool.cached) == 2
    stats = m.tenant_stats()
    assert stats["a"].tiers["gpu"].blocks == stats["b"].tiers["gpu"].blocks == 2


def test_counts_follow_evictions_and_a_tenant_is_kept_after_its_blocks_are_gone():
    m = KVCacheManager(4, BS)
    run(m, "r1", [1, 2, 3, 4, 5], "a")  # 2 cached blocks
    run(m, "r2", [9] * 7, "b")  # needs all 4 blocks: a's two are evicted
    stats = m.tenant_stats()
    assert stats["a"].tiers["gpu"].blocks == 0 and stats["a"].tiers["gpu"].evicted_blocks == 2
    assert stats["a"].requests == 1 and stats["b"].tiers["gpu"].blocks == 3
    assert set(stats) == {"a", "b"} and list(stats["a"].tiers) == ["gpu"]
    assert m.reset_prefix_cache()
    after = m.tenant_stats()
    assert after["b"].tiers["gpu"].blocks == 0 and after["b"].requests == 1


def test_quota_blocks_are_reported_and_preempted_readmissions_are_not_counted():
    m = KVCacheManager(10, BS)
    m.set_quotas(Quotas(tenants={"a": Quota(gpu=0.25)}))
    req = run(m, "r1", [1, 2, 3, 4, 5], "a", free=False)
    m.preempt(req)
    hits, n = m.get_computed_blocks(req)
    m.allocate_slots(req, req.num_tokens - n, hits, n)
    stats = m.tenant_stats()
    assert stats["a"].tiers["gpu"].quota_blocks == 2 and stats["a"].requests == 1
    assert stats["a"].prompt_tokens == 5 and stats["a"].cached_tokens == 0


def test_lower_tiers_have_rows_and_the_ledger_spans_them():
    m = KVCacheManager(4, BS, cpu_blocks=4, disk_blocks=2)
    run(m, "r1", [1, 2, 3], "a")
    assert list(m.tenant_stats()["a"].tiers) == ["gpu", "cpu", "disk"]
    ledger = TenantLedger([TierLedger("cpu", 8)])  # a CPU pool: its hits are "gpu" ones
    ledger.admitted("t", 10, {"gpu": 4, "peer": 2}, BS)
    row = ledger.stats()["t"]
    assert row.tiers["cpu"].hit_blocks == 2 and row.cached_tokens == 6
