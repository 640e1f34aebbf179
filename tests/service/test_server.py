"""The grpc.aio service end to end over a real Valkey: protocol workers register, heartbeat
and publish; routers route."""
from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from kvmesh.hashing import block_hashes
from kvmesh.v1 import index_pb2 as pb
from service.config import ServiceConfig
from tests.service.manual_clock import ManualClock
from tests.service.protocol_worker import BS, ProtocolWorker, prompt, route, serve


def redis_cfg(url: str, **kw: object) -> ServiceConfig:
    return ServiceConfig(backend="redis", redis_url=url, **kw)  # type: ignore[arg-type]


def test_shared_prefix_goes_to_its_holder_and_salts_never_mix(redis_url: str) -> None:
    async def main() -> None:
        async with serve(redis_cfg(redis_url)) as r:
            a, b = ProtocolWorker(r.stub, "a", port=1), ProtocolWorker(r.stub, "b", port=2)
            reg = await a.register()
            assert reg.resync and reg.namespace == f"tiny:{BS}:sha256_cbor"
            assert (reg.heartbeat_interval_ms, reg.liveness_timeout_ms) == (1000, 3000)
            await a.sync()
            await b.join()
            system = prompt(40)                    # a shared "system prompt" of 10 blocks
            await a.store(system + [500, 501, 502, 503])
            res = await route(r.stub, system + [900, 901, 902, 903, 904])
            assert [c.worker_id for c in res.candidates] == ["a", "b"]
            best = res.candidates[0]
            assert (best.matched_tokens, best.tier, best.address) == (40, pb.TIER_GPU,
                                                                      "127.0.0.1:1")
            assert res.prompt_tokens == 45 and res.policy == "kvmesh" and not res.degraded
            # the same tokens under another tenant's salt never match
            salted = await route(r.stub, system + [900], salt="tenant-b")
            assert all(c.matched_tokens == 0 for c in salted.candidates)
            # a salted chain matches only its own salt
            await b.store(system, salt="tenant-b")
            again = await route(r.stub, system + [900], salt="tenant-b")
            assert again.candidates[0].worker_id == "b"
            assert again.candidates[0].matched_tokens == 40

    asyncio.run(main())


def test_eviction_removes_blocks_from_the_index(redis_url: str) -> None:
    async def main() -> None:
        async with serve(redis_cfg(redis_url)) as r:
            a = ProtocolWorker(r.stub, "a")
            await a.join()
            p = prompt(33)                                  # 8 full blocks + 1 token
            chain = await a.store(p)
            assert (await route(r.stub, p)).candidates[0].matched_tokens == 32
            res = await a.evict_tail(chain, 3)
            assert res.applied == 1 and res.last_seq == 2 and not res.resync
            assert (await route(r.stub, p)).candidates[0].matched_tokens == 20
            stats = await r.stub.Stats(pb.StatsRequest())
            (w,) = stats.workers
            assert (w.worker_id, w.indexed_blocks, w.last_seq, w.alive) == ("a", 5, 2, True)
            cleared = a.next_event(cleared=pb.AllBlocksCleared())
            assert (await a.publish(cleared)).applied == 1
            assert (await r.stub.Stats(pb.StatsRequest())).workers[0].indexed_blocks == 0

    asyncio.run(main())


def test_last_token_is_never_counted_as_cached(redis_url: str) -> None:
    async def main() -> None:
        async with serve(redis_cfg(redis_url)) as r:
            a = ProtocolWorker(r.stub, "a")
            await a.join()
            p = prompt(16)                                  # exactly 4 full blocks
            await a.store(p)
            assert (await route(r.stub, p)).candidates[0].matched_tokens == 12
            assert (await route(r.stub, p[:3])).candidates[0].matched_tokens == 0

    asyncio.run(main())


def test_provisional_entries_co_locate_a_burst(redis_url: str) -> None:
    async def main() -> None:
        async with serve(redis_cfg(redis_url)) as r:
            workers = [ProtocolWorker(r.stub, f"w{i}", port=i + 1) for i in range(4)]
            for w in workers:
                await w.join()
            new = prompt(64, start=7000)                    # nobody holds it
            first = await route(r.stub, new, policy="prefix_only")
            assert first.candidates[0].matched_tokens == 0
            chosen = first.candidates[0].worker_id
            for _ in range(5):                              # before any event arrives
                res = await route(r.stub, new, policy="prefix_only")
                assert res.candidates[0].worker_id == chosen
                assert res.candidates[0].matched_tokens == 60
            # the default policy sees the provisional match too
            res = await route(r.stub, new)
            assert {c.worker_id: c.matched_tokens for c in res.candidates}[chosen] == 60

    asyncio.run(main())


def test_dry_run_routes_record_nothing(redis_url: str) -> None:
    async def main() -> None:
        async with serve(redis_cfg(redis_url)) as r:
            for i in range(2):
                await ProtocolWorker(r.stub, f"w{i}").join()
            new = prompt(64, start=7000)
            for _ in range(3):
                res = await r.stub.Route(pb.RouteRequest(token_ids=new, dry_run=True))
                assert all(c.matched_tokens == 0 for c in res.candidates)
            st = await r.stub.Stats(pb.StatsRequest())
            assert all(w.indexed_blocks == 0 for w in st.workers)
            # a real route records provisional entries; a dry run sees them without adding
            chosen = (await route(r.stub, new)).candidates[0].worker_id
            res = await r.stub.Route(pb.RouteRequest(token_ids=new, dry_run=True))
            assert {c.worker_id: c.matched_tokens for c in res.candidates}[chosen] == 60

    asyncio.run(main())


def test_provisional_entries_never_outlive_their_ttl(redis_url: str) -> None:
    async def main() -> None:
        clock = ManualClock()
        async with serve(redis_cfg(redis_url, provisional_ttl_s=2.0), clock=clock) as r:
            for i in range(2):
                await ProtocolWorker(r.stub, f"w{i}").join()
            new = prompt(64, start=7000)
            await route(r.stub, new)
            assert max(c.matched_tokens for c in (await route(r.stub, new)).candidates) == 60
            clock.advance(2000)   # exactly the TTL: both routes recorded at the same instant
            res = await route(r.stub, new)                  # looked up before it records
            assert res.candidates and all(c.matched_tokens == 0 for c in res.candidates)
            st = await r.stub.Stats(pb.StatsRequest())
            assert all(w.indexed_blocks == 0 for w in st.workers)

    asyncio.run(main())


def test_root_hash_mismatch_is_refused(redis_url: str) -> None:
    async def main() -> None:
        async with serve(redis_cfg(redis_url)) as r:
            odd = ProtocolWorker(r.stub, "odd", seed="0")        # PYTHONHASHSEED=0 style seed
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await odd.register()
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "0% cache hits" in (e.value.details() or "")
            assert (await r.stub.Stats(pb.StatsRequest())).workers == []
        async with serve(redis_cfg(redis_url, hash_seed="0")) as r:
            assert (await ProtocolWorker(r.stub, "odd", seed="0").register()).resync

    asyncio.run(main())


def test_sequence_gaps_and_unknown_workers_ask_for_recovery(redis_url: str) -> None:
    async def main() -> None:
        async with serve(redis_cfg(redis_url)) as r:
            a = ProtocolWorker(r.stub, "a")
            await a.join()
            chain = await a.store(prompt(8))
            a.seq += 5                                      # five events lost
            lost = a.next_event(removed=pb.BlockRemoved(block_hashes=chain[-1:]))
            res = await a.publish(lost)
            assert res.resync and res.applied == 0 and res.last_seq == 1
            assert (await route(r.stub, prompt(9))).candidates[0].matched_tokens == 8
            # the index is behind the worker: tolerated for one heartbeat (a publish may be
            # in flight), then a resync is requested
            assert not (await a.heartbeat()).resync
            assert (await a.heartbeat()).resync
            assert (await a.sync()).indexed_blocks == 2
            assert not (await a.heartbeat()).resync
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await ProtocolWorker(r.stub, "ghost").store(prompt(8))
            assert e.value.code() == grpc.StatusCode.NOT_FOUND
            hb = await ProtocolWorker(r.stub, "ghost").heartbeat()
            assert hb.reregister and hb.resync

    asyncio.run(main())


def test_models_are_separate_namespaces(redis_url: str) -> None:
    async def main() -> None:
        async with serve(redis_cfg(redis_url)) as r:
            a = ProtocolWorker(r.stub, "a", model="llama")
            b = ProtocolWorker(r.stub, "b", model="qwen", algo="xxhash")
            await a.join()
            await b.join()
            await a.store(prompt(20))
            await b.store(prompt(20))
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await route(r.stub, prompt(21))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "several models" in (e.value.details() or "")
            for model, wid in (("llama", "a"), ("qwen", "b")):
                res = await route(r.stub, prompt(21), model=model)
                assert [(c.worker_id, c.matched_tokens) for c in res.candidates] == [(wid, 20)]
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await route(r.stub, prompt(21), model="mistral")
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE

    asyncio.run(main())


def test_health_reflection_and_policy_choice() -> None:
    async def main() -> None:
        async with serve(ServiceConfig(policy="round_robin")) as r:
            health = health_pb2_grpc.HealthStub(r.channel)
            for name in ("", "kvmesh.v1.IndexService"):
                res = await health.Check(health_pb2.HealthCheckRequest(service=name))
                assert res.status == health_pb2.HealthCheckResponse.SERVING
            refl = reflection_pb2_grpc.ServerReflectionStub(r.channel)
            req = reflection_pb2.ServerReflectionRequest(list_services="")
            async for res in refl.ServerReflectionInfo(iter([req])):
                names = {s.name for s in res.list_services_response.service}
                assert "kvmesh.v1.IndexService" in names
            for i in range(3):
                await ProtocolWorker(r.stub, f"w{i}").join()
            got = [(await route(r.stub, prompt(5))).candidates[0].worker_id for _ in range(3)]
            assert sorted(got) == ["w0", "w1", "w2"]
            res = await route(r.stub, prompt(5), policy="random", max_candidates=2)
            assert res.policy == "random" and len(res.candidates) == 2

    asyncio.run(main())


def test_lora_and_multimodal_requests_hash_like_the_worker(redis_url: str) -> None:
    async def main() -> None:
        async with serve(redis_cfg(redis_url)) as r:
            a = ProtocolWorker(r.stub, "a")
            await a.join()
            p = prompt(24)
            lora, mm = ("sql", "/adapters/sql"), [("img-1", 4, 6)]
            for kw in ({"lora": lora}, {"mm": mm}):
                chain = block_hashes(p, BS, **kw)  # type: ignore[arg-type]
                ev = a.next_event(stored=pb.BlockStored(block_hashes=chain))
                assert (await a.publish(ev)).applied == 1
            with_lora = await route(r.stub, p + [1], lora=pb.Lora(name="sql", path="/adapters/sql"))
            assert with_lora.candidates[0].matched_tokens == 24
            with_mm = await route(r.stub, p + [1], mm=[pb.MultimodalItem(
                identifier="img-1", offset=4, length=6)])
            assert with_mm.candidates[0].matched_tokens == 24
            other_image = await route(r.stub, p + [1], mm=[pb.MultimodalItem(
                identifier="img-2", offset=4, length=6)])
            # the image starts in block 1: block 0 is shared, block 1 already differs
            assert other_image.candidates[0].matched_tokens == 4
            plain = await route(r.stub, p + [1])
            assert plain.candidates[0].matched_tokens == 4

    asyncio.run(main())


def test_stop_does_not_wait_for_ever_on_a_loop_that_ignores_its_cancel(monkeypatch, caplog
                                                                      ) -> None:
    """A background step stuck in a call that swallows cancellation (a hang seen once under
    load) must not keep ``stop()`` from releasing the port: it waits ``STOP_TASKS_S``, says
    where the loop is, and stops without it."""
    import service.server as server_mod
    from service.server import create_server

    monkeypatch.setattr(server_mod, "STOP_TASKS_S", 0.5)
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                pass  # what a badly behaved library call does

    async def main() -> None:
        server, _ = await create_server("127.0.0.1:0", ServiceConfig())
        await server.start()
        stuck = asyncio.create_task(stubborn())
        server._tasks.append(stuck)
        await asyncio.sleep(0)
        t0 = asyncio.get_running_loop().time()
        await asyncio.wait_for(server.stop(None), 10)
        took = asyncio.get_running_loop().time() - t0
        assert 0.4 < took < 5, took
        assert not stuck.done()
        assert "still running" in caplog.text and "stubborn" in caplog.text
        release.set()
        stuck.cancel()
        await stuck

    asyncio.run(main())
