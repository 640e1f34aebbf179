"""The KVBoost monitoring set on a real worker: Stats and Prometheus follow a real offload,
a real onboard and the index's promises per tier."""
from __future__ import annotations

import asyncio
import urllib.request

import grpc

from kvmesh.v1 import worker_pb2, worker_pb2_grpc
from tests.worker.serving import with_worker
from worker import Engine
from worker.engine.async_engine import AsyncEngine
from worker.kv_cache.tier_config import TierConfig
from worker.rpc.metrics import WorkerMetrics
from worker.rpc.server import create_server

A = list(range(40, 90))    # 50 tokens: 3 full blocks of 16 + 2
B = list(range(100, 150))  # another 50
KV_BLOCK_BYTES = 4 * 2 * 16 * 2 * 32 * 4  # tiny: layers x K,V x tokens x heads x dim x fp32


def _req(tokens: list[int], **kw) -> worker_pb2.GenerateRequest:
    return worker_pb2.GenerateRequest(
        token_ids=tokens, sampling=worker_pb2.SamplingParams(max_tokens=4, ignore_eos=True),
        **kw)


async def _scenario(stub) -> list[worker_pb2.GenerateResponse]:
    """A on a 4-block device pool; B evicts it to the CPU tier; A again is onboarded (the
    index promised it on the device: missed); A once more hits the device (the index
    promised the CPU tier: kept, a faster tier)."""
    finals = []
    for tokens, promise in ((A, {}), (B, {}), (A, {"gpu": 48}), (A, {"cpu": 48})):
        msgs = [m async for m in stub.Generate(_req(
            tokens, index_matched_tokens=sum(promise.values()),
            index_matched_tokens_by_tier=promise))]
        finals.append(msgs[-1])
    return finals


def _serve(fn):
    runner = AsyncEngine(Engine.from_pretrained("tiny", num_blocks=4,
                                                tiers=TierConfig(cpu_blocks=16))).start()

    async def main():
        server, port, servicer = await create_server("127.0.0.1:0", runner, worker_id="w-t",
                                                     model_name="tiny")
        servicer.metrics = WorkerMetrics(runner, "w-t", servicer.tier_precision)
        mport = servicer.metrics.serve(0)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                return await fn(worker_pb2_grpc.WorkerServiceStub(ch)), mport
        finally:
            await server.stop(None)

    try:
        out, mport = asyncio.run(main())
        text = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics").read().decode()
    finally:
        runner.stop()
    return out, text


def test_stats_and_metrics_follow_offload_onboard_and_the_index_promises() -> None:
    async def body(stub):
        before = await stub.Stats(worker_pb2.WorkerStatsRequest())
        finals = await _scenario(stub)
        return before, finals, await stub.Stats(worker_pb2.WorkerStatsRequest())

    (before, finals, after), text = _serve(body)
    assert [t.tier for t in before.tiers] == ["gpu", "cpu"]
    assert all(t.offloads == t.onboard_blocks == t.hit_tokens == 0 for t in before.tiers)
    assert [f.num_cached_tokens for f in finals] == [0, 0, 48, 48]

    gpu, cpu = after.tiers
    assert (gpu.capacity_blocks, cpu.capacity_blocks) == (4, 16)
    # A's 3 full blocks went down when B came; B's 3 when A's onboard took their blocks
    assert gpu.offloads == 6 and gpu.evictions == 0 and cpu.cached_blocks == 6
    assert cpu.onboard_blocks == 3 and cpu.onboard_bytes == 3 * KV_BLOCK_BYTES
    assert cpu.onboard_seconds > 0
    assert cpu.hit_tokens == 48 and gpu.hit_tokens == 48  # A onboarded, then A on the device
    assert (gpu.index_promised_tokens, gpu.index_missed_tokens) == (48, 48)
    assert (cpu.index_promised_tokens, cpu.index_missed_tokens) == (48, 0)
    assert after.mean_matched_tokens == (48 + 48) / 4 and after.pinned_blocks == 0

    samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
               for line in text.splitlines() if line and not line.startswith("#")}
    cpu_l, gpu_l = 'tier="cpu",worker_id="w-t"', 'tier="gpu",worker_id="w-t"'  # sorted
    assert samples[f"kvmesh_worker_tier_offloads_total{{{gpu_l}}}"] == 6
    assert samples[f"kvmesh_worker_tier_onboard_blocks_total{{{cpu_l}}}"] == 3
    assert samples[f"kvmesh_worker_tier_onboard_bytes_total{{{cpu_l}}}"] == 3 * KV_BLOCK_BYTES
    assert samples[f"kvmesh_worker_tier_load_factor{{{cpu_l}}}"] == 6 / 16
    assert samples[f"kvmesh_worker_tier_hit_rate{{{cpu_l}}}"] == 48 / 200
    assert samples[f"kvmesh_worker_onboard_latency_seconds_count{{{cpu_l}}}"] == 1
    assert samples[f"kvmesh_worker_onboard_latency_seconds_sum{{{cpu_l}}}"] == \
        cpu.onboard_seconds
    assert samples[f"kvmesh_worker_index_missed_tokens_total{{{gpu_l}}}"] == 48
    assert samples[f"kvmesh_worker_index_promised_tokens_total{{{cpu_l}}}"] == 48
    assert samples['kvmesh_worker_pinned_blocks{worker_id="w-t"}'] == 0


def test_a_worker_without_lower_tiers_reports_the_device_tier_only() -> None:
    async def body(stub, _channel):
        await _scenario(stub)
        async for _m in stub.Generate(_req(A, index_matched_tokens_by_tier={"gpu": 48})):
            pass  # A a third time in a row: on the device, as promised
        return await stub.Stats(worker_pb2.WorkerStatsRequest())

    runner = AsyncEngine(Engine.from_pretrained("tiny", num_blocks=4)).start()
    stats = asyncio.run(with_worker(body, runner))
    (gpu,) = stats.tiers
    assert gpu.tier == "gpu" and gpu.offloads == 0 and gpu.evictions == 6
    assert gpu.hit_tokens == 96 and gpu.onboard_blocks == 0  # A's last two runs hit
    assert (gpu.index_promised_tokens, gpu.index_missed_tokens) == (96, 48)


def test_huge_promises_keep_stats_answering() -> None:
    """Promises of 2^64 - 1 tokens per tier (a hostile or buggy router) are capped at the
    prompt, so the uint64 counters of Stats never overflow."""
    async def body(stub, _channel):
        for _ in range(2):
            async for _m in stub.Generate(_req(A, index_matched_tokens_by_tier={
                    "gpu": 2**64 - 1, "cpu": 2**64 - 1, "disk": 2**64 - 1})):
                pass
        return await stub.Stats(worker_pb2.WorkerStatsRequest())

    runner = AsyncEngine(Engine.from_pretrained("tiny", num_blocks=8,
                                                tiers=TierConfig(cpu_blocks=8))).start()
    stats = asyncio.run(with_worker(body, runner))
    gpu, cpu = stats.tiers
    assert gpu.index_promised_tokens == cpu.index_promised_tokens == 2 * 50
    assert gpu.index_missed_tokens == 50 + 2  # the 2nd run served 48 from the device
