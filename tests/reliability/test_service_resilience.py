"""Failure handling over a real Valkey: dead workers, the janitor, Redis killed and restarted
empty, service restarts, and two replicas sharing one Redis.

Time the service measures (liveness, purge, the degraded period) is a ManualClock moved by
the test; what takes real time (the background loops, Redis coming back) is waited for as a
condition."""
from __future__ import annotations

import asyncio

import grpc

from deploy.redis_server import RedisServer
from deploy.waiting import eventually
from kvmesh.v1 import index_pb2 as pb
from service.config import ServiceConfig
from tests.service.manual_clock import ManualClock
from tests.service.protocol_worker import ProtocolWorker, Running, prompt, route, serve

FAST = dict(heartbeat_interval_s=0.2, liveness_timeout_s=0.6, purge_after_s=1.0,
            janitor_interval_s=0.2, refresh_interval_s=0.1, degraded_retry_s=0.2)


def redis_cfg(url: str, **kw: object) -> ServiceConfig:
    return ServiceConfig(backend="redis", redis_url=url, redis_timeout_s=0.3, **kw)  # type: ignore


async def index_down(r: Running) -> bool:
    """Whether the replica answers degraded at once (its refresh loop found Redis down)."""
    return r.server.servicer.router.index_down


def test_silent_worker_leaves_routing_within_three_seconds(redis_url: str) -> None:
    async def main() -> None:
        clock = ManualClock()
        async with serve(redis_cfg(redis_url), clock=clock) as r:  # defaults: 1 s / 3 s
            a, b = ProtocolWorker(r.stub, "a"), ProtocolWorker(r.stub, "b")
            await a.join()
            await b.join()
            p = prompt(40)
            await a.store(p)
            assert (await route(r.stub, p)).candidates[0].worker_id == "a"
            await a.heartbeat()
            await b.heartbeat()
            for _ in range(5):                          # b keeps heartbeating, a is silent
                clock.advance(500)
                await b.heartbeat()
            clock.advance(499)                          # 2.999 s after a's last heartbeat
            res = await route(r.stub, p)
            assert res.candidates[0].worker_id == "a", "left routing too early"
            clock.advance(1)                            # exactly 3.0 s: out of routing
            res = await route(r.stub, p)
            assert [c.worker_id for c in res.candidates] == ["b"]
            st = await r.stub.Stats(pb.StatsRequest())
            assert {w.worker_id: w.alive for w in st.workers} == {"a": False, "b": True}

    asyncio.run(main())


def test_janitor_purges_dead_workers(redis_url: str) -> None:
    async def main() -> None:
        clock = ManualClock()
        async with serve(redis_cfg(redis_url, **FAST), clock=clock) as r:
            a = ProtocolWorker(r.stub, "a")
            await a.join()
            await a.store(prompt(40))
            assert (await r.stub.Stats(pb.StatsRequest())).workers
            clock.advance(1001)                                 # past purge_after_s
            await eventually(lambda: r.stub.Stats(pb.StatsRequest()),
                             lambda st: not st.workers, within=3)  # the janitor's next round
            hb = await a.heartbeat()                            # it comes back: too late
            assert hb.reregister and hb.resync
            await a.join()                                      # re-register + snapshot
            res = await route(r.stub, prompt(41))
            assert res.candidates[0].matched_tokens == 40

    asyncio.run(main())


def test_redis_down_degrades_then_recovers_empty(redis_server: RedisServer,
                                                 redis_url: str) -> None:
    async def main() -> None:
        clock = ManualClock()
        async with serve(redis_cfg(redis_url, **FAST), clock=clock) as r:
            a, b = ProtocolWorker(r.stub, "a"), ProtocolWorker(r.stub, "b")
            await a.join(running=2)
            await b.join(running=1)
            p = prompt(40)
            await a.store(p)
            assert (await route(r.stub, p)).candidates[0].worker_id == "a"
            redis_server.kill()
            for _ in range(3):
                res = await route(r.stub, p)                    # never an error
                assert res.degraded and res.policy == "least_loaded"
                assert [c.worker_id for c in res.candidates] == ["b", "a"]
            st = await r.stub.Stats(pb.StatsRequest())
            assert st.degraded and {w.worker_id for w in st.workers} == {"a", "b"}
            try:
                await a.heartbeat()
                raise AssertionError("heartbeat should fail while the index is down")
            except grpc.aio.AioRpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE
            clock.advance(1000)                                 # past the liveness timeout
            await eventually(lambda: index_down(r), within=3)   # the refresh loop's next try
            assert len((await route(r.stub, p)).candidates) == 2
            redis_server.start()                                # back, EMPTY
            hb = await eventually(a.heartbeat, lambda hb: hb.reregister, within=3)
            assert hb.resync
            await a.join(running=2)
            await b.join(running=1)
            res = await eventually(lambda: route(r.stub, p),
                                   lambda res: not res.degraded, within=3)
            assert res.candidates[0].worker_id == "a"
            assert res.candidates[0].matched_tokens == 36       # re-synced snapshot

    asyncio.run(main())


def test_two_replicas_over_one_redis_agree(redis_url: str) -> None:
    async def main() -> None:
        cfg = redis_cfg(redis_url, refresh_interval_s=0.1)
        async with serve(cfg) as r1, serve(cfg) as r2:
            a, b = ProtocolWorker(r1.stub, "a", port=1), ProtocolWorker(r2.stub, "b", port=2)
            await a.join()
            await b.join()
            p1, p2 = prompt(40), prompt(40, start=5000)
            await a.store(p1)
            await b.store(p2)
            for stub in (r1.stub, r2.stub):
                res = await eventually(lambda s=stub: route(s, p1),
                                       lambda res: len(res.candidates) == 2, within=2)
                assert (res.candidates[0].worker_id, res.candidates[0].matched_tokens) == ("a", 36)
                res = await route(stub, p2)
                assert (res.candidates[0].worker_id, res.candidates[0].matched_tokens) == ("b", 36)
            assert not (await ProtocolWorker(r2.stub, "a").heartbeat()).reregister
            # a provisional entry written through one replica steers the other
            new = prompt(40, start=9000)
            first = (await route(r1.stub, new, policy="prefix_only")).candidates[0]
            second = (await route(r2.stub, new, policy="prefix_only")).candidates[0]
            assert second.worker_id == first.worker_id and second.matched_tokens == 36
            s1 = await r1.stub.Stats(pb.StatsRequest())
            s2 = await r2.stub.Stats(pb.StatsRequest())
            blocks = sorted((w.worker_id, w.indexed_blocks, w.last_seq) for w in s1.workers)
            assert blocks == sorted((w.worker_id, w.indexed_blocks, w.last_seq)
                                    for w in s2.workers) == [("a", 10, 1), ("b", 10, 1)]

    asyncio.run(main())


def test_service_restart_keeps_redis_state_but_memory_asks_to_reregister(
        redis_url: str) -> None:
    async def main() -> None:
        for cfg in (redis_cfg(redis_url), ServiceConfig()):
            async with serve(cfg) as r:
                a = ProtocolWorker(r.stub, "a")
                await a.join()
                await a.store(prompt(20))
            async with serve(cfg) as r:                         # a new process
                a.stub = r.stub
                hb = await a.heartbeat()
                assert hb.reregister is (cfg.backend == "memory")
                if hb.reregister:
                    await a.join()
                res = await route(r.stub, prompt(21))
                assert res.candidates[0].matched_tokens == 20

    asyncio.run(main())


def test_emptied_redis_answers_degraded_until_workers_return(redis_url: str) -> None:
    import redis.asyncio as aioredis

    async def main() -> None:
        async with serve(redis_cfg(redis_url, **FAST)) as r:
            a = ProtocolWorker(r.stub, "a")
            await a.join()
            p = prompt(40)
            await a.store(p)
            client = aioredis.Redis.from_url(redis_url)
            await client.flushall()
            await client.aclose()
            servicer = r.server.servicer

            async def lost() -> bool:                   # a refresh saw the empty registry
                return servicer.table.lost(servicer.clock())

            await eventually(lost, within=3)
            res = await route(r.stub, p)                # never an error meanwhile
            assert res.degraded and [c.worker_id for c in res.candidates] == ["a"]
            hb = await a.heartbeat()
            assert hb.reregister
            await a.join()
            await a.store(p)
            res = await eventually(lambda: route(r.stub, p),
                                   lambda res: not res.degraded, within=3)
            assert res.candidates[0].matched_tokens == 36

    asyncio.run(main())


def test_worker_back_from_silence_rejoins_with_a_snapshot(redis_url: str) -> None:
    async def main() -> None:
        clock = ManualClock()
        async with serve(redis_cfg(redis_url, **FAST), clock=clock) as r:
            a, b = ProtocolWorker(r.stub, "a"), ProtocolWorker(r.stub, "b")
            await a.join()
            await b.join()
            assert not (await a.heartbeat()).resync
            clock.advance(800)                          # past the 0.6 s liveness timeout
            await b.heartbeat()
            live = await route(r.stub, prompt(8))
            assert [c.worker_id for c in live.candidates] == ["b"]
            hb = await a.heartbeat()                    # alive again: resync first
            assert hb.resync and not hb.reregister
            assert not (await a.heartbeat()).resync     # only once

    asyncio.run(main())


def test_a_replica_routes_to_workers_registered_elsewhere_at_once(redis_url: str) -> None:
    async def main() -> None:
        cfg = redis_cfg(redis_url, refresh_interval_s=60.0)  # no periodic refresh in time
        async with serve(cfg) as r1, serve(cfg) as r2:
            await r2.stub.Stats(pb.StatsRequest())       # r2 has looked: nobody yet
            await ProtocolWorker(r1.stub, "a").join()
            res = await route(r2.stub, prompt(8))
            assert [c.worker_id for c in res.candidates] == ["a"]

    asyncio.run(main())
