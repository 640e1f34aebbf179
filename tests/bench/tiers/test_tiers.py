"""`kvmesh bench tiers`: the accounting is honest (bytes, hits per tier, TTFT of onboards)."""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from bench import tiers
from bench.replay.cluster import CostModel, SimRequest, SimWorker
from bench.replay.replay import ReplayConfig, run
from bench.replay.trace import CHUNK_TOKENS, TokenSynth, TraceRequest, load_trace
from worker.kv_cache import KVCacheManager, KVRequest

COST = CostModel()
# 3 workers of 160 blocks of 16 (5 chunks each): the small trace's ~2,300 blocks do not fit,
# so blocks are evicted, offloaded and onboarded again.
BASE = ReplayConfig(workers=3, block_size=16, capacity_blocks=160, cost=COST,
                    weights=tiers.credits(COST, 16))


def _setups(*names: str) -> list[tiers.Setup]:
    return [tiers.Setup.parse(n) for n in names]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory,
            ) -> tuple[list, dict[str, tiers.SetupResult]]:
    from tests.bench.conftest import write_trace

    path = write_trace(tmp_path_factory.mktemp("tiers") / "t.jsonl", convs=13, turns=5)
    reqs = load_trace(path)
    # a CPU tier of 2x: the ~1,700 blocks offloaded overflow it, so the disk tier is used
    res = tiers.run(reqs, _setups("gpu", "gpu+cpu", "gpu+cpu+disk", "gpu+cpu/layered/pin"),
                    BASE, cpu_x=2.0, disk_x=16.0)
    return reqs, {r.setup.name: r for r in res}


def test_gpu_only_is_the_replay_bench_and_moves_no_bytes(results) -> None:
    reqs, by = results
    (replayed,) = run(reqs, ["kvmesh"], BASE)
    gpu = by["gpu"].result
    assert gpu.hit_tokens > 0 and gpu.evictions > 0  # hits, and under pressure
    assert (gpu.hit_tokens, gpu.prefill_tokens, gpu.ttfts) == (
        replayed.hit_tokens, replayed.prefill_tokens, replayed.ttfts)
    assert gpu.hit_by_tier == {"gpu": gpu.hit_tokens}
    c = gpu.copies
    assert (c.onboard_blocks, c.offload_blocks, c.spill_blocks, c.copy_s) == ({}, 0, 0, 0.0)
    assert by["gpu"].onboard_bytes() == 0 and by["gpu"].summary()["offload_bytes"] == 0


@pytest.mark.parametrize("name", ["gpu+cpu", "gpu+cpu+disk", "gpu+cpu/layered/pin"])
def test_hits_by_tier_add_up_and_match_the_onboarded_blocks(results, name: str) -> None:
    _, by = results
    r = by[name].result
    assert sum(r.hit_by_tier.values()) == r.hit_tokens
    assert r.prompt_tokens == r.hit_tokens + r.prefill_tokens
    # every onboarded block is a hit of the request that onboarded it, counted on its tier
    for tier in ("cpu", "disk"):
        assert r.hit_by_tier.get(tier, 0) == 16 * r.copies.onboard_blocks.get(tier, 0)
        assert by[name].onboard_bytes(tier) == (r.copies.onboard_blocks.get(tier, 0)
                                                * COST.block_bytes(16))
    assert r.copies.offload_blocks > 0 and r.copies.onboard_blocks.get("cpu", 0) > 0


def test_lower_tiers_raise_the_hit_rate_at_equal_device_memory(results) -> None:
    _, by = results
    gpu, cpu, disk = (by[n].result for n in ("gpu", "gpu+cpu", "gpu+cpu+disk"))
    assert cpu.token_hit_rate > gpu.token_hit_rate
    assert disk.token_hit_rate >= cpu.token_hit_rate
    assert by["gpu+cpu+disk"].result.copies.spill_blocks > 0
    assert by["gpu+cpu"].result.copies.spill_blocks == 0


@pytest.mark.parametrize("offloads", ["sync", "write-behind"])
def test_an_onboard_delays_the_prefill_by_its_copy_time(offloads: str) -> None:
    """A pool of 33 blocks (one 512-token prompt + its output block): b evicts all of a's
    blocks to the CPU tier; c (a's prompt again) has them copied back, waiting for the copy,
    then prefills only its last block. Its admission's offloads stall its prefill, unless
    they are written behind it (and then the onboard's own copies wait only for the copy
    out of the block each overwrites, on the other lane)."""
    cost = CostModel(prefill_s_per_token=1e-3, decode_step_s=0.01, decode_s_per_ctx_token=0,
                     offloads=offloads)
    w = SimWorker(0, KVCacheManager(33, 16, cpu_blocks=64), cost)
    synth = TokenSynth(16)

    def req(i: int, ids: tuple[int, ...], at: float) -> SimRequest:
        tr = TraceRequest(i, at, len(ids) * CHUNK_TOKENS, 1, ids)
        return SimRequest(tr, KVRequest(f"r{i}", synth.tokens(tr),
                                        block_hashes=synth.chain(tr)))

    a, b, c = req(0, (1,), 0.0), req(1, (2,), 1.0), req(2, (1,), 2.0)
    for r in (a, b):
        w.advance(r.trace.arrival_s)
        w.submit(r, r.trace.arrival_s)
    w.advance(2.0)
    assert not w.running and not w.waiting
    copies = w.totals.copies
    assert copies.onboard_blocks == {} and copies.offload_blocks == 32  # a's hashed blocks
    w.submit(c, 2.0)
    w.advance(math.inf)
    assert c.hit_tokens == 31 * 16 and c.hit_by_tier == {"gpu": 0, "cpu": 31 * 16, "disk": 0}
    assert copies.onboard_blocks == {"cpu": 31}
    # the onboard's 31 device blocks: b's unhashed output block (free queue head) and 30 of
    # b's cached blocks, offloaded first; c's admission evicts (offloads) 2 more
    assert copies.offload_blocks == 32 + 30 + 2
    behind = offloads == "write-behind"
    # written behind: 2 copies out (168 us) end long before its 16 ms prefill: no stall
    assert c.copy_s == pytest.approx(0.0 if behind else 2 * cost.offload_s(16))
    # the onboard: after its 30 offloads on one engine, or beside them, each copy in after
    # the copy out of its block (equal sizes and bandwidths: the last one lands last)
    onboard = 31 * cost.onboard_s("cpu", 16) + (0 if behind else 30 * cost.offload_s(16))
    assert c.ttft_s == pytest.approx(onboard + 16e-3 + c.copy_s)
    assert copies.onboard_wait_s == pytest.approx(onboard)


def test_costs_per_block_follow_the_bandwidths() -> None:
    c = CostModel()
    assert c.block_bytes(16) == 2 << 20
    assert c.onboard_s("cpu", 16) == pytest.approx((2 << 20) / 25e9)
    assert c.onboard_s("disk", 16) == pytest.approx((2 << 20) / 6e9 + (2 << 20) / 25e9)
    assert c.onboard_s("cpu", 16) / c.prefill_s(16) < 0.2  # the goal, as modelled
    w = tiers.credits(c, 16)
    assert w.cpu_credit == pytest.approx(1 - c.onboard_s("cpu", 16) / c.prefill_s(16))
    with pytest.raises(ValueError):
        c.onboard_s("gpu", 16)


@pytest.mark.parametrize("bad", ["tpu", "gpu/fast", "gpu/pin/pin", "cpu", "gpu+cpu/"])
def test_setup_names_are_checked(bad: str) -> None:
    with pytest.raises(ValueError):
        tiers.Setup.parse(bad)


def test_setup_sizes_the_lower_tiers_from_the_device_pool() -> None:
    cfg = tiers.Setup.parse("gpu+cpu+disk/layered").config(BASE, 4.0, 16.0)
    assert (cfg.capacity_blocks, cfg.cpu_blocks, cfg.disk_blocks) == (160, 640, 2560)
    assert (cfg.eviction, cfg.auto_pin, cfg.cost.offloads) == ("layered", False, "write-behind")
    assert tiers.Setup.parse("gpu+cpu/sync/pin").config(BASE, 4, 16).cost.offloads == "sync"
    bound = tiers.Setup.parse("bound").config(BASE, 4.0, 16.0)  # the CPU tier's memory on device
    assert (bound.capacity_blocks, bound.cpu_blocks, bound.disk_blocks) == (800, 0, 0)


@pytest.mark.slow
def test_cli_json_and_table_with_goals(small_trace: Path, tmp_path: Path,
                                       make_trace: Callable[..., Path]) -> None:
    app = typer.Typer()
    tiers.register(app)
    runner = CliRunner()
    args = [str(small_trace), "--workers", "2", "--capacity-blocks", "160"]
    res = runner.invoke(app, [*args, "--setups", "gpu,gpu+cpu", "--json"])
    assert res.exit_code == 0, res.output
    lines = [json.loads(x) for x in res.stdout.splitlines()]
    assert [x["setup"] for x in lines] == ["gpu", "gpu+cpu"]
    assert lines[0]["hit_rate_x"] == 1.0 and lines[1]["cpu_blocks"] == 640
    assert {"token_hit_rate", "mean_ttft_s", "p90_ttft_s", "prefill_tokens", "onboard_bytes",
            "hit_share_by_tier", "mean_ttft_cut"} <= set(lines[1])
    png = tmp_path / "t.png"
    res = runner.invoke(app, [*args, "--setups", "gpu,gpu+cpu,bound", "--plot", str(png)],
                        env={"COLUMNS": "220"})
    assert res.exit_code == 0, res.output
    assert "onboard a cpu block < 1/5 of recomputing it" in res.stdout
    assert "gpu+cpu hit rate >= 1.5x gpu" in res.stdout and png.stat().st_size > 10_000
    assert "the bound, the CPU tier's memory at device speed" in res.stdout
    bad = runner.invoke(app, [*args, "--setups", "gpu+tpu"])
    assert bad.exit_code == 2 and "bad setup" in bad.output


@pytest.mark.parametrize("offloads", ["sync", "write-behind"])
def test_written_behind_offloads_stall_a_prefill_only_for_what_outlasts_it(offloads: str) -> None:
    """A slow link (20 ms per block): b's prompt evicts 31 of a's blocks (its head block is
    a's unhashed output block), its output block one more. Synchronous, b's prefill waits
    for all 32 copies; written behind, only for what of the prompt's 31 is not done when its
    prefill would have ended, less its last layer, and never for its decode block's."""
    cost = CostModel(prefill_s_per_token=1e-3, decode_step_s=0.01, decode_s_per_ctx_token=0,
                     pcie_bytes_per_s=(2 << 20) / 0.02, offloads=offloads)
    w = SimWorker(0, KVCacheManager(33, 16, cpu_blocks=64), cost)
    synth = TokenSynth(16)
    reqs = []
    for i, at in enumerate((0.0, 1.0)):
        tr = TraceRequest(i, at, CHUNK_TOKENS, 1, (i + 1,))
        reqs.append(SimRequest(tr, KVRequest(f"r{i}", synth.tokens(tr),
                                             block_hashes=synth.chain(tr))))
        w.advance(at)
        w.submit(reqs[-1], at)
    w.advance(math.inf)
    b = reqs[1]
    assert w.totals.copies.offload_blocks == 32 and cost.offload_s(16) == pytest.approx(0.02)
    prefill = 512 * 1e-3
    want = 32 * 0.02 if offloads == "sync" else 31 * 0.02 - prefill * (1 - 1 / cost.layers)
    assert b.copy_s == pytest.approx(want)
    assert b.ttft_s == pytest.approx(prefill + want)
