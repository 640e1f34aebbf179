"""`kvmesh stats --tenants`' table: tenants summed over the workers that report them."""
from __future__ import annotations

from io import StringIO

from rich.console import Console

from client.commands import print_stats
from client.tenant_stats import tenant_cells, tenant_table, tenant_totals
from kvmesh.quota import OTHER


def _tenant(name: str, requests: int, prompt: int, cached: int,
            **tiers: tuple[int, int, int]) -> dict[str, object]:
    """A ``TenantStats`` dict; ``tiers``: tier -> (blocks, quota_blocks, evicted_blocks)."""
    return {"tenant": name, "requests": requests, "prompt_tokens": prompt,
            "cached_tokens": cached,
            "tiers": [{"tier": t, "blocks": b, "quota_blocks": q, "hit_blocks": 0,
                       "evicted_blocks": e} for t, (b, q, e) in tiers.items()]}


def _workers() -> list[dict[str, object]]:
    return [
        {"worker_id": "w1", "worker_stats": {"tenants": [
            _tenant("a", 3, 300, 150, gpu=(10, 16, 2), cpu=(4, 0, 1)),
            _tenant(OTHER, 9, 900, 0, gpu=(50, 0, 0), cpu=(0, 0, 0))]}},
        {"worker_id": "w2", "worker_stats": {"tenants": [
            _tenant("a", 1, 100, 100, gpu=(6, 16, 0)),
            _tenant("b", 2, 200, 20, gpu=(20, 0, 5))]}},
        {"worker_id": "old", "worker_stats": {"cache": {}}},  # predates tenants
        {"worker_id": "down", "worker_stats": None},
    ]


def test_totals_sum_each_tenant_over_the_workers_other_last() -> None:
    rows = tenant_totals(_workers())
    assert [r["tenant"] for r in rows] == ["b", "a", OTHER]  # gpu blocks 20, 16; other last
    a = rows[1]
    assert (a["workers"], a["requests"], a["prompt_tokens"], a["cached_tokens"]) == (
        2, 4, 400, 250)
    assert a["tiers"]["gpu"] == {"blocks": 16, "quota_blocks": 32, "hit_blocks": 0,
                                 "evicted_blocks": 2}
    assert a["tiers"]["cpu"]["blocks"] == 4 and "cpu" not in rows[0]["tiers"]


def test_cells_show_hit_rate_blocks_against_quota_and_evictions() -> None:
    b, a, other = map(tenant_cells, tenant_totals(_workers()))
    assert a == ["a", "4", "400", "62.5%", "16 / 32", "4", "-", "3"]
    assert b == ["b", "2", "200", "10.0%", "20", "-", "-", "5"]  # no quota: the blocks alone
    assert other[:4] == [OTHER, "9", "900", "0.0%"]


def test_no_tenants_reported_is_an_empty_table_that_says_so() -> None:
    assert tenant_totals([{"worker_id": "old", "worker_stats": {}}]) == []
    table = tenant_table([])
    assert table.row_count == 0 and "no worker reported tenants" in table.caption


def test_print_stats_shows_the_tenants_wide_and_narrow() -> None:
    workers = [{**w, "address": "127.0.0.1:1", "alive": True} for w in _workers()]
    data = {"service": "s", "counters": {}, "workers": workers,
            "tenants": tenant_totals(workers)}
    for width in (200, 80):
        out = StringIO()
        print_stats(data, Console(file=out, width=width))
        text = out.getvalue()
        assert "Tenants (summed over workers)" in text and "…" not in text
        assert "16 / 32" in text and "62.5%" in text
        assert max(map(len, text.splitlines())) <= width
