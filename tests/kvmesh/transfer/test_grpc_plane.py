"""The grpc plane: its refusals are proper gRPC statuses, and its receiver refuses crafted
frames (truncated, oversized, out of order, another offer's) before they reach the sink."""
from __future__ import annotations

import asyncio
import secrets

import grpc
import pytest

from kvmesh.transfer import grpc_plane
from kvmesh.transfer.endpoint import Endpoint
from kvmesh.transfer.frames import CLAIM, DATA, Head, TransferError, unpack
from kvmesh.transfer.offers import OfferBook
from kvmesh.transfer.transports import pull

BB = 512


def _crafted(frames) -> tuple[TransferError, list[int]]:
    """Pull 4 blocks from a grpc source that streams ``frames(key)``."""

    async def main():
        key = secrets.token_bytes(16)

        async def serve(request: bytes, context):
            assert unpack(request).kind == CLAIM
            for msg in frames(key):
                yield msg

        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            grpc_plane.SERVICE, {"Pull": grpc.unary_stream_rpc_method_handler(serve)}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        seen: list[int] = []
        try:
            with pytest.raises(TransferError) as e:
                await pull(str(Endpoint("grpc", "127.0.0.1", port, key)), BB, 4,
                           lambda i, b: seen.append(i), timeout_s=5)
        finally:
            await server.stop(None)
        return e.value, seen

    return asyncio.run(main())


def _data(key: bytes, index: int, first: int, count: int, nbytes: int) -> bytes:
    return Head(DATA, key, index, first, count).pack() + bytes(nbytes)


def test_a_truncated_frame_is_refused_whole() -> None:
    err, seen = _crafted(lambda k: [_data(k, 0, 0, 2, 2 * BB - 1)])
    assert (err.reason, err.landed, seen) == ("truncated", 0, [])


def test_an_oversized_frame_is_refused() -> None:
    err, seen = _crafted(lambda k: [_data(k, 0, 0, 1, BB), _data(k, 1, 1, 1, BB + 1)])
    assert (err.reason, err.landed, seen) == ("oversized", 1, [0])


def test_an_out_of_order_frame_is_refused() -> None:
    err, seen = _crafted(lambda k: [_data(k, 0, 0, 1, BB), _data(k, 1, 3, 1, BB)])
    assert (err.reason, err.landed, seen) == ("out_of_order", 1, [0])


def test_a_frame_for_another_offer_is_refused() -> None:
    err, seen = _crafted(lambda k: [_data(secrets.token_bytes(16), 0, 0, 1, BB)])
    assert (err.reason, err.landed, seen) == ("malformed", 0, [])


def test_a_stream_that_ends_early_is_truncated() -> None:
    err, seen = _crafted(lambda k: [_data(k, 0, 0, 2, 2 * BB)])
    assert (err.reason, err.landed, seen) == ("truncated", 2, [0, 1])


@pytest.mark.parametrize(("claim", "code"), [
    (b"nonsense", grpc.StatusCode.INVALID_ARGUMENT),
    (Head(DATA, bytes(16)).pack(), grpc.StatusCode.INVALID_ARGUMENT),
    (Head(CLAIM, bytes(16), count=1, extra=8).pack(), grpc.StatusCode.NOT_FOUND),
])
def test_a_bad_claim_gets_a_status_with_an_actionable_message(claim: bytes, code) -> None:
    async def main() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc_plane.handler(OfferBook(), 1 << 20),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    async for _ in ch.unary_stream(grpc_plane.METHOD)(claim, timeout=5):
                        pass
            assert e.value.code() == code
            assert "peer KV pull refused" in e.value.details()
        finally:
            await server.stop(None)

    asyncio.run(main())
