"""worker/rpc/tenant_metrics.py: the per-tenant families on a real registry's page, the
label bound with many tenants, and counters that never go back as tenants move in and out
of the top."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvmesh.quota import OTHER
from worker.kv_cache.tenant_stats import TenantCounts, TenantTier
from worker.rpc.tenant_metrics import TenantSeries, read_racing, tenant_families

NAMES = {"kvmesh_worker_tenant_cached_blocks", "kvmesh_worker_tenant_quota_blocks",
         "kvmesh_worker_tenant_hit_blocks_total", "kvmesh_worker_tenant_evicted_blocks_total",
         "kvmesh_worker_tenant_requests_total", "kvmesh_worker_tenant_prompt_tokens_total",
         "kvmesh_worker_tenant_cached_tokens_total"}


def _counts(name: str, blocks: int, prompt: int = 10, hits: int = 1) -> TenantCounts:
    return TenantCounts(name, requests=1, prompt_tokens=prompt, cached_tokens=prompt // 2,
                        tiers={"gpu": TenantTier(blocks=blocks, quota_blocks=8,
                                                 hit_blocks=hits, evicted_blocks=hits)})


class _Page:
    """A registry scraping ``self.counts`` (replaced between scrapes by the test)."""

    def __init__(self, n: int = 8) -> None:
        self.counts: dict[str, TenantCounts] = {}
        self.series = TenantSeries(n)
        self.registry = CollectorRegistry()
        self.registry.register(self)

    def collect(self):
        return tenant_families(self.series, self.counts, ["gpu", "cpu"], "w1")

    def scrape(self) -> dict[tuple[str, str, str], float]:
        """(sample name, tenant, tier) -> value."""
        text = generate_latest(self.registry).decode()
        return {(s.name, s.labels["tenant"], s.labels.get("tier", "")): s.value
                for f in text_string_to_metric_families(text) for s in f.samples
                if not s.name.endswith("_created")}


def test_names_labels_and_values() -> None:
    page = _Page()
    page.counts = {"a": _counts("a", 5, prompt=40, hits=3)}
    got = page.scrape()
    assert {name for name, _, _ in got} == NAMES
    assert got["kvmesh_worker_tenant_cached_blocks", "a", "gpu"] == 5
    assert got["kvmesh_worker_tenant_cached_blocks", "a", "cpu"] == 0  # enabled, empty
    assert got["kvmesh_worker_tenant_quota_blocks", "a", "gpu"] == 8
    assert got["kvmesh_worker_tenant_hit_blocks_total", "a", "gpu"] == 3
    assert got["kvmesh_worker_tenant_evicted_blocks_total", "a", "gpu"] == 3
    assert got["kvmesh_worker_tenant_prompt_tokens_total", "a", ""] == 40
    assert got["kvmesh_worker_tenant_cached_tokens_total", "a", ""] == 20
    assert got["kvmesh_worker_tenant_requests_total", "a", ""] == 1
    text = generate_latest(page.registry).decode()
    assert 'worker_id="w1"' in text


def test_fifty_tenants_export_at_most_top_plus_other() -> None:
    page = _Page(n=8)
    page.counts = {f"t{i}": _counts(f"t{i}", i, prompt=10) for i in range(50)}
    got = page.scrape()
    tenants = {t for _, t, _ in got}
    assert tenants == {f"t{i}" for i in range(42, 50)} | {OTHER}
    assert got["kvmesh_worker_tenant_cached_blocks", OTHER, "gpu"] == sum(range(42))
    assert got["kvmesh_worker_tenant_prompt_tokens_total", OTHER, ""] == 420
    # every tenant's tokens are counted exactly once, labelled or not
    assert sum(v for (n, _, _), v in got.items()
               if n == "kvmesh_worker_tenant_prompt_tokens_total") == 500


def test_counters_stay_monotonic_as_tenants_move_in_and_out_of_the_top() -> None:
    page = _Page(n=1)
    page.counts = {"a": _counts("a", 9, prompt=100), "b": _counts("b", 1, prompt=10)}
    first = page.scrape()
    assert first["kvmesh_worker_tenant_prompt_tokens_total", "a", ""] == 100
    assert first["kvmesh_worker_tenant_prompt_tokens_total", OTHER, ""] == 10
    # b grows past a: b takes the label, a falls under (other) with what it does from now on
    page.counts = {"a": _counts("a", 1, prompt=130), "b": _counts("b", 20, prompt=50)}
    second = page.scrape()
    assert ("kvmesh_worker_tenant_prompt_tokens_total", "a", "") not in second
    assert second["kvmesh_worker_tenant_prompt_tokens_total", "b", ""] == 40  # since b's label
    assert second["kvmesh_worker_tenant_prompt_tokens_total", OTHER, ""] == 10 + 30
    # a comes back: its series resumes from its own total, (other) keeps what it had
    page.counts = {"a": _counts("a", 50, prompt=135), "b": _counts("b", 2, prompt=51)}
    third = page.scrape()
    assert third["kvmesh_worker_tenant_prompt_tokens_total", "a", ""] == 105
    assert third["kvmesh_worker_tenant_prompt_tokens_total", OTHER, ""] == 41
    for before, after in ((first, second), (second, third)):
        for key, value in after.items():
            if key[0].endswith("_total") and key in before:
                assert value >= before[key], key


def test_a_count_that_goes_down_credits_nothing_and_restarts_from_there() -> None:
    series = TenantSeries(n=8)
    series.update({"a": _counts("a", 1, prompt=50)})
    series.update({"a": _counts("a", 1, prompt=20)})  # a manager that forgot a
    ((_, totals),) = series.update({"a": _counts("a", 1, prompt=25)})
    assert totals["prompt_tokens", ""] == 55


def test_read_racing_retries_a_read_the_engine_thread_disturbed() -> None:
    calls = []

    def flaky() -> int:
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("dictionary changed size during iteration")
        return 7

    assert read_racing(flaky) == 7 and len(calls) == 3
