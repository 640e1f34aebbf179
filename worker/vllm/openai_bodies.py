"""OpenAI request and response bodies of ``kvmesh worker --http-port``, shaped as vLLM's.

Requests: the fields the engine honours (``model``, ``prompt`` or ``messages``,
``max_tokens`` / ``max_completion_tokens`` (default, as vLLM's: 16 for completions, and for
chat what the context leaves after the prompt), ``temperature`` (default 1.0), ``seed``,
``stream``, ``stream_options.include_usage`` and ``continuous_usage_stats`` (with it, usage
so far on every chunk), and vLLM's own ``cache_salt``,
``ignore_eos``, ``add_special_tokens``, ``return_token_ids``, ``add_generation_prompt``,
``continue_final_message``, ``chat_template_kwargs``, ``tools``); fields it cannot honour
(``n`` > 1, ``best_of`` > 1, ``logprobs``, ``echo``, ``stop``, ``suffix``) are refused with
400, and unknown fields are ignored, as vLLM does.

Responses carry ``usage.prompt_tokens_details.cached_tokens`` (the prompt tokens the prefix
cache served), which vLLM reports with ``--enable-prompt-tokens-details``.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

DEFAULT_MAX_TOKENS = 16


class BodyError(ValueError):
    """A request the server refuses with 400 (``param``: the field)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class _Options(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0)
    seed: int | None = None
    stream: bool = False
    stream_options: _Options | None = None
    cache_salt: str | None = None
    ignore_eos: bool = False
    return_token_ids: bool = False
    n: int = 1
    best_of: int | None = None
    logprobs: Any = None
    echo: bool = False
    stop: str | list[str] | None = None
    suffix: str | None = None

    @field_validator("cache_salt")
    @classmethod
    def _salt(cls, value: str | None) -> str | None:
        if value is not None and not value:
            raise ValueError("cache_salt must be a non-empty string")
        return value

    def refuse_unsupported(self) -> None:
        for name, bad in (("n", self.n != 1), ("best_of", (self.best_of or 1) != 1),
                          ("logprobs", self.logprobs not in (None, False)), ("echo", self.echo),
                          ("stop", bool(self.stop)), ("suffix", bool(self.suffix))):
            if bad:
                raise BodyError(f"{name} is not supported by this engine", name)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """vLLM's ``continuous_usage_stats``: usage on every chunk (with ``include_usage``)."""
        return self.include_usage and bool(self.stream_options
                                           and self.stream_options.continuous_usage_stats)


class Completion(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]
    add_special_tokens: bool = True

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise BodyError("the prompt is empty", "prompt")
        if isinstance(p[0], int):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


class Chat(_Common):
    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = Field(default=None, ge=1)
    add_special_tokens: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None


def parse(kind: type[BaseModel], raw: bytes) -> Any:
    """``raw`` as a ``kind`` body; raises ``BodyError``."""
    try:
        body = kind.model_validate_json(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ())) or None
        raise BodyError(f"{where}: {err.get('msg')}" if where else str(err.get("msg")),
                        where) from None
    body.refuse_unsupported()
    return body


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    kind = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError"}.get(
        status, "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def usage(prompt: int, completion: int, cached: int | None) -> dict[str, Any]:
    """vLLM's usage object (``cached`` None: the counts so far of a stream chunk, which carry
    no ``prompt_tokens_details``)."""
    out: dict[str, Any] = {"prompt_tokens": prompt, "total_tokens": prompt + completion,
                           "completion_tokens": completion}
    if cached is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    return out


class Shape:
    """Response bodies of one request (``chat``: chat completions, else completions)."""

    def __init__(self, chat: bool, model: str) -> None:
        self.chat = chat
        self.model = model
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def choice(self, index: int, text: str, finish: str | None,
               token_ids: list[int] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"index": index, "logprobs": None, "finish_reason": finish,
                               "stop_reason": None}
        if self.chat:
            out["message"] = {"role": "assistant", "content": text, "tool_calls": []}
        else:
            out["text"] = text
        if token_ids is not None:
            out["token_ids"] = token_ids
        return out

    def body(self, choices: list[dict[str, Any]], use: dict[str, Any]) -> dict[str, Any]:
        return {**self._head(self.object), "choices": choices, "usage": use}

    def chunk(self, text: str | None, finish: str | None = None, *,
              role: bool = False, use: dict[str, Any] | None = None) -> str:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish,
                                  "stop_reason": None}
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        extra = {} if use is None else {"usage": use}
        return sse({**self._head(obj), "choices": [choice], **extra})

    def usage_chunk(self, use: dict[str, Any]) -> str:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return sse({**self._head(obj), "choices": [], "usage": use})


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


DONE = "data: [DONE]\n\n"
