"""The worker's server: access token (derived from the router token), TLS, calls in flight
per connection, request bytes."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from deploy.waiting import eventually
from kvmesh.rpc.auth import worker_access_token
from kvmesh.rpc.tls import TlsFiles
from kvmesh.v1 import worker_pb2, worker_pb2_grpc
from tests.grpc_codes import code_of
from worker import Engine
from worker.engine.async_engine import AsyncEngine
from worker.rpc.server import create_server

if TYPE_CHECKING:  # the certs fixture skips where `cryptography` is missing
    from tests.certificates import Certs

ROUTER = [("authorization", "Bearer router-tok")]
TOKEN = [("authorization", f"Bearer {worker_access_token('router-tok', 'w')}")]


def _req(tokens: list[int], max_tokens: int = 2) -> worker_pb2.GenerateRequest:
    return worker_pb2.GenerateRequest(token_ids=tokens, sampling=worker_pb2.SamplingParams(
        max_tokens=max_tokens, ignore_eos=True))


async def _serve(runner: AsyncEngine, **kw):
    server, port, _ = await create_server("127.0.0.1:0", runner, worker_id="w",
                                          model_name="tiny", **kw)
    await server.start()
    return server, port


@pytest.fixture(scope="module")
def runner():
    r = AsyncEngine(Engine.from_pretrained("tiny", num_blocks=32)).start()
    yield r
    r.stop()


def test_access_token_and_tls_guard_every_worker_call(runner: AsyncEngine, certs: Certs) -> None:
    tls = TlsFiles(cert=str(certs.server_cert), key=str(certs.server_key))

    async def main() -> None:
        server, port = await _serve(runner, access_token=worker_access_token("router-tok", "w"),
                                    credentials=tls.server_credentials())
        target = f"127.0.0.1:{port}"
        ok, unauth = grpc.StatusCode.OK, grpc.StatusCode.UNAUTHENTICATED
        try:
            creds = TlsFiles(ca=str(certs.ca)).channel_credentials()
            async with grpc.aio.secure_channel(target, creds) as ch:
                stub = worker_pb2_grpc.WorkerServiceStub(ch)
                assert await code_of(stub.Generate(_req([1, 2, 3]))) == unauth
                assert await code_of(stub.Generate(_req([1, 2, 3]), metadata=[
                    ("authorization", "Bearer wrong")])) == unauth
                assert await code_of(stub.Stats(worker_pb2.WorkerStatsRequest())) == unauth
                # FetchBlocks reaches its handler from anyone: the ticket is its credential
                fetch = worker_pb2.FetchBlocksRequest(requester_id="w2", block_hashes=[b"h"])
                assert await code_of(stub.FetchBlocks(fetch)) == grpc.StatusCode.PERMISSION_DENIED
                assert await code_of(stub.FetchBlocks(fetch, metadata=TOKEN)) == (
                    grpc.StatusCode.PERMISSION_DENIED)
                # the router token itself is not a worker credential
                assert await code_of(stub.Generate(_req([1, 2, 3]), metadata=ROUTER)) == unauth
                assert await code_of(stub.Generate(_req([1, 2, 3]), metadata=TOKEN)) == ok
                assert await code_of(stub.Stats(worker_pb2.WorkerStatsRequest(),
                                              metadata=TOKEN)) == ok
                health = health_pb2_grpc.HealthStub(ch)  # probes need no token
                assert (await health.Check(health_pb2.HealthCheckRequest())).status == 1
            for creds in (None, TlsFiles(ca=str(certs.other_ca)).channel_credentials()):
                channel = (grpc.aio.secure_channel(target, creds) if creds is not None
                           else grpc.aio.insecure_channel(target))
                async with channel as ch:
                    stats = worker_pb2_grpc.WorkerServiceStub(ch).Stats(
                        worker_pb2.WorkerStatsRequest(), metadata=TOKEN, timeout=3)
                    assert await code_of(stats) == grpc.StatusCode.UNAVAILABLE
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_calls_in_flight_are_limited_per_connection(runner: AsyncEngine) -> None:
    async def main() -> None:
        server, port = await _serve(runner, max_inflight_per_conn=1)
        target = f"127.0.0.1:{port}"
        try:
            async with grpc.aio.insecure_channel(target) as ch, \
                    grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool",
                                                                1)]) as other:
                stub = worker_pb2_grpc.WorkerServiceStub(ch)
                stream = stub.Generate(_req([5, 6, 7], max_tokens=40))
                first = await stream.read()  # the stream is in flight now
                assert first.token_ids
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.Stats(worker_pb2.WorkerStatsRequest())
                assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "limit is 1 per connection" in err.value.details()
                assert "--max-inflight-per-conn" in err.value.details()
                # another connection is not affected
                await worker_pb2_grpc.WorkerServiceStub(other).Stats(
                    worker_pb2.WorkerStatsRequest())
                while await stream.read() != grpc.aio.EOF:
                    pass
                # the slot is free again once the stream ended (released as the call ends
                # on the server, which may be a moment after the client saw its status)
                await eventually(lambda: code_of(stub.Stats(worker_pb2.WorkerStatsRequest())),
                                 lambda code: code == grpc.StatusCode.OK, within=2,
                                 interval=0.02)
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_oversized_and_undecodable_requests(runner: AsyncEngine) -> None:
    async def main() -> None:
        server, port = await _serve(runner, max_message_bytes=4096)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                stub = worker_pb2_grpc.WorkerServiceStub(ch)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    async for _ in stub.Generate(_req([255] * 3000)):
                        pass
                # refused by the transport as it arrives (never buffered whole)
                assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "larger than max" in err.value.details()
                raw = ch.unary_stream("/kvmesh.v1.WorkerService/Generate")
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    async for _ in raw(b"\xff\xff\xff"):
                        pass
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "kvmesh.v1.GenerateRequest" in err.value.details()
                assert await code_of(stub.Generate(_req([1, 2]))) == grpc.StatusCode.OK
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_the_worker_keeps_only_the_access_token() -> None:
    """``--token T`` derives this worker's access token and drops T; ``--access-token`` must
    match T's derivation for THIS worker id when both are given (a worker no client of T
    could call is refused, and so is another worker's token)."""
    from worker.main import access_token_of

    access = worker_access_token("router-tok", "w")
    assert access_token_of("router-tok", None, "w") == access
    assert access_token_of(None, access, "w") == access
    assert access_token_of("router-tok", access, "w") == access
    assert access_token_of(None, None, "w") is None
    with pytest.raises(ValueError, match="access token"):
        access_token_of("router-tok", "something-else", "w")
    with pytest.raises(ValueError, match="access token"):  # worker x's token on worker w
        access_token_of("router-tok", worker_access_token("router-tok", "x"), "w")
