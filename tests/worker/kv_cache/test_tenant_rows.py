"""worker/kv_cache/tenant_rows.py: the Stats rows keep the top-N bound and give every tenant
one row per enabled tier, fastest first."""
from __future__ import annotations

from kvmesh.quota import OTHER
from worker.kv_cache.tenant_rows import enabled, tenant_rows
from worker.kv_cache.tenant_stats import TenantCounts, TenantTier


def _counts(name: str, gpu: int, cpu: int = 0, prompt: int = 100) -> TenantCounts:
    tiers = {"gpu": TenantTier(blocks=gpu, quota_blocks=10, hit_blocks=2, evicted_blocks=1)}
    if cpu:
        tiers["cpu"] = TenantTier(blocks=cpu, hit_blocks=3)
    return TenantCounts(name, requests=2, prompt_tokens=prompt, cached_tokens=prompt // 4,
                        tiers=tiers)


def test_enabled_tiers_come_fastest_first() -> None:
    assert enabled({"disk": 1, "gpu": 2, "cpu": 3}) == ["gpu", "cpu", "disk"]
    assert enabled(["cpu", "bogus"]) == ["cpu"]


def test_rows_carry_the_counts_and_one_tier_row_per_enabled_tier() -> None:
    (row,) = tenant_rows({"a": _counts("a", 4)}, ["cpu", "gpu"])
    assert (row.tenant, row.requests, row.prompt_tokens, row.cached_tokens) == ("a", 2, 100, 25)
    assert [t.tier for t in row.tiers] == ["gpu", "cpu"]
    gpu, cpu = row.tiers
    assert (gpu.blocks, gpu.quota_blocks, gpu.hit_blocks, gpu.evicted_blocks) == (4, 10, 2, 1)
    assert (cpu.blocks, cpu.quota_blocks, cpu.hit_blocks, cpu.evicted_blocks) == (0, 0, 0, 0)


def test_counts_of_a_tier_not_enabled_are_left_out() -> None:
    (row,) = tenant_rows({"a": _counts("a", 4, cpu=7)}, ["gpu"])
    assert [t.tier for t in row.tiers] == ["gpu"]


def test_the_largest_are_kept_and_the_rest_summed_as_other() -> None:
    src = {f"t{i:02}": _counts(f"t{i:02}", gpu=i) for i in range(50)}
    rows = tenant_rows(src, ["gpu"], n=8)
    assert [r.tenant for r in rows] == [f"t{i:02}" for i in range(49, 41, -1)] + [OTHER]
    other = rows[-1]
    assert other.requests == 2 * 42 and other.prompt_tokens == 4200
    assert other.tiers[0].blocks == sum(range(42)) and other.tiers[0].evicted_blocks == 42
    assert src["t00"].requests == 2  # the inputs are not changed


def test_no_tenants_no_rows() -> None:
    assert tenant_rows({}, ["gpu", "cpu"]) == []
