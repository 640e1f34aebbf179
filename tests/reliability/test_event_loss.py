"""A lost event batch is detected as a sequence gap and repaired by a resync.

Real parts in one process: the service over the session's Valkey, a worker's engine and
gRPC server, and its service link; the link drops one batch "in transit".
"""
from __future__ import annotations

import asyncio

from client import AsyncKvmeshClient
from kvmesh.hashing import none_hash
from service.config import ServiceConfig
from service.server import create_server as create_service
from worker import Engine
from worker.async_engine import AsyncEngine
from worker.server import create_server as create_worker
from worker.service_link import ServiceLink


async def _eventually(probe, ok, within: float = 10.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        value = await probe()
        if ok(value):
            return value
        assert loop.time() < deadline, f"not within {within}s: {value!r}"
        await asyncio.sleep(0.05)


def test_lost_batch_is_detected_and_resynced(redis_url):
    async def main():
        service, sport = await create_service(
            "127.0.0.1:0", ServiceConfig(backend="redis", redis_url=redis_url,
                                         provisional_ttl_s=0.05))  # only real entries count
        await service.start()
        runner = AsyncEngine(Engine.from_pretrained("tiny", num_blocks=64)).start()
        worker, wport, _ = await create_worker("127.0.0.1:0", runner, worker_id="w0",
                                               model_name="tiny")
        await worker.start()
        link = ServiceLink([f"127.0.0.1:{sport}"], runner, worker_id="w0",
                           address=f"127.0.0.1:{wport}", model="tiny",
                           root_hash=none_hash("sha256_cbor"), heartbeat_s=0.2)
        task = asyncio.create_task(link.run())
        kv = AsyncKvmeshClient(f"127.0.0.1:{sport}")
        try:
            await _eventually(lambda: kv.stats(), lambda st: len(st["workers"]) == 1)
            first = [7] * 40
            await kv.generate(first, max_tokens=2)
            await _eventually(lambda: kv.route(first, dry_run=True),
                              lambda r: r.matched_tokens == 32)
            resyncs = link.counters["resyncs"]
            link.drop_next_batch = True          # the next batch is lost in transit
            second = [9] * 40
            await kv.generate(second, max_tokens=2)
            third = [11] * 40                    # its batch arrives after the gap
            await kv.generate(third, max_tokens=2)
            await _eventually(lambda: asyncio.sleep(0, link.counters["gaps"]),
                              lambda gaps: gaps >= 1)
            # The resync snapshot restores what the lost batch carried.
            await asyncio.sleep(0.1)             # provisional entries have expired
            for prompt in (first, second, third):
                await _eventually(lambda p=prompt: kv.route(p, dry_run=True),
                                  lambda r: r.matched_tokens == 32)
            assert link.counters["resyncs"] > resyncs
        finally:
            await kv.close()
            await link.close()
            task.cancel()
            await worker.stop(None)
            runner.stop()
            await service.stop(None)

    asyncio.run(main())
