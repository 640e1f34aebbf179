"""kvmesh bench fleet --shards 1,3: the ratios the issue names, from the runs' per-shard
figures (medians over repeated shard counts), and the command's JSON line."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from bench.fleet.compare import compare


def _run(shards: int, entry: list[float], route: list[float], service_route: float,
         ctl: int = 0, entries: int = 1000, batches: int = 10) -> dict:
    return {"config": {"shards": shards}, "usec_per_entry": entry, "usec_per_route": route,
            "cpu_usec_per_entry": [2 * x for x in entry], "cpu_usec_per_route": route,
            "service_usec_per_route": service_route, "service_usec_per_entry": 5.0,
            "control_shard": ctl,
            "phases": [{"phase": "events", "entries": entries, "batches": batches}]}


def test_the_busiest_shard_is_set_against_the_whole_single_server() -> None:
    runs = [_run(1, [3.0], [300.0], 1500.0), _run(3, [1.0, 1.2, 1.5], [100.0, 90.0, 80.0],
                                                   1800.0, ctl=2),
            _run(1, [5.0], [500.0], 2500.0), _run(3, [1.0, 1.0, 2.0], [120.0, 90.0, 80.0],
                                                   2000.0, ctl=2),
            _run(1, [4.0], [400.0], 2000.0)]
    c = compare(runs)
    assert c["base_shards"] == 1 and c["shards"] == 3
    # medians: single 4.0 us per entry, 400 us per route, 2000 us of service CPU; three
    # shards' busiest 1.75 us per entry, 110 us per route, 1900 us of service CPU
    assert c["busiest_shard_apply_ratio"] == pytest.approx(1.75 / 4.0)
    assert c["busiest_shard_lookup_ratio"] == pytest.approx(110 / 400)
    assert c["route_cpu_ratio"] == pytest.approx(1900 / 2000)
    assert c["total_apply_ratio"] == pytest.approx(3.85 / 4.0)
    assert c["busiest_shard_apply_cpu_ratio"] == pytest.approx(3.5 / 8.0)
    # the control shard's time beyond the others' mean, per batch of 100 entries
    assert c["summary"]["3"]["control_usec_per_batch"] == pytest.approx(
        ((1.5 - 1.1) * 100 + (2.0 - 1.0) * 100) / 2)
    assert c["summary"]["1"]["control_usec_per_batch"] == 0
    json.dumps(c)


def test_a_bad_shard_list_is_refused_before_anything_starts() -> None:
    from client.cli import app

    res = CliRunner().invoke(app, ["bench", "fleet", "--shards", "1,x"])
    assert res.exit_code == 2 and "shard counts" in res.output
    res = CliRunner().invoke(app, ["bench", "fleet", "--shards", "0"])
    assert res.exit_code == 2
