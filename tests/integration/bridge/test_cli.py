"""``kvmesh bridge vllm`` as a process (flags and a config file), its own metrics, failover
across service addresses, an index that loses everything being restored, mutual TLS and
worker tokens bound to each rank."""
from __future__ import annotations

import asyncio
import urllib.request
from dataclasses import replace

import pytest
import redis

from deploy.process import ServerProcess
from deploy.redis_server import RedisServer
from kvmesh.rpc.channel import Dialer
from kvmesh.v1 import index_pb2 as pb
from tests.bridge.cluster import (
    BS,
    BridgeProcess,
    Engine,
    P,
    Router,
    Running,
    chain,
    router,
)
from tests.ports import closed_port_address, free_port

pytestmark = pytest.mark.integration


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def test_the_verb_bridges_an_engine_and_reports_on_it(service: str) -> None:
    async def main():
        e = Engine("cli", "m-cli", lora={"ad": "/a/ad"})
        e.pub.publish(chain(P))
        mport = free_port()
        proc = BridgeProcess(
            "--service", f"{closed_port_address()},{service}",  # the first one is down
            "--worker-id", "cli", "--address", e.metrics.url, "--events", e.spec.events,
            "--replay", e.spec.replay, "--block-size", str(BS), "--lora", "ad=/a/ad",
            "--metrics-port", str(mport))
        try:
            async with router(service) as r:
                await r.until(lambda: r.matched(P, "m-cli"), lambda m: m.get("cli") == 12)
                e.pub.publish(chain(P, first=10, lora="ad", keys=[("ad",)] * 3))
                e.pub.publish(chain(P[:4], first=20), drop=True)  # lost: filled by replay
                e.pub.publish(chain(P[:8], first=30, lora="ad", keys=[("ad",)] * 2))
                await r.until(lambda: r.matched(P, "m-cli", lora=("ad", "/a/ad")),
                              lambda m: m.get("cli") == 12)
                page = await r.until(lambda: asyncio.to_thread(scrape, mport),
                                     lambda t: 'kvmesh_bridge_up{worker_id="cli"} 1.0' in t
                                     and 'kvmesh_bridge_gaps_total{worker_id="cli"}' in t)
                for name in ("batches_total", "blocks_stored_total", "replays_total",
                             "events_published_total", "heartbeats_total"):
                    assert f'kvmesh_bridge_{name}{{worker_id="cli"}}' in page, name
                assert 'kvmesh_bridge_lag_seconds_count{worker_id="cli"}' in page
            assert proc.stop() == 0, proc.output()
        finally:
            proc.stop()
            await e.close()
    asyncio.run(main())


def test_a_config_file_bridges_many_engines_from_one_process(service: str, tmp_path) -> None:
    async def main():
        a = Engine("cfg-a", "m-cfg")
        b = Engine("cfg-b", "m-cfg", ranks=2)
        cfg = tmp_path / "fleet.yaml"
        cfg.write_text(
            f"service: {service}\nengines:\n"
            f"  - {{worker-id: cfg-a, address: '{a.metrics.url}', events: '{a.spec.events}',"
            f" replay: '{a.spec.replay}', block-size: {BS}}}\n"
            f"  - {{worker-id: cfg-b, address: '{b.metrics.url}', events: '{b.spec.events}',"
            f" replay: '{b.spec.replay}', block-size: {BS}, dp-ranks: 2}}\n")
        b.ranks[1].publish(chain(P))
        proc = BridgeProcess("--config", str(cfg))
        try:
            async with router(service) as r:
                await r.until(lambda: r.matched(P, "m-cfg"),
                              lambda m: m == {"cfg-a": 0, "cfg-b-dp0": 0, "cfg-b-dp1": 12})
        finally:
            assert proc.stop() == 0, proc.output()
            await a.close()
            await b.close()
    asyncio.run(main())


@pytest.mark.parametrize("args, says", [
    (["--service", "s:1", "--config", "{cfg}", "--worker-id", "x"], "not both"),
    (["--service", "s:1", "--worker-id", "x"], "--events"),
    (["--worker-id", "x", "--address", "http://h:1", "--events", "tcp://h:2"], "--service"),
    (["--service", "s:1", "--worker-id", "x", "--address", "http://h:1", "--events",
      "tcp://h:2", "--lora", "nopath"], "NAME=PATH"),
])
def test_bad_invocations_exit_with_a_reason(tmp_path, args: list[str], says: str) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("engines = []\n")
    proc = BridgeProcess(*[a.replace("{cfg}", str(cfg)) for a in args])
    assert proc.proc.wait(60) == 2
    proc.stop()
    assert says in proc.output()


def test_an_index_that_lost_everything_is_restored(service: str,
                                                   redis_server: RedisServer) -> None:
    async def main():
        e = Engine("lost", "m-lost")
        async with Running(service, [e.spec]) as br, router(service) as r:
            await br.live("lost", e.pub)
            e.pub.publish(chain(P))
            await r.until(lambda: r.matched(P, "m-lost"), lambda m: m.get("lost") == 12)
            link = br.ranks["lost"].link

            async def resyncs() -> int:
                return link.counters["resyncs"]
            # A sync is counted when its reply is back in this loop, which may be after a
            # route already sees what it wrote: read the count only once nothing is owed.
            syncs = await r.until(resyncs, lambda n: n >= 1 and link.settled)
            with redis.Redis.from_url(redis_server.url) as client:
                client.flushall()
            # the service notices (the worker is unknown, or behind), the link re-registers
            # or resyncs: the state's snapshot puts the engine's blocks back
            await r.until(lambda: r.matched(P, "m-lost"), lambda m: m.get("lost") == 12)
            await r.until(resyncs, lambda n: n > syncs)
        await e.close()
    asyncio.run(main())



def test_mutual_tls_and_tokens_bound_to_each_rank(redis_server: RedisServer, certs) -> None:
    from kvmesh.rpc.tls import TlsFiles
    from service.worker_tokens import mint

    secret, router_token = "s" * 24, "router-token"
    svc = ServerProcess("tls-service", "service", [
        "--port", "0", "--log-level", "warning", "--token", router_token,
        "--worker-secret", secret, "--tls-cert", str(certs.server_cert),
        "--tls-key", str(certs.server_key), "--tls-ca", str(certs.ca), "--tls-client-auth"],
        env={"KVMESH_REDIS_URL": redis_server.url}).start()

    async def main():
        e = Engine("sec", "m-tls", ranks=2)
        bad = Engine("impostor", "m-tls")
        e.spec = replace(e.spec, service_token=(mint(secret, "sec-dp0"), mint(secret, "sec-dp1")))
        bad.spec = replace(bad.spec, service_token=mint(secret, "sec-dp0"))  # not its own id
        e.ranks[1].publish(chain(P))
        tls = TlsFiles(ca=str(certs.ca), cert=str(certs.client_cert), key=str(certs.client_key))
        channel = Dialer.from_tls(tls).aio(svc.address)
        r = Router(svc.address, channel)
        meta = (("authorization", f"Bearer {router_token}"),)
        try:
            async with Running(svc.address, [e.spec, bad.spec], tls=tls) as br:
                async def ranked():
                    resp = await r.stub.Route(pb.RouteRequest(
                        token_ids=[*P, 0], model="m-tls", dry_run=True), metadata=meta,
                        timeout=5)
                    return {c.worker_id: c.matched_tokens for c in resp.candidates}
                await r.until(ranked, lambda m: m == {"sec-dp0": 0, "sec-dp1": 12})
                link = br.ranks["impostor"].link
                await r.until(lambda: asyncio.sleep(0, link.counters),
                              lambda c: c["error_permission_denied"] > 0)
                assert not link.registered
        finally:
            await channel.close()
            await e.close()
            await bad.close()
    try:
        asyncio.run(main())
    finally:
        svc.stop()
