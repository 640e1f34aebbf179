"""Errors: OpenAI-shaped JSON bodies with the right HTTP status, for the SDK and for raw HTTP."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import grpc
import openai
import pytest

from client.errors import KvmeshError
from client.gateway.errors import from_kvmesh
from kvmesh.rpc.retry import TABLE, Action
from tests.client.gateway.conftest import Stack

CHAT = [{"role": "user", "content": "hi"}]


def post(url: str, data: bytes, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """POST raw bytes; returns (status, parsed JSON body)."""
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def assert_openai_shape(body: Any) -> dict[str, Any]:
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    return body["error"]


@pytest.mark.parametrize(("code", "status", "exc"), [
    (grpc.StatusCode.INVALID_ARGUMENT, 400, openai.BadRequestError),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, 413, openai.APIStatusError),
    (grpc.StatusCode.UNAVAILABLE, 503, openai.InternalServerError),
    (grpc.StatusCode.UNAUTHENTICATED, 401, openai.AuthenticationError),
])
def test_service_errors_map_to_http_status(stack: Stack, code: grpc.StatusCode, status: int,
                                           exc: type[Exception],
                                           caplog: pytest.LogCaptureFixture) -> None:
    """The caller's own mistakes (400, 413) keep the server's reason; the rest say what the
    status means; the full text, with the service's address, goes to the log only."""
    stack.index.error = (code, "scripted failure")
    client = stack.gateway.openai()
    with caplog.at_level("WARNING", logger="client.gateway"), pytest.raises(exc) as info:
        client.completions.create(model="tiny", prompt="hello")
    assert info.value.status_code == status
    error = assert_openai_shape({"error": info.value.body})
    assert ("scripted failure" in error["message"]) == (status in (400, 413))
    assert error["code"] == code.name.lower()
    assert "127.0.0.1" not in json.dumps(info.value.body)
    assert any("scripted failure" in r.getMessage() for r in caplog.records)


def test_worker_invalid_argument_is_400_even_when_streaming(stack: Stack) -> None:
    stack.w1.mode = "invalid"
    client = stack.gateway.openai()
    with pytest.raises(openai.BadRequestError, match="prompt longer than the model"):
        client.chat.completions.create(model="tiny", messages=CHAT)
    with pytest.raises(openai.BadRequestError, match="prompt longer than the model"):
        client.chat.completions.create(model="tiny", messages=CHAT, stream=True)


def test_no_candidate_worker_is_503(stack: Stack) -> None:
    stack.index.candidates = []
    with pytest.raises(openai.InternalServerError) as info:
        stack.gateway.openai().completions.create(model="tiny", prompt="x")
    assert info.value.status_code == 503


def test_error_after_the_first_token_ends_the_stream_with_an_error_event(stack: Stack) -> None:
    stack.index.candidates = stack.index.candidates[:1]
    stack.w1.mode = "abort"  # one chunk, then UNAVAILABLE: too late to fail over
    stream = stack.gateway.openai().completions.create(model="tiny", prompt="x", max_tokens=6,
                                                       stream=True)
    texts = []
    with pytest.raises(openai.APIError, match="unavailable"):
        for chunk in stream:
            texts.append(chunk.choices[0].text)
    assert texts == ["de"]


def test_unknown_model_is_404(stack: Stack) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        stack.gateway.openai().completions.create(model="gpt-4", prompt="x")
    assert info.value.body["code"] == "model_not_found"
    assert info.value.body["param"] == "model"


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"n": 2}, "n"),
    ({"logprobs": 1}, "logprobs"),
    ({"echo": True}, "echo"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": 3}, "temperature"),
    ({"prompt": [99999]}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": ["a", "b"], "stream": True}, "prompt"),
])
def test_bad_completion_fields_are_400(stack: Stack, kwargs: dict[str, Any], param: str) -> None:
    args = {"model": "tiny", "prompt": "x", **kwargs}
    with pytest.raises(openai.BadRequestError) as info:
        stack.gateway.openai().completions.create(**args)
    assert info.value.body["param"] == param
    assert stack.w1.requests == [] and stack.w2.requests == []


def test_bad_chat_messages_are_400(stack: Stack) -> None:
    client = stack.gateway.openai()
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=[{"role": "wizard",
                                                                "content": "x"}])
    assert info.value.body["param"] == "messages[0].role"
    image = {"type": "image_url", "image_url": {"url": "http://x/y.png"}}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=[{"role": "user",
                                                                "content": [image]}])
    assert info.value.body["param"] == "messages[0].content[0]"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[])


def test_missing_field_and_bad_json_are_400_not_422(stack: Stack) -> None:
    url = f"{stack.gateway.url}/v1/completions"
    status, body = post(url, json.dumps({"model": "tiny"}).encode())
    assert status == 400
    error = assert_openai_shape(body)
    assert error["param"] == "prompt"
    assert error["type"] == "invalid_request_error"
    status, body = post(url, b"{not json")
    assert status == 400
    assert "invalid JSON" in assert_openai_shape(body)["message"]
    status, body = post(f"{stack.gateway.url}/v1/chat/completions",
                        json.dumps({"model": "tiny", "messages": [{"content": "x"}]}).encode())
    assert status == 400
    assert assert_openai_shape(body)["param"] == "messages[0].role"


def test_unknown_route_is_404_in_openai_shape(stack: Stack) -> None:
    status, body = post(f"{stack.gateway.url}/v1/embeddings", b"{}")
    assert status == 404
    assert_openai_shape(body)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(("code", "action"),
                         [pytest.param(r.code, r.worker, id=r.code.name) for r in TABLE])
def test_worker_failures_follow_the_retry_table(stack: Stack, code: grpc.StatusCode,
                                                action: Action, stream: bool) -> None:
    stack.w1.mode = "fail"
    stack.w1.failure = (code, "scripted worker failure")
    create = stack.gateway.openai().completions.with_raw_response.create
    if action is Action.NEXT_CANDIDATE:
        raw = create(model="tiny", prompt="a", max_tokens=2, stream=stream)
        assert raw.headers["x-kvmesh-worker"] == "w2"
        parsed = raw.parse()
        text = "".join(c.choices[0].text for c in parsed) if stream else parsed.choices[0].text
        assert text == "de" and len(stack.w1.requests) == len(stack.w2.requests) == 1
        return
    with pytest.raises(openai.APIStatusError) as info:
        create(model="tiny", prompt="a", max_tokens=2, stream=stream)
    expected = from_kvmesh(KvmeshError(code, "x"))
    assert info.value.status_code == expected.status
    assert assert_openai_shape({"error": info.value.body})["code"] == code.name.lower()
    assert stack.w2.requests == []
