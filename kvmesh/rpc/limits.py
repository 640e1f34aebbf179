"""What one connection and one request may cost a kvmesh server (a ``grpc.aio`` interceptor).

At most ``max_inflight`` calls per connection (more: RESOURCE_EXHAUSTED naming the flag); the
transport refuses a message over ``max_message_bytes`` while it arrives (never buffered
whole); bytes that do not parse -> INVALID_ARGUMENT. Calls auth already refused pass
untouched, so an unauthenticated caller learns nothing here.

See docs/architecture.md#rpc-auth-limits-tls-retries.
"""
from __future__ import annotations

from typing import Any

import grpc

from kvmesh.rpc.guarded import guarded

KVMESH_PREFIX = "/kvmesh.v1."
_TOO_MUCH = grpc.StatusCode.RESOURCE_EXHAUSTED


def server_options(max_message_bytes: int, max_inflight: int) -> list[tuple[str, int]]:
    """gRPC server options enforcing ``max_message_bytes`` on the transport (send and
    receive) and, when ``max_inflight`` > 0, ``max_inflight + 1`` streams per connection."""
    cap = min(max_message_bytes, 2**31 - 1)
    options = [("grpc.max_receive_message_length", cap), ("grpc.max_send_message_length", cap)]
    if max_inflight:
        options.append(("grpc.max_concurrent_streams", max_inflight + 1))
    return options


class RequestLimits(grpc.aio.ServerInterceptor):
    """In-flight calls per connection, request size and decoding (see the module docstring).

    ``inflight_flag`` / ``bytes_flag`` are the command-line flags named in the errors.
    """

    def __init__(self, *, max_inflight: int, max_message_bytes: int,
                 prefix: str = KVMESH_PREFIX, inflight_flag: str = "--max-inflight-per-conn",
                 bytes_flag: str = "--max-message-bytes") -> None:
        if max_inflight < 0 or max_message_bytes < 1:
            raise ValueError("max_inflight must be >= 0 and max_message_bytes >= 1")
        self.max_inflight = max_inflight
        self.max_message_bytes = max_message_bytes
        self.prefix = prefix
        self.inflight_flag = inflight_flag
        self.bytes_flag = bytes_flag
        self.inflight: dict[str, int] = {}  # peer -> calls in flight (one event loop: no lock)

    def _leave(self, peer: str) -> None:
        n = self.inflight.get(peer, 0) - 1
        if n > 0:
            self.inflight[peer] = n
        else:
            self.inflight.pop(peer, None)

    async def _enter(self, context: grpc.aio.ServicerContext) -> None:
        """Count the call in (or abort it); the handler's end counts it out
        (``guarded``'s ``leave``: a done callback would keep the server alive, see there)."""
        if not self.max_inflight:
            return
        peer = context.peer()
        n = self.inflight.get(peer, 0)
        if n >= self.max_inflight:
            await context.abort(_TOO_MUCH, (
                f"{n} calls already in flight on this connection; the limit is "
                f"{self.max_inflight} per connection (raise it with {self.inflight_flag}, "
                "or spread calls over more channels)"))
        self.inflight[peer] = n + 1

    def _wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        decode = handler.request_deserializer

        async def admit(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
            await self._enter(context)
            try:
                if len(raw) > self.max_message_bytes:
                    await context.abort(_TOO_MUCH, (
                        f"{method}: the request is {len(raw)} bytes; the limit is "
                        f"{self.max_message_bytes} (raise it with {self.bytes_flag})"))
                try:
                    return decode(raw)
                except Exception as e:  # DecodeError, invalid UTF-8, recursion limit ...
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, (
                        f"{method}: the request is not a valid {_message_name(decode)} "
                        f"({type(e).__name__})"))
            except BaseException:  # refused after counting in: the handler never runs
                self._leave_call(context)
                raise

        return guarded(handler, admit, raw=True, leave=self._leave_call)

    def _leave_call(self, context: grpc.aio.ServicerContext) -> None:
        if self.max_inflight:
            self._leave(context.peer())

    async def intercept_service(self, continuation: Any,
                                handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if (handler is None or not method.startswith(self.prefix) or handler.request_streaming
                or handler.request_deserializer is None):
            return handler
        return self._wrap(handler, method)


def _message_name(decode: Any) -> str:
    owner = getattr(decode, "__self__", None)  # Message.FromString is a bound classmethod
    descriptor = getattr(owner, "DESCRIPTOR", None)
    return getattr(descriptor, "full_name", "request message")
