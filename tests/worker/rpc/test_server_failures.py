"""The worker server while its engine fails: clear codes, never UNKNOWN, and a request
cancelled before the engine thread took it is not run."""
from __future__ import annotations

import asyncio
import logging
import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from deploy.waiting import eventually
from kvmesh.v1 import worker_pb2
from tests.grpc_codes import status_of
from tests.worker.faults import FailingForward
from tests.worker.serving import with_worker
from worker import Engine
from worker.engine.async_engine import AsyncEngine
from worker.engine.sequence import SamplingParams

PROMPT = list(range(40, 90))


def _gen(tokens, max_tokens=4) -> worker_pb2.GenerateRequest:
    return worker_pb2.GenerateRequest(token_ids=tokens, sampling=worker_pb2.SamplingParams(
        max_tokens=max_tokens, ignore_eos=True))


def test_every_rpc_has_its_code_while_the_engine_fails():
    engine = Engine.from_pretrained("tiny", num_blocks=64)
    broken = FailingForward(engine)
    want = Engine.from_pretrained("tiny", num_blocks=64).generate(
        [PROMPT], max_tokens=4, ignore_eos=True)[0].token_ids

    async def body(stub, ch):
        calls = {
            "Generate": lambda: stub.Generate(_gen(PROMPT)),
            "Stats": lambda: stub.Stats(worker_pb2.WorkerStatsRequest()),
            "FetchBlocks": lambda: stub.FetchBlocks(worker_pb2.FetchBlocksRequest()),
            # (a warming Pin, which runs a step: tests/worker/rpc/test_pin_call.py)
            "Pin": lambda: stub.Pin(worker_pb2.PinRequest(token_ids=PROMPT, ttl_s=60)),
        }
        methods = worker_pb2.DESCRIPTOR.services_by_name["WorkerService"].methods
        assert set(calls) == {m.name for m in methods}, "a WorkerService RPC is not covered"
        got = {name: await status_of(call()) for name, call in calls.items()}
        health = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
        broken.failing = False  # the fault clears: the same worker serves the same prompt
        after = [t async for m in stub.Generate(_gen(PROMPT)) for t in m.token_ids]
        return got, health, after

    runner = AsyncEngine(engine).start()
    got, health, after = asyncio.run(with_worker(body, runner, "w-f"))
    assert all(code != grpc.StatusCode.UNKNOWN for code, _ in got.values()), got
    code, details = got["Generate"]
    assert code == grpc.StatusCode.INTERNAL
    assert "step failed" in details and "out of memory" in details
    assert "another worker" in details
    assert got["Stats"][0] == grpc.StatusCode.OK
    assert got["FetchBlocks"][0] == grpc.StatusCode.INVALID_ARGUMENT  # names no blocks
    assert got["Pin"][0] == grpc.StatusCode.OK  # nothing held yet: nothing pinned
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert after == want
    assert runner.failed_steps == 1 and runner.error is None  # recovered: still healthy


@pytest.mark.parametrize("method", ["Generate", "Stats"])
def test_unexpected_errors_are_logged_and_answered_internal(method, caplog, monkeypatch):
    engine = Engine.from_pretrained("tiny", num_blocks=64)

    def explode(*_a, **_k):
        raise KeyError("bug in the worker (injected)")

    # Generate validates on the loop; Stats reads the cache stats on the engine thread.
    if method == "Generate":
        monkeypatch.setattr(engine, "validate", explode)
    else:
        monkeypatch.setattr(type(engine.kv), "stats", property(explode))
    runner = AsyncEngine(engine).start()

    async def body(stub, ch):
        if method == "Generate":
            return await status_of(stub.Generate(_gen(PROMPT)))
        return await status_of(stub.Stats(worker_pb2.WorkerStatsRequest()))

    with caplog.at_level(logging.ERROR, logger="kvmesh.worker.rpc"):
        code, details = asyncio.run(with_worker(body, runner, "w-f"))
    assert code == grpc.StatusCode.INTERNAL
    assert "KeyError" in details and "bug in the worker" in details
    assert any(r.exc_info and "bug in the worker" in str(r.exc_info[1]) for r in caplog.records)


def test_request_cancelled_before_the_engine_thread_takes_it_never_runs():
    engine = Engine.from_pretrained("tiny", num_blocks=64)
    runner = AsyncEngine(engine).start()
    gate, busy = threading.Event(), threading.Event()

    async def until(cond) -> None:
        await eventually(lambda: asyncio.sleep(0, cond()), interval=0.002)

    async def main():
        hold = runner.call(lambda e: (busy.set(), gate.wait(10)))  # engine thread busy
        await until(busy.is_set)

        async def consume():
            async for _ in runner.generate(PROMPT, SamplingParams(max_tokens=50,
                                                                  ignore_eos=True),
                                           request_id="r1"):
                pass

        task = asyncio.create_task(consume())
        await until(lambda: runner._inbox.qsize() == 1)  # its enqueue waits behind the gate
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.set()
        await hold
        # FIFO inbox: this runs after the enqueue and whatever the cancellation posted.
        return await runner.call(lambda e: (e.has_work(), e.requests_done,
                                            e.kv.num_free_blocks))

    try:
        has_work, done, free = asyncio.run(main())
    finally:
        runner.stop()
    assert not has_work and done == 0 and free == 64
