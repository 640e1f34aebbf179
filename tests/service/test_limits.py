"""Request limits of the metadata service: calls in flight per connection and request sizes,
each refused with RESOURCE_EXHAUSTED naming the limit and the flag that raises it."""
from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc
import pytest

from deploy.waiting import eventually
from kvmesh.v1 import index_pb2 as pb
from kvmesh.v1 import index_pb2_grpc as pb_grpc
from service.config import ServiceConfig
from service.index.base import BlockMatch
from service.index.memory import MemoryBackend
from tests.service.protocol_worker import ProtocolWorker, prompt, route, serve

TOO_MUCH = grpc.StatusCode.RESOURCE_EXHAUSTED


class SlowLookups(MemoryBackend):
    """A memory index whose lookups wait until ``release`` is set (Route stays in flight)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.waiting = 0

    async def lookup(self, ns: str, hashes: Sequence[bytes], now_ms: int,
                     workers: Sequence[str]) -> dict[str, BlockMatch]:
        self.waiting += 1
        await self.release.wait()
        return await super().lookup(ns, hashes, now_ms, workers)


def test_calls_in_flight_per_connection() -> None:
    async def main() -> None:
        backend = SlowLookups()
        async with serve(ServiceConfig(max_inflight_per_conn=2), backend) as r:
            await ProtocolWorker(r.stub, "w").join()
            held = [asyncio.ensure_future(route(r.stub, prompt(9))) for _ in range(2)]

            async def waiting() -> int:
                return backend.waiting

            await eventually(waiting, ok=lambda n: n >= 2, within=10)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await r.stub.Stats(pb.StatsRequest())
            assert err.value.code() == TOO_MUCH
            assert "the limit is 2 per connection" in err.value.details()
            assert "--max-inflight-per-conn" in err.value.details()
            options = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own
            async with grpc.aio.insecure_channel(r.address, options=options) as other:
                await pb_grpc.IndexServiceStub(other).Stats(pb.StatsRequest())
            backend.release.set()
            assert all(res.candidates for res in await asyncio.gather(*held))

    asyncio.run(main())


def test_request_size_limits_name_their_flags() -> None:
    cfg = ServiceConfig(max_message_bytes=2048, max_prompt_tokens=100, max_batch_events=3,
                        max_snapshot_blocks=4, max_batch_hashes=5)

    async def main() -> None:
        async with serve(cfg) as r:
            w = ProtocolWorker(r.stub, "w")
            await w.join()
            h = [bytes([i]) * 32 for i in range(8)]
            cleared = pb.AllBlocksCleared()
            cases = {
                "--max-prompt-tokens": route(r.stub, prompt(101)),
                "--max-batch-events": w.publish(*[pb.KvEvent(seq=i + 1, cleared=cleared)
                                                  for i in range(4)]),
                "--max-batch-hashes": w.publish(pb.KvEvent(seq=1, stored=pb.BlockStored(
                    block_hashes=h[:6]))),
                "--max-snapshot-blocks": r.stub.SyncWorker(pb.SyncWorkerRequest(
                    worker_id="w", seq=1, blocks=[pb.BlockStored(block_hashes=h[:5])])),
            }
            for flag, call in cases.items():
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call
                assert err.value.code() == TOO_MUCH, flag
                assert flag in err.value.details(), err.value.details()
            # over --max-message-bytes, gRPC's transport refuses it as it arrives
            for n in (1500, 5000):  # ~3 KB (just over), ~10 KB
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await route(r.stub, [300] * n)
                assert err.value.code() == TOO_MUCH
                assert "larger than max" in err.value.details()
            assert (await route(r.stub, prompt(17))).candidates

    asyncio.run(main())
