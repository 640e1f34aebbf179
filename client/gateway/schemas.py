"""Request bodies the gateway accepts: the OpenAI fields kvmesh can honour.

Fields the workers cannot honour are refused with 400 (``n`` > 1, ``logprobs``, ``echo``,
``best_of`` > 1, ``suffix``); other unknown fields (``top_p``, ``presence_penalty``,
``logit_bias``, ...) are accepted and ignored, as vLLM's server does with fields it does not
know. ``temperature`` defaults to OpenAI's 1.0. ``max_tokens`` defaults as in vLLM: 16 for
completions; for chat, the model's context left after the prompt (generate until EOS or the
context limit, as OpenAI and vLLM do).
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

DEFAULT_MAX_TOKENS = 16
MAX_TOKENS_LIMIT = 2**32 - 1  # the wire format's bound; workers enforce their context length

Prompt = str | list[int] | list[str] | list[list[int]]


class Unsupported(ValueError):
    """A field the gateway cannot honour; ``param`` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a last chunk with ``usage`` and no choices;
    with it, vLLM's ``continuous_usage_stats`` puts the counts so far on every chunk too."""

    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False
    continuous_usage_stats: bool = False


class OpenAIRequest(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    user: str | None = None
    cache_salt: str | None = None
    n: int | None = 1
    logprobs: Any = None

    @field_validator("cache_salt")
    @classmethod
    def _salt_not_empty(cls, value: str | None) -> str | None:
        if value is not None and not value:
            raise ValueError("cache_salt must be a non-empty string when given")
        return value

    def include_usage(self) -> bool:
        """Whether a stream ends with a usage chunk."""
        return bool(self.stream_options and self.stream_options.include_usage)

    def continuous_usage(self) -> bool:
        """Whether every stream chunk carries usage (vLLM: only together with
        ``include_usage``)."""
        return self.include_usage() and bool(self.stream_options
                                             and self.stream_options.continuous_usage_stats)

    def stop_strings(self) -> list[str]:
        """``stop`` as a list (empty strings dropped)."""
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s]

    def sampling_temperature(self) -> float:
        """The temperature to sample with (OpenAI's default 1.0 when absent)."""
        return 1.0 if self.temperature is None else float(self.temperature)

    def check_supported(self) -> None:
        """Raise ``Unsupported`` for fields the workers cannot honour."""
        if (self.n or 1) != 1:
            raise Unsupported("n", "only n=1 is supported")
        if self.logprobs not in (None, False):
            raise Unsupported("logprobs", "logprobs are not supported")
        if len(self.stop_strings()) > 4:
            raise Unsupported("stop", "at most 4 stop sequences are allowed")


class CompletionRequest(OpenAIRequest):
    """``POST /v1/completions``: ``prompt`` is text, token ids, or a batch of either."""

    prompt: Prompt
    echo: bool | None = False
    best_of: int | None = None
    suffix: str | None = None

    def max_new_tokens(self) -> int:
        """``max_tokens`` or the default."""
        return self.max_tokens or DEFAULT_MAX_TOKENS

    def check_supported(self) -> None:
        super().check_supported()
        if self.echo:
            raise Unsupported("echo", "echo is not supported")
        if (self.best_of or 1) != 1:
            raise Unsupported("best_of", "only best_of=1 is supported")
        if self.suffix:
            raise Unsupported("suffix", "suffix is not supported")

    def prompts(self) -> list[str | list[int]]:
        """The prompts of this request: one, or several for a batch."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise Unsupported("prompt", "prompt must not be empty")
        if isinstance(p[0], int):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


class ChatMessage(BaseModel):
    """One chat message; ``content`` is text or a list of ``{"type": "text"}`` parts."""

    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None


class ChatCompletionRequest(OpenAIRequest):
    """``POST /v1/chat/completions``; ``max_completion_tokens`` is an alias of
    ``max_tokens`` (the newer name wins when both are given)."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)

    def max_new_tokens(self, room: int) -> int:
        """``max_completion_tokens``, else ``max_tokens``, else ``room``: what the model's
        context leaves after the prompt (vLLM's default; may be < 1 when nothing is left)."""
        return self.max_completion_tokens or self.max_tokens or room

    def check_supported(self) -> None:
        super().check_supported()
        if self.model_extra and self.model_extra.get("top_logprobs"):
            raise Unsupported("top_logprobs", "logprobs are not supported")
