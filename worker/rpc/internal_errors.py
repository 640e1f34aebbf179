"""No worker RPC answers UNKNOWN: an unexpected exception becomes INTERNAL with a message.

gRPC answers UNKNOWN for any exception a handler lets escape, which tells the caller
nothing and hides the traceback. :class:`InternalErrors` wraps every handler of the server
(outermost interceptor): a ``context.abort`` (an intended status) and cancellation pass
through untouched; anything else is logged with its traceback and answered INTERNAL,
which clients treat as the worker's fault (try the next candidate).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc

from kvmesh.rpc.guarded import stream_items

log = logging.getLogger("kvmesh.worker.rpc")


async def _answer_internal(method: str, exc: Exception, context: grpc.aio.ServicerContext
                           ) -> None:
    log.error("%s failed unexpectedly", method, exc_info=exc)
    await context.abort(grpc.StatusCode.INTERNAL,
                        f"internal error in the worker serving {method} "
                        f"({type(exc).__name__}: {exc})")


def _wrap_stream(method: str, inner: Callable[..., Any]) -> Callable[..., Any]:
    async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            async for item in stream_items(inner(request, context)):
                yield item
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _answer_internal(method, exc, context)

    return stream


def _wrap_unary(method: str, inner: Callable[..., Any]) -> Callable[..., Any]:
    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await inner(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _answer_internal(method, exc, context)

    return unary


class InternalErrors(grpc.aio.ServerInterceptor):
    """Answer INTERNAL (logged, with a message) where a handler would answer UNKNOWN."""

    async def intercept_service(self, continuation: Any,
                                handler_call_details: grpc.HandlerCallDetails) -> Any:
        method = handler_call_details.method
        try:
            handler = await continuation(handler_call_details)
        except Exception as exc:  # an inner interceptor broke before any handler ran
            failure = exc

            async def refuse(_request: Any, context: grpc.aio.ServicerContext) -> None:
                await _answer_internal(method, failure, context)

            return grpc.unary_unary_rpc_method_handler(refuse)
        if handler is None:
            return None
        kw = {"request_deserializer": handler.request_deserializer,
              "response_serializer": handler.response_serializer}
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(
                _wrap_stream(method, handler.stream_stream), **kw)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(
                _wrap_unary(method, handler.stream_unary), **kw)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(
                _wrap_stream(method, handler.unary_stream), **kw)
        return grpc.unary_unary_rpc_method_handler(
            _wrap_unary(method, handler.unary_unary), **kw)
