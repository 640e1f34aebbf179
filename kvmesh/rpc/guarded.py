"""A gRPC method handler behind an admission check: how kvmesh's server interceptors wrap a
handler (``kvmesh.rpc.auth``, ``kvmesh.rpc.limits``).

``guarded(handler, admit)`` returns a handler that first awaits ``admit(request, context)``,
which either aborts the call (``context.abort``: the handler never runs) or returns the
request to hand on (possibly a different object, e.g. the parsed message of raw bytes). Only
unary-request handlers are wrapped (request-streaming ones are returned unchanged); the
response side may stream. With ``raw=True`` the wrapped handler receives the request's bytes
undecoded, and ``admit`` must return the decoded request. ``leave(context)``, if given, runs
once when an admitted call ends (returned, raised, aborted or cancelled), never for a call
``admit`` refused.

Why not ``context.add_done_callback``: grpc.aio keeps the callback in the call's state, which
the callback's context points back to; that cycle holds the call, and through it the
server, until the cyclic garbage collector runs, so a stopped server keeps gRPC's aio poller
thread alive and is finalized later at a random point, in any thread.
"""
from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

Admit = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]
Leave = Callable[[grpc.aio.ServicerContext], None]


async def stream_items(result: Any) -> AsyncIterator[Any]:
    """The messages of a server-streaming handler's ``result``: an async generator's items,
    or none for a coroutine that writes with ``context.write`` (or only aborts)."""
    if inspect.isasyncgen(result):
        async for item in result:
            yield item
    else:
        await result


def guarded(handler: grpc.RpcMethodHandler, admit: Admit, *, raw: bool = False,
            leave: Leave | None = None) -> grpc.RpcMethodHandler:
    """``handler`` with ``admit`` in front of it (see the module docstring)."""
    if handler.request_streaming:
        return handler
    kw = {"request_deserializer": None if raw else handler.request_deserializer,
          "response_serializer": handler.response_serializer}
    if handler.response_streaming:
        inner_stream = handler.unary_stream

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
            request = await admit(request, context)
            try:
                async for item in stream_items(inner_stream(request, context)):
                    yield item
            finally:
                if leave is not None:
                    leave(context)

        return grpc.unary_stream_rpc_method_handler(stream, **kw)
    inner = handler.unary_unary

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        request = await admit(request, context)
        try:
            return await inner(request, context)
        finally:
            if leave is not None:
                leave(context)

    return grpc.unary_unary_rpc_method_handler(unary, **kw)
