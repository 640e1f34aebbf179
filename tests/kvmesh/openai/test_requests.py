"""Request bodies: one validation rule per field, for the gateway and the worker alike."""
from __future__ import annotations

import json
from typing import Any

import pytest

from kvmesh.openai.errors import OpenAIError
from kvmesh.openai.requests import (
    DEFAULT_MAX_TOKENS,
    ChatCompletionRequest,
    CompletionRequest,
    parse,
)


def completion(**fields: Any) -> CompletionRequest:
    return parse(CompletionRequest, json.dumps({"model": "m", "prompt": "x", **fields}).encode())


def chat(**fields: Any) -> ChatCompletionRequest:
    messages = [{"role": "user", "content": "hi"}]
    return parse(ChatCompletionRequest,
                 json.dumps({"model": "m", "messages": messages, **fields}).encode())


@pytest.mark.parametrize(("fields", "param"), [
    ({"temperature": 2.5}, "temperature"),
    ({"temperature": -0.1}, "temperature"),
    ({"seed": 2**63}, "seed"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 2**32}, "max_tokens"),
    ({"cache_salt": ""}, "cache_salt"),
    ({"prompt": {"not": "a prompt"}}, "prompt"),
])
def test_out_of_range_fields_are_400_naming_them(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(OpenAIError) as info:
        completion(**fields)
    assert info.value.status == 400 and info.value.param is not None
    assert info.value.param.startswith(param)


def test_in_range_fields_and_unknown_ones_are_accepted() -> None:
    body = completion(temperature=2.0, seed=-(2**63), max_tokens=2**32 - 1, top_p=0.5)
    assert body.sampling_temperature() == 2.0 and body.model_extra == {"top_p": 0.5}
    assert completion().sampling_temperature() == 1.0
    assert completion().max_new_tokens() == DEFAULT_MAX_TOKENS


@pytest.mark.parametrize(("fields", "param"), [
    ({"n": 2}, "n"), ({"best_of": 3}, "best_of"), ({"logprobs": 1}, "logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"), ({"echo": True}, "echo"),
    ({"suffix": "s"}, "suffix"), ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
])
def test_what_the_engine_cannot_honour_is_refused(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(OpenAIError) as info:
        completion(**fields).check_supported()
    assert (info.value.status, info.value.param, info.value.code) == (400, param, "unsupported")
    completion(n=1, stop=["a", ""], logprobs=False).check_supported()


def test_prompts_one_or_a_batch() -> None:
    assert completion().prompts() == ["x"]
    assert completion(prompt=[1, 2]).prompts() == [[1, 2]]
    assert completion(prompt=[[1], [2]]).prompts() == [[1], [2]]
    with pytest.raises(OpenAIError) as info:
        completion(prompt=[]).prompts()
    assert info.value.param == "prompt"


def test_stream_usage_options() -> None:
    assert not completion(stream=True).include_usage()
    both = {"include_usage": True, "continuous_usage_stats": True}
    assert completion(stream_options=both).continuous_usage()
    assert not completion(stream_options={"continuous_usage_stats": True}).continuous_usage()
    assert completion(stop="x").stop_strings() == ["x"]


def test_chat_defaults_as_vllm() -> None:
    body = chat()
    assert body.max_new_tokens(100) == 100 and body.requested_tokens() is None
    assert chat(max_tokens=5, max_completion_tokens=7).max_new_tokens(100) == 7
    assert body.template_options()["add_special_tokens"] is False
    assert body.template_options()["add_generation_prompt"] is True
    assert completion().add_special_tokens is True


def test_chat_messages_reach_the_template_as_sent() -> None:
    calls = [{"id": "c", "type": "function"}]
    body = chat(messages=[{"role": "assistant", "tool_calls": calls},
                          {"role": "user", "content": [{"type": "text", "text": "x"}]}])
    assert body.message_dicts() == [{"role": "assistant", "tool_calls": calls},
                                    {"role": "user",
                                     "content": [{"type": "text", "text": "x"}]}]
    with pytest.raises(OpenAIError) as info:
        chat(messages=[{"content": "no role"}])
    assert info.value.param == "messages[0].role"
