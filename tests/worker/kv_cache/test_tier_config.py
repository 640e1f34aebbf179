"""``TierConfig``: its checks, and ``argv()`` rebuilding it through ``kvmesh worker``'s flags."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import typer

from worker.cli import options_of, register
from worker.kv_cache.tier_config import TierConfig


def parsed(args: list[str]) -> TierConfig:
    """The ``TierConfig`` that ``kvmesh worker ARGS`` would run with (nothing started)."""
    app = typer.Typer()
    register(app)
    app.command("unused")(lambda: None)  # a group: the verb is named, as in `kvmesh worker`
    group = typer.main.get_command(app)
    ctx = group.commands["worker"].make_context("worker", list(args))
    return options_of(ctx.params).tiers


@pytest.mark.parametrize("cfg", [
    TierConfig(),
    TierConfig(cpu_blocks=64),
    TierConfig(cpu_blocks=8, disk_blocks=256, disk_dir="d", eviction="layered", auto_pin=True),
])
def test_argv_rebuilds_the_config_through_the_worker_flags(cfg, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parsed(cfg.argv()) == cfg
    assert TierConfig().argv() == []


def test_each_worker_of_a_fleet_gets_its_own_disk_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shared = TierConfig(cpu_blocks=1, disk_blocks=4, disk_dir="d")
    assert shared.of_worker("w1").disk_dir == os.path.join("d", "w1")
    assert shared.of_worker("w1", absolute=True).disk_dir == str(tmp_path.resolve() / "d" / "w1")
    assert TierConfig(cpu_blocks=1).of_worker("w1") == TierConfig(cpu_blocks=1)


@pytest.mark.parametrize("cfg, words", [
    (TierConfig(cpu_blocks=-1), "must be >= 0"),
    (TierConfig(disk_blocks=4), "needs --disk-dir"),
    (TierConfig(disk_blocks=4, disk_dir="x"), "needs --cpu-blocks"),
    (TierConfig(eviction="fifo"), "fifo"),
])
def test_settings_that_cannot_work_are_refused(cfg, words):
    with pytest.raises(ValueError, match=words):
        cfg.check()


def test_a_disk_dir_others_may_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(ValueError, match="writable"):
        TierConfig(cpu_blocks=1, disk_blocks=1, disk_dir=str(shared)).check()


def test_the_launchers_import_it_without_torch():
    code = "import sys, worker.kv_cache.tier_config; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
