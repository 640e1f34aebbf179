"""A worker's gRPC server in this process, reached over a real loopback channel."""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from kvmesh.v1 import worker_pb2_grpc
from worker.engine.async_engine import AsyncEngine
from worker.rpc.server import create_server

T = TypeVar("T")


async def with_worker(fn: Callable[[worker_pb2_grpc.WorkerServiceStub, grpc.aio.Channel],
                                   Awaitable[T]],
                      runner: AsyncEngine, worker_id: str = "w-test") -> T:
    """``await fn(stub, channel)`` against worker ``worker_id`` serving ``runner``; the
    server and the runner are stopped afterwards, whatever happens."""
    server, port, servicer = await create_server("127.0.0.1:0", runner, worker_id=worker_id,
                                                 model_name="tiny")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            return await fn(worker_pb2_grpc.WorkerServiceStub(ch), ch)
    finally:
        await server.stop(None)
        await servicer.close_peers()
        runner.stop()
