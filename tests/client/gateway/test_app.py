"""The gateway through the official ``openai`` package: completions, chat, streaming, models.

The fake workers answer ``max_tokens`` tokens 100, 101, ... which the byte-level ``tiny``
vocabulary decodes to "defg..."; worker ``w1`` reports ``W1_CACHED`` cached prompt tokens.
"""
from __future__ import annotations

import grpc
import openai
import pytest

from client.gateway.app import GatewayConfig
from tests.client.fake_servers import candidate, closed_port_address
from tests.client.gateway.conftest import W1_CACHED, LiveGateway, Stack


def test_ignore_eos_reaches_the_worker_whole_and_streamed(stack: Stack) -> None:
    """vLLM's ``ignore_eos`` (benchmark tools send it to get exactly max_tokens tokens)."""
    client = stack.gateway.openai()
    client.completions.create(model="tiny", prompt="hi", max_tokens=3,
                              extra_body={"ignore_eos": True})
    assert stack.last_request.sampling.ignore_eos
    chunks = list(client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
        stream=True, extra_body={"ignore_eos": True}))
    assert chunks and stack.last_request.sampling.ignore_eos


def test_completion_text_usage_and_headers(stack: Stack) -> None:
    client = stack.gateway.openai()
    raw = client.completions.with_raw_response.create(model="tiny", prompt="hello",
                                                      max_tokens=4, seed=7)
    completion = raw.parse()
    assert completion.object == "text_completion"
    assert completion.id.startswith("cmpl-")
    assert completion.choices[0].text == "defg"
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage.prompt_tokens == 5
    assert completion.usage.completion_tokens == 4
    assert completion.usage.total_tokens == 9
    assert completion.usage.prompt_tokens_details.cached_tokens == W1_CACHED
    # a worker that gives no split served everything from its device tier
    assert completion.usage.prompt_tokens_details.cached_tokens_by_tier == {
        "gpu": W1_CACHED, "cpu": 0, "disk": 0, "peer": 0}
    assert raw.headers["x-kvmesh-worker"] == "w1"
    assert raw.headers["x-kvmesh-cached-tokens"] == str(W1_CACHED)
    req = stack.last_request
    assert list(req.token_ids) == list(b"hello")
    assert req.sampling.max_tokens == 4
    assert req.sampling.seed == 7
    assert req.sampling.temperature == 1.0  # OpenAI's default
    assert not req.sampling.ignore_eos
    assert len(req.salt) == 32  # no tenant keys, no cache_salt: a random salt of its own
    assert stack.index.routes[-1].salt == req.salt
    assert list(stack.index.routes[-1].token_ids) == list(b"hello")
    client.completions.create(model="tiny", prompt="hello", max_tokens=1)
    assert stack.last_request.salt not in ("", req.salt)  # shared with no later request


def test_token_prompt_default_max_tokens_and_cache_salt(stack: Stack) -> None:
    client = stack.gateway.openai()
    completion = client.completions.create(model="tiny", prompt=[1, 2, 3], temperature=0,
                                           extra_body={"cache_salt": "team-1"})
    assert len(completion.choices[0].text) == 16  # max_tokens defaults to 16
    req = stack.last_request
    assert list(req.token_ids) == [1, 2, 3]
    assert req.sampling.temperature == 0.0
    assert req.salt == "team-1"  # without tenant keys the caller's cache_salt passes through
    assert stack.index.routes[-1].salt == "team-1"


def test_batch_of_prompts(stack: Stack) -> None:
    client = stack.gateway.openai()
    raw = client.completions.with_raw_response.create(model="tiny", prompt=["ab", "cd"],
                                                      max_tokens=2)
    completion = raw.parse()
    assert [c.text for c in completion.choices] == ["de", "de"]
    assert [c.index for c in completion.choices] == [0, 1]
    assert completion.usage.prompt_tokens == 4
    assert completion.usage.prompt_tokens_details.cached_tokens == 2 * W1_CACHED
    assert raw.headers["x-kvmesh-worker"] == "w1,w1"


def test_chat_completion_renders_the_simple_template(stack: Stack) -> None:
    client = stack.gateway.openai()
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", max_tokens=3,
        messages=[{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": [{"type": "text", "text": "Hi"}]}])
    chat = raw.parse()
    assert chat.object == "chat.completion"
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == "def"
    assert chat.usage.prompt_tokens_details.cached_tokens == W1_CACHED
    assert raw.headers["x-kvmesh-worker"] == "w1"
    prompt = bytes(stack.last_request.token_ids).decode()
    assert prompt == "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n"


def test_max_completion_tokens_wins(stack: Stack) -> None:
    client = stack.gateway.openai()
    chat = client.chat.completions.create(model="tiny", max_tokens=9, max_completion_tokens=2,
                                          messages=[{"role": "user", "content": "x"}])
    assert chat.choices[0].message.content == "de"


def test_streaming_completion(stack: Stack) -> None:
    client = stack.gateway.openai()
    raw = client.completions.with_raw_response.create(
        model="tiny", prompt="hello", max_tokens=5, stream=True,
        stream_options={"include_usage": True})
    assert raw.headers["x-kvmesh-worker"] == "w1"
    assert raw.headers["content-type"].startswith("text/event-stream")
    chunks = list(raw.parse())
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == "defgh"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    assert len({c.id for c in chunks}) == 1
    usage = chunks[-1].usage
    assert chunks[-1].choices == []
    assert (usage.prompt_tokens, usage.completion_tokens) == (5, 5)
    assert usage.prompt_tokens_details.cached_tokens == W1_CACHED


def test_cached_tokens_by_tier_in_usage(stack: Stack) -> None:
    """The worker's split, a peer's blocks included, reaches
    ``usage.prompt_tokens_details`` (body and usage chunk), summed over a batch."""
    stack.w1.cached, stack.w1.cached_by_tier = 5, {"gpu": 1, "cpu": 2, "peer": 2}
    client = stack.gateway.openai()
    batch = client.completions.create(model="tiny", prompt=["hello", "world"], max_tokens=1)
    details = batch.usage.prompt_tokens_details
    assert details.cached_tokens == 10
    assert details.cached_tokens_by_tier == {"gpu": 2, "cpu": 4, "disk": 0, "peer": 4}
    chunks = list(client.completions.create(model="tiny", prompt="hello", max_tokens=2,
                                            stream=True, stream_options={"include_usage": True}))
    details = chunks[-1].usage.prompt_tokens_details
    assert details.cached_tokens_by_tier == {"gpu": 1, "cpu": 2, "disk": 0, "peer": 2}


def test_streaming_chat(stack: Stack) -> None:
    client = stack.gateway.openai()
    stream = client.chat.completions.create(model="tiny", max_tokens=4, stream=True,
                                            messages=[{"role": "user", "content": "hi"}])
    chunks = list(stream)
    assert chunks[0].object == "chat.completion.chunk"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "defg"
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chunks)  # no usage chunk unless asked


def test_stop_strings(stack: Stack) -> None:
    client = stack.gateway.openai()
    completion = client.completions.create(model="tiny", prompt="x", max_tokens=8, stop="fg")
    assert completion.choices[0].text == "de"
    assert completion.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(model="tiny", max_tokens=8, stream=True,
                                            stop=["zz", "gh"],
                                            messages=[{"role": "user", "content": "x"}])
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "def"
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_stream_fails_over_before_the_first_token(stack: Stack) -> None:
    stack.index.candidates = [candidate("down", closed_port_address()),
                              candidate("w2", stack.w2_address)]
    client = stack.gateway.openai()
    raw = client.completions.with_raw_response.create(model="tiny", prompt="a", max_tokens=2,
                                                      stream=True)
    assert raw.headers["x-kvmesh-worker"] == "w2"
    assert "".join(c.choices[0].text for c in raw.parse()) == "de"


def test_models_list_and_retrieve(stack: Stack) -> None:
    """``models.retrieve`` (GET /v1/models/{id}) answered 404 before; now the SDK's call
    returns the card, and an unknown id is the SDK's NotFoundError."""
    client = stack.gateway.openai()
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert models.data[0].owned_by == "kvmesh"
    model = client.models.retrieve("tiny")
    assert (model.id, model.object, model.owned_by) == ("tiny", "model", "kvmesh")
    assert model.model_extra["max_model_len"] == 8192
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("gpt-4")
    assert info.value.body["code"] == "model_not_found"
    with pytest.raises(openai.AuthenticationError):  # behind the tenant keys, as /v1/models
        stack.tenant_gateway.openai("key-nobody").models.retrieve("tiny")
    assert stack.tenant_gateway.openai("key-acme").models.retrieve("tiny").id == "tiny"


def test_models_with_slashes_and_adapters(stack: Stack) -> None:
    gateway = LiveGateway(GatewayConfig(service=stack.index_address, model_name="org/base-7b",
                                        loras={"sql": "/adapters/sql"}))
    try:
        client = gateway.openai()
        assert [(m.id, m.model_extra["parent"]) for m in client.models.list().data] == [
            ("org/base-7b", None), ("sql", "org/base-7b")]
        assert client.models.retrieve("org/base-7b").id == "org/base-7b"
        assert client.models.retrieve("sql").model_extra["root"] == "sql"  # never the path
    finally:
        gateway.stop()


def test_chat_without_max_tokens_runs_to_the_context(stack: Stack) -> None:
    """vLLM (and OpenAI) generate a chat without max_tokens until EOS or the context limit;
    completions keep vLLM's default of 16."""
    gateway = LiveGateway(GatewayConfig(service=stack.index_address, max_model_len=64))
    try:
        client = gateway.openai()
        chat = client.chat.completions.create(model="tiny",
                                              messages=[{"role": "user", "content": "x"}])
        prompt = len(b"<|user|>\nx\n<|assistant|>\n")
        assert stack.last_request.sampling.max_tokens == 64 - prompt
        assert chat.usage.completion_tokens == 64 - prompt
        assert chat.choices[0].finish_reason == "length"
        assert client.chat.completions.create(
            model="tiny", max_tokens=3,
            messages=[{"role": "user", "content": "x"}]).usage.completion_tokens == 3
        assert client.completions.create(model="tiny", prompt="x").usage.completion_tokens == 16
        with pytest.raises(openai.BadRequestError) as info:  # nothing left to generate
            client.chat.completions.create(model="tiny",
                                           messages=[{"role": "user", "content": "x" * 60}])
        assert info.value.body["code"] == "context_length_exceeded"
    finally:
        gateway.stop()


def test_a_pool_refusal_of_the_default_says_so(stack: Stack) -> None:
    """A worker whose KV pool cannot hold the whole context refuses a chat that asked for
    the default: the 413 says that max_tokens defaulted, and what to change."""
    stack.index.candidates = [candidate("w1", stack.w1_address)]
    stack.w1.mode = "fail"
    stack.w1.failure = (grpc.StatusCode.RESOURCE_EXHAUSTED, "needs 513 blocks; the pool has 64")
    client = stack.gateway.openai()
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == 413
    assert "max_tokens was not given" in info.value.body["message"]
    assert "--max-model-len" in info.value.body["message"]
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="tiny", max_tokens=4,
                                       messages=[{"role": "user", "content": "x"}])
    assert "max_tokens was not given" not in info.value.body["message"]


def test_continuous_usage_stats_put_usage_on_every_chunk(stack: Stack) -> None:
    """vLLM's ``stream_options.continuous_usage_stats`` (with ``include_usage``): every chunk
    carries the counts so far; the last, usage-only chunk adds the cached tokens."""
    client = stack.gateway.openai()
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = list(client.chat.completions.create(
        model="tiny", max_tokens=5, stream=True, stream_options=options,
        messages=[{"role": "user", "content": "hi"}]))
    prompt = len(b"<|user|>\nhi\n<|assistant|>\n")
    assert all(c.usage is not None and c.usage.prompt_tokens == prompt for c in chunks)
    done = [c.usage.completion_tokens for c in chunks]
    assert done[0] == 0 and done == sorted(done) and done[-2:] == [5, 5]
    assert all(c.usage.total_tokens == prompt + c.usage.completion_tokens for c in chunks)
    assert chunks[-1].choices == []
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == W1_CACHED
    text = list(client.completions.create(model="tiny", prompt="hello", max_tokens=4,
                                          stream=True, stream_options=options))
    assert [c.usage.completion_tokens for c in text if c.choices and c.choices[0].text] == [
        2, 4]
    plain = list(client.completions.create(  # vLLM: only together with include_usage
        model="tiny", prompt="hello", max_tokens=2, stream=True,
        stream_options={"continuous_usage_stats": True}))
    assert all(c.usage is None for c in plain)


def test_each_worker_gets_its_own_candidates_fetch_plan(stack: Stack) -> None:
    """The gateway routes once and hands the answer to the client: w1 (failing before any
    token) gets its plan, the failover to w2 gets w2's, whole and streamed alike."""
    from kvmesh.v1 import index_pb2

    plans = [index_pb2.FetchPlan(source_worker_id=s, source_address=f"{s}:1", start_block=i,
                                 block_hashes=[bytes([i]) * 32], tokens=16, est_s=0.001,
                                 ticket=s.encode() * 8) for i, s in enumerate(("h1", "h2"))]
    for cand, plan in zip(stack.index.candidates, plans, strict=True):
        cand.fetch.CopyFrom(plan)
    stack.w1.mode = "fail"
    stack.w1.failure = (grpc.StatusCode.UNAVAILABLE, "draining")
    client = stack.gateway.openai()
    client.completions.create(model="tiny", prompt="hello", max_tokens=2)
    list(client.completions.create(model="tiny", prompt="hello", max_tokens=2, stream=True))
    assert [r.fetch for r in stack.w1.requests] == [plans[0]] * 2
    assert [r.fetch for r in stack.w2.requests] == [plans[1]] * 2
