"""No IndexService handler ever answers UNKNOWN: every RPC sent while the backend is down
(from the start, or killed under live workers) gets its designed code, and a bug in a backend
becomes INTERNAL with a message and a logged traceback."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from deploy.redis_server import RedisServer
from kvmesh.v1 import index_pb2 as pb
from service.config import ServiceConfig
from service.index.memory import MemoryBackend
from service.servicer import IndexServicer
from tests.ports import free_port
from tests.service.protocol_worker import ProtocolWorker, prompt, route, serve

UNAVAILABLE, INTERNAL, OK = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL,
                             grpc.StatusCode.OK)
FAST = dict(heartbeat_interval_s=0.2, liveness_timeout_s=5.0, refresh_interval_s=0.1,
            degraded_retry_s=0.2)


async def answer(call: Awaitable[Any]) -> tuple[grpc.StatusCode, Any]:
    try:
        return OK, await call
    except grpc.aio.AioRpcError as e:
        return e.code(), e.details()


def every_rpc(stub: Any, w: ProtocolWorker) -> dict[str, Callable[[], Awaitable[Any]]]:
    """One well-formed call of each IndexService RPC (worker ``w`` speaking for the worker).
    Route first: a worker call that finds the backend down makes Route answer degraded at
    once for a while, and the first Route must take the path that looks for workers."""
    chain = w.hashes(prompt(8))
    return {
        "Route": lambda: route(stub, prompt(12)),
        "Stats": lambda: stub.Stats(pb.StatsRequest()),
        "RegisterWorker": w.register,
        "Heartbeat": w.heartbeat,
        "PublishEvents": lambda: w.publish(pb.KvEvent(seq=w.seq + 1, stored=pb.BlockStored(
            block_hashes=chain, tier=pb.TIER_GPU))),
        "SyncWorker": w.sync,
        "SetTenantQuota": lambda: stub.SetTenantQuota(pb.SetTenantQuotaRequest(
            quota=pb.TenantQuota(tenant="a", gpu=0.3))),
        "GetTenantQuotas": lambda: stub.GetTenantQuotas(pb.GetTenantQuotasRequest()),
    }




def test_every_handler_goes_through_the_error_mapping() -> None:
    names = pb.DESCRIPTOR.services_by_name["IndexService"].methods_by_name
    assert set(names) == {"RegisterWorker", "Heartbeat", "PublishEvents", "SyncWorker",
                          "Route", "Stats", "PinPrefix", "UnpinPrefix", "SetTenantQuota",
                          "GetTenantQuotas"}
    for name in names:
        assert hasattr(getattr(IndexServicer, name), "__wrapped__"), name


def test_every_rpc_while_redis_is_down_from_the_start() -> None:
    """A service started while Redis is down: no live worker known, so Route is UNAVAILABLE
    (it used to hit an unset attribute and answer UNKNOWN); Stats answers degraded."""
    cfg = ServiceConfig(backend="redis", redis_url=f"redis://127.0.0.1:{free_port()}",
                        redis_timeout_s=0.3, **FAST)  # type: ignore[arg-type]

    async def main() -> None:
        async with serve(cfg) as r:
            calls = every_rpc(r.stub, ProtocolWorker(r.stub, "a"))
            codes = {name: (await answer(call()))[0] for name, call in calls.items()}
            assert codes == {"RegisterWorker": UNAVAILABLE, "Heartbeat": UNAVAILABLE,
                             "PublishEvents": UNAVAILABLE, "SyncWorker": UNAVAILABLE,
                             "Route": UNAVAILABLE, "Stats": OK, "SetTenantQuota": UNAVAILABLE,
                             "GetTenantQuotas": UNAVAILABLE}, codes
            st = await r.stub.Stats(pb.StatsRequest())
            assert st.degraded
            async with grpc.aio.insecure_channel(r.address) as ch:
                health = await health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(service="kvmesh.v1.IndexService"))
            assert health.status == health_pb2.HealthCheckResponse.SERVING

    asyncio.run(main())


def test_every_rpc_after_redis_died_under_live_workers(redis_server: RedisServer,
                                                      redis_url: str) -> None:
    """Workers registered, then Redis killed: worker RPCs are UNAVAILABLE (retry), Route and
    Stats answer degraded from the worker table."""
    cfg = ServiceConfig(backend="redis", redis_url=redis_url, redis_timeout_s=0.3,
                        **FAST)  # type: ignore[arg-type]

    async def main() -> None:
        async with serve(cfg) as r:
            a = ProtocolWorker(r.stub, "a")
            await a.join()
            await a.store(prompt(12))
            redis_server.kill()
            for _ in range(2):  # before and after the service noticed the outage
                codes: dict[str, grpc.StatusCode] = {}
                for name, call in every_rpc(r.stub, a).items():
                    codes[name], res = await answer(call())
                    if name in ("Route", "Stats"):
                        assert res.degraded, name
                assert codes == {"RegisterWorker": UNAVAILABLE, "Heartbeat": UNAVAILABLE,
                                 "PublishEvents": UNAVAILABLE, "SyncWorker": UNAVAILABLE,
                                 "Route": OK, "Stats": OK, "SetTenantQuota": UNAVAILABLE,
                                 "GetTenantQuotas": UNAVAILABLE}, codes

    asyncio.run(main())


class BrokenBackend(MemoryBackend):
    """Once ``broken`` is set, every call hits a bug (not an outage)."""

    broken = False

    def __getattribute__(self, name: str) -> Any:
        if not super().__getattribute__("broken") or name in ("close", "ping", "broken") \
                or name.startswith("_"):
            return super().__getattribute__(name)

        async def broken(*args: Any, **kw: Any) -> Any:
            raise ZeroDivisionError(f"bug in {name}")

        return broken


def test_a_backend_bug_is_internal_with_a_message_and_a_logged_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        backend = BrokenBackend()
        async with serve(ServiceConfig(backend="memory"), backend) as r:
            backend.broken = True
            for name, call in every_rpc(r.stub, ProtocolWorker(r.stub, "a")).items():
                caplog.clear()
                code, details = await answer(call())
                assert code == INTERNAL, (name, code, details)
                assert "ZeroDivisionError" in details, details
                failed = [rec for rec in caplog.records if rec.levelno == logging.ERROR]
                assert failed and failed[0].exc_info is not None, name

    with caplog.at_level(logging.ERROR, logger="kvmesh.service"):
        asyncio.run(main())


def test_pins_after_redis_died_under_live_workers(redis_server: RedisServer,
                                                  redis_url: str) -> None:
    """PinPrefix needs the index to find the holders: UNAVAILABLE without it (never
    UNKNOWN); UnpinPrefix touches no index and answers, the unreachable worker as an error
    entry."""
    cfg = ServiceConfig(backend="redis", redis_url=redis_url, redis_timeout_s=0.3,
                        **FAST)  # type: ignore[arg-type]
    prefix = pb.PrefixRef(token_ids=prompt(12))

    async def main() -> None:
        async with serve(cfg) as r:
            a = ProtocolWorker(r.stub, "a", port=free_port())
            await a.join()
            await a.store(prompt(12))
            redis_server.kill()
            code, _ = await answer(r.stub.PinPrefix(pb.PinPrefixRequest(prefix=prefix)))
            assert code == UNAVAILABLE
            code, res = await answer(r.stub.UnpinPrefix(pb.UnpinPrefixRequest(prefix=prefix)))
            assert code == OK and res.workers[0].error.startswith("UNAVAILABLE"), res

    asyncio.run(main())


def test_a_backend_bug_under_pin_prefix_is_internal(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        backend = BrokenBackend()
        async with serve(ServiceConfig(backend="memory"), backend) as r:
            await ProtocolWorker(r.stub, "a").join()
            backend.broken = True
            code, details = await answer(r.stub.PinPrefix(pb.PinPrefixRequest(
                prefix=pb.PrefixRef(token_ids=prompt(12)))))
            assert code == INTERNAL and "ZeroDivisionError" in details, details

    with caplog.at_level(logging.ERROR, logger="kvmesh.service"):
        asyncio.run(main())
