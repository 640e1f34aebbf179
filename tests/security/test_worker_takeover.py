"""A live worker id cannot be taken over; a dead one can. Both backends,
through the service's RPCs on a real gRPC server (Redis: the session's real Valkey).

The index remembers the address and the credential fingerprint a worker registered with; a
registration of a live id (heartbeat within the liveness timeout) from another address or
credential is ALREADY_EXISTS and changes nothing, the same address and credential may come
back at once (a worker restarted on its port), and anyone may take the id once its record
stops heartbeating."""
from __future__ import annotations

import asyncio

import grpc
import pytest

from kvmesh.v1 import index_pb2 as pb
from service.config import ServiceConfig
from service.worker_tokens import mint
from tests.grpc_codes import code_of
from tests.service.manual_clock import ManualClock
from tests.service.protocol_worker import ProtocolWorker, prompt, route, serve

SECRET = "takeover-test-secret"
TIMING = {"heartbeat_interval_s": 0.1, "liveness_timeout_s": 0.5, "purge_after_s": 30.0,
          "refresh_interval_s": 0.05}
IN_USE = grpc.StatusCode.ALREADY_EXISTS


@pytest.fixture(params=["memory", "redis"])
def config(request: pytest.FixtureRequest) -> ServiceConfig:
    if request.param == "memory":
        return ServiceConfig(backend="memory", worker_token="shared-w",
                             worker_secret=SECRET, **TIMING)  # type: ignore[arg-type]
    return ServiceConfig(backend="redis", redis_url=request.getfixturevalue("redis_url"),
                         worker_token="shared-w", worker_secret=SECRET,
                         **TIMING)  # type: ignore[arg-type]




async def alive(stub: object, worker_id: str) -> bool:
    stats = await stub.Stats(pb.StatsRequest())  # type: ignore[attr-defined]
    return any(w.alive for w in stats.workers if w.worker_id == worker_id)


def test_a_live_worker_id_is_kept_a_dead_one_is_free(config: ServiceConfig) -> None:
    async def main() -> None:
        clock = ManualClock()
        async with serve(config, clock=clock) as r:
            real = ProtocolWorker(r.stub, "a", token="shared-w", port=9000, incarnation=1)
            await real.join()
            await real.store(prompt(12))
            # another address, same (shared) credential: refused, nothing changed
            thief = ProtocolWorker(r.stub, "a", token="shared-w", port=9666, incarnation=2)
            assert await code_of(thief.register()) == IN_USE
            # the same address with another credential (a's own bound token): refused too
            other = ProtocolWorker(r.stub, "a", token=mint(SECRET, "a"), port=9000, incarnation=3)
            assert await code_of(other.register()) == IN_USE
            res = await route(r.stub, prompt(12), dry_run=True)
            assert (res.candidates[0].address, res.candidates[0].matched_tokens) \
                == (real.address, 8)
            assert not (await real.heartbeat()).reregister  # the real one is untouched
            # the same address and credential: a restart on its port comes back at once
            again = ProtocolWorker(r.stub, "a", token="shared-w", port=9000, incarnation=4)
            await again.join()
            assert await code_of(real.heartbeat()) == grpc.StatusCode.FAILED_PRECONDITION
            # once it stops heartbeating, a worker on another port may take the id
            assert await alive(r.stub, "a")
            clock.advance(int(config.liveness_timeout_s * 1000))
            assert not await alive(r.stub, "a")
            moved = ProtocolWorker(r.stub, "a", token=mint(SECRET, "a"), port=9001, incarnation=5)
            await moved.join()
            res = await route(r.stub, prompt(12), dry_run=True)
            assert res.candidates[0].address == moved.address
            assert res.candidates[0].matched_tokens == 0  # nothing of the old record left

    asyncio.run(main())
