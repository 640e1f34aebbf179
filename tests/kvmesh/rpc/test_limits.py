"""``RequestLimits`` counts every call out however it ends, and holds nothing of a call after
it: a stopped server is freed at once, never left to the garbage collector (which once kept
gRPC's aio poller thread alive from test to test and finalized old servers at random)."""
from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import grpc
import pytest

from kvmesh.rpc.limits import RequestLimits

OK, BAD, BIG = grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, \
    grpc.StatusCode.RESOURCE_EXHAUSTED


def _handlers() -> grpc.GenericRpcHandler:
    async def echo(text: str, context) -> bytes:
        if text == "raise":
            raise RuntimeError("the handler broke")
        return text.encode()

    async def count(text: str, context):
        for i in range(int(text)):
            yield str(i).encode()
            await asyncio.sleep(0.01)

    kw = {"request_deserializer": lambda b: b.decode("ascii")}  # non-ASCII: undecodable
    return grpc.method_handlers_generic_handler("t.T", {
        "Echo": grpc.unary_unary_rpc_method_handler(echo, **kw),
        "Count": grpc.unary_stream_rpc_method_handler(count, **kw)})


def test_calls_are_counted_out_however_they_end() -> None:
    limits = RequestLimits(max_inflight=3, max_message_bytes=64, prefix="/t.")

    async def main() -> list[grpc.StatusCode]:
        server = grpc.aio.server(interceptors=[limits])
        server.add_generic_rpc_handlers((_handlers(),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        codes = []
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                echo, count = ch.unary_unary("/t.T/Echo"), ch.unary_stream("/t.T/Count")
                for payload in (b"hi", b"\xff\xfe", b"x" * 65, b"raise"):
                    try:
                        await echo(payload)
                        codes.append(OK)
                    except grpc.aio.AioRpcError as e:
                        codes.append(e.code())
                codes.append(OK if len([m async for m in count(b"3")]) == 3 else None)
                call = count(b"1000")  # the caller gives up half way
                await call.read()
                call.cancel()
                # a full connection still refuses, and lets go again
                held = [count(b"1000") for _ in range(3)]
                for c in held:
                    await c.read()
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await echo(b"hi")
                codes.append(err.value.code())
                for c in held:
                    c.cancel()
                for _ in range(200):  # the server sees the cancels a moment later
                    if not limits.inflight:
                        break
                    await asyncio.sleep(0.01)
        finally:
            await server.stop(None)
        return codes

    codes = asyncio.run(main())
    assert codes == [OK, BAD, BIG, grpc.StatusCode.UNKNOWN, OK, BIG]
    assert limits.inflight == {}


def test_a_stopped_server_leaves_no_grpc_aio_behind() -> None:
    """In a fresh interpreter (this one may hold other tests' gRPC state): after one call
    through the limits and ``server.stop``, gRPC's aio poller thread is gone without any
    garbage collection."""
    code = textwrap.dedent("""
        import asyncio, gc, threading, grpc
        from kvmesh.rpc.limits import RequestLimits
        from tests.kvmesh.rpc.test_limits import _handlers

        async def main():
            server = grpc.aio.server(interceptors=[
                RequestLimits(max_inflight=4, max_message_bytes=64, prefix="/t.")])
            server.add_generic_rpc_handlers((_handlers(),))
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                assert await ch.unary_unary("/t.T/Echo")(b"hi") == b"hi"
            await server.stop(None)

        gc.disable()
        asyncio.run(main())
        print(sorted(t.name for t in threading.enumerate() if "poll" in t.name))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr
