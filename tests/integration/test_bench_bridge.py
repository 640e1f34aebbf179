"""``kvmesh bench bridge`` end to end at a small rate: every published block is ingested and
indexed, the probes become routable, and nothing was lost on the way."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def test_a_small_run_ingests_everything_and_measures_the_lag() -> None:
    kvmesh = str(Path(sys.executable).parent / "kvmesh")
    out = subprocess.run([kvmesh, "bench", "bridge", "--rates", "2000", "--seconds", "2",
                          "--engines", "2", "--blocks", "20", "--requests", "2", "--json"],
                         capture_output=True, text=True, timeout=240, check=True).stdout
    (row,) = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert row["stored_blocks"] == 4000
    assert row["applied_blocks"] == 4000  # the probes' blocks taken out
    assert row["lag_clears"] == row["skipped_batches"] == 0
    assert row["ingest_blocks_per_s"] > 1000 and row["blocks_per_bridge_cpu_s"] > 0
    assert row["probes"] >= 2 and row["probes_lost"] == 0
    assert 0 < row["probe_lag_p50_ms"] < 10_000
    assert row["gaps"] == row["clears"] == row["registrations"] == 0


def test_the_bridge_runs_alone_on_the_core_it_is_given() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    core = cpus[-1]
    kvmesh = str(Path(sys.executable).parent / "kvmesh")
    proc = subprocess.run([kvmesh, "bench", "bridge", "--rates", "1000", "--seconds", "1",
                           "--engines", "1", "--blocks", "10", "--requests", "1",
                           "--bridge-core", str(core), "--json"],
                          capture_output=True, text=True, timeout=240)
    if len(cpus) == 1:  # nothing left for the others: refused, with the reason
        assert proc.returncode != 0 and "--bridge-core" in proc.stderr
        return
    (row,) = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert row["bridge_cpus"] == [core] and row["applied_blocks"] == 1000
    assert os.sched_getaffinity(0) == set(cpus)  # this process was not touched
