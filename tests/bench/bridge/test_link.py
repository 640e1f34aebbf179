"""``python -m bench.bridge.link``: every batch of the load travels through real links to a
real service by ``PublishEvents`` (none shed, none resynced away), and the CPU is split."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.integration
def test_every_event_reaches_the_index_by_publish() -> None:
    out = subprocess.run([sys.executable, "-m", "bench.bridge.link", "--batches", "400",
                          "--engines", "2", "--blocks", "16", "--requests", "1",
                          "--bulk-removals", "--turn", "4", "--repeat", "1"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    row = json.loads(out.splitlines()[-1])
    assert row["stored_blocks"] == 400 * 16
    # a stored event per batch, and the removal of the batch 64 earlier once there is one
    assert row["events_published"] == 400 + (200 - 64) * 2
    assert row["sheds"] == 0 and row["registrations"] == row["resyncs"] == 2
    assert 0 < row["publishes"] <= row["events_published"]
    assert row["cpu_s"] > row["ingest_cpu_s"] > 0 and row["link_us_per_block"] > 0
