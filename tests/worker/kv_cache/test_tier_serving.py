"""The tiers from outside the engine: the measured costs in the worker's load report, the
worker and ``kvmesh up`` flags, and the engine thread draining its copies when stopped."""
from __future__ import annotations

import asyncio
import stat

import pytest
from typer.testing import CliRunner

from client.cli import app
from deploy.local import ClusterSpec, tier_args
from kvmesh.v1 import worker_pb2
from tests.worker.serving import with_worker
from worker import Engine
from worker.engine.async_engine import AsyncEngine
from worker.kv_cache.tier_config import TierConfig


def test_stats_report_the_measured_costs(tmp_path):
    engine = Engine.from_pretrained("tiny", block_size=4, num_blocks=16, tiers=TierConfig(
        cpu_blocks=8, disk_blocks=8, disk_dir=tmp_path))

    async def body(stub, ch):
        return await stub.Stats(worker_pb2.WorkerStatsRequest())

    load = asyncio.run(with_worker(body, AsyncEngine(engine).start())).load
    assert load.prefill_us_per_token > 0
    assert load.onboard_us_per_block_cpu > 0 and load.onboard_us_per_block_disk > 0
    assert not engine.copies.running  # the runner's stop closed the engine


def test_a_worker_without_tiers_reports_no_onboard_cost():
    engine = Engine.from_pretrained("tiny", num_blocks=16)
    assert engine.copies is None
    load = engine.load()
    assert load["onboard_us_per_block_cpu"] == load["onboard_us_per_block_disk"] == 0.0


@pytest.mark.parametrize("args, words", [
    (["--disk-blocks", "4"], "needs --disk-dir"),
    (["--disk-blocks", "4", "--disk-dir", "x"], "needs --cpu-blocks"),
    (["--cpu-blocks", "-1"], "greater than or equal to 0"),
    (["--eviction", "fifo"], "fifo"),
])
def test_worker_refuses_tier_flags_that_cannot_work(args, words):
    result = CliRunner().invoke(app, ["worker", *args], env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert words in result.output


def test_up_passes_the_tier_flags_to_each_worker(tmp_path):
    assert tier_args(ClusterSpec(), "w0") == []
    spec = ClusterSpec(tiers=TierConfig(cpu_blocks=64, disk_blocks=256, disk_dir=str(tmp_path),
                                        eviction="layered", auto_pin=True))
    assert tier_args(spec, "w1") == ["--cpu-blocks", "64", "--disk-blocks", "256",
                                     "--disk-dir", str(tmp_path / "w1"),
                                     "--eviction", "layered", "--auto-pin"]


def test_up_refuses_tier_flags_that_cannot_work_before_starting_anything():
    result = CliRunner().invoke(app, ["up", "--disk-blocks", "4", "--cpu-blocks", "4"],
                                env={"COLUMNS": "300"})
    assert result.exit_code == 2 and "needs --disk-dir" in result.output, result.output


@pytest.mark.integration  # a worker process
def test_a_worker_process_takes_the_tier_flags(tmp_path):
    from deploy.process import ServerProcess

    proc = ServerProcess("w", "worker", [
        "--port", "0", "--num-blocks", "16", "--device", "cpu", "--cpu-blocks", "8",
        "--disk-blocks", "32", "--disk-dir", str(tmp_path), "--eviction", "lru"])
    proc.start(timeout=120)
    try:
        line = next(x for x in proc.lines if "listening on" in x)
        assert "16 blocks of 16, 8 cpu blocks, 32 disk blocks" in line, line
        # the model fingerprint's directory and the MAC key, private to this user
        found = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
        assert found.pop("disk.key") == 0o600
        assert list(found.values()) == [0o700], found
    finally:
        proc.stop()


@pytest.mark.integration  # a service, Redis and a worker process
def test_a_restarted_worker_reannounces_its_disk_blocks_to_the_index(tmp_path):
    import random

    from deploy.local import LocalCluster
    from deploy.waiting import wait_until

    rng = random.Random(0)
    ps = [[rng.randrange(256) for _ in range(64)] for _ in range(6)]
    cluster = LocalCluster(ClusterSpec(workers=1, num_blocks=16, tiers=TierConfig(
        cpu_blocks=4, disk_blocks=64, disk_dir=str(tmp_path)))).start()
    try:
        with cluster.client() as client:
            first = [client.generate(p, max_tokens=4) for p in ps]  # the pool holds ~1
        worker = cluster.workers[0]
        worker.stop()
        worker.start(120)
        cluster.wait_ready(60)
        with cluster.client() as client:
            # before any request: the restarted worker's first sync announced the disk
            # the restarted process listens on a new port: wait for its own registration
            # (the dead one's record may still be listed until it is purged)
            def announced() -> bool:
                return any(w["address"] == worker.address and w["alive"]
                           and w["indexed_blocks"] > 0 for w in client.stats()["workers"])

            wait_until(announced, 30, what="disk blocks indexed")
            again = client.generate(ps[0], max_tokens=4)  # the oldest: all of it on disk
        assert again.matched_tokens == again.num_cached_tokens == 48
        assert again.token_ids == first[0].token_ids
    finally:
        cluster.stop()
