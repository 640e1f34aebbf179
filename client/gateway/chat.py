r"""The prompt of a chat request: the model's own chat template, or the gateway's simple one.

With a tokenizer that has a chat template, messages render and tokenize exactly as vLLM
does, so the gateway routes by the ids an engine hashes. Otherwise each message is
``<|role|>\ncontent\n`` and ``<|assistant|>\n`` follows, so a chat repeating its history
renders to a prompt whose start is byte-identical to the previous turn's.

See docs/architecture.md#the-openai-gateway.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from client.gateway.tokenizer import Tokenizer
from kvmesh.openai.errors import OpenAIError
from kvmesh.openai.requests import ChatCompletionRequest
from kvmesh.openai.tokenizer import ChatTemplateError, VllmTokenizer

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


class ChatFormatError(ValueError):
    """A message the template cannot render; ``param`` names the offending field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def message_text(content: str | Sequence[Any] | None, where: str) -> str:
    """The text of a message's ``content``: a string, or a list of ``{"type": "text"}`` parts
    (joined with newlines). Any other part type (images, audio) raises ``ChatFormatError``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
        text = part.get("text") if isinstance(part, dict) else getattr(part, "text", None)
        if kind != "text" or not isinstance(text, str):
            raise ChatFormatError(f"content part of type {kind!r} is not supported; only text "
                                  "parts are", f"{where}.content[{i}]")
        texts.append(text)
    return "\n".join(texts)


def render_chat(messages: Sequence[tuple[str, str]]) -> str:
    """``[(role, text), ...]`` -> the prompt, ending with the assistant's header.

    Raises ``ChatFormatError`` for an empty conversation or an unknown role.
    """
    if not messages:
        raise ChatFormatError("messages must contain at least one message", "messages")
    lines = []
    for i, (role, text) in enumerate(messages):
        if role not in ROLES:
            raise ChatFormatError(f"unknown role {role!r}; expected one of "
                                  f"{', '.join(sorted(ROLES))}", f"messages[{i}].role")
        lines.append(f"<|{role}|>\n{text}\n")
    lines.append("<|assistant|>\n")
    return "".join(lines)


def chat_ids(tokenizer: Tokenizer, body: ChatCompletionRequest) -> list[int]:
    """The prompt ids of a chat request: the model's chat template as vLLM renders it when
    the tokenizer has one (``--tokenizer``), else the gateway's simple template."""
    if isinstance(tokenizer, VllmTokenizer) and tokenizer.chat is not None:
        try:
            return tokenizer.chat_ids(body.message_dicts(), **body.template_options())
        except (ChatTemplateError, TypeError, AttributeError) as exc:
            raise OpenAIError(400, f"the chat template refused the messages: {exc}",
                              param="messages") from None
    try:
        turns = [(m.role, message_text(m.content, f"messages[{i}]"))
                 for i, m in enumerate(body.messages)]
        return tokenizer.encode(render_chat(turns))
    except ChatFormatError as exc:
        raise OpenAIError(400, str(exc), param=exc.param) from None
