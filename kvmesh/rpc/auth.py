"""Bearer-token authentication of kvmesh gRPC servers (a ``grpc.aio`` server interceptor).

Each server supplies its policy (the role a method needs, the verifiers per role). Before any
handler runs: no token or a wrong one -> UNAUTHENTICATED, without reading the request; a
grant bound to an identity passes only a request for that ``worker_id`` (else
PERMISSION_DENIED). Comparison is constant-time. Workers never hold the router token: each
checks its own :func:`worker_access_token`, valid on no other worker.

See docs/architecture.md#rpc-auth-limits-tls-retries.
"""
from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from kvmesh.rpc.guarded import guarded

OPEN_PREFIXES = ("/grpc.health.v1.Health/",)
IDENTITY_FIELD = "worker_id"


@dataclass(frozen=True)
class Grant:
    """What a verified token allows: a ``role`` and, for a bound token, the only
    ``identity`` (worker id) it may act for."""

    role: str
    identity: str | None = None


Verifier = Callable[[str], Grant | None]


def shared_token(role: str, expected: str | Callable[[], str | None]) -> Verifier:
    """A verifier accepting exactly ``expected`` (a token shared by all holders of ``role``).

    ``expected`` may be a function, asked at every check, for a token known only once the
    server is built (a worker whose id is its bound port); while it returns ``None`` every
    token is refused (never open)."""
    if callable(expected):
        source = expected

        def verify_late(token: str) -> Grant | None:
            want = source()
            return (Grant(role) if want is not None
                    and hmac.compare_digest(token.encode(), want.encode()) else None)

        return verify_late
    want = expected.encode()

    def verify(token: str) -> Grant | None:
        return Grant(role) if hmac.compare_digest(token.encode(), want) else None

    return verify


_ACCESS_KEY_LABEL = b"kvmesh worker access key v2"  # domain separation: router token -> key
_ACCESS_LABEL = b"kvmesh worker access v2\x00"      # key + worker id -> that worker's token


def worker_access_key(router_token: str) -> bytes:
    """The key every worker's access token is minted from: HMAC-SHA256(router_token,
    "kvmesh worker access key v2"). Held by whoever calls workers (clients, the gateway,
    routers, the service for pins) and by no worker; it cannot Route (the service checks
    the router token itself) and the router token cannot be recovered from it."""
    if not router_token:
        raise ValueError("the router token is empty")
    return hmac.new(router_token.encode(), _ACCESS_KEY_LABEL, hashlib.sha256).digest()


class WorkerAccess:
    """Mints the access token of any worker from the router token (one key, derived once).

    Invariant: ``token(w)`` is valid on worker ``w`` only; distinct ids give unrelated
    tokens (HMAC-SHA256 under :func:`worker_access_key`), so nothing one worker receives
    lets it call another. The router token itself is not kept.
    """

    __slots__ = ("_key",)

    def __init__(self, router_token: str) -> None:
        self._key = worker_access_key(router_token)

    def token(self, worker_id: str) -> str:
        """The token worker ``worker_id``'s WorkerService requires (hex). Raises
        ``ValueError`` for an empty id (no worker has one: a token for "" would be one
        nobody can bind)."""
        if not worker_id:
            raise ValueError("worker_id is empty: a worker access token is bound to one worker")
        return hmac.new(self._key, _ACCESS_LABEL + worker_id.encode(),
                        hashlib.sha256).hexdigest()

    def __repr__(self) -> str:  # never print the key
        return "WorkerAccess(<key>)"


def worker_access_token(router_token: str, worker_id: str) -> str:
    """The token clients send to worker ``worker_id``'s WorkerService (Generate/Stats, and
    Pin on a cluster without worker credentials), derived from the router token:
    HMAC-SHA256(:func:`worker_access_key` (router_token), "kvmesh worker access v2\\0" +
    worker_id), hex.

    Each worker is configured with its own token only (``kvmesh worker-access-token
    --worker-id ID`` mints it for an operator), never the router token, so a worker (or an
    impostor registered as one) that collects it can call no other worker, cannot Route,
    read Stats or register anything at the service; the router token cannot be recovered
    from it. Raises ``ValueError`` for an empty router token or worker id.
    """
    return WorkerAccess(router_token).token(worker_id)


def worker_pin_token(service_token: str) -> str:
    """The token a worker's ``Pin`` requires, derived from the credential the worker
    presents to the metadata service (its bound ``kvmesh worker-token``, or the shared
    worker token): HMAC-SHA256(service_token, "kvmesh worker pin v1"), hex.

    Only the service (which can mint every worker's credential from its worker secret) and
    the worker itself can compute it; routers, which hold the worker access token, cannot
    pin directly on a worker and bypass the service's admin-only ``PinPrefix``. One-way, so
    whoever answers at a worker's address learns nothing that registers or heartbeats.
    """
    return hmac.new(service_token.encode(), b"kvmesh worker pin v1", hashlib.sha256).hexdigest()


def bearer(metadata: Sequence[tuple[str, Any]] | None) -> str:
    """The token of an ``authorization: Bearer <token>`` entry, or ``""`` when absent."""
    for key, value in metadata or ():
        if key == "authorization":
            text = value if isinstance(value, str) else value.decode(errors="replace")
            return text[7:].strip() if text.startswith("Bearer ") else ""
    return ""


def _deny(handler: grpc.RpcMethodHandler, code: grpc.StatusCode,
          message: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as ``handler`` that aborts with ``code``/``message``."""

    async def deny(_request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message)

    kw = {"response_serializer": handler.response_serializer}
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny, **kw)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny, **kw)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny, **kw)
    return grpc.unary_unary_rpc_method_handler(deny, **kw)


def _refuse_unread(handler: grpc.RpcMethodHandler, code: grpc.StatusCode,
                   message: str) -> grpc.RpcMethodHandler:
    """A handler that aborts with ``code``/``message`` before reading any request message.

    It is request-streaming whatever the method is: grpc.aio reads a unary request in full
    before calling its handler, but hands a streaming handler an iterator it reads only on
    demand. The client cannot tell (the call ends with a status and no message)."""

    async def refuse(_requests: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message)

    kw = {"response_serializer": handler.response_serializer}
    if handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse, **kw)
    return grpc.stream_unary_rpc_method_handler(refuse, **kw)


def _bind(handler: grpc.RpcMethodHandler, method: str, identity: str) -> grpc.RpcMethodHandler:
    """``handler`` refusing requests whose ``worker_id`` is not ``identity``."""
    if handler.request_streaming:
        return _deny(handler, grpc.StatusCode.PERMISSION_DENIED,
                     f"{method}: a token bound to one worker cannot call a streaming method")

    async def admit(request: Any, context: grpc.aio.ServicerContext) -> Any:
        acting = getattr(request, IDENTITY_FIELD, None)
        if acting != identity:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, (
                f"{method}: this token is bound to worker {identity!r} and cannot act for "
                f"worker {str(acting)[:140]!r}"))
        return request

    return guarded(handler, admit)


class BearerAuth(grpc.aio.ServerInterceptor):
    """Checks the bearer token of every call against the role its method needs.

    ``role_of(method)`` names the role (``None``: open); ``verifiers[role]`` are tried in
    order and the first :class:`Grant` wins. A role without verifiers is open. Methods under
    :data:`OPEN_PREFIXES` (gRPC health) are always open: probes send no metadata.
    """

    def __init__(self, role_of: Callable[[str], str | None],
                 verifiers: Mapping[str, Sequence[Verifier]]) -> None:
        self.role_of = role_of
        self.verifiers = {role: list(v) for role, v in verifiers.items()}

    def grant(self, method: str, token: str) -> Grant | None:
        """The grant ``token`` earns on ``method`` (``Grant("open")`` for open methods)."""
        role = None if method.startswith(OPEN_PREFIXES) else self.role_of(method)
        checks = self.verifiers.get(role or "", [])
        if role is None or not checks:
            return Grant("open")
        if not token:
            return None
        for verify in checks:
            granted = verify(token)
            if granted is not None:
                return granted
        return None

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        method = handler_call_details.method
        token = bearer(handler_call_details.invocation_metadata)
        granted = self.grant(method, token)
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        if granted is None:
            role = self.role_of(method)
            why = ("missing 'authorization: Bearer <token>' metadata" if not token
                   else f"invalid {role} token")
            return _refuse_unread(handler, grpc.StatusCode.UNAUTHENTICATED, f"{method}: {why}")
        if granted.identity is not None:
            return _bind(handler, method, granted.identity)
        return handler
