"""The gateway's chat template: OpenAI chat messages -> one prompt string.

Every message becomes ``<|role|>\\ncontent\\n``, and ``<|assistant|>\\n`` follows the last one
so the model answers as the assistant. The gateway uses this template for every model,
including a model directory whose ``tokenizer_config.json`` ships its own Jinja
``chat_template`` (that one is not rendered); a chat that repeats its history therefore
renders to a prompt whose start is byte-identical to the previous turn's, which is exactly
what prefix caching needs.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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
