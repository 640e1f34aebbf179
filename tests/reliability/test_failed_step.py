"""A failed engine step, end to end: the index never advertises the blocks the step cached
but never wrote, and the retry's output equals a fresh engine's (issue 11, item 1).

Real parts in one process: the service over the session's Valkey, a worker's engine, gRPC
server and service link; the worker's model is wrapped (in the test, not in production
code) so that one forward raises.
"""
from __future__ import annotations

import asyncio
import random

import grpc
import pytest

from client import AsyncKvmeshClient
from kvmesh.hashing import none_hash
from kvmesh.v1 import worker_pb2, worker_pb2_grpc
from service.config import ServiceConfig
from service.server import create_server as create_service
from tests.worker.faults import FailingForward
from worker import Engine
from worker.async_engine import AsyncEngine
from worker.scheduler import SchedulerConfig
from worker.server import create_server as create_worker
from worker.service_link import ServiceLink

PROMPT = [random.Random(5).randrange(256) for _ in range(50)]  # 3 full blocks of 16 + 2
SCHED = SchedulerConfig(max_batched_tokens=16)  # prefill in chunks of 16, 16, 16, 2


async def _eventually(probe, ok, within: float = 10.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        value = await probe()
        if ok(value):
            return value
        assert loop.time() < deadline, f"not within {within}s: {value!r}"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("fail_at, kept", [(1, 0), (3, 32)])
def test_failed_step_is_never_advertised_and_the_retry_is_exact(redis_url, fail_at, kept):
    want = Engine.from_pretrained("tiny", num_blocks=64).generate(
        [PROMPT], max_tokens=6, ignore_eos=True)[0].token_ids

    async def main():
        service, sport = await create_service(
            "127.0.0.1:0", ServiceConfig(backend="redis", redis_url=redis_url,
                                         provisional_ttl_s=0.05))  # only real entries count
        await service.start()
        engine = Engine.from_pretrained("tiny", num_blocks=64, scheduler=SCHED)
        FailingForward(engine, fail_at)
        runner = AsyncEngine(engine).start()
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
            async with grpc.aio.insecure_channel(f"127.0.0.1:{wport}") as ch:
                stub = worker_pb2_grpc.WorkerServiceStub(ch)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    async for _ in stub.Generate(worker_pb2.GenerateRequest(
                            token_ids=PROMPT, sampling=worker_pb2.SamplingParams(
                                max_tokens=6, ignore_eos=True))):
                        pass
            assert err.value.code() == grpc.StatusCode.INTERNAL
            # Every event of the failed step (its stores and their removal) is applied.
            await _eventually(lambda: asyncio.sleep(0, (link.last_seq, engine.kv.pool.last_seq)),
                              lambda seqs: seqs[0] == seqs[1] > 0)
            routed = await kv.route(PROMPT, dry_run=True)
            retry = await kv.generate(PROMPT, max_tokens=6, ignore_eos=True)
            return routed.matched_tokens, retry
        finally:
            await kv.close()
            await link.close()
            task.cancel()
            await worker.stop(None)
            runner.stop()
            await service.stop(None)

    matched, retry = asyncio.run(main())
    assert matched == kept  # only chunks of steps that completed are advertised
    assert retry.worker_id == "w0" and retry.num_cached_tokens == kept
    assert retry.token_ids == want
