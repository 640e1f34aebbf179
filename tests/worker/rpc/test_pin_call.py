"""The worker's ``Pin`` RPC over a real channel: pinning what it holds, warming what it
lacks, unpinning, the prefix by hashes, pinned blocks surviving pressure, bad requests, and
its own credential (the service's pin token, not the routers' access token)."""
from __future__ import annotations

import asyncio
import math
import random

import grpc
import pytest

from kvmesh.hashing import block_hashes
from kvmesh.rpc.auth import worker_access_token, worker_pin_token
from kvmesh.v1 import index_pb2, worker_pb2, worker_pb2_grpc
from tests.grpc_codes import code_of, status_of
from tests.worker.faults import FailingForward
from tests.worker.serving import with_worker
from worker import Engine
from worker.engine.async_engine import AsyncEngine
from worker.rpc.server import create_server

BS = 16
PREFIX = list(range(40, 40 + 3 * BS + 5))  # 3 full blocks


def _runner(num_blocks: int = 32) -> AsyncEngine:
    return AsyncEngine(Engine.from_pretrained("tiny", num_blocks=num_blocks)).start()


def _gen(tokens: list[int], salt: str = "") -> worker_pb2.GenerateRequest:
    return worker_pb2.GenerateRequest(token_ids=tokens, salt=salt,
                                      sampling=worker_pb2.SamplingParams(max_tokens=1,
                                                                         ignore_eos=True))


async def _cached(stub, tokens: list[int], salt: str = "") -> int:
    return [m async for m in stub.Generate(_gen(tokens, salt))][-1].num_cached_tokens


async def _pinned(stub) -> int:
    return (await stub.Stats(worker_pb2.WorkerStatsRequest())).pinned_blocks


def test_pin_holds_warms_and_unpins() -> None:
    async def body(stub: worker_pb2_grpc.WorkerServiceStub, _ch) -> None:
        # cold, no warming: nothing to pin
        res = await stub.Pin(worker_pb2.PinRequest(token_ids=PREFIX, salt="t", ttl_s=60))
        assert res.pinned_blocks == 0 and await _pinned(stub) == 0
        # warm: the worker prefills the prefix, then pins its full blocks
        res = await stub.Pin(worker_pb2.PinRequest(token_ids=PREFIX, salt="t", ttl_s=60,
                                                   warm=True))
        assert res.pinned_blocks == 3 and await _pinned(stub) == 3
        assert await _cached(stub, PREFIX, "t") == 3 * BS
        # the same prefix by its hashes refreshes the same pins
        chain = block_hashes(PREFIX, BS, salt="t")[:3]
        res = await stub.Pin(worker_pb2.PinRequest(block_hashes=chain, ttl_s=60))
        assert res.pinned_blocks == 3 and await _pinned(stub) == 3
        res = await stub.Pin(worker_pb2.PinRequest(token_ids=PREFIX, salt="t", unpin=True))
        assert res.pinned_blocks == 3 and await _pinned(stub) == 0

    asyncio.run(with_worker(body, _runner()))


def test_pinned_prefix_survives_pressure_an_unpinned_one_does_not() -> None:
    """A 40-block pool (pin cap: 4 blocks): after pinning prefix A (3 blocks) and running
    more other prompts than the pool holds, A is still fully cached; B, cached as A was but
    unpinned, is gone."""
    rng = random.Random(14)
    b_prefix = [rng.randrange(256) for _ in range(3 * BS + 5)]
    other = [[rng.randrange(256) for _ in range(4 * BS + 1)] for _ in range(15)]

    async def body(stub: worker_pb2_grpc.WorkerServiceStub, _ch) -> None:
        await _cached(stub, PREFIX)
        await _cached(stub, b_prefix)
        assert (await stub.Pin(worker_pb2.PinRequest(token_ids=PREFIX, ttl_s=60))
                ).pinned_blocks == 3
        for tokens in other:
            await _cached(stub, tokens)
        assert await _cached(stub, PREFIX) == 3 * BS
        assert await _cached(stub, b_prefix) == 0

    asyncio.run(with_worker(body, _runner(num_blocks=40)))


INVALID, TOO_BIG = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.mark.parametrize("req, code", [
    (worker_pb2.PinRequest(ttl_s=1), INVALID),                                  # no prefix
    (worker_pb2.PinRequest(token_ids=[1], block_hashes=[b"\x01" * 32]), INVALID),
    (worker_pb2.PinRequest(block_hashes=[b"\x01" * 32], salt="s"), INVALID),
    (worker_pb2.PinRequest(block_hashes=[b"\x01" * 32, b"\x02" * 16]), INVALID),
    (worker_pb2.PinRequest(token_ids=[1, 2], ttl_s=math.nan), INVALID),
    (worker_pb2.PinRequest(token_ids=[1, 2], ttl_s=-1), INVALID),
    (worker_pb2.PinRequest(token_ids=[1, 10**6]), INVALID),                     # vocabulary
    (worker_pb2.PinRequest(token_ids=[1], lora=index_pb2.Lora(path="/p")), INVALID),
    (worker_pb2.PinRequest(token_ids=[1], salt="s" * 4097), INVALID),
    (worker_pb2.PinRequest(token_ids=[1] * 40 * BS, warm=True), TOO_BIG),       # > the pool
])
def test_bad_pins_are_refused_and_change_nothing(req: worker_pb2.PinRequest,
                                                 code: grpc.StatusCode) -> None:
    async def body(stub: worker_pb2_grpc.WorkerServiceStub, _ch) -> None:
        before = await stub.Stats(worker_pb2.WorkerStatsRequest())
        assert await code_of(stub.Pin(req)) == code
        after = await stub.Stats(worker_pb2.WorkerStatsRequest())
        assert (after.cache, after.pinned_blocks, after.requests_done) == (
            before.cache, before.pinned_blocks, before.requests_done)

    asyncio.run(with_worker(body, _runner()))


def test_a_failed_warming_step_is_internal_and_pins_nothing() -> None:
    """The warming request's step fails (the engine's fault): INTERNAL, which says so, and
    nothing pinned; once the fault clears the same pin succeeds."""
    engine = Engine.from_pretrained("tiny", num_blocks=32)
    broken = FailingForward(engine)
    req = worker_pb2.PinRequest(token_ids=PREFIX, ttl_s=60, warm=True)

    async def body(stub: worker_pb2_grpc.WorkerServiceStub, _ch) -> None:
        code, details = await status_of(stub.Pin(req))
        assert code == grpc.StatusCode.INTERNAL and "out of memory" in details
        assert await _pinned(stub) == 0
        broken.failing = False
        assert (await stub.Pin(req)).pinned_blocks == 3

    asyncio.run(with_worker(body, AsyncEngine(engine).start()))


def test_pin_needs_the_pin_token_not_the_access_token() -> None:
    """Routers hold the access token: it serves Generate but never Pin, which takes only
    the pin token derived from the worker's service credential (and that token is no
    Generate credential)."""
    access = [("authorization", f"Bearer {worker_access_token('router-tok', 'w')}")]
    pin = [("authorization", f"Bearer {worker_pin_token('w:minted-service-token')}")]
    unauth, ok = grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.OK
    req = worker_pb2.PinRequest(token_ids=PREFIX, ttl_s=60)

    async def main() -> None:
        runner = _runner()
        server, port, _ = await create_server(
            "127.0.0.1:0", runner, worker_id="w", model_name="tiny",
            access_token=worker_access_token("router-tok", "w"),
            pin_token=worker_pin_token("w:minted-service-token"))
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                stub = worker_pb2_grpc.WorkerServiceStub(ch)
                assert await code_of(stub.Pin(req)) == unauth
                assert await code_of(stub.Pin(req, metadata=access)) == unauth
                assert await code_of(stub.Pin(req, metadata=pin)) == ok
                assert await code_of(stub.Generate(_gen(PREFIX), metadata=pin)) == unauth
                assert await code_of(stub.Generate(_gen(PREFIX), metadata=access)) == ok
        finally:
            await server.stop(None)
            runner.stop()

    asyncio.run(main())
