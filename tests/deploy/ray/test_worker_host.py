"""deploy.ray.worker_host: the WorkerService a Ray worker actor hosts requires exactly the
access token its launcher minted for its id (``worker_access_token(router token, id)``),
refuses another worker's and the router token. Runs the host in this process (the actor's
code without Ray: a fixed host, cpu, no service)."""
from __future__ import annotations

import asyncio

import grpc

from deploy.ray.worker_host import WorkerConfig, WorkerHost
from kvmesh.rpc.auth import worker_access_token
from kvmesh.v1 import worker_pb2, worker_pb2_grpc
from tests.grpc_codes import code_of

ROUTER = "ray-router-token"


def test_the_hosted_worker_takes_its_own_token_only() -> None:
    own, other = worker_access_token(ROUTER, "kvmesh-w0"), worker_access_token(ROUTER, "kvmesh-w1")
    req = worker_pb2.GenerateRequest(token_ids=[1, 2, 3], sampling=worker_pb2.SamplingParams(
        max_tokens=1, ignore_eos=True))

    async def main() -> None:
        host = await WorkerHost(WorkerConfig(
            worker_id="kvmesh-w0", services=(), num_blocks=32, device="cpu",
            host="127.0.0.1", access_token=own)).start()
        try:
            async with grpc.aio.insecure_channel(host.address) as ch:
                stub = worker_pb2_grpc.WorkerServiceStub(ch)
                for token in (other, ROUTER):
                    md = [("authorization", f"Bearer {token}")]
                    assert await code_of(stub.Generate(req, metadata=md)) \
                        == grpc.StatusCode.UNAUTHENTICATED
                md = [("authorization", f"Bearer {own}")]
                assert await code_of(stub.Generate(req, metadata=md)) == grpc.StatusCode.OK
        finally:
            await host.stop()

    asyncio.run(main())
