"""A lost event batch is detected as a sequence gap and repaired by a resync.

Real parts in one process (``in_process.linked_worker``): the service over the session's
Valkey, a worker's engine and gRPC server, and its service link; the link drops one batch
"in transit".
"""
from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from deploy.waiting import eventually
from service.index.redis.keys import PROV_KEYS_MATCH
from tests.reliability.in_process import linked_worker
from worker import Engine


def test_lost_batch_is_detected_and_resynced(redis_url):
    async def main():
        engine = Engine.from_pretrained("tiny", num_blocks=64)
        db = aioredis.Redis.from_url(redis_url)
        async with linked_worker(redis_url, engine) as linked:
            link, client = linked.link, linked.client
            first = [7] * 40
            await client.generate(first, max_tokens=2)
            await eventually(lambda: client.route(first, dry_run=True),
                             lambda r: r.matched_tokens == 32)
            resyncs = link.counters["resyncs"]
            link.drop_next_batch = True          # the next batch is lost in transit
            second = [9] * 40
            await client.generate(second, max_tokens=2)
            third = [11] * 40                    # its batch arrives after the gap
            await client.generate(third, max_tokens=2)
            await eventually(lambda: asyncio.sleep(0, link.counters["gaps"]),
                             lambda gaps: gaps >= 1)
            # The resync snapshot restores what the lost batch carried.
            await eventually(lambda: db.keys(PROV_KEYS_MATCH), lambda keys: not keys)  # provisional
            for prompt in (first, second, third):  # entries have expired: only real ones count
                await eventually(lambda p=prompt: client.route(p, dry_run=True),
                                 lambda r: r.matched_tokens == 32)
            # counted once the sync's reply is back, which can be after a route sees it
            await eventually(lambda: asyncio.sleep(0, link.counters["resyncs"]),
                             lambda n: n > resyncs)
        await db.aclose()

    asyncio.run(main())
