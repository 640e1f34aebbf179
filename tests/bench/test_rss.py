"""``bench.rss``: per-process RSS trends of the soak (pure functions of samples)."""
from __future__ import annotations

import os

from bench.rss import FLAT_MIB_PER_MIN, rss_mib, slope_per_min, table, trends


def samples(series: dict[str, list[tuple[int, float]]], every_s: float = 30.0) -> list[dict]:
    """``{name: [(pid, MiB) per tick]}`` -> soak samples, one per ``every_s`` seconds."""
    ticks = max(len(v) for v in series.values())
    out = []
    for i in range(ticks):
        rows = {n: v[i] for n, v in series.items() if i < len(v)}
        out.append({"t": i * every_s, "rss_mib": {n: m for n, (_, m) in rows.items()},
                    "pid": {n: p for n, (p, _) in rows.items()}})
    return out


def test_a_plateau_is_flat_and_a_leak_is_not() -> None:
    # 20 minutes at 30 s: one fills a bounded memo for 8 minutes then stays, one leaks
    plateau = [(10, 70 + min(i, 16) * 1.5) for i in range(40)]
    leak = [(11, 400 + i * 1.0) for i in range(40)]           # 2 MiB/min
    rows = {r.name: r for r in trends(samples({"service-1": plateau, "worker-0": leak}), 60)}
    svc, wrk = rows["service-1"], rows["worker-0"]
    assert svc.first == 73.0 and svc.last == svc.max == 94.0 and svc.start_s == 60
    assert svc.early_rate > 2.0 and svc.late_rate == 0.0 and svc.verdict() == "flat"
    assert abs(wrk.late_rate - 2.0) < 1e-9 and wrk.verdict() == "STILL GROWING"
    text = table(list(rows.values()), 60)
    assert text[-1].startswith("RSS stopped growing: no") and "worker-0(11)" in text[-1]
    assert FLAT_MIB_PER_MIN < 2.0


def test_a_restarted_process_is_a_new_series_with_its_own_warmup() -> None:
    # service-0 restarted (new pid) at tick 10 with a lower RSS: not one falling series
    restarted = [(20, 90.0)] * 10 + [(21, 60.0 + i) for i in range(10)]
    rows = trends(samples({"service-0": restarted}), 60)
    assert [(r.pid, r.samples, r.start_s) for r in rows] == [(20, 8, 60), (21, 8, 360)]
    assert rows[1].first == 62.0 and rows[1].late_rate > FLAT_MIB_PER_MIN
    short = trends(samples({"w": [(30, 5.0)] * 4}), 60)
    assert short[0].verdict() == "too short to tell"
    assert "cannot tell" in table(short, 60)[-1]


def test_slope_and_rss_of_this_process() -> None:
    assert slope_per_min([(0, 1.0), (60, 3.0), (120, 5.0)]) == 2.0
    assert slope_per_min([(0, 1.0)]) == 0.0
    assert rss_mib(os.getpid()) > 1 and rss_mib(None) == 0.0
