"""Measured credits of lower-tier matches: the rule, its precedence, and a real route where
a CPU-tier holder whose copies are cheap beats a cold worker while a slow-disk holder does
not."""
from __future__ import annotations

import asyncio
import random

import pytest

from kvmesh.v1 import index_pb2 as pb
from service.config import CostWeights, ServiceConfig
from service.credits import measured_credit, tier_credits
from service.index.base import BlockMatch, WorkerLoad
from service.policy import KvmeshPolicy, WorkerView
from tests.service.protocol_worker import BS, ProtocolWorker, prompt, route, serve


def test_the_rule() -> None:
    # recomputing a 16-token block costs 16 x 10 us; copying it 40 us saves 3/4 of that
    assert measured_credit(40.0, 10.0, 16) == pytest.approx(0.75)
    assert measured_credit(160.0, 10.0, 16) == 0.0           # as slow as recomputing
    assert measured_credit(1600.0, 10.0, 16) == 0.0          # slower: clamped, never negative
    assert measured_credit(1e-9, 10.0, 16) == pytest.approx(1.0)
    for unknown in ((0.0, 10.0, 16), (40.0, 0.0, 16), (40.0, 10.0, 0)):
        assert measured_credit(*unknown) is None


def test_precedence_explicit_then_measured_then_fallback() -> None:
    measured = WorkerLoad(prefill_us_per_token=10.0, onboard_us_per_block_cpu=40.0,
                          onboard_us_per_block_disk=120.0)
    assert tier_credits(CostWeights(), measured, 16) == pytest.approx((0.75, 0.25))
    assert tier_credits(CostWeights(), measured, 4) == pytest.approx((0.0, 0.0))
    # not measured (an older worker, or one still calibrating): the fallbacks
    assert tier_credits(CostWeights(), WorkerLoad(), 16) == (0.5, 0.25)
    only_cpu = WorkerLoad(prefill_us_per_token=10.0, onboard_us_per_block_cpu=80.0)
    assert tier_credits(CostWeights(disk_credit_fallback=0.1), only_cpu, 16) \
        == pytest.approx((0.5, 0.1))
    # the operator's credit wins over any measurement, per tier
    assert tier_credits(CostWeights(cpu_credit=0.9), measured, 16) == pytest.approx((0.9, 0.25))
    assert tier_credits(CostWeights(cpu_credit=0.0, disk_credit=1.0), measured, 16) == (0.0, 1.0)


def test_credits_out_of_range_are_refused() -> None:
    for bad in (dict(cpu_credit=1.5), dict(disk_credit=-0.1), dict(cpu_credit_fallback=2.0)):
        with pytest.raises(ValueError, match="must be in"):
            CostWeights(**bad)  # type: ignore[arg-type]


def test_policy_credits_each_worker_by_its_own_costs() -> None:
    fast = WorkerLoad(prefill_us_per_token=10.0, onboard_us_per_block_cpu=16.0)  # credit 0.9
    slow = WorkerLoad(prefill_us_per_token=10.0, onboard_us_per_block_cpu=144.0)  # 0.1
    p = KvmeshPolicy()
    match = BlockMatch(10, 0, 10, 0)
    assert p.credited_tokens(WorkerView("f", load=fast, match=match)) == pytest.approx(144.0)
    assert p.credited_tokens(WorkerView("s", load=slow, match=match)) == pytest.approx(16.0)
    assert p.credited_tokens(WorkerView("u", match=match)) == pytest.approx(80.0)  # fallback
    ranked = p.rank(200, [WorkerView("s", load=slow, match=match),
                          WorkerView("f", load=fast, match=match)], random.Random(0))
    assert [r.view.worker_id for r in ranked] == ["f", "s"]


# prefill 10 us/token, a block of BS=4 tokens 40 us to recompute
PREFILL = dict(prefill_us_per_token=10.0)


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_route_prefers_a_cheap_cpu_holder_over_a_cold_worker_not_a_slow_disk_one(
        backend: str, request: pytest.FixtureRequest) -> None:
    """Three workers, equally idle: ``cold`` holds nothing, ``cpu`` holds the prompt on its
    CPU tier and onboards a block in 4 us (credit 0.9), ``disk`` holds it on disk and needs
    60 us a block (slower than recomputing: credit 0). The cost model sends the prompt to
    ``cpu``, and ranks ``disk`` no better than ``cold``; an operator's disk credit of 1.0
    turns that around."""
    url = request.getfixturevalue("redis_url") if backend == "redis" else None

    async def main(weights: CostWeights) -> list[pb.Candidate]:
        cfg = ServiceConfig(backend=backend, redis_url=url, weights=weights)
        async with serve(cfg) as r:
            loads = {"cold": PREFILL, "cpu": dict(onboard_us_per_block_cpu=4.0, **PREFILL),
                     "disk": dict(onboard_us_per_block_disk=60.0, **PREFILL)}
            tiers = {"cpu": pb.TIER_CPU, "disk": pb.TIER_DISK}
            for port, (wid, load) in enumerate(loads.items(), 9001):
                w = ProtocolWorker(r.stub, wid, port=port)
                await w.join(**load)  # type: ignore[arg-type]
                if wid in tiers:
                    await w.store(prompt(8 * BS), tier=tiers[wid])
            res = await route(r.stub, prompt(8 * BS + 1), dry_run=True)
            return list(res.candidates)

    cands = asyncio.run(main(CostWeights()))
    by_id = {c.worker_id: c for c in cands}
    assert cands[0].worker_id == "cpu", cands
    assert by_id["cpu"].tier == pb.TIER_CPU and by_id["cpu"].matched_tokens == 8 * BS
    assert dict(by_id["cpu"].matched_tokens_by_tier) == {"gpu": 0, "cpu": 8 * BS, "disk": 0}
    assert dict(by_id["cold"].matched_tokens_by_tier) == {"gpu": 0, "cpu": 0, "disk": 0}
    assert by_id["cpu"].load.onboard_us_per_block_cpu == 4.0
    assert by_id["disk"].load.onboard_us_per_block_disk == 60.0
    assert by_id["disk"].cost == by_id["cold"].cost   # its match is worth nothing
    assert by_id["cpu"].cost < by_id["cold"].cost
    trusting = asyncio.run(main(CostWeights(disk_credit=1.0)))
    assert trusting[0].worker_id == "disk", trusting


def test_route_splits_a_chain_held_across_tiers() -> None:
    """A chain whose head is on the GPU and whose tail was offloaded to the CPU, then disk:
    the candidate reports its matched tokens per tier, capped at the usable blocks by
    dropping the slowest tier first."""
    async def main() -> None:
        async with serve(ServiceConfig()) as r:
            w = ProtocolWorker(r.stub, "a")
            await w.join()
            chain = await w.store(prompt(6 * BS))
            for tier, blocks in ((pb.TIER_CPU, chain[3:5]), (pb.TIER_DISK, chain[5:])):
                await w.publish(w.next_event(stored=pb.BlockStored(
                    block_hashes=blocks, parent_hash=chain[chain.index(blocks[0]) - 1],
                    tier=tier)))
                await w.publish(w.next_event(removed=pb.BlockRemoved(
                    block_hashes=blocks, tier=pb.TIER_GPU)))
            res = await route(r.stub, prompt(6 * BS + 1), dry_run=True)
            assert dict(res.candidates[0].matched_tokens_by_tier) == {
                "gpu": 3 * BS, "cpu": 2 * BS, "disk": BS}
            assert res.candidates[0].tier == pb.TIER_DISK
            # a prompt ending inside the chain's last block cannot use it: the disk block goes
            res = await route(r.stub, prompt(6 * BS), dry_run=True)
            assert dict(res.candidates[0].matched_tokens_by_tier) == {
                "gpu": 3 * BS, "cpu": 2 * BS, "disk": 0}

    asyncio.run(main())
