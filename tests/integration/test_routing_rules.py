"""The room check and the saturation rule through a real service over a real Valkey: workers
(protocol peers speaking the worker side of IndexService) report loads, hold chains, and
the Route answers are checked against the rules of ``service/policy/cost.py`` and
``room.py``. Run on the real cluster in ``test_routing_at_saturation.py``."""
from __future__ import annotations

import asyncio

from service.config import CostWeights, ServiceConfig
from tests.service.protocol_worker import BS, ProtocolWorker, prompt, route, serve

SYSTEM = prompt(BS * 60)            # a 60-block shared prefix
QUESTION = prompt(BS * 4, start=900)


def config(url: str, **weights: float) -> ServiceConfig:
    return ServiceConfig(backend="redis", redis_url=url, weights=CostWeights(**weights))


async def _fleet(r, n: int = 2) -> list[ProtocolWorker]:
    workers = [ProtocolWorker(r.stub, f"w{i}", port=9000 + i) for i in range(n)]
    for w in workers:
        await w.join(free_blocks=200, total_blocks=200, free_empty_blocks=200)
    await workers[0].store(SYSTEM)
    return workers


def test_a_busy_holder_short_of_free_blocks_keeps_its_prefix(redis_url: str) -> None:
    """The holder's hits are held by running requests (every free block is empty), so its
    3 free blocks are room for the 4 new ones but one: a wait of one block, not an
    exclusion (the old guard counted the 60 hits against the 3 free blocks and sent the
    request to recompute 64 blocks on the idle worker)."""
    async def main() -> None:
        async with serve(config(redis_url)) as r:
            holder, _ = await _fleet(r)
            await holder.heartbeat(running=8, free_blocks=3, free_empty_blocks=3,
                                   total_blocks=200)
            res = await route(r.stub, SYSTEM + QUESTION, dry_run=True)
            assert res.candidates[0].worker_id == "w0", res
            assert res.candidates[0].matched_tokens == 60 * BS
            # the same free count, all of it the request's own free hits: it must wait for
            # 4 blocks (the idle holder's hits are in its free queue): still cheaper than
            # recomputing 60 blocks elsewhere
            await holder.heartbeat(running=0, free_blocks=3, free_empty_blocks=0,
                                   total_blocks=200)
            res = await route(r.stub, SYSTEM + QUESTION, dry_run=True)
            assert res.candidates[0].worker_id == "w0"
            # prefill + the wait for 4 blocks + the 4 cached blocks it evicts
            assert res.candidates[0].cost == 2.0 * 4 * BS + 4 * BS + 4 * BS

    asyncio.run(main())


def test_at_saturation_the_holder_keeps_the_tenant_and_an_idle_worker_takes_it(
        redis_url: str) -> None:
    """Both workers have a backlog: the holder keeps its prefix although its queue is the
    longer. The other worker idle: the request moves (balance buys throughput then). With
    the saturation term off, the busy fleet moves it too."""
    async def main() -> None:
        for weights, busy_fleet_moves in (({}, False), ({"saturation_weight": 0.0}, True)):
            async with serve(config(redis_url, **weights)) as r:
                holder, cold = await _fleet(r)
                await holder.heartbeat(queued_prefill_tokens=4000, running=4,
                                       free_blocks=100, free_empty_blocks=100,
                                       total_blocks=200)
                await cold.heartbeat(queued_prefill_tokens=2000, running=4, free_blocks=100,
                                     free_empty_blocks=100, total_blocks=200)
                res = await route(r.stub, SYSTEM + QUESTION, dry_run=True)
                assert (res.candidates[0].worker_id == "w1") == busy_fleet_moves, (weights,
                                                                                   res)
                await cold.heartbeat(running=0, free_blocks=200, free_empty_blocks=200,
                                     total_blocks=200)
                res = await route(r.stub, SYSTEM + QUESTION, dry_run=True)
                assert res.candidates[0].worker_id == "w1", (weights, res)

    asyncio.run(main())
