"""``AsyncKvmeshClient.generate_stream``: chunks then one result; failover only before the
first token; a cancelled consumer leaves nothing hanging."""
from __future__ import annotations

import asyncio
from collections.abc import Iterator

import grpc
import pytest

from client import AsyncKvmeshClient, GenerateResult, KvmeshError
from client.async_client import TokenChunk
from deploy.waiting import eventually
from kvmesh.v1 import index_pb2_grpc, worker_pb2_grpc
from tests.client.fake_servers import (
    FakeIndex,
    FakeWorker,
    candidate,
    closed_port_address,
    start_server,
)


@pytest.fixture
def servers() -> Iterator[list[grpc.Server]]:
    started: list[grpc.Server] = []
    yield started
    for server in started:
        server.stop(0)


def serve(servers: list[grpc.Server], index: FakeIndex,
          *workers: FakeWorker) -> tuple[str, list[str]]:
    server, index_address = start_server(index, index_pb2_grpc.add_IndexServiceServicer_to_server)
    servers.append(server)
    addresses = []
    for worker in workers:
        server, address = start_server(worker,
                                       worker_pb2_grpc.add_WorkerServiceServicer_to_server)
        servers.append(server)
        addresses.append(address)
    return index_address, addresses


async def collect(address: str, **kwargs: object) -> list[TokenChunk | GenerateResult]:
    async with AsyncKvmeshClient(address, generate_timeout=5) as client:
        return [item async for item in client.generate_stream([1, 2, 3], **kwargs)]


def test_chunks_then_one_result(servers: list[grpc.Server]) -> None:
    index = FakeIndex()
    address, (w1,) = serve(servers, index, FakeWorker("w1", cached=2))
    index.candidates = [candidate("w1", w1, matched=2)]
    items = asyncio.run(collect(address, max_tokens=5, salt="s"))
    chunks, result = items[:-1], items[-1]
    assert [c.token_ids for c in chunks] == [[100, 101], [102, 103], [104]]
    assert all(c.worker_id == "w1" and c.address == w1 for c in chunks)
    assert isinstance(result, GenerateResult)
    assert result.token_ids == [100, 101, 102, 103, 104]
    assert (result.num_cached_tokens, result.attempts, result.matched_tokens) == (2, 1, 2)
    assert index.routes[-1].salt == "s"


def test_fails_over_before_the_first_token(servers: list[grpc.Server]) -> None:
    index = FakeIndex()
    address, (w2,) = serve(servers, index, FakeWorker("w2"))
    index.candidates = [candidate("down", closed_port_address()), candidate("w2", w2)]
    items = asyncio.run(collect(address, max_tokens=2))
    assert items[0].worker_id == "w2"
    assert items[-1].attempts == 2


def test_no_failover_after_the_first_token(servers: list[grpc.Server]) -> None:
    index = FakeIndex()
    aborting, spare = FakeWorker("w1", mode="abort"), FakeWorker("w2")
    address, (w1, w2) = serve(servers, index, aborting, spare)
    index.candidates = [candidate("w1", w1), candidate("w2", w2)]
    seen: list[TokenChunk | GenerateResult] = []

    async def run() -> None:
        async with AsyncKvmeshClient(address, generate_timeout=5) as client:
            async for item in client.generate_stream([1], max_tokens=6):
                seen.append(item)

    with pytest.raises(KvmeshError) as info:
        asyncio.run(run())
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    assert [c.token_ids for c in seen] == [[100, 101]]
    assert spare.requests == []


def test_truncated_stream_after_tokens_is_unavailable(servers: list[grpc.Server]) -> None:
    index = FakeIndex()
    address, (w1,) = serve(servers, index, FakeWorker("w1", mode="truncate"))
    index.candidates = [candidate("w1", w1)]
    with pytest.raises(KvmeshError) as info:
        asyncio.run(collect(address, max_tokens=6))
    assert info.value.code == grpc.StatusCode.UNAVAILABLE


def test_invalid_argument_is_not_retried(servers: list[grpc.Server]) -> None:
    index = FakeIndex()
    bad, spare = FakeWorker("w1", mode="invalid"), FakeWorker("w2")
    address, (w1, w2) = serve(servers, index, bad, spare)
    index.candidates = [candidate("w1", w1), candidate("w2", w2)]
    with pytest.raises(KvmeshError) as info:
        asyncio.run(collect(address))
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert spare.requests == []


def test_cancelling_a_waiting_stream_is_clean(servers: list[grpc.Server]) -> None:
    index = FakeIndex()
    worker = FakeWorker("w1", mode="hang")
    address, (w1,) = serve(servers, index, worker)
    index.candidates = [candidate("w1", w1)]

    async def run() -> None:
        async with AsyncKvmeshClient(address, generate_timeout=30) as client:
            stream = client.generate_stream([1])
            task = asyncio.ensure_future(anext(stream))
            # Wait until the worker holds the request.
            await eventually(lambda: asyncio.sleep(0, worker.requests), within=2, interval=0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(asyncio.wait_for(run(), 10))
    assert len(worker.requests) == 1
