"""``python -m bench.bridge_ingest``: the load is bench.bridge_load's, every block of it is
ingested and removed, and ``--against`` measures another revision's code beside this one."""
from __future__ import annotations

import json
import subprocess
import sys

from bench.bridge_ingest import measure, payloads
from kvmesh import vllm_events as ve


def test_the_load_is_fresh_chains_and_their_removal_a_window_later() -> None:
    work = payloads(12, engines=2, blocks=4, block_size=4, window=3)
    assert [(i, seq) for i, seq, _ in work[:4]] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    batches = [ve.decode_batch(p) for _, _, p in work]
    first, seventh = batches[0].events, batches[6].events
    assert len(first) == 1 and len(first[0].token_ids) == 16
    assert first[0].parent_block_hash is None and first[0].medium == "GPU"
    assert seventh[1].block_hashes == first[0].block_hashes  # engine 0, 3 batches later
    row = measure(work, engines=2, block_size=4, per_request=2)
    assert row["stored_blocks"] == row["rehashed"] == 48
    assert row["removed_blocks"] == 6 * 4 and row["request_bytes"] > 48 * 32


def test_against_a_revision_runs_both_codes() -> None:
    out = subprocess.run([sys.executable, "-m", "bench.bridge_ingest", "--batches", "40",
                          "--repeat", "1", "--rounds", "1", "--against", "HEAD"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    before, after, summary = (json.loads(line) for line in out.splitlines())
    assert before["label"] == "before (HEAD)" and before["code"].endswith("src")
    assert after["code"] != before["code"] and after["stored_blocks"] == 640
    assert summary["before_blocks_per_cpu_s"] == before["blocks_per_cpu_s"]
