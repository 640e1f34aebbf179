"""Prompt ids as vLLM computes them: the chat template rendered without ``transformers``, and
the ids, equal to ``transformers``' own (``apply_chat_template``, ``tokenizer(...)``) on tiny
local tokenizer directories."""
from __future__ import annotations

from pathlib import Path

import pytest
import transformers

from kvmesh.openai.chat_template import ChatTemplate
from kvmesh.openai.tokenizer import ChatTemplateError, VllmTokenizer
from tests.tokenizer_dirs import (
    CHATML_TOOLS,
    HEADERS,
    INDENTED,
    PARTS,
    STRICT,
    byte_tokenizer_dir,
)

CHATS = [
    [{"role": "user", "content": "Hello, wörld! <s> is text here"}],
    [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "hi"},
     {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}],
    [{"role": "user", "content": "x", "name": None}, {"role": "assistant", "content": None},
     {"role": "user", "content": "y"}],
    [{"role": "user", "content": "é" * 40 + "\n\n  spaced  "}],
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Wetter für",
                                           "parameters": {"type": "object", "properties": {}}}}]


def both(tmp_path: Path, template: str, *, jinja_file: bool = False):
    d = byte_tokenizer_dir(tmp_path / "tok", template, jinja_file=jinja_file)
    return VllmTokenizer.load(d), transformers.AutoTokenizer.from_pretrained(str(d))


def hf_ids(hf, chat, **kw) -> list[int]:
    out = hf.apply_chat_template(chat, tokenize=True, **kw)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.mark.parametrize("template", [HEADERS, CHATML_TOOLS, STRICT, INDENTED],
                         ids=["headers", "chatml", "strict", "indented"])
@pytest.mark.parametrize("chat", CHATS, ids=range(len(CHATS)))
@pytest.mark.parametrize("gen", [True, False])
def test_rendering_and_ids_equal_transformers(tmp_path: Path, template: str, chat: list,
                                              gen: bool) -> None:
    ours, hf = both(tmp_path, template)
    try:
        want = hf.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
    except Exception as exc:  # the template refuses this chat: so must we
        with pytest.raises(ChatTemplateError):
            ours.chat_prompt(chat, add_generation_prompt=gen)
        assert "alternate" in str(exc)
        return
    assert ours.chat_prompt(chat, add_generation_prompt=gen) == want
    assert ours.chat_ids(chat, add_generation_prompt=gen) == hf_ids(
        hf, chat, add_generation_prompt=gen)


def test_tools_and_extra_template_kwargs_reach_the_template(tmp_path: Path) -> None:
    ours, hf = both(tmp_path, CHATML_TOOLS + "{{ flavour }}")
    chat = CHATS[1]
    want = hf.apply_chat_template(chat, tools=TOOLS, tokenize=False,
                                  add_generation_prompt=True, flavour="salty")
    got = ours.chat_prompt(chat, tools=TOOLS, chat_template_kwargs={"flavour": "salty"})
    assert got == want and "Wetter für" in got and got.endswith("salty")


def test_continue_final_message_cuts_where_the_message_ends(tmp_path: Path) -> None:
    ours, hf = both(tmp_path, HEADERS)
    chat = [{"role": "user", "content": "Finish: "}, {"role": "assistant", "content": "Once upon"}]
    want = hf.apply_chat_template(chat, tokenize=False, continue_final_message=True)
    got = ours.chat_prompt(chat, add_generation_prompt=False, continue_final_message=True)
    assert got == want and got.endswith("Once upon")


def test_a_template_iterating_over_parts_gets_parts_as_vllm_hands_them(tmp_path: Path) -> None:
    ours, hf = both(tmp_path, PARTS, jinja_file=True)
    assert ours.chat is not None and ours.chat.content_format == "openai"
    chat = [{"role": "user", "content": [{"type": "text", "text": "a"},
                                         {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "c"}]
    as_vllm = [{"role": "user", "content": [{"type": "text", "text": "a"},
                                            {"type": "text", "text": "b"}]},
               {"role": "assistant", "content": [{"type": "text", "text": "c"}]}]
    want = hf.apply_chat_template(as_vllm, tokenize=False, add_generation_prompt=True)
    assert ours.chat_prompt(chat) == want == "[user](a)(b)[assistant](c)[assistant]"


def test_string_templates_get_text_parts_joined_by_newlines(tmp_path: Path) -> None:
    ours, hf = both(tmp_path, HEADERS)
    assert ours.chat is not None and ours.chat.content_format == "string"
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"},
                                          {"type": "text", "text": "b"}]}]
    want = hf.apply_chat_template([{"role": "user", "content": "a\nb"}], tokenize=False,
                                  add_generation_prompt=True)
    assert ours.chat_prompt(parts) == want
    with pytest.raises(ChatTemplateError):
        ours.chat_prompt([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])


@pytest.mark.parametrize("text", ["", "hello", "héllo <s></s> wörld", "a\n\tb  ", "日本語"])
@pytest.mark.parametrize("special", [True, False])
def test_completion_prompts_equal_transformers(tmp_path: Path, text: str, special: bool) -> None:
    ours, hf = both(tmp_path, HEADERS)
    assert ours.encode(text, special) == hf(text, add_special_tokens=special)["input_ids"]


def test_the_sandbox_holds(tmp_path: Path) -> None:
    with pytest.raises(Exception):  # noqa: B017 - Jinja's SecurityError, from the sandbox
        ChatTemplate("{{ ''.__class__.__mro__ }}").render([])
    with pytest.raises(Exception):  # noqa: B017
        ChatTemplate("{% set ns = namespace(_x=1) %}").render([])


def test_no_template_and_tiny(tmp_path: Path) -> None:
    ours = VllmTokenizer.load(byte_tokenizer_dir(tmp_path / "t", None))
    with pytest.raises(ChatTemplateError):
        ours.chat_prompt([{"role": "user", "content": "x"}])
    tiny = VllmTokenizer.load("tiny")
    assert tiny.encode("hé") == [104, 195, 169] and tiny.decode([104, 195, 169, 257]) == "hé"
    with pytest.raises(FileNotFoundError):
        VllmTokenizer.load(tmp_path)
