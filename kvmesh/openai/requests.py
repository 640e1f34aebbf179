"""Request bodies of ``/v1/completions`` and ``/v1/chat/completions``, one rule per field.

The gateway and the worker's HTTP API validate with these models, as vLLM does; unknown
fields are ignored, and what the engine cannot honour is refused by ``check_supported``
(400 ``unsupported``).

See docs/architecture.md#openai-shapes.
"""
from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kvmesh.openai.errors import OpenAIError, invalid

DEFAULT_MAX_TOKENS = 16
MAX_TOKENS_LIMIT = 2**32 - 1  # the wire format's bound; engines enforce their context
MAX_STOPS = 4

Prompt = str | list[int] | list[str] | list[list[int]]
Body = TypeVar("Body", bound=BaseModel)


def _unsupported(param: str, message: str) -> OpenAIError:
    return OpenAIError(400, message, param=param, code="unsupported")


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
    best_of: int | None = None
    logprobs: Any = None
    echo: bool | None = False
    suffix: str | None = None
    ignore_eos: bool = False
    return_token_ids: bool = False

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
        """Whether every stream chunk carries usage (vLLM: only with ``include_usage``)."""
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
        """Raise a 400 ``OpenAIError`` (code ``unsupported``) for a field kvmesh's engine
        cannot honour."""
        if (self.n or 1) != 1:
            raise _unsupported("n", "only n=1 is supported")
        if (self.best_of or 1) != 1:
            raise _unsupported("best_of", "only best_of=1 is supported")
        if self.logprobs not in (None, False):
            raise _unsupported("logprobs", "logprobs are not supported")
        if (self.model_extra or {}).get("top_logprobs"):
            raise _unsupported("top_logprobs", "logprobs are not supported")
        if self.echo:
            raise _unsupported("echo", "echo is not supported")
        if self.suffix:
            raise _unsupported("suffix", "suffix is not supported")
        if len(self.stop_strings()) > MAX_STOPS:
            raise _unsupported("stop", f"at most {MAX_STOPS} stop sequences are allowed")


class CompletionRequest(OpenAIRequest):
    """``POST /v1/completions``: ``prompt`` is text, token ids, or a batch of either."""

    prompt: Prompt
    add_special_tokens: bool = True

    def max_new_tokens(self) -> int:
        """``max_tokens`` or the default."""
        return self.max_tokens or DEFAULT_MAX_TOKENS

    def prompts(self) -> list[str | list[int]]:
        """The prompts of this request: one, or several for a batch; raises a 400
        ``OpenAIError`` for an empty list."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise OpenAIError(400, "prompt must not be empty", param="prompt")
        if isinstance(p[0], int):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


class ChatMessage(BaseModel):
    """One chat message; ``content`` is text or a list of ``{"type": "text"}`` parts. Other
    fields (``tool_calls``, ``tool_call_id``, ...) are kept for the chat template."""

    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None


class ChatCompletionRequest(OpenAIRequest):
    """``POST /v1/chat/completions``; ``max_completion_tokens`` is an alias of
    ``max_tokens`` (the newer name wins when both are given)."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    add_special_tokens: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    documents: list[dict[str, Any]] | None = None

    def requested_tokens(self) -> int | None:
        """``max_completion_tokens``, else ``max_tokens``; None when neither is given."""
        return self.max_completion_tokens or self.max_tokens

    def max_new_tokens(self, room: int) -> int:
        """The requested tokens, else ``room``: what the model's context leaves after the
        prompt (vLLM's default; may be < 1 when nothing is left)."""
        return self.requested_tokens() or room

    def message_dicts(self) -> list[dict[str, Any]]:
        """The messages as the request sent them, for a chat template."""
        return [m.model_dump(exclude_unset=True) for m in self.messages]

    def template_options(self) -> dict[str, Any]:
        """Keyword arguments of ``VllmTokenizer.chat_ids``, as vLLM reads them."""
        return {"add_special_tokens": self.add_special_tokens,
                "add_generation_prompt": self.add_generation_prompt,
                "continue_final_message": self.continue_final_message, "tools": self.tools,
                "documents": self.documents, "chat_template_kwargs": self.chat_template_kwargs}


def parse(kind: type[Body], raw: bytes) -> Body:
    """``raw`` (JSON) as a ``kind`` body; raises the 400 ``OpenAIError`` of ``invalid``."""
    try:
        return kind.model_validate_json(raw)
    except ValidationError as exc:
        raise invalid(exc.errors()) from None
