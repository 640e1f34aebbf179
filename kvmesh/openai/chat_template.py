"""A model's Jinja chat template, rendered as vLLM renders it (through ``transformers``).

A prefix-aware router must know the exact token ids an engine will hash, so this renders the
template as ``transformers``' ``apply_chat_template`` does (sandbox, options, globals,
variables), without ``transformers`` or torch; tests compare the two.

See docs/architecture.md#openai-shapes.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

_REASONING = ("reasoning_content", "thinking", "reasoning")
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class ChatTemplateError(ValueError):
    """A conversation the template refuses (``raise_exception``) or cannot continue."""


def _environment() -> Any:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: marks assistant text; renders its body."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body
                                          ).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return caller()

    class Namespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - Jinja's own signature
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"a chat template cannot set {name!r} on a namespace")

    class Dicts:
        def __call__(self, *args: Any, **kwargs: Any) -> dict:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
            return dict.fromkeys(*args, **kwargs)

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: Any = None, sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["dict"] = Dicts()
    env.globals["namespace"] = Namespace
    return env


def _loops_over_content(tree: Any) -> bool:
    """Whether the template iterates over some ``x.content`` / ``x['content']``."""
    from jinja2 import nodes

    for loop in tree.find_all(nodes.For):
        it = loop.iter
        while isinstance(it, nodes.Filter | nodes.Test) and it.node is not None:
            it = it.node
        if isinstance(it, nodes.Getattr) and it.attr == "content":
            return True
        if (isinstance(it, nodes.Getitem) and isinstance(it.arg, nodes.Const)
                and it.arg.value == "content"):
            return True
    return False


class ChatTemplate:
    """One template source with the tokenizer's named special tokens (strings)."""

    def __init__(self, source: str, special_tokens: Mapping[str, str] | None = None) -> None:
        env = _environment()
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        self._template = env.from_string(source)
        self.content_format = "openai" if _loops_over_content(env.parse(source)) else "string"

    def render(self, messages: Sequence[Mapping[str, Any]], *,
               add_generation_prompt: bool = False, continue_final_message: bool = False,
               tools: list[Any] | None = None, documents: list[Any] | None = None,
               **kwargs: Any) -> str:
        """The prompt text of ``messages``. Raises ``ChatTemplateError``."""
        import jinja2

        if continue_final_message and add_generation_prompt:
            raise ChatTemplateError("continue_final_message and add_generation_prompt are not "
                                    "compatible")
        chat = [_message(m) for m in messages]
        final = None
        if continue_final_message:
            if not chat or chat[-1].get("content") is None:
                raise ChatTemplateError("continue_final_message needs a final message with "
                                        "content")
            final = _tag_final(chat[-1])
        try:
            text = self._template.render(
                messages=chat, tools=tools, documents=documents,
                add_generation_prompt=add_generation_prompt,
                **{**self.special_tokens, **kwargs})
        except jinja2.exceptions.TemplateError as exc:
            raise ChatTemplateError(str(exc)) from None
        return text if final is None else _cut_at_tag(text, final)


def _message(message: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in message.items() if v is not None}
    reasoning = next((out[k] for k in _REASONING if out.get(k) is not None), None)
    if reasoning is not None:
        out = {"thinking": reasoning, **out, "reasoning_content": reasoning}
    return json.loads(json.dumps(out))  # plain JSON data only: the template is untrusted


def _tag_final(message: dict[str, Any]) -> str:
    """Append the cut marker to the final message's last text; returns that text."""
    content = message["content"]
    if isinstance(content, list):
        for part in reversed(content):
            if isinstance(part, dict) and "text" in part:
                final = part["text"]
                part["text"] = final + _CONTINUE_TAG
                return final
        raise ChatTemplateError("continue_final_message: the final message has no text")
    final = str(content)
    message["content"] = final + _CONTINUE_TAG
    return final


def _cut_at_tag(text: str, final: str) -> str:
    tag = _CONTINUE_TAG.strip()
    if final.strip() not in text or tag not in text:
        raise ChatTemplateError("continue_final_message: the template drops part of the final "
                                "message")
    at = text.rindex(tag)
    if text[at:at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return text[:at]
    return text[:at].rstrip()
