"""Response bodies and stream chunks of completions and chat completions, as vLLM shapes them.

``ResponseShape`` builds every JSON object of one response (the whole body, each
server-sent-event chunk, the usage-only chunk) with one id and creation time; choices carry
vLLM's ``stop_reason`` (and, for chat, ``tool_calls``) next to OpenAI's fields. kvmesh's
facts ride in ``usage``: ``prompt_tokens_details.cached_tokens`` is what the engine really
served from its prefix cache (``null`` when unknown, e.g. a stream cut short by a stop string,
or the counts so far on a chunk of vLLM's ``continuous_usage_stats``), and
``cached_tokens_by_tier`` the same split by KV tier, and ``peer`` for blocks pulled from
another worker (``kvmesh.contract.CACHE_SOURCES``).
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from kvmesh.contract import CACHE_SOURCES

DONE = "data: [DONE]\n\n"


@dataclass(frozen=True)
class Usage:
    """Token counts of one request (summed over a batch). ``cached_tokens_by_tier`` splits
    ``cached_tokens`` by the KV tier the blocks came from (a missing tier counts 0); both are
    None when unknown."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None
    cached_tokens_by_tier: dict[str, int] | None = None

    def __add__(self, other: Usage) -> Usage:
        cached = (None if self.cached_tokens is None or other.cached_tokens is None
                  else self.cached_tokens + other.cached_tokens)
        by_tier = None
        if cached is not None:
            by_tier = {t: self.tier(t) + other.tier(t) for t in CACHE_SOURCES}
        return Usage(self.prompt_tokens + other.prompt_tokens,
                     self.completion_tokens + other.completion_tokens, cached, by_tier)

    def tier(self, name: str) -> int:
        """Cached tokens that came from tier ``name`` (all of them from ``gpu`` when the
        engine gave no split)."""
        if self.cached_tokens_by_tier is None:
            return (self.cached_tokens or 0) if name == "gpu" else 0
        return int(self.cached_tokens_by_tier.get(name, 0))

    def as_dict(self) -> dict[str, Any]:
        """OpenAI's ``usage`` object; kvmesh adds ``cached_tokens_by_tier`` next to
        ``cached_tokens`` in ``prompt_tokens_details``."""
        details = None
        if self.cached_tokens is not None:
            details = {"cached_tokens": self.cached_tokens,
                       "cached_tokens_by_tier": {t: self.tier(t) for t in CACHE_SOURCES}}
        return {"prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": details}


def sse(obj: dict[str, Any]) -> str:
    """One server-sent event carrying ``obj`` as JSON."""
    return f"data: {json.dumps(obj, separators=(',', ':'), ensure_ascii=False)}\n\n"


class ResponseShape:
    """The JSON objects of one response; ``chat`` picks chat completion vs text completion."""

    def __init__(self, chat: bool, model: str) -> None:
        self.chat = chat
        self.model = model
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _head(self, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat \
            else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def choice(self, index: int, text: str, finish: str | None,
               token_ids: list[int] | None = None) -> dict[str, Any]:
        """One choice of a whole body (``token_ids``: vLLM's ``return_token_ids``)."""
        out: dict[str, Any] = {"index": index}
        if self.chat:
            out["message"] = {"role": "assistant", "content": text, "tool_calls": []}
        else:
            out["text"] = text
        out.update(logprobs=None, finish_reason=finish, stop_reason=None)
        if token_ids is not None:
            out["token_ids"] = token_ids
        return out

    def body(self, choices: list[dict[str, Any]], usage: Usage) -> dict[str, Any]:
        """The non-streaming body: ``choices`` (from ``choice``) and ``usage``."""
        return {**self._head(False), "choices": choices, "usage": usage.as_dict()}

    def chunk(self, text: str | None, finish_reason: str | None = None,
              role: bool = False, usage: Usage | None = None) -> dict[str, Any]:
        """One stream chunk: new ``text`` (chat: in ``delta``; ``role`` adds the assistant
        role, as the first chat chunk does), on the last one ``finish_reason``, and the
        ``usage`` so far when given (``continuous_usage_stats``)."""
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": text or ""}
        choice.update(logprobs=None, finish_reason=finish_reason, stop_reason=None)
        out = {**self._head(True), "choices": [choice]}
        if usage is not None:
            out["usage"] = usage.as_dict()
        return out

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        """The last chunk of a stream with ``stream_options.include_usage``: no choices."""
        return {**self._head(True), "choices": [], "usage": usage.as_dict()}
