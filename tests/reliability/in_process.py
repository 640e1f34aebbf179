"""One worker and the service in this process, linked as in production.

Real parts: the service over the session's Valkey (provisional entries live 50 ms, so only
real entries count once they expire), a worker's engine and gRPC server, and its service
link (heartbeat 0.2 s). :func:`linked_worker` yields once the service counts the worker.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from client import AsyncKvmeshClient
from deploy.waiting import eventually
from kvmesh.hashing import none_hash
from service.config import ServiceConfig
from service.server import create_server as create_service
from worker import Engine
from worker.engine.async_engine import AsyncEngine
from worker.index_link import ServiceLink
from worker.rpc.server import create_server as create_worker


@dataclass
class Linked:
    link: ServiceLink
    client: AsyncKvmeshClient  # of the service
    worker_address: str


@contextlib.asynccontextmanager
async def linked_worker(redis_url: str, engine: Engine) -> AsyncIterator[Linked]:
    """Worker ``w0`` serving ``engine`` (model ``tiny``), registered with a fresh service."""
    service, sport = await create_service(
        "127.0.0.1:0", ServiceConfig(backend="redis", redis_url=redis_url,
                                     provisional_ttl_s=0.05))  # only real entries count
    await service.start()
    runner = AsyncEngine(engine).start()
    worker, wport, _ = await create_worker("127.0.0.1:0", runner, worker_id="w0",
                                           model_name="tiny")
    await worker.start()
    link = ServiceLink([f"127.0.0.1:{sport}"], runner, worker_id="w0",
                       address=f"127.0.0.1:{wport}", model="tiny",
                       root_hash=none_hash("sha256_cbor"), heartbeat_s=0.2)
    task = asyncio.create_task(link.run())
    client = AsyncKvmeshClient(f"127.0.0.1:{sport}")
    try:
        await eventually(lambda: client.stats(), lambda st: len(st["workers"]) == 1)
        yield Linked(link, client, f"127.0.0.1:{wport}")
    finally:
        await client.close()
        await link.close()
        task.cancel()
        await worker.stop(None)
        runner.stop()
        await service.stop(None)
