"""A failed engine step, end to end: the index never advertises the blocks the step cached
but never wrote, and the retry's output equals a fresh engine's.

Real parts in one process (``in_process.linked_worker``): the service over the session's
Valkey, a worker's engine, gRPC server and service link; the worker's model is wrapped (in
the test, not in production code) so that one forward raises.
"""
from __future__ import annotations

import asyncio
import random

import grpc
import pytest

from deploy.waiting import eventually
from kvmesh.v1 import worker_pb2, worker_pb2_grpc
from tests.reliability.in_process import linked_worker
from tests.worker.faults import FailingForward
from worker import Engine
from worker.engine.scheduler import SchedulerConfig

PROMPT = [random.Random(5).randrange(256) for _ in range(50)]  # 3 full blocks of 16 + 2
SCHED = SchedulerConfig(max_batched_tokens=16)  # prefill in chunks of 16, 16, 16, 2


@pytest.mark.parametrize("fail_at, kept", [(1, 0), (3, 32)])
def test_failed_step_is_never_advertised_and_the_retry_is_exact(redis_url, fail_at, kept):
    want = Engine.from_pretrained("tiny", num_blocks=64).generate(
        [PROMPT], max_tokens=6, ignore_eos=True)[0].token_ids

    async def main():
        engine = Engine.from_pretrained("tiny", num_blocks=64, scheduler=SCHED)
        FailingForward(engine, fail_at)
        async with linked_worker(redis_url, engine) as linked:
            link, client = linked.link, linked.client
            async with grpc.aio.insecure_channel(linked.worker_address) as ch:
                stub = worker_pb2_grpc.WorkerServiceStub(ch)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    async for _ in stub.Generate(worker_pb2.GenerateRequest(
                            token_ids=PROMPT, sampling=worker_pb2.SamplingParams(
                                max_tokens=6, ignore_eos=True))):
                        pass
            assert err.value.code() == grpc.StatusCode.INTERNAL
            # Every event of the failed step (its stores and their removal) is applied.
            await eventually(lambda: asyncio.sleep(0, (link.last_seq, engine.kv.pool.last_seq)),
                             lambda seqs: seqs[0] == seqs[1] > 0)
            routed = await client.route(PROMPT, dry_run=True)
            retry = await client.generate(PROMPT, max_tokens=6, ignore_eos=True)
            return routed.matched_tokens, retry

    matched, retry = asyncio.run(main())
    assert matched == kept  # only chunks of steps that completed are advertised
    assert retry.worker_id == "w0" and retry.num_cached_tokens == kept
    assert retry.token_ids == want
