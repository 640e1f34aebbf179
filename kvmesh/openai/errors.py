"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

One exception, ``OpenAIError``, for every refusal of the gateway and of the worker's HTTP
API; each server turns it into its body. ``body()`` is OpenAI's own (``type`` a snake-case
kind, ``code`` a short string or null), which the gateway answers; ``vllm_body()`` is what
vLLM's OpenAI server answers (``type`` the exception's class name, ``code`` the HTTP status),
which the worker answers as the vLLM stand-in it is. ``invalid`` words a request body's
validation errors the same way on both: the first problem, its field as OpenAI names it
(``messages[0].role``), and how many more there were.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_TYPES = {400: "invalid_request_error", 401: "authentication_error",
          403: "permission_error", 404: "not_found_error", 413: "invalid_request_error",
          429: "rate_limit_error"}
_VLLM_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError"}


class OpenAIError(Exception):
    """A refusal answered with HTTP ``status`` and an OpenAI-shaped body (``param``: the
    request field at fault; ``headers``: extra response headers, e.g. ``Retry-After``)."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, type_: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers
        self.message = message
        self.param = param
        self.code = code
        self.type = type_ or _TYPES.get(status, "server_error" if status >= 500
                                        else "invalid_request_error")

    def body(self) -> dict[str, Any]:
        """OpenAI's body: ``{"error": {"message", "type", "param", "code"}}``."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def vllm_body(self) -> dict[str, Any]:
        """vLLM's body: the same keys, ``type`` an exception name and ``code`` the status."""
        kind = _VLLM_TYPES.get(self.status, "InternalServerError")
        return {"error": {"message": self.message, "type": kind, "param": self.param,
                          "code": self.status}}


def param_of(loc: Sequence[Any]) -> str | None:
    """A validation error's location as OpenAI names a field (``messages[0].role``); the
    leading ``body`` of a FastAPI location is dropped. None for the body as a whole."""
    out = ""
    for p in (str(p) for p in loc if p != "body"):
        out += f"[{p}]" if p.isdigit() else (f".{p}" if out else p)
    return out or None


def invalid(errors: Sequence[Mapping[str, Any]]) -> OpenAIError:
    """The 400 for a body that failed validation (``errors``: pydantic's, first first)."""
    first = errors[0] if errors else {}
    param = param_of(tuple(first.get("loc", ())))
    if first.get("type") == "json_invalid" or param is None:
        message = f"invalid JSON body: {first.get('msg', 'could not parse the request body')}"
    else:
        message = f"{param}: {first.get('msg', 'invalid value')}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem(s))"
    return OpenAIError(400, message, param=param, code="invalid_request")
