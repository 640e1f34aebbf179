"""``python -m bench.bridge.ingest``: the load is bench.bridge.load's, every block of it is
ingested and removed, and ``--against`` measures another revision's code beside this one."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.bridge.ingest import measure, payloads
from kvmesh.events import vllm as ve


def test_the_load_is_engine_steps_of_fresh_chains_and_their_removal_a_window_later() -> None:
    work = payloads(12, engines=2, blocks=5, block_size=4, window=3, requests=2)
    assert [(i, seq) for i, seq, _ in work[:4]] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    batches = [ve.decode_batch(p) for _, _, p in work]
    first, seventh = batches[0].events, batches[6].events
    # one BlockStored per request of the step: chains of 3 and 2 blocks
    assert [len(e.block_hashes) for e in first] == [3, 2]
    assert [len(e.token_ids) for e in first] == [12, 8]
    assert all(e.parent_block_hash is None and e.medium == "GPU" for e in first)
    # engine 0, 3 batches later: its first batch evicted one block an event, tails first
    removed = [e.block_hashes for e in seventh if isinstance(e, ve.VllmRemoved)]
    a, b = first[0].block_hashes, first[1].block_hashes
    assert removed == [[h] for h in [*reversed(a), *reversed(b)]]
    row = measure(work, engines=2, block_size=4, per_request=2)
    assert row["stored_blocks"] == row["rehashed"] == 60
    assert row["removed_blocks"] == 6 * 5 and row["request_bytes"] > 60 * 32


def test_bulk_removals_are_one_event_a_batch() -> None:
    work = payloads(8, engines=1, blocks=4, block_size=4, window=2, bulk_removals=True)
    first, third = (ve.decode_batch(work[i][2]).events for i in (0, 2))
    assert third[-1].block_hashes == [h for e in first for h in e.block_hashes]
    assert measure(work, engines=1, block_size=4, per_request=1)["removed_blocks"] == 6 * 4


@pytest.mark.integration
def test_against_a_revision_runs_both_codes() -> None:
    out = subprocess.run([sys.executable, "-m", "bench.bridge.ingest", "--batches", "40",
                          "--repeat", "1", "--rounds", "1", "--against", "HEAD"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    before, after, summary = (json.loads(line) for line in out.splitlines())
    assert before["label"] == "before (HEAD)" and before["code"].endswith("src")
    assert after["code"] != before["code"] and after["stored_blocks"] == 40 * 128
    assert summary["before_blocks_per_cpu_s"] == before["blocks_per_cpu_s"]
