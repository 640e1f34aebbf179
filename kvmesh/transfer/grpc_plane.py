"""The grpc plane: a server-streaming method on the DataServer's own grpc.aio server.

No proto: the request is a CLAIM head and each response message a DATA head followed by the
frame's blocks, joined (gRPC sends each message as one buffer, so a frame costs one copy on
the source). gRPC's own flow control paces the stream. Refusals are gRPC statuses with an
actionable message and the reason in the trailing metadata ``kvmesh-reason``.

See docs/architecture.md#peer-kv-transfer-the-data-plane.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import grpc

from kvmesh.transfer.endpoint import Endpoint
from kvmesh.transfer.frames import (
    CLAIM,
    DATA,
    HEAD,
    SOURCE_REASONS,
    FrameCheck,
    Head,
    TransferError,
    blocks_per_frame,
    frame_spans,
    unpack,
)
from kvmesh.transfer.offers import OfferBook

SERVICE = "kvmesh.transfer.Data"
METHOD = f"/{SERVICE}/Pull"
MAX_MESSAGE = 256 << 20
OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE),
           ("grpc.max_send_message_length", MAX_MESSAGE)]
_CODES = {"refused": grpc.StatusCode.NOT_FOUND, "expired": grpc.StatusCode.FAILED_PRECONDITION,
          "mismatch": grpc.StatusCode.INVALID_ARGUMENT,
          "malformed": grpc.StatusCode.INVALID_ARGUMENT}
_REASONS = {grpc.StatusCode.DEADLINE_EXCEEDED: "timeout", grpc.StatusCode.CANCELLED: "closed",
            grpc.StatusCode.NOT_FOUND: "refused",
            grpc.StatusCode.FAILED_PRECONDITION: "expired",
            grpc.StatusCode.INVALID_ARGUMENT: "mismatch"}


def handler(book: OfferBook, frame_bytes: int) -> grpc.GenericRpcHandler:
    """The generic handler serving ``book``'s "grpc" offers."""

    async def pull(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        try:
            head = unpack(request)
            if head.kind != CLAIM:
                raise TransferError("malformed", 0, "the request is not a CLAIM head")
            offer = book.take(head.key, "grpc")
            if head.count != len(offer.blocks) or head.extra != offer.block_bytes:
                offer.finish("failed")
                raise TransferError("mismatch", 0, f"the offer holds {len(offer.blocks)} blocks "
                                    f"of {offer.block_bytes} bytes, the claim asks for "
                                    f"{head.count} of {head.extra}")
        except TransferError as e:
            await context.abort(_CODES.get(e.reason, grpc.StatusCode.INVALID_ARGUMENT),
                                f"peer KV pull refused ({e.reason}): {e}; route again",
                                trailing_metadata=(("kvmesh-reason", e.reason),))
            return
        bb, outcome = offer.block_bytes, "failed"
        try:
            spans = frame_spans(len(offer.blocks), blocks_per_frame(bb, frame_bytes))
            for index, (first, n) in enumerate(spans):
                head_bytes = Head(DATA, offer.key, index, first, n).pack()
                yield b"".join([head_bytes, *offer.blocks[first:first + n]])
            outcome = "sent"
        finally:
            offer.finish(outcome)

    rpc = grpc.unary_stream_rpc_method_handler(pull)
    return grpc.method_handlers_generic_handler(SERVICE, {"Pull": rpc})


async def pull(ep: Endpoint, block_bytes: int, count: int,
               sink: Callable[[int, memoryview], None], timeout_s: float) -> int:
    """Pull over grpc; the contract is :func:`kvmesh.transfer.transports.pull`'s."""
    check = FrameCheck(ep.key, block_bytes, count)
    claim = Head(CLAIM, ep.key, 0, 0, count, block_bytes).pack()
    got_any = False
    async with grpc.aio.insecure_channel(ep.address, options=OPTIONS) as channel:
        call = channel.unary_stream(METHOD)(claim, timeout=timeout_s)
        try:
            async with asyncio.timeout(timeout_s):
                async for msg in call:
                    got_any = True
                    view = memoryview(msg)
                    head = unpack(view, check.landed)
                    check.check(head, len(view) - HEAD.size)
                    base = HEAD.size
                    for j in range(head.count):
                        off = base + j * block_bytes
                        sink(head.first + j, view[off:off + block_bytes])
                    check.advance(head)
                    if check.done:
                        break
        except TimeoutError:
            raise TransferError("timeout", check.landed,
                                f"the pull did not finish within {timeout_s} s") from None
        except grpc.aio.AioRpcError as e:
            raise TransferError(_reason(e, got_any), check.landed,
                                f"the grpc pull failed: {e.code().name}: {e.details()}") from None
        finally:
            call.cancel()
    if not check.done:
        raise TransferError("truncated", check.landed, "the stream ended before the last block")
    return count


def _reason(e: grpc.aio.AioRpcError, got_any: bool) -> str:
    for key, value in e.trailing_metadata() or ():
        if key == "kvmesh-reason":
            return str(value) if value in SOURCE_REASONS else "refused"
    if e.code() == grpc.StatusCode.UNAVAILABLE:
        return "closed" if got_any else "unreachable"
    return _REASONS.get(e.code(), "closed")
