"""consistent_hash through the real service (memory backend, protocol workers): the Route's
key is its salt and first KEY_TOKENS tokens, and the routed load bounds each worker."""
from __future__ import annotations

import asyncio
import random

from kvmesh.v1 import index_pb2 as pb
from service.config import ServiceConfig
from service.policy import ConsistentHashPolicy, WorkerView
from service.route_steps import KEY_TOKENS, prompt_key
from tests.service.protocol_worker import ProtocolWorker, prompt, route, serve

WORKERS = [f"w{i}" for i in range(4)]


async def dry(stub: object, tokens: list[int], **kw: object) -> pb.RouteResponse:
    """A route that records nothing (no routed load): what the ring alone says."""
    return await route(stub, tokens, policy="consistent_hash", dry_run=True, **kw)  # type: ignore[arg-type]


def test_same_head_same_worker_and_salts_spread() -> None:
    async def main() -> None:
        async with serve(ServiceConfig()) as r:
            for i, w in enumerate(WORKERS):
                await ProtocolWorker(r.stub, w, port=i + 1).join()
            head = prompt(KEY_TOKENS, start=1000)
            a = await dry(r.stub, head + prompt(40, start=5))
            b = await dry(r.stub, head + prompt(700, start=90_000))
            assert a.policy == "consistent_hash" and not a.degraded
            assert [c.worker_id for c in a.candidates] == [c.worker_id for c in b.candidates]
            assert sorted(c.worker_id for c in a.candidates) == WORKERS  # every worker
            assert [c.cost for c in a.candidates] == [0.0, 1.0, 2.0, 3.0]
            # the service keys exactly as prompt_key does (and the policy alone agrees)
            ring = ConsistentHashPolicy().rank(1, [WorkerView(w) for w in WORKERS],
                                               random.Random(0),
                                               key=prompt_key(head, "t1", None))
            salted = await dry(r.stub, head + [7], salt="t1")
            assert [c.worker_id for c in salted.candidates] == [x.view.worker_id for x in ring]
            # another tenant's salt is another key: the tenants spread over the workers
            homes = {(await dry(r.stub, head, salt=f"tenant-{i}")).candidates[0].worker_id
                     for i in range(12)}
            assert len(homes) >= 3
            # a different head is another key too
            other = {(await dry(r.stub, prompt(KEY_TOKENS, start=s))).candidates[0].worker_id
                     for s in range(0, 120_000, 10_000)}
            assert len(other) >= 3

    asyncio.run(main())


def test_routed_requests_fill_the_home_worker_to_the_bound_then_spill() -> None:
    """Real routes count as load on the chosen worker until its next heartbeat: with 4 idle
    workers the bound after one request is ceil(1.25 * 2 / 4) = 1, so the second request
    of the same prefix goes to the ring's next worker; a heartbeat that reports the home
    worker idle again brings the prefix back."""
    async def main() -> None:
        async with serve(ServiceConfig()) as r:
            workers = [ProtocolWorker(r.stub, w, port=i + 1) for i, w in enumerate(WORKERS)]
            for w in workers:
                await w.join()
            p = prompt(KEY_TOKENS + 10, start=3)
            order = [c.worker_id for c in (await dry(r.stub, p)).candidates]
            first = await route(r.stub, p, policy="consistent_hash")
            second = await route(r.stub, p, policy="consistent_hash")
            assert first.candidates[0].worker_id == order[0]
            assert second.candidates[0].worker_id == order[1]
            assert second.candidates[-1].worker_id == order[0]  # full: last
            await asyncio.sleep(0.002)  # a heartbeat of a later millisecond: a new report
            for w in workers:
                await w.heartbeat()
            assert (await dry(r.stub, p)).candidates[0].worker_id == order[0]

    asyncio.run(main())
