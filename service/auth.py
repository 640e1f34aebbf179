"""Bearer-token authentication as a grpc.aio server interceptor.

Roles: the *router* token (``token``) guards Route, Stats and reflection; the *worker* token
(``worker_token``, defaulting to ``token``) guards RegisterWorker, Heartbeat, PublishEvents
and SyncWorker. A role with no token configured is open. The standard health service is
always open (load balancers and Kubernetes probes send no metadata). A call without the
right ``authorization: Bearer <token>`` fails with UNAUTHENTICATED before any handler runs.
"""
from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

WORKER_METHODS = frozenset(f"/kvmesh.v1.IndexService/{m}" for m in
                           ("RegisterWorker", "Heartbeat", "PublishEvents", "SyncWorker"))
OPEN_PREFIX = "/grpc.health.v1.Health/"


def _denied(message: str) -> Callable[..., Awaitable[Any]]:
    async def deny(_request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return deny


class BearerAuth(grpc.aio.ServerInterceptor):
    """Checks ``authorization: Bearer <token>`` against the method's role."""

    def __init__(self, token: str | None, worker_token: str | None = None) -> None:
        self.token = token
        self.worker_token = worker_token if worker_token is not None else token

    def _required(self, method: str) -> tuple[str | None, str]:
        if method.startswith(OPEN_PREFIX):
            return None, ""
        if method in WORKER_METHODS:
            return self.worker_token, "worker"
        return self.token, "router"

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        method = handler_call_details.method
        expected, role = self._required(method)
        if expected is None:
            return await continuation(handler_call_details)
        given = ""
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                given = value if isinstance(value, str) else value.decode(errors="replace")
                break
        if given.startswith("Bearer ") and hmac.compare_digest(
                given[7:].strip().encode(), expected.encode()):
            return await continuation(handler_call_details)
        why = ("missing 'authorization: Bearer <token>' metadata" if not given
               else f"invalid {role} token")
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        deny = _denied(f"{method}: {why}")
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(deny)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(deny)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(deny)
        return grpc.unary_unary_rpc_method_handler(deny)
