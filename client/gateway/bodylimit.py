"""A cap on request body size, enforced before the body is read.

A body whose ``Content-Length`` is over the cap is answered 413 at once, without reading a
byte of it; a body without one (chunked) is counted as it arrives, and the read that passes
the cap raises a 413 instead of returning data, so the gateway holds at most the cap (plus
one chunk) of any request in memory, before authentication or JSON parsing.
"""
from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from client.gateway.errors import respond
from client.gateway.limits import DEFAULT_MAX_BODY_BYTES
from kvmesh.openai.errors import OpenAIError


def _too_large(limit: int) -> str:
    return f"the request body is over this gateway's limit of {limit} bytes"


class BodyLimit:
    """ASGI middleware: HTTP request bodies over ``max_bytes`` get 413."""

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        if max_bytes < 1:
            raise ValueError("the body size limit must be at least 1 byte")
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            refusal = OpenAIError(413, _too_large(self.max_bytes), code="body_too_large")
            await respond(refusal)(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:  # routes turn this into the OpenAI-shaped 413
                    raise HTTPException(413, _too_large(self.max_bytes))
            return message

        await self.app(scope, counted, send)
