"""`kvmesh stats`'s KV tier table: the figures each tier row shows, rates over a window."""
from __future__ import annotations

from io import StringIO

from rich.console import Console

from client.commands import print_stats
from client.tier_stats import tier_rows


def _tier(tier: str, **kw: float) -> dict[str, object]:
    base = {"tier": tier, "capacity_blocks": 100, "cached_blocks": 25, "hit_tokens": 0,
            "evictions": 0, "offloads": 0, "onboard_blocks": 0, "onboard_bytes": 0,
            "onboard_seconds": 0.0, "index_promised_tokens": 0, "index_missed_tokens": 0}
    return {**base, **kw}


def _stats(tiers: list[dict[str, object]]) -> dict[str, object]:
    return {"cache": {"queries": 1000, "cached_blocks": 25, "hit_rate": 0.7}, "tiers": tiers,
            "pinned_blocks": 3,
            "mean_matched_tokens": 48.0}


def test_rows_show_load_factor_hit_rate_onboards_and_precision() -> None:
    stats = _stats([_tier("gpu", hit_tokens=500, evictions=7),
                    _tier("cpu", capacity_blocks=400, cached_blocks=100, hit_tokens=200,
                          offloads=9, onboard_blocks=4, onboard_bytes=4 << 20,
                          onboard_seconds=0.002, index_promised_tokens=64,
                          index_missed_tokens=16)])
    gpu, cpu = tier_rows("w1", stats)
    assert gpu == ["w1", "gpu", "25/100 (25%)", "50.0%", "7", "0", "-", "-"]
    assert cpu[:6] == ["w1", "cpu", "100/400 (25%)", "20.0%", "0", "9"]
    assert cpu[6] == "4 (4.0 MiB, 0.500 ms/blk)"
    assert cpu[7] == "75.0% of 64"


def test_rates_over_a_window() -> None:
    before = _stats([_tier("cpu", evictions=10, offloads=100)])
    now = _stats([_tier("cpu", evictions=30, offloads=150)])
    (row,) = tier_rows("w1", now, before, window_s=2.0)
    assert row[4:6] == ["10.0/s", "25.0/s"]


def test_print_stats_shows_the_tier_table_wide_and_narrow() -> None:
    data = {"service": "s", "counters": {}, "workers": [
        {"worker_id": "w1", "address": "127.0.0.1:5000", "alive": True,
         "worker_stats": _stats([_tier("gpu"), _tier("cpu", offloads=9)])},
        {"worker_id": "w2", "address": "127.0.0.1:5001", "alive": False,
         "worker_stats": None}]}
    for width in (220, 80):
        out = StringIO()
        print_stats(data, Console(file=out, width=width))
        text = out.getvalue()
        assert "KV tiers" in text and "…" not in text
        assert "3 pinned blocks" in text and "mean matched prefix 48 tokens" in text
        assert max(map(len, text.splitlines())) <= width


def test_no_tier_table_without_tiers() -> None:
    out = StringIO()
    data = {"service": "s", "counters": {}, "workers": [
        {"worker_id": "w1", "address": "a", "alive": True,
         "worker_stats": {"cache": {"cached_blocks": 1, "hit_rate": 0.0}}}]}
    print_stats(data, Console(file=out, width=200))
    assert "KV tiers" not in out.getvalue()
