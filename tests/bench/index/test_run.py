"""`kvmesh bench index` at a tiny size, and the pieces it is built from."""
from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from bench import index as index_cmd
from bench.index import pipelined
from bench.index.data import Layout, plan
from bench.index.run import run
from service.index.base import BlockMatch
from service.index.testing import handle_bytes

TINY = Layout(workers=8, chain_blocks=16, holders=3, event_blocks=4, batch_events=4)


def test_plan_reaches_the_entry_count_with_shrinking_prefixes() -> None:
    data = plan(1000, TINY)
    assert [TINY.held(j) for j in range(3)] == [16, 11, 6]
    assert data.entries >= 1000 and data.entries - 1000 < TINY.entries_per_chain
    assert data.expected(0) == {"worker-000": 16, "worker-001": 11, "worker-002": 6}
    events = [ev for w in range(8) for b in data.batches(w) for ev in b]
    assert sum(len(ev.op.hashes) for ev in events) == data.entries
    first = data.batches(0)[0]
    assert [ev.seq for ev in first] == [1, 2, 3, 4]
    assert first[0].op.parent == b"" and first[1].op.parent == first[0].op.hashes[-1]


def test_walk_counts_consecutive_blocks_per_worker_and_tier() -> None:
    def v(**holders: int) -> bytes:  # a block value: sorted (handle, tier bits) entries
        live_of = {"a": 1, "b": 2, "c": 3, "z": 9}
        return b"".join(handle_bytes(live_of[w]) + bytes([m])
                        for w, m in sorted(holders.items(), key=lambda x: live_of[x[0]]))

    live = {1: "a", 2: "b", 3: "c"}  # z's handle 9 is not live: never counted
    values = [v(a=1, b=2, c=1, z=1), v(a=1, b=3, z=1), v(a=2), None, v(a=1)]
    assert pipelined.walk(values, live, None) == {
        "a": BlockMatch(3, 2, 1, 0), "b": BlockMatch(2, 1, 1, 0), "c": BlockMatch(1, 1, 0, 0)}
    assert pipelined.walk(values, live, {"b"}) == {"b": BlockMatch(2, 1, 1, 0)}
    assert pipelined.walk([None, v(a=1)], live, None) == {}


@pytest.mark.integration
def test_index_bench_lookups_agree_on_real_redis() -> None:
    res = run(entries=2000, layout=TINY, queries=20, tail_blocks=2)
    assert res["identical"] and res["correct"] and res["correct_after_evictions"]
    assert res["entries"] >= 2000 and res["events"] > 0 and res["events_per_s"] > 0
    assert res["bytes_per_entry"] > 0 and res["block_keys_bytes_per_entry"] > 0
    assert res["query_blocks"] == 18
    for kind in ("kvmesh", "pipelined", "per_tag"):
        for k in ("p50_ms", "p99_ms", "server_us", "cpu_us"):
            assert res[f"{kind}_{k}"] > 0, (kind, k)
    assert res["lookup_server_us_per_block"] > 0 and res["apply_server_us_per_entry"] > 0


@pytest.mark.integration
def test_index_command_prints_json() -> None:
    app = typer.Typer()
    index_cmd.register(app)
    app.command("noop")(lambda: None)  # a second command keeps "index" a subcommand
    out = CliRunner().invoke(app, ["index", "--entries", "500", "--workers", "4",
                                   "--chain-blocks", "8", "--holders", "2", "--queries", "5",
                                   "--json"])
    assert out.exit_code == 0, out.output
    res = json.loads(out.output.strip().splitlines()[-1])
    assert res["identical"] and res["workers"] == 4
