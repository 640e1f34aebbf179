"""Response bodies and chunks, shaped as vLLM's, with kvmesh's cached-token facts."""
from __future__ import annotations

import json

from kvmesh.openai.responses import DONE, ResponseShape, Usage, sse


def test_usage_reports_cached_tokens_by_tier_and_sums() -> None:
    a = Usage(10, 2, 4, {"gpu": 1, "cpu": 3})
    b = Usage(5, 1, 2)  # no split: all from gpu
    total = (a + b).as_dict()
    assert total["total_tokens"] == 18
    assert total["prompt_tokens_details"] == {
        "cached_tokens": 6, "cached_tokens_by_tier": {"gpu": 3, "cpu": 3, "disk": 0,
                                                      "peer": 0}}
    fetched = (a + Usage(8, 1, 6, {"gpu": 2, "peer": 4})).as_dict()  # pulled from a peer
    assert fetched["prompt_tokens_details"]["cached_tokens_by_tier"] == {
        "gpu": 3, "cpu": 3, "disk": 0, "peer": 4}
    assert (a + Usage(1, 1, None)).cached_tokens is None
    assert Usage(1, 1, None).as_dict()["prompt_tokens_details"] is None


def test_whole_bodies() -> None:
    text = ResponseShape(False, "m")
    body = text.body([text.choice(0, "hi", "length", [1, 2])], Usage(3, 2, 0))
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"] == [{"index": 0, "text": "hi", "logprobs": None,
                                "finish_reason": "length", "stop_reason": None,
                                "token_ids": [1, 2]}]
    chat = ResponseShape(True, "m")
    choice = chat.body([chat.choice(0, "hi", "stop")], Usage(3, 2, 0))["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "hi", "tool_calls": []}


def test_stream_chunks() -> None:
    chat = ResponseShape(True, "m")
    first = chat.chunk("", role=True, usage=Usage(3, 0, None))
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["usage"]["completion_tokens"] == 0
    assert chat.chunk(None, "stop")["choices"][0]["delta"] == {}
    last = chat.usage_chunk(Usage(3, 1, 3))
    assert last["choices"] == [] and last["id"] == first["id"]
    text = ResponseShape(False, "m").chunk(None, "length")
    assert text["object"] == "text_completion" and text["choices"][0]["text"] == ""


def test_sse_framing() -> None:
    event = sse({"a": "é"})
    assert event.startswith("data: ") and event.endswith("\n\n")
    assert json.loads(event[6:]) == {"a": "é"}
    assert DONE == "data: [DONE]\n\n"
