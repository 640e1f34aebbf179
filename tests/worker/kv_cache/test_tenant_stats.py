"""worker/kv_cache/tenant_stats.py: the cardinality bound keeps the largest tenants and sums
the rest, without changing the inputs."""
from __future__ import annotations

from kvmesh.quota import OTHER
from worker.kv_cache.tenant_stats import TenantCounts, TenantTier, top_tenants


def counts(name: str, blocks: int, prompt: int = 0) -> TenantCounts:
    return TenantCounts(name, requests=1, prompt_tokens=prompt, cached_tokens=prompt // 2,
                        tiers={"gpu": TenantTier(blocks=blocks, hit_blocks=1)})


def test_few_tenants_are_all_kept_largest_first():
    rows = top_tenants([counts("b", 1), counts("a", 5), counts("c", 1, prompt=9)], n=3)
    assert [r.tenant for r in rows] == ["a", "c", "b"]


def test_the_rest_is_summed_under_other():
    src = {f"t{i}": counts(f"t{i}", i, prompt=10) for i in range(12)}
    rows = top_tenants(src, n=4)
    assert [r.tenant for r in rows] == ["t11", "t10", "t9", "t8", OTHER]
    other = rows[-1]
    assert other.requests == 8 and other.prompt_tokens == 80 and other.cached_tokens == 40
    assert other.tiers["gpu"].blocks == sum(range(8)) and other.tiers["gpu"].hit_blocks == 8
    assert src["t0"].tiers["gpu"].blocks == 0 and src["t1"].requests == 1  # inputs unchanged
    assert other.hit_rate == 0.5
