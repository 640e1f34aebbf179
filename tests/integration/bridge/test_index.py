"""The bridge against real processes: vLLM-like publishers (``FakeEngine``: real PUB + replay
ROUTER sockets) and ``/metrics`` pages (``FakeMetrics``: real HTTP) -> the bridge -> a service
process on a real Valkey, read back with Route and Stats as a router does.

Each test serves its own model name, so its Routes see only its own workers.
"""
from __future__ import annotations

import asyncio

import grpc
import pytest

from kvmesh.events import vllm as ve
from kvmesh.v1 import index_pb2 as pb
from tests.bridge.cluster import (
    BS,
    Engine,
    P,
    Running,
    chain,
    removed,
    router,
    stored,
)
from tests.bridge.fake_vllm import FakeEngine

pytestmark = pytest.mark.integration


def test_routes_find_the_engine_holding_a_prefix(service: str) -> None:
    async def main():
        a, b = Engine("holder-a", "m-prefix"), Engine("holder-b", "m-prefix")
        a.pub.publish(chain(P[:8]))  # before the bridge: learnt from the replay socket
        async with Running(service, [a.spec, b.spec]) as br, router(service) as r:
            await br.live("holder-a", a.pub)
            await br.live("holder-b", b.pub)
            got = await r.until(lambda: r.matched(P, "m-prefix"),
                                lambda m: m.get("holder-a") == 8 and "holder-b" in m)
            assert got["holder-b"] == 0
            a.pub.publish(stored([3], P[8:], parent=2, block_size=BS))
            b.pub.publish(chain(P[:4], first=50))
            await r.until(lambda: r.matched(P, "m-prefix"),
                          lambda m: m == {"holder-a": 12, "holder-b": 4})
            a.pub.publish(removed([2, 3]))  # evicted from the tail
            await r.until(lambda: r.matched(P, "m-prefix"), lambda m: m["holder-a"] == 4)
        await a.close()
        await b.close()
    asyncio.run(main())


def test_salted_prompts_match_only_their_own_salt(service: str) -> None:
    async def main():
        e = Engine("salty", "m-salt")
        e.pub.publish(chain(P, keys=[("s1",), None, None]))
        async with Running(service, [e.spec]) as br, router(service) as r:
            await br.live("salty", e.pub)
            await r.until(lambda: r.matched(P, "m-salt", salt="s1"),
                          lambda m: m.get("salty") == 12)
            assert (await r.matched(P, "m-salt"))["salty"] == 0
            assert (await r.matched(P, "m-salt", salt="s2"))["salty"] == 0
        await e.close()
    asyncio.run(main())


def test_a_lora_request_matches_only_its_adapter(service: str) -> None:
    async def main():
        e = Engine("lora", "m-lora", lora={"ad": "/adapters/ad"})
        e.pub.publish(chain(P, lora="ad", keys=[("ad",)] * 3))
        e.pub.publish(chain(P, first=20, lora="other", keys=[("other",)] * 3))  # unmapped
        async with Running(service, [e.spec]) as br, router(service) as r:
            await br.live("lora", e.pub)
            await r.until(lambda: r.matched(P, "m-lora", lora=("ad", "/adapters/ad")),
                          lambda m: m.get("lora") == 12)
            assert (await r.matched(P, "m-lora"))["lora"] == 0
            assert (await r.matched(P, "m-lora", lora=("ad", "/elsewhere")))["lora"] == 0
            assert (await r.matched(P, "m-lora", lora=("other", "/x")))["lora"] == 0
            assert br.ranks["lora"].state.stats.unroutable == {"unknown_lora": 3}
        await e.close()
    asyncio.run(main())


def test_duplicates_survive_one_removal(service: str) -> None:
    async def main():
        e = Engine("dups", "m-dups")
        e.pub.publish(chain(P))
        e.pub.publish(chain(P))  # the same hashes in other physical blocks
        async with Running(service, [e.spec]) as br, router(service) as r:
            await br.live("dups", e.pub)
            await r.until(lambda: r.matched(P, "m-dups"), lambda m: m.get("dups") == 12)
            e.pub.publish(removed([1, 2, 3]))
            e.pub.publish(chain(P[:4], first=90))  # a later batch: the removal was applied
            await r.until(lambda: r.matched(P[:4] + [7] * 4, "m-dups"),
                          lambda m: m.get("dups") == 4)
            assert (await r.matched(P, "m-dups"))["dups"] == 12
            e.pub.publish(removed([1, 2, 3]))
            await r.until(lambda: r.matched(P, "m-dups"), lambda m: m["dups"] == 4)
        await e.close()
    asyncio.run(main())


def test_a_dropped_message_is_replayed(service: str) -> None:
    async def main():
        e = Engine("drops", "m-drop")
        async with Running(service, [e.spec]) as br, router(service) as r:
            await br.live("drops", e.pub)
            e.pub.publish(chain(P[:4]))
            await r.until(lambda: r.matched(P, "m-drop"), lambda m: m.get("drops") == 4)
            e.pub.publish(stored([2], P[4:8], parent=1, block_size=BS), drop=True)
            e.pub.publish(stored([3], P[8:], parent=2, block_size=BS))
            await r.until(lambda: r.matched(P, "m-drop"), lambda m: m["drops"] == 12)
            stats = br.ranks["drops"].sub.stats
            assert stats.gaps == 1 and stats.unfilled == 0 and stats.restarts == 0
        await e.close()
    asyncio.run(main())


def test_an_engine_restart_leaves_no_stale_entry(service: str) -> None:
    async def main():
        e = Engine("restarts", "m-restart")
        other = list(range(5000, 5012))
        async with Running(service, [e.spec]) as br, router(service) as r:
            await br.live("restarts", e.pub)
            e.pub.publish(chain(P))
            await r.until(lambda: r.matched(P, "m-restart"), lambda m: m.get("restarts") == 12)
            await e.pub.close()
            pub, rep = e.ports[0]

            async def bind():
                try:
                    return FakeEngine(pub, rep)
                except Exception as err:  # noqa: BLE001 - port not released yet
                    return err
            e.ranks[0] = await r.until(bind, lambda x: isinstance(x, FakeEngine))
            # the new process numbers its batches from 0 again and holds something else
            e.pub.publish(chain(other))
            await r.until(lambda: r.matched(other, "m-restart"),
                          lambda m: m.get("restarts") == 12)
            assert (await r.matched(P, "m-restart"))["restarts"] == 0
            assert br.ranks["restarts"].sub.stats.restarts >= 1
        await e.close()
    asyncio.run(main())


def test_all_blocks_cleared(service: str) -> None:
    async def main():
        e = Engine("clears", "m-clear")
        async with Running(service, [e.spec]) as br, router(service) as r:
            await br.live("clears", e.pub)
            e.pub.publish(chain(P))
            await r.until(lambda: r.matched(P, "m-clear"), lambda m: m.get("clears") == 12)
            e.pub.publish(ve.VllmCleared())
            await r.until(lambda: r.matched(P, "m-clear"), lambda m: m["clears"] == 0)
        await e.close()
    asyncio.run(main())


def test_a_cpu_medium_block_routes_with_a_cpu_tier_match(service: str) -> None:
    async def main():
        e = Engine("tiers", "m-cpu")
        async with Running(service, [e.spec]) as br, router(service) as r:
            await br.live("tiers", e.pub)
            e.pub.publish(chain(P, medium="CPU"))  # stored by the offloading connector
            await r.until(lambda: r.matched(P, "m-cpu", tiers=True),
                          lambda m: m.get("tiers") == (12, pb.TIER_CPU))
            e.pub.publish(chain(P[:4]))  # block 0 back on the device
            e.pub.publish(removed([1, 2, 3], medium="CPU"))  # the CPU copies dropped
            await r.until(lambda: r.matched(P, "m-cpu", tiers=True),
                          lambda m: m.get("tiers") == (4, pb.TIER_GPU))
        await e.close()
    asyncio.run(main())


def test_two_data_parallel_ranks_are_two_workers(service: str) -> None:
    async def main():
        e = Engine("dp", "m-dp", ranks=2)
        e.metrics.load[1].running = 3
        async with Running(service, [e.spec]) as br, router(service) as r:
            await br.live("dp-dp0", e.ranks[0])
            await br.live("dp-dp1", e.ranks[1])
            e.ranks[1].publish(chain(P))
            e.ranks[0].publish(chain(P[:4], first=70))
            await r.until(lambda: r.matched(P, "m-dp"),
                          lambda m: m == {"dp-dp0": 4, "dp-dp1": 12})
            resp = await r.stub.Stats(pb.StatsRequest(), timeout=5)
            loads = {w.worker_id: w.load.running for w in resp.workers if w.model == "m-dp"}
            assert loads == {"dp-dp0": 0, "dp-dp1": 3}
        await e.close()
    asyncio.run(main())


def test_silent_metrics_take_the_engine_out_of_routing(service: str) -> None:
    async def main():
        e = Engine("quiet", "m-quiet")
        async with Running(service, [e.spec]) as br, router(service) as r:
            await br.live("quiet", e.pub)
            e.pub.publish(chain(P))
            await r.until(lambda: r.matched(P, "m-quiet"), lambda m: m.get("quiet") == 12)
            e.metrics.fail = True
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            await r.until(r.alive, lambda a: a.get("quiet") is False)
            # the service's liveness timeout (3 s), a heartbeat period and a refresh at most
            assert loop.time() - t0 < 3.0 + 1.0 + 1.0
            with pytest.raises(grpc.aio.AioRpcError) as err:  # its only worker is dead
                await r.matched(P, "m-quiet")
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert br.ranks["quiet"].link.silent
            e.metrics.fail = False
            await r.until(lambda: r.matched(P, "m-quiet"), lambda m: m.get("quiet") == 12)
        await e.close()
    asyncio.run(main())
