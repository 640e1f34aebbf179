"""The worker's gRPC server over a real channel on a free loopback port."""
from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvmesh.v1 import index_pb2, worker_pb2, worker_pb2_grpc
from tests.worker.serving import with_worker
from worker import Engine
from worker.engine.async_engine import AsyncEngine
from worker.rpc.server import create_server

PROMPT = list(range(40, 90))  # 50 tokens: 3 full blocks of 16 + 2


def _worker(num_blocks: int = 64) -> AsyncEngine:
    return AsyncEngine(Engine.from_pretrained("tiny", num_blocks=num_blocks)).start()


def _req(tokens, max_tokens=6, **kw) -> worker_pb2.GenerateRequest:
    return worker_pb2.GenerateRequest(
        token_ids=tokens, sampling=worker_pb2.SamplingParams(max_tokens=max_tokens,
                                                             ignore_eos=True), **kw)


async def _collect(stub, req):
    return [m async for m in stub.Generate(req)]


def test_generate_streams_tokens_and_final_facts():
    want = Engine.from_pretrained("tiny", num_blocks=64).generate(
        [PROMPT], max_tokens=6, ignore_eos=True)[0].token_ids

    async def body(stub, ch):
        first = await _collect(stub, _req(PROMPT))
        second = await _collect(stub, _req(PROMPT, index_matched_tokens=48))
        stats = await stub.Stats(worker_pb2.WorkerStatsRequest())
        health = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
        return first, second, stats, health

    first, second, stats, health = asyncio.run(with_worker(body, _worker()))
    for msgs in (first, second):
        assert [t for m in msgs for t in m.token_ids] == want
        final = msgs[-1]
        assert final.finished and final.finish_reason == "length"
        assert final.worker_id == "w-test" and final.prompt_tokens == 50
        assert final.ttft_s > 0 and final.e2e_s >= final.ttft_s
        assert not any(m.finished for m in msgs[:-1])
    assert first[-1].num_cached_tokens == 0
    assert second[-1].num_cached_tokens == 48  # 3 full blocks; the last token is computed
    # a worker without lower tiers served its hit from the device pool
    assert dict(second[-1].cached_tokens_by_tier) == {"gpu": 48, "cpu": 0, "disk": 0}
    assert stats.cache.hits == 48 and stats.cache.queries == 100
    assert stats.index_promised_tokens == 48 and stats.index_served_tokens == 48
    assert stats.requests_done == 2 and stats.load.total_blocks == 64
    assert health.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("req, code, words", [
    (_req([1, 2, 300]), grpc.StatusCode.INVALID_ARGUMENT, "outside the vocabulary"),
    (_req([1, -2]), grpc.StatusCode.INVALID_ARGUMENT, "outside the vocabulary"),
    (_req([]), grpc.StatusCode.INVALID_ARGUMENT, "empty"),
    (_req([1, 2], max_tokens=0), grpc.StatusCode.INVALID_ARGUMENT, "max_tokens"),
    (_req([1] * 8200, max_tokens=1), grpc.StatusCode.INVALID_ARGUMENT, "context"),
    (_req([1] * 200, max_tokens=1), grpc.StatusCode.RESOURCE_EXHAUSTED, "pool"),
    (_req([1, 2], salt="s" * 5000), grpc.StatusCode.INVALID_ARGUMENT, "salt"),
    (_req([1, 2], mm=[index_pb2.MultimodalItem(identifier="i", offset=0, length=0)]),
     grpc.StatusCode.INVALID_ARGUMENT, "length"),
    (_req([1, 2], tenant="a b"), grpc.StatusCode.INVALID_ARGUMENT, "spaces"),
    (_req([1, 2], tenant="*"), grpc.StatusCode.INVALID_ARGUMENT, "reserved"),
])
def test_bad_requests_get_clear_codes_and_worker_keeps_serving(req, code, words):
    async def body(stub, ch):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _collect(stub, req)
        ok = await _collect(stub, _req([5, 6, 7], max_tokens=2))
        stats = await stub.Stats(worker_pb2.WorkerStatsRequest())
        return err.value, ok, stats

    err, ok, stats = asyncio.run(with_worker(body, _worker(num_blocks=8)))
    assert err.code() == code and words in err.details()
    assert ok[-1].finished and len([t for m in ok for t in m.token_ids]) == 2
    assert stats.cache.free_blocks == 8  # nothing leaked by the refused call


def test_generate_charges_what_it_caches_to_the_requests_tenant():
    runner = _worker()

    async def body(stub, ch):
        await _collect(stub, _req(PROMPT, tenant="acme"))
        await _collect(stub, _req(PROMPT))  # no tenant: the default one, hitting acme's
        return await runner.call(lambda e: e.kv.tenant_stats())

    stats = asyncio.run(with_worker(body, runner))
    assert stats["acme"].tiers["gpu"].blocks == 3 and stats["acme"].requests == 1
    assert stats["default"].tiers["gpu"].blocks == 0 and stats["default"].cached_tokens == 48


def test_fetch_blocks_naming_no_blocks_is_invalid():
    async def body(stub, ch):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in stub.FetchBlocks(worker_pb2.FetchBlocksRequest()):
                pass
        return err.value

    err = asyncio.run(with_worker(body, _worker()))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "requester_id" in err.details()


def test_prometheus_metrics_follow_the_cache():
    import urllib.request

    from worker.rpc.metrics import WorkerMetrics

    async def body(stub, ch):
        await _collect(stub, _req(PROMPT))
        await _collect(stub, _req(PROMPT))

    runner = AsyncEngine(Engine.from_pretrained("tiny", num_blocks=64)).start()

    async def main():
        server, port, servicer = await create_server("127.0.0.1:0", runner, worker_id="w-m",
                                                     model_name="tiny")
        servicer.metrics = WorkerMetrics(runner, "w-m")
        mport = servicer.metrics.serve(0)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                await body(worker_pb2_grpc.WorkerServiceStub(ch), ch)
        finally:
            await server.stop(None)
        return mport

    try:
        mport = asyncio.run(main())
        text = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics").read().decode()
    finally:
        runner.stop()
    samples = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
               if line and not line.startswith("#")}
    assert samples['kvmesh_worker_prefix_cache_queries_total{worker_id="w-m"}'] == 100
    assert samples['kvmesh_worker_prefix_cache_hits_total{worker_id="w-m"}'] == 48
    assert samples['kvmesh_worker_requests_finished_total{worker_id="w-m"}'] == 2
    assert samples["kvmesh_worker_time_to_first_token_seconds_count"] == 2
    assert samples['kvmesh_worker_kv_blocks_total{worker_id="w-m"}'] == 64


def test_stats_and_metrics_report_the_largest_tenants_and_other():
    """The manager's per-tenant counts (hand-built here: the pool's own accounting is
    tested with it) reach Stats and the Prometheus page under the same top-N bound."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from kvmesh.quota import OTHER, TOP_TENANTS
    from worker.kv_cache.tenant_stats import TenantCounts, TenantTier
    from worker.rpc.metrics import WorkerMetrics

    counts = {f"t{i}": TenantCounts(f"t{i}", requests=1, prompt_tokens=16 * i,
                                    tiers={"gpu": TenantTier(blocks=i, quota_blocks=8)})
              for i in range(TOP_TENANTS + 3)}
    runner = _worker()
    runner.engine.kv.tenant_stats = lambda: counts
    page = WorkerMetrics(runner, "w-t").registry

    async def body(stub, ch):
        return await stub.Stats(worker_pb2.WorkerStatsRequest())

    stats = asyncio.run(with_worker(body, runner))
    names = [t.tenant for t in stats.tenants]
    assert names == [f"t{i}" for i in range(TOP_TENANTS + 2, 2, -1)] + [OTHER]
    top = stats.tenants[0]
    assert (top.prompt_tokens, [(t.tier, t.blocks, t.quota_blocks) for t in top.tiers]) == (
        16 * (TOP_TENANTS + 2), [("gpu", TOP_TENANTS + 2, 8)])
    assert stats.tenants[-1].tiers[0].blocks == 0 + 1 + 2
    cached = {s.labels["tenant"]: s.value
              for f in text_string_to_metric_families(generate_latest(page).decode())
              if f.name == "kvmesh_worker_tenant_cached_blocks" for s in f.samples}
    assert cached == {**{n: int(n[1:]) for n in names[:-1]}, OTHER: 3}


def test_two_tenants_are_counted_apart_in_stats_and_on_the_metrics_page():
    """acme caches PROMPT and hits it; beta (same salt: the same trust group) hits acme's
    blocks without being charged for them, then caches a prompt of its own."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from worker.rpc.metrics import WorkerMetrics

    other = list(range(200, 240))  # 40 tokens: 2 full blocks
    runner = _worker()
    metrics = WorkerMetrics(runner, "w-t")
    mport = metrics.serve(0)

    async def body(stub, ch):
        for tokens, tenant in ((PROMPT, "acme"), (PROMPT, "acme"), (PROMPT, "beta"),
                               (other, "beta")):
            await _collect(stub, _req(tokens, tenant=tenant))
        return await stub.Stats(worker_pb2.WorkerStatsRequest())

    stats = asyncio.run(with_worker(body, runner))
    rows = {t.tenant: t for t in stats.tenants}
    assert set(rows) == {"acme", "beta"}
    acme, beta = rows["acme"], rows["beta"]
    assert (acme.requests, acme.prompt_tokens, acme.cached_tokens) == (2, 100, 48)
    assert (beta.requests, beta.prompt_tokens, beta.cached_tokens) == (2, 90, 48)
    (acme_gpu,), (beta_gpu,) = acme.tiers, beta.tiers
    assert (acme_gpu.tier, acme_gpu.blocks, acme_gpu.hit_blocks) == ("gpu", 3, 3)
    assert (beta_gpu.blocks, beta_gpu.hit_blocks) == (2, 3)  # acme's 3 blocks: not beta's
    page = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics").read().decode()
    got = {(s.name, s.labels["tenant"], s.labels.get("tier", "")): s.value
           for f in text_string_to_metric_families(page) for s in f.samples
           if s.name.startswith("kvmesh_worker_tenant_") and not s.name.endswith("_created")}
    assert got["kvmesh_worker_tenant_prompt_tokens_total", "acme", ""] == 100
    assert got["kvmesh_worker_tenant_prompt_tokens_total", "beta", ""] == 90
    assert got["kvmesh_worker_tenant_cached_tokens_total", "acme", ""] == 48
    assert got["kvmesh_worker_tenant_cached_tokens_total", "beta", ""] == 48
    assert got["kvmesh_worker_tenant_cached_blocks", "acme", "gpu"] == 3
    assert got["kvmesh_worker_tenant_cached_blocks", "beta", "gpu"] == 2
