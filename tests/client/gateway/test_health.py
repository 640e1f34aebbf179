"""``/health`` says whether a request could be served now (a service replica answers and
lists a live worker); ``/ping`` only that the gateway runs. Over the fake index, and over a
real cluster whose worker and then service are stopped."""
from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import grpc
import openai
import pytest

from client.errors import KvmeshError
from client.gateway.app import GatewayConfig
from client.gateway.health import ClusterHealth
from deploy.local import ClusterSpec, LocalCluster
from deploy.waiting import wait_until
from kvmesh.v1 import index_pb2
from tests.client.gateway.conftest import LiveGateway, Stack


def probe(url: str, path: str = "/health", method: str = "GET") -> tuple[int, dict]:
    """(status, JSON body) of a probe; HEAD answers no body ({})."""
    req = urllib.request.Request(f"{url}{path}", method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    return status, json.loads(raw) if raw else {}


def live_worker(alive: bool = True) -> index_pb2.StatsResponse:
    return index_pb2.StatsResponse(workers=[index_pb2.WorkerInfo(
        worker_id="w1", address="10.9.8.7:50061", model="tiny", alive=alive)])


def test_health_needs_a_live_worker_and_ping_does_not(stack: Stack) -> None:
    url = stack.gateway.url
    stack.index.stats = live_worker()
    assert probe(url) == (200, {"status": "ok", "model": "tiny"})
    assert probe(url, method="HEAD") == (200, {})
    for stats in (index_pb2.StatsResponse(), live_worker(alive=False)):
        stack.index.stats = stats
        status, body = probe(url)
        assert status == 503 and body["status"] == "unhealthy"
        assert body["reason"] == "the metadata service lists no live worker"
        assert "10.9.8.7" not in json.dumps(body)  # anyone may probe: no machine is named
        assert probe(url, "/ping") == (200, {"status": "ok"})


@pytest.mark.parametrize("code, reason", [
    (grpc.StatusCode.UNAVAILABLE, "no metadata service replica answered"),
    (grpc.StatusCode.UNAUTHENTICATED, "the metadata service refused the gateway's credentials"),
])
def test_health_reports_a_service_that_fails(stack: Stack, code: grpc.StatusCode,
                                             reason: str) -> None:
    stack.index.stats = live_worker()
    stack.index.error = (code, f"scripted by {stack.index_address}")
    status, body = probe(stack.gateway.url)
    assert status == 503 and body["reason"].startswith(reason)
    assert stack.index_address not in json.dumps(body)
    assert probe(stack.gateway.url, "/ping")[0] == 200


def test_health_checks_are_cached_and_shared() -> None:
    """Probes come often: the service is asked once per TTL, by one call that concurrent
    probes share, and a failing answer is cached as well as a good one."""
    calls: list[float] = []
    now = [100.0]
    answer: list[object] = [live_worker_dict()]

    async def stats() -> dict:
        calls.append(now[0])
        await asyncio.sleep(0.01)
        if isinstance(answer[0], Exception):
            raise answer[0]
        return answer[0]

    async def scenario() -> None:
        health = ClusterHealth(stats, ttl_s=2.0, clock=lambda: now[0])
        verdicts = await asyncio.gather(*(health.verdict() for _ in range(20)))
        assert all(v.healthy for v in verdicts) and len(calls) == 1
        now[0] += 1.0
        assert (await health.verdict()).healthy and len(calls) == 1
        answer[0] = KvmeshError(grpc.StatusCode.UNAVAILABLE, "down")
        now[0] += 1.5
        assert not (await health.verdict()).healthy and len(calls) == 2
        assert not (await health.verdict()).healthy and len(calls) == 2

    asyncio.run(scenario())


def live_worker_dict() -> dict:
    return {"service": "s", "workers": [{"worker_id": "w1", "alive": True}]}


def test_a_hanging_service_is_unhealthy_within_the_timeout() -> None:
    async def hang() -> dict:
        await asyncio.sleep(60)
        return {}

    async def scenario() -> None:
        health = ClusterHealth(hang, timeout_s=0.05)
        verdict = await asyncio.wait_for(health.verdict(), 5)
        assert not verdict.healthy
        assert verdict.reason == "no metadata service replica answered"

    asyncio.run(scenario())


@pytest.mark.integration
def test_health_follows_a_real_cluster_as_its_worker_and_service_stop() -> None:
    """guidellm's pre-flight passed while every request got 503: now /health fails when the
    worker is gone, and again when the service is gone, as requests do."""
    with LocalCluster(ClusterSpec(workers=1, num_blocks=32)) as cluster:
        gateway = LiveGateway(GatewayConfig(service=cluster.service_addresses,
                                            generate_timeout=30, health_ttl_s=0.2))
        try:
            assert probe(gateway.url) == (200, {"status": "ok", "model": "tiny"})
            client = gateway.openai()
            client.completions.create(model="tiny", prompt="hello", max_tokens=1)

            cluster.workers[0].stop()
            wait_until(lambda: probe(gateway.url)[0] == 503, timeout=30,
                       what="/health to see the worker gone")
            assert probe(gateway.url)[1]["reason"] == "the metadata service lists no live worker"

            cluster.services[0].stop()
            wait_until(lambda: probe(gateway.url)[1].get("reason")
                       == "no metadata service replica answered", timeout=30,
                       what="/health to see the service gone")
            assert probe(gateway.url, "/ping") == (200, {"status": "ok"})
            with pytest.raises(openai.InternalServerError) as info:  # what requests see too
                client.completions.create(model="tiny", prompt="hello", max_tokens=1)
            assert info.value.status_code == 503
        finally:
            gateway.stop()
