"""The gateway's errors, in OpenAI's shape (``kvmesh.openai.errors.OpenAIError``).

Every failure, FastAPI's validation errors (400 here) and unknown routes included, uses this
body. A kvmesh failure (after the client's failover) maps by its final gRPC code to an HTTP
status. Callers never see the cluster's inside: full texts go to the log, and the body adds
the server's reason only for the caller's own mistakes, addresses masked.

See docs/architecture.md#the-openai-gateway.
"""
from __future__ import annotations

import logging
import re
from http import HTTPStatus

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from client.errors import KvmeshError
from kvmesh.openai.errors import OpenAIError, invalid

_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 413,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}

log = logging.getLogger("client.gateway")

# What each status tells a caller when the server's own words stay in the log.
_PUBLIC = {
    401: "the kvmesh cluster rejected the gateway's credentials (see the gateway's log)",
    403: "the kvmesh cluster refused the gateway's request (see the gateway's log)",
    404: "the kvmesh cluster does not know this request's target",
    503: "the kvmesh cluster is unavailable for this request now (no worker could "
         "take it, or one stopped); retry later",
    504: "the request took longer than the gateway's deadline",
}
_REASON_SHOWN = frozenset({400, 413})
# host:port, [v6]:port and gRPC's ipv4:/ipv6:/unix: target forms.
_ADDRESS = re.compile(r"(?:\b(?:ipv4|ipv6|dns|unix):)?(?:\[[0-9A-Fa-f:.%]+\]|[\w.-]+):\d{1,5}\b"
                      r"|\bunix:[^\s,;)]+")
# ``client.failover.Failures.surface`` appends the earlier failures after this marker.
_EARLIER = " (after "


def respond(err: OpenAIError) -> JSONResponse:
    """The HTTP response carrying ``err.body()`` (its status and headers)."""
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def public_reason(message: str) -> str:
    """A server's reason fit for a caller: the last failure only, addresses masked."""
    return _ADDRESS.sub("<address>", message.split(_EARLIER, 1)[0])


def from_kvmesh(err: KvmeshError) -> OpenAIError:
    """The OpenAI error for a kvmesh client failure (status per the module's table); logs
    the full message, which the returned error does not carry."""
    status = _STATUS.get(err.code, 500)
    log.warning("kvmesh call failed: %s: %r", err.code.name, err.message)
    if status in _REASON_SHOWN:
        message = public_reason(err.message)
    else:
        message = _PUBLIC.get(status, "the kvmesh cluster failed this request (see the "
                              "gateway's log)")
    return OpenAIError(status, message, code=err.code.name.lower())


def _validation(_: Request, exc: Exception) -> JSONResponse:
    return respond(invalid(exc.errors() if isinstance(exc, RequestValidationError) else []))


def _http(_: Request, exc: Exception) -> JSONResponse:
    status = exc.status_code if isinstance(exc, StarletteHTTPException) else 500
    detail = getattr(exc, "detail", None) or HTTPStatus(status).phrase
    headers = getattr(exc, "headers", None)
    return respond(OpenAIError(status, str(detail), headers=dict(headers) if headers else None))


def _openai(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, OpenAIError)
    return respond(exc)


def _kvmesh(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, KvmeshError)
    return respond(from_kvmesh(exc))


def _unexpected(_: Request, exc: Exception) -> JSONResponse:
    return respond(OpenAIError(500, f"internal error in the gateway: {type(exc).__name__}"))


def install_handlers(app: FastAPI) -> None:
    """Answer validation errors, HTTP errors, ``OpenAIError``, ``KvmeshError`` and any other
    exception (500, still logged by the server) raised by a route in OpenAI's error shape."""
    app.add_exception_handler(Exception, _unexpected)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(OpenAIError, _openai)
    app.add_exception_handler(KvmeshError, _kvmesh)
