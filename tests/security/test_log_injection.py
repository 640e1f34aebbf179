"""Attack: client-given strings forging service log lines.

``RegisterWorker`` used to check only the ``host:port`` shape of an address and log it raw:
an address with newlines wrote a line of the attacker's choosing ("purged worker ...") into
the service log. A real service (gRPC on a free port, Redis index) is attacked here; its log
is captured and must hold no line the attacker wrote.
"""
from __future__ import annotations

import asyncio
import logging

import grpc
import pytest

from kvmesh.hashing import none_hash
from kvmesh.v1 import index_pb2 as pb
from service.config import ServiceConfig
from service.validate import RequestError, address
from tests.service.protocol_worker import serve

FORGED = "2025-01-01 00:00:00,000 kvmesh.service purged worker victim (no heartbeat for 5.0s)"


def _register(stub, **kw: object):
    fields = dict(worker_id="evil", address="127.0.0.1:9000", model="tiny", block_size=4,
                  hash_algo="sha256_cbor", root_hash=none_hash("sha256_cbor"))
    fields.update(kw)
    return stub.RegisterWorker(pb.RegisterWorkerRequest(**fields))  # type: ignore[arg-type]


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [line for rec in caplog.records for line in rec.getMessage().splitlines()]


def test_forged_log_lines_are_refused_or_quoted(redis_url: str,
                                                caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with serve(ServiceConfig(backend="redis", redis_url=redis_url)) as r:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _register(r.stub, address=f"127.0.0.1:1\n{FORGED}\nx:9000")
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "must be host:port" in (err.value.details() or "")
            # model names are free text by design (percent-encoded in keys): quoted in logs
            await _register(r.stub, model=f"tiny\n{FORGED}")
            assert (await r.stub.Stats(pb.StatsRequest())).workers

    with caplog.at_level(logging.INFO, logger="kvmesh"):
        asyncio.run(main())
    assert any("registered worker 'evil'" in line for line in _lines(caplog))
    assert not any(line.startswith(FORGED[:10]) for line in _lines(caplog)), _lines(caplog)


@pytest.mark.parametrize("value", [
    "127.0.0.1:50051", "0.0.0.0:1", "localhost:65535", "w-1.pool.example.com:80", "[::1]:5",
    "[2001:db8::ff00:42:8329]:443"])
def test_valid_addresses(value: str) -> None:
    assert address(value) == value


@pytest.mark.parametrize("value", [
    "nowhere", "h:0", "h:65536", "h:+1", "h:\uff11", "::1:5", "[::1]", "[zz::1]:5",
    "1.2.3.999:5", "-h:1", "h-:1", "a..b:1", "h.:1", "a b:1", "h\n:1", "user@h:1",
    "h/x:1", "h_1:1", "[::1%eth0]:5", "x" * 254 + ":1", "a" * 64 + ".b:1"])
def test_invalid_addresses(value: str) -> None:
    with pytest.raises(RequestError, match="must be host:port"):
        address(value)
