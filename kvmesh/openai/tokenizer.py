"""Prompt token ids exactly as vLLM's OpenAI server computes them, without torch.

A prefix-aware router must hash the token ids the engine will cache: completions tokenize
with ``add_special_tokens`` (default true), chats render the template and tokenize without
them. A model directory is read as ``transformers`` reads it.

See docs/architecture.md#openai-shapes.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kvmesh.openai import vocab
from kvmesh.openai.chat_template import ChatTemplate, ChatTemplateError

TINY = vocab.TINY
SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                 "mask_token")

__all__ = ["ChatTemplateError", "VllmTokenizer"]


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _template_source(model_dir: Path, config: Mapping[str, Any]) -> str | None:
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    source = config.get("chat_template")
    if isinstance(source, list):  # named templates
        source = next((t.get("template") for t in source
                       if isinstance(t, Mapping) and t.get("name") == "default"), None)
    return source if isinstance(source, str) and source else None


class VllmTokenizer:
    """The tokenizer of ``tiny`` or of a model directory (:meth:`load`)."""

    def __init__(self, backend: Any | None, chat: ChatTemplate | None = None,
                 eos_token_id: int | None = None) -> None:
        self._tok = backend  # a tokenizers.Tokenizer, None for the byte vocabulary
        self.chat = chat
        self.eos_token_id = eos_token_id
        self.vocab_size = (vocab.VOCAB if backend is None
                           else backend.get_vocab_size(with_added_tokens=True))

    @classmethod
    def load(cls, source: str | Path | None) -> VllmTokenizer:
        """``None`` or ``"tiny"``: bytes; else a directory with ``tokenizer.json``. Raises
        ``FileNotFoundError`` without one and ``ValueError`` for an unreadable config or an
        invalid template."""
        if source is None or str(source) == TINY:
            return cls(None, eos_token_id=vocab.EOS)
        model_dir = Path(source)
        file = model_dir / "tokenizer.json"
        if not file.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {model_dir}")
        from tokenizers import Tokenizer

        backend = Tokenizer.from_file(str(file))
        config_file = model_dir / "tokenizer_config.json"
        try:
            config = (json.loads(config_file.read_text(encoding="utf-8"))
                      if config_file.is_file() else {})
        except ValueError as exc:
            raise ValueError(f"{config_file}: {exc}") from None
        if not isinstance(config, Mapping):
            raise ValueError(f"{config_file}: not a JSON object")
        specials = {name: text for name in SPECIAL_NAMES
                    if (text := _token_text(config.get(name))) is not None}
        source_text = _template_source(model_dir, config)
        try:
            chat = ChatTemplate(source_text, specials) if source_text else None
        except Exception as exc:  # a Jinja syntax error: the directory is unusable for chat
            raise ValueError(f"{model_dir}: invalid chat template ({exc})") from None
        eos = specials.get("eos_token")
        return cls(backend, chat, backend.token_to_id(eos) if eos else None)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """``tokenizer(text, add_special_tokens=...)``'s ids."""
        if self._tok is None:
            return vocab.encode(text)
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` without special tokens (a cut character decodes to U+FFFD)."""
        if self._tok is None:
            return vocab.decode(ids)
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def chat_prompt(self, messages: Sequence[Mapping[str, Any]], *,
                    add_generation_prompt: bool = True, continue_final_message: bool = False,
                    tools: list[Any] | None = None, documents: list[Any] | None = None,
                    chat_template_kwargs: Mapping[str, Any] | None = None) -> str:
        """The prompt text vLLM renders for a chat request (messages as the request sends
        them: content a string or a list of parts). Raises ``ChatTemplateError`` (also when
        the model has no chat template, as vLLM refuses such chats)."""
        if self.chat is None:
            raise ChatTemplateError("this model has no chat template")
        convo = [_vllm_message(m, self.chat.content_format) for m in messages]
        return self.chat.render(convo, add_generation_prompt=add_generation_prompt,
                                continue_final_message=continue_final_message, tools=tools,
                                documents=documents, **dict(chat_template_kwargs or {}))

    def chat_ids(self, messages: Sequence[Mapping[str, Any]], *,
                 add_special_tokens: bool = False, **options: Any) -> list[int]:
        """The prompt ids of a chat request (``options``: as :meth:`chat_prompt`)."""
        return self.encode(self.chat_prompt(messages, **options), add_special_tokens)


def _vllm_message(message: Mapping[str, Any], content_format: str) -> dict[str, Any]:
    """A request message as vLLM hands it to the template: text parts joined by newlines
    (``string``), or as ``{"type": "text", "text": ...}`` parts (``openai``). Raises
    ``ChatTemplateError`` for a part that is not text."""
    out = dict(message)
    content = message.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, Mapping) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise ChatTemplateError("only text content parts are supported")
            texts.append(part["text"])
        out["content"] = ("\n".join(texts) if content_format == "string"
                          else [{"type": "text", "text": t} for t in texts])
    elif isinstance(content, str) and content_format == "openai":
        out["content"] = [{"type": "text", "text": content}]
    return out
