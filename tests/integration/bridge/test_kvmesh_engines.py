"""The whole chain on real processes, with kvmesh workers as the vLLM engines: ``kvmesh worker
--http-port --vllm-events --vllm-replay`` -> the bridge -> a service on Valkey -> Route.

What a real engine does that the in-test publishers do not: events come from a real KV pool
(evictions, duplicates, the CPU tier), load from a real ``/metrics`` page, and a restart is a
new process whose ``seq`` starts at 0 on the same ports."""
from __future__ import annotations

import asyncio

import openai
import pytest
import zmq.auth

from bridge.config import EngineSpec
from kvmesh.v1 import index_pb2 as pb
from tests.bridge.cluster import Running, router
from tests.http_engines import BS, HttpWorker
from tests.ports import free_port

pytestmark = pytest.mark.integration
WITHIN = 30.0


def spec(w: HttpWorker, worker_id: str) -> EngineSpec:
    return EngineSpec(worker_id=worker_id, address=w.url, events=w.events, replay=w.replay,
                      block_size=BS, metrics_url=w.metrics_url)


def complete(w: HttpWorker, ids: list[int], **body) -> None:
    openai.OpenAI(base_url=f"{w.url}/v1", api_key="x", max_retries=0).completions.create(
        model="tiny", prompt=ids, max_tokens=1, temperature=0, extra_body=body)


def test_a_late_bridge_learns_the_cache_and_a_restart_leaves_nothing_stale(service: str):
    """The worker serves before the bridge exists (replay), then restarts on the same ports:
    what the old process held leaves the index, what the new one serves enters it."""
    http, pub, rep, mport = free_port(), free_port(), free_port(), free_port()
    flags = ("--vllm-events", f"tcp://127.0.0.1:{pub}", "--vllm-replay",
             f"tcp://127.0.0.1:{rep}", "--metrics-port", str(mport))
    old = [5, 6, 7, 8] * (3 * BS // 4) + [9]
    new = [11, 12, 13, 14] * (3 * BS // 4) + [9]
    w = HttpWorker("chain-1", *flags, events=False, http_port=http).start()
    w.events, w.replay = f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{rep}"
    complete(w, old)

    async def main():
        nonlocal w
        async with Running(service, [spec(w, "kv-engine")]), router(service) as r:
            await r.until(lambda: r.matched(old, "tiny"),
                          lambda m: m.get("kv-engine") == 3 * BS)
            w.stop()
            w = HttpWorker("chain-2", *flags, events=False, http_port=http).start()
            complete(w, new)
            got = await r.until(lambda: r.matched(new, "tiny"),
                                lambda m: m.get("kv-engine") == 3 * BS, within=WITHIN)
            assert got["kv-engine"] == 3 * BS
            assert (await r.matched(old, "tiny"))["kv-engine"] == 0
    try:
        asyncio.run(main())
    finally:
        w.stop()


def test_evicted_blocks_route_with_the_cpu_tier_and_salts_stay_apart(service: str):
    w = HttpWorker("chain-cpu", "--cpu-blocks", "32", num_blocks=12).start()
    first = list(range(30, 30 + 2 * BS)) + [1]
    try:
        complete(w, first, cache_salt="t1")
        for i in range(8):  # push it out of the device pool (12 blocks)
            complete(w, list(range(100 + 10 * i, 100 + 10 * i + 2 * BS)) + [1])

        async def main():
            async with Running(service, [spec(w, "kv-cpu")]), router(service) as r:
                got = await r.until(
                    lambda: r.matched(first, "tiny", salt="t1", tiers=True),
                    lambda m: m.get("kv-cpu", (0, 0))[0] == 2 * BS, within=WITHIN)
                assert got["kv-cpu"][1] == pb.TIER_CPU
                assert (await r.matched(first, "tiny"))["kv-cpu"] == 0  # unsalted: nothing
        asyncio.run(main())
    finally:
        w.stop()


def test_a_bridge_with_its_curve_key_indexes_a_worker_serving_curve(service: str, tmp_path):
    """A worker with an access token serves its events over CURVE only (kvmesh.events.zmq_curve):
    the bridge, given its certificate (``curve_key``) and the worker's public key
    (``curve-server-key``), indexes the worker's blocks as over plain ZMQ."""
    clients = tmp_path / "clients"
    clients.mkdir()
    _, worker_secret = zmq.auth.create_certificates(tmp_path, "worker")
    bridge_public, bridge_secret = zmq.auth.create_certificates(tmp_path, "bridge")
    (clients / "bridge.key").write_bytes(open(bridge_public, "rb").read())
    access = "access-curve"
    w = HttpWorker("chain-curve", env={"KVMESH_WORKER_ACCESS_TOKEN": access,
                                       "KVMESH_VLLM_CURVE_KEY": worker_secret,
                                       "KVMESH_VLLM_CURVE_CLIENTS": str(clients)}).start()
    ids = list(range(40, 40 + 3 * BS)) + [1]
    try:
        openai.OpenAI(base_url=f"{w.url}/v1", api_key=access, max_retries=0).completions.create(
            model="tiny", prompt=ids, max_tokens=1, temperature=0)
        engine = EngineSpec(worker_id="kv-curve", address=w.url, events=w.events,
                            replay=w.replay, block_size=BS, metrics_url=w.metrics_url,
                            curve_server_key=str(tmp_path / "worker.key"))

        async def main():
            async with Running(service, [engine], curve_key=bridge_secret), \
                    router(service) as r:
                got = await r.until(lambda: r.matched(ids, "tiny"),
                                    lambda m: m.get("kv-curve") == 3 * BS, within=WITHIN)
                assert got["kv-curve"] == 3 * BS
        asyncio.run(main())
    finally:
        w.stop()
