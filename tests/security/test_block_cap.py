"""Attack: a worker credential indexes far more blocks than the pool it reports.

A real ``python -m service`` process over the session's Valkey. A worker reporting 16
blocks tries to index 200,000 random block hashes in batches: every batch past its cap
(``--min-indexed-cap`` here, since 2 x 16 is smaller) is refused RESOURCE_EXHAUSTED and
Redis never holds more than the cap plus one batch of its block keys; a snapshot over the
cap is refused and changes nothing. A legit worker filling (and churning) its whole pool
is never refused.
"""
from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import grpc
import pytest
import redis

from deploy.process import ServerProcess
from deploy.redis_server import RedisServer
from kvmesh.v1 import index_pb2 as pb
from service.index.redis.keys import BLOCK_KEYS_MATCH
from tests.service.protocol_worker import ProtocolWorker, stub

CAP = 64
BATCH = 8000  # under the default --max-batch-hashes (8192)


@pytest.fixture
def service(redis_server: RedisServer, redis_url: str) -> Iterator[ServerProcess]:
    proc = ServerProcess("cap-service", "service", [
        "--port", "0", "--log-level", "error", "--min-indexed-cap", str(CAP)],
        env={"KVMESH_REDIS_URL": redis_url}).start()
    try:
        yield proc
    finally:
        proc.stop()


def _block_keys(client: redis.Redis) -> int:
    return sum(1 for _ in client.scan_iter(match=BLOCK_KEYS_MATCH, count=10_000))


def _stored(n: int) -> pb.BlockStored:
    return pb.BlockStored(block_hashes=[os.urandom(32) for _ in range(n)])


def test_a_worker_cannot_index_more_than_its_pool(service: ServerProcess,
                                                  redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)

    async def main() -> None:
        async with grpc.aio.insecure_channel(service.address) as ch:
            liar = ProtocolWorker(stub(ch), "liar", port=9001)
            await liar.join(total_blocks=16, free_blocks=16)
            refused, peak = 0, 0
            for _ in range(200_000 // BATCH):
                try:
                    await liar.publish(liar.next_event(stored=_stored(BATCH)))
                except grpc.aio.AioRpcError as e:
                    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
                    assert f"more than {CAP} blocks" in e.details()
                    liar.seq -= 1  # nothing was applied: it tries again with the same seq
                    refused += 1
                peak = max(peak, _block_keys(client))
            assert refused == 200_000 // BATCH
            assert peak == 0, peak  # refused before any work: nothing was ever indexed
            # ...and in batches under the cap, it stops at the cap too
            liar.seq = 0
            await liar.sync()
            got = []
            for _ in range(4):
                try:
                    res = await liar.publish(liar.next_event(stored=_stored(CAP // 2)))
                    got.append("resync" if res.resync else "ok")
                except grpc.aio.AioRpcError as e:
                    got.append(e.code().name)
            assert got[:3] == ["ok", "ok", "RESOURCE_EXHAUSTED"], got
            assert _block_keys(client) <= CAP
            # a snapshot over the cap changes nothing
            liar.chains = {b"x": list(_stored(CAP + 1).block_hashes)}
            before = _block_keys(client)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await liar.sync()
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert _block_keys(client) == before

            # a legit worker: a pool of 512 blocks, filled and churned, never refused
            legit = ProtocolWorker(stub(ch), "legit", port=9002)
            await legit.join(total_blocks=512, free_blocks=512)
            held: list[bytes] = []
            for _ in range(6):
                new = _stored(128)
                res = await legit.publish(legit.next_event(stored=new))
                assert not res.resync
                held += list(new.block_hashes)
                if len(held) > 512:
                    gone, held = held[:len(held) - 512], held[len(held) - 512:]
                    await legit.publish(legit.next_event(
                        removed=pb.BlockRemoved(block_hashes=gone)))
            legit.chains = {b"pool": held}
            assert (await legit.sync()).indexed_blocks == 512

    try:
        asyncio.run(main())
    finally:
        client.close()


def test_lower_tiers_count_toward_the_cap(service: ServerProcess) -> None:
    """A worker with a CPU tier indexes more than a multiple of its device pool: a device pool
    of 16 blocks and 80 tier blocks index 300 blocks (over 4 x 16 and over the floor of 64),
    while the same 300 from a worker without tiers are refused."""

    async def main() -> None:
        async with grpc.aio.insecure_channel(service.address) as ch:
            tiered = ProtocolWorker(stub(ch), "tiered", port=9003)
            await tiered.join(total_blocks=16, free_blocks=16, tier_blocks=80)
            res = await tiered.publish(tiered.next_event(stored=_stored(300)))
            assert not res.resync and res.applied == 1
            flat = ProtocolWorker(stub(ch), "flat", port=9004)
            await flat.join(total_blocks=16, free_blocks=16)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await flat.publish(flat.next_event(stored=_stored(300)))
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

    asyncio.run(main())
