"""One definition of a request's LoRA for the service and the worker.

The service turns ``RouteRequest.lora`` into the LoRA it hashes (``service.validate.route``)
and the worker turns ``GenerateRequest.lora`` into the one its KV cache hashes
(``WorkerServicer.Generate``). Both must agree for every message, or the index never matches.
"""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import grpc
import pytest

from kvmesh.hashing import block_hashes, lora_key
from kvmesh.v1 import index_pb2, worker_pb2
from service import validate
from service.config import ServiceConfig
from worker.rpc.server import WorkerServicer

TOKENS = list(range(64))


class _Aborted(Exception):
    pass


class _Context:
    """The part of a grpc.aio servicer context Generate uses before the engine."""

    code: grpc.StatusCode | None = None

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code = code
        raise _Aborted(details)


class _Runner:
    """Records what the worker would hand its engine, and runs nothing."""

    lora: object = "unset"
    engine = SimpleNamespace()  # the servicer sets its peer switch there

    async def generate(self, prompt, params, *, request_id, salt=None, lora=None, mm=(),
                       tenant=None, on_enqueued=None):
        self.lora = lora
        return
        yield  # an (empty) async generator, like AsyncEngine.generate


def _worker_lora(lora: index_pb2.Lora | None):
    runner, ctx = _Runner(), _Context()
    req = worker_pb2.GenerateRequest(token_ids=TOKENS, lora=lora)

    async def run() -> None:
        async for _ in WorkerServicer(runner, "w", "tiny").Generate(req, ctx):
            pass

    try:
        asyncio.run(run())
    except _Aborted:
        return ctx.code
    return runner.lora


def _service_lora(lora: index_pb2.Lora | None):
    req = index_pb2.RouteRequest(token_ids=TOKENS, lora=lora)
    try:
        return validate.route(req, ServiceConfig()).lora
    except validate.RequestError as e:
        return e.code


@pytest.mark.parametrize("lora", [
    None, index_pb2.Lora(), index_pb2.Lora(name=""), index_pb2.Lora(name="ad"),
    index_pb2.Lora(name="ad", path="/p"), index_pb2.Lora(path="/p"),
], ids=["unset", "empty", "empty-name", "name", "name-path", "path-only"])
def test_service_and_worker_convert_a_lora_alike(lora):
    service, worker = _service_lora(lora), _worker_lora(lora)
    assert service == worker
    if isinstance(service, grpc.StatusCode):
        assert service == grpc.StatusCode.INVALID_ARGUMENT  # a path without a name
    else:
        assert block_hashes(TOKENS, 16, lora=service) == block_hashes(TOKENS, 16, lora=worker)


def test_an_empty_lora_is_no_lora():
    assert lora_key("", "") is None
    assert block_hashes(TOKENS, 16, lora=lora_key("", "")) == block_hashes(TOKENS, 16)
    assert lora_key("ad", "") == ("ad", "")
    assert lora_key("ad", "/p") == ("ad", "/p")
    with pytest.raises(ValueError, match="name is empty"):
        lora_key("", "/p")

