"""`kvmesh bench tiers --step-overhead`: real engines, the same steps, offloads counted."""
from __future__ import annotations

import json

import torch
import typer
from typer.testing import CliRunner

from bench import tiers
from bench.tiers import steps


def test_each_mode_runs_the_same_steps_and_only_tiers_offload() -> None:
    res = steps.measure(steps.model(), block_size=16, batch=2, prompt_tokens=32, steps=3,
                        warmup=1)
    assert [r.mode for r in res] == list(steps.MODES)
    assert all(len(r.step_s) == 3 and min(r.step_s) > 0 for r in res)
    none, sync, wb = res
    # Every step evicts what the steps before cached (all but the pool's 2 spare blocks):
    # offloaded with a CPU tier, the same blocks in both.
    assert none.offloaded == 0 and 3 * 4 - 2 <= sync.offloaded == wb.offloaded <= 3 * 4
    assert none.copy_s == 0 and sync.copy_s > 0 and sync.waits == 0
    assert none.overhead(none) == 0.0
    met, detail = steps.goal(res)
    assert isinstance(met, bool) and "write-behind" in detail


def test_a_wider_kv_model_has_more_kv_per_token() -> None:
    (_, small), (_, wide) = steps.model(), steps.model(2)
    assert wide.num_key_value_heads == 2 * small.num_key_value_heads
    assert (wide.kv_cache_bytes_per_block(16, torch.float32)
            == 2 * small.kv_cache_bytes_per_block(16, torch.float32))


def test_cli_step_overhead_json_and_trace_required_otherwise() -> None:
    app = typer.Typer()
    tiers.register(app)
    runner = CliRunner()
    res = runner.invoke(app, ["--step-overhead", "--steps", "2", "--batch", "2",
                              "--prompt-tokens", "32", "--json"])
    assert res.exit_code == 0, res.output
    lines = [json.loads(x) for x in res.stdout.splitlines()]
    assert [x["mode"] for x in lines] == list(steps.MODES)
    assert {"median_step_ms", "overhead_vs_none", "stall_share"} <= set(lines[1])
    table = runner.invoke(app, ["--step-overhead", "--steps", "2", "--batch", "2",
                                "--prompt-tokens", "32"])
    assert table.exit_code == 0 and "within 10% of no offloads" in table.stdout
    bad = runner.invoke(app, [])
    assert bad.exit_code == 2 and "--step-overhead" in bad.output


def test_an_emulated_slow_link_holds_the_synchronous_step_only() -> None:
    res = steps.measure(steps.model(), block_size=16, batch=2, prompt_tokens=32, steps=3,
                        warmup=1, link_us_per_block=20_000)
    _, sync, wb = res
    assert sync.offloaded == wb.offloaded > 0
    assert sync.copy_s >= sync.offloaded * 0.02  # every block's emulated 20 ms, in the step
    assert wb.copy_s < sync.offloaded * 0.02 / 4  # handed to the lane, not waited for there
