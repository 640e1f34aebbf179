"""One error, two bodies: OpenAI's (the gateway) and vLLM's (the worker's HTTP API)."""
from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from kvmesh.openai.errors import OpenAIError, invalid, param_of


def test_openai_body_names_a_kind_and_a_string_code() -> None:
    err = OpenAIError(400, "bad", param="prompt", code="unsupported")
    assert err.body() == {"error": {"message": "bad", "type": "invalid_request_error",
                                    "param": "prompt", "code": "unsupported"}}
    assert OpenAIError(429, "slow down").type == "rate_limit_error"
    assert OpenAIError(503, "later").type == "server_error"


def test_vllm_body_names_the_exception_and_the_status() -> None:
    assert OpenAIError(404, "no", param="model").vllm_body() == {
        "error": {"message": "no", "type": "NotFoundError", "param": "model", "code": 404}}
    assert OpenAIError(500, "x").vllm_body()["error"]["type"] == "InternalServerError"


def test_param_names_a_field_as_openai_does() -> None:
    assert param_of(("body", "messages", 0, "role")) == "messages[0].role"
    assert param_of(("body",)) is None


class _Body(BaseModel):
    a: int
    b: int


def test_invalid_words_the_first_problem_and_counts_the_rest() -> None:
    with pytest.raises(ValidationError) as info:
        _Body.model_validate({"a": "x", "b": "y"})
    err = invalid(info.value.errors())
    assert err.status == 400 and err.param == "a" and err.code == "invalid_request"
    assert err.message.startswith("a: ") and "(and 1 more problem(s))" in err.message
    with pytest.raises(ValidationError) as info:
        _Body.model_validate_json(b"{nope")
    assert invalid(info.value.errors()).message.startswith("invalid JSON body")
