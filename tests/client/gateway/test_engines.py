"""The gateway forwards only to the HTTP engines its operator listed, each with its own key
(``client.gateway.engines``), and hides an engine's cache hits from a caller who may not see
them (``client.gateway.hidden_usage``). Real loopback HTTP engines behind a fake index: the
index offers whatever addresses the test says, as one worker's registration could."""
from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest

from client.gateway.cli import build_config
from client.gateway.engines import EngineList, EngineListError, canonical, parse_engine_keys
from client.gateway.hidden_usage import hide_in_body, hide_in_stream
from tests.client.fake_servers import candidate
from tests.client.gateway.conftest import (
    METRICS_KEY,
    LiveGateway,
    Stack,
    metric_delta,
    metric_samples,
)
from tests.client.gateway.recording_engine import RecordingEngine

SHARED_KEY, B_KEY = "engine-key-shared", "engine-key-of-b-only"


@dataclass
class Engines:
    a: RecordingEngine      # listed with --engine-allow: gets --engine-api-key
    b: RecordingEngine      # listed in --engine-keys with a key of its own
    evil: RecordingEngine   # registered by a worker, listed nowhere
    listed: LiveGateway     # --engine-allow a --engine-keys {b} --engine-api-key
    default: LiveGateway    # --engine-api-key only: no engine listed
    shared: LiveGateway     # --insecure-shared-cache, a listed

    def reset(self) -> None:
        for e in (self.a, self.b, self.evil):
            e.requests.clear()
            e.status = 200


@pytest.fixture(scope="module")
def _engines(_stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    a, b, evil = RecordingEngine(), RecordingEngine(), RecordingEngine()
    keys = tmp_path_factory.mktemp("engines") / "engine-keys"
    keys.write_text(f"# engine b's own key\n{b.url}/ {B_KEY}\n")
    keys.chmod(0o600)
    service = _stack.index_address
    gateways = [LiveGateway(build_config(service, engine_api_key=SHARED_KEY,
                                         engine_allow=[a.url], engine_keys=keys,
                                         metrics_key=METRICS_KEY)),
                LiveGateway(build_config(service, engine_api_key=SHARED_KEY)),
                LiveGateway(build_config(service, shared_cache=True, engine_allow=[a.url]))]
    yield Engines(a, b, evil, *gateways)
    for g in gateways:
        g.stop()
    for e in (a, b, evil):
        e.stop()


@pytest.fixture
def engines(_engines: Engines, stack: Stack) -> Engines:
    _engines.reset()
    return _engines


def ask(gateway: LiveGateway, **body: object) -> httpx2.Response:
    return httpx2.post(f"{gateway.url}/v1/completions", timeout=10, json={
        "model": "tiny", "prompt": "hello", "max_tokens": 2, **body})


def offer(stack: Stack, *addresses: tuple[str, str]) -> None:
    """The index answers every route with these (worker id, address) candidates, in order."""
    stack.index.candidates = [candidate(w, addr) for w, addr in addresses]


# --- where the gateway's traffic and engine keys go ----------------------------------------

def test_an_unlisted_engine_gets_nothing_and_a_kvmesh_worker_serves(engines: Engines,
                                                                    stack: Stack) -> None:
    offer(stack, ("gpu-9", engines.evil.url), ("w1", stack.w1_address))
    before = metric_samples(engines.listed.url)
    answer = ask(engines.listed)
    assert answer.status_code == 200 and answer.headers["x-kvmesh-worker"] == "w1"
    assert engines.evil.requests == []  # not the prompt, not the salt, not a key
    refused = metric_delta(before, metric_samples(engines.listed.url),
                           "kvmesh_gateway_engine_forwards_total", outcome="refused")
    assert refused == 1


def test_only_unlisted_engines_is_a_502_that_sent_nothing(engines: Engines,
                                                          stack: Stack) -> None:
    offer(stack, ("gpu-9", engines.evil.url))
    for stream in (False, True):
        answer = ask(engines.listed, stream=stream)
        assert answer.status_code == 502
        assert answer.json()["error"]["code"] == "engine_not_allowed"
    assert engines.evil.requests == []


def test_without_an_engine_list_the_engine_key_goes_nowhere(engines: Engines,
                                                           stack: Stack) -> None:
    """What ``kvmesh gateway --engine-api-key K`` alone does: no engine is listed, so even a
    real engine's address (a's) receives nothing."""
    offer(stack, ("ea", engines.a.url), ("w1", stack.w1_address))
    assert ask(engines.default).headers["x-kvmesh-worker"] == "w1"
    offer(stack, ("ea", engines.a.url))
    assert ask(engines.default).status_code == 502
    assert engines.a.requests == []


def test_each_listed_engine_gets_only_its_own_key(engines: Engines, stack: Stack) -> None:
    offer(stack, ("gpu-9", engines.evil.url), ("ea", engines.a.url), ("eb", engines.b.url))
    engines.a.status = 500  # a fails: the request fails over to b
    answer = ask(engines.listed, cache_salt="s1")
    assert answer.status_code == 200 and answer.headers["x-kvmesh-worker"] == "eb"
    assert engines.a.keys == [f"Bearer {SHARED_KEY}"]
    assert engines.b.keys == [f"Bearer {B_KEY}"]
    assert engines.evil.requests == []
    assert engines.b.requests[0]["body"]["cache_salt"] == "s1"


def test_the_request_goes_to_the_listed_address_not_the_registered_spelling(
        engines: Engines, stack: Stack) -> None:
    port = engines.a.url.rsplit(":", 1)[1]
    offer(stack, ("ea", f"http://127.0.0.1:{port}"))
    assert ask(engines.listed).headers["x-kvmesh-worker"] == "ea"
    assert len(engines.a.requests) == 1


def test_addresses_are_compared_in_one_canonical_form() -> None:
    assert canonical("http://Engine.Local:8000/") == "http://engine.local:8000"
    assert canonical("http://engine") == "http://engine:80"
    assert canonical("https://[::1]") == "https://[::1]:443"
    listed = EngineList.build(["http://e:8000,https://f:8443"], "k")
    assert listed.allowed("http://E:8000") == "http://e:8000"
    assert listed.key("http://e:8000") == "k"
    assert listed.allowed("https://e:8000") is None  # another scheme is another engine
    assert listed.allowed("http://e:8001") is None
    for bad in ("e:8000", "ftp://e:1", "http://u:p@e:1", "http://e:1/v1", "http://e:1?x",
                "http://e:99999", "http://:1"):
        with pytest.raises(EngineListError):
            canonical(bad)
        assert listed.allowed(bad) is None


def test_an_engine_keys_file_is_checked() -> None:
    assert parse_engine_keys('{"http://a:1": "ka", "http://b:2": null}') == {
        "http://a:1": "ka", "http://b:2": None}
    assert parse_engine_keys("http://a:1 ka\n\nhttp://b:2  # no key\n") == {
        "http://a:1": "ka", "http://b:2": None}
    for bad in ("http://a:1 k extra", "http://a:1 k\nhttp://A:1 k2", '{"http://a:1": 3}',
                "{not json", "a:1 k"):
        with pytest.raises(EngineListError) as err:
            parse_engine_keys(bad)
        assert "k2" not in str(err.value)  # messages never quote a key


def test_a_bad_engine_flag_is_a_flag_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="engine address"):
        build_config("127.0.0.1:1", engine_allow=["10.0.0.1:8000"])
    keys = tmp_path / "keys"
    keys.write_text("http://a:1 k x\n")
    with pytest.raises(ValueError, match="line 1"):
        build_config("127.0.0.1:1", engine_keys=keys)


# --- --insecure-shared-cache hides an engine's cache hits ------------------------------------

def test_shared_cache_zeroes_an_engines_cached_tokens_in_whole_answers(
        engines: Engines, stack: Stack) -> None:
    offer(stack, ("ea", engines.a.url))
    answer = ask(engines.shared)
    assert answer.headers["x-kvmesh-cache-scope"] == "shared"  # relayed answers say it too
    usage = answer.json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0
    assert usage["prompt_tokens"] == 10  # the rest is the engine's
    salted = ask(engines.shared, cache_salt="mine").json()["usage"]  # a salt it holds
    assert salted["prompt_tokens_details"]["cached_tokens"] == engines.a.cached


def test_shared_cache_zeroes_an_engines_cached_tokens_in_every_stream_chunk(
        engines: Engines, stack: Stack) -> None:
    offer(stack, ("ea", engines.a.url))
    answer = ask(engines.shared, stream=True, stream_options={"include_usage": True})
    assert answer.headers["x-kvmesh-cache-scope"] == "shared"
    raw = answer.text
    events = [e for e in raw.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "hello"
    assert [c["usage"]["prompt_tokens_details"]["cached_tokens"] for c in chunks] == [0, 0]


def test_hiding_rewrites_only_usage_and_keeps_every_other_byte() -> None:
    body = b'{"usage": {"prompt_tokens_details": {"cached_tokens": 5, ' \
           b'"cached_tokens_by_tier": {"gpu": 3, "cpu": 2}}}}'
    assert json.loads(hide_in_body(body))["usage"]["prompt_tokens_details"] == {
        "cached_tokens": 0, "cached_tokens_by_tier": {"gpu": 0, "cpu": 0}}
    for untouched in (b'{"error": {"message": "usage"}}', b"not json usage", b'{"a": 1}'):
        assert hide_in_body(untouched) == untouched
    stream = (b': comment\r\n\r\ndata: {"x": 1}\n\n'
              b'data: {"usage": {"prompt_tokens_details": {"cached_tokens": 9}}}\n\n'
              b'data: {"usage": {"prompt_tokens_details": {"cached_tokens": 4}}}')

    async def pieces(size: int) -> list[bytes]:
        async def chunks():
            for k in range(0, len(stream), size):
                yield stream[k:k + size]
        return [c async for c in hide_in_stream(chunks())]

    for size in (1, 2, 7, len(stream)):
        out = b"".join(asyncio.run(pieces(size)))
        assert out.startswith(b': comment\r\n\r\ndata: {"x": 1}\n\n')
        assert b'"cached_tokens": 9' not in out and b'"cached_tokens": 4' not in out
        assert out.count(b'"cached_tokens": 0') == 2


def test_an_engine_key_without_engines_and_a_readable_keys_file_are_warned_about(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    build_config("127.0.0.1:1", engine_api_key="k")
    assert "the key is sent nowhere" in capsys.readouterr().err
    keys = tmp_path / "keys"
    keys.write_text("http://a:1 sk-engine-a-7731\n")
    keys.chmod(0o644)
    with caplog.at_level("WARNING", logger="kvmesh.ops.file_perms"):
        config = build_config("127.0.0.1:1", engine_keys=keys)
    assert "--engine-keys file" in caplog.text and "sk-engine-a" not in caplog.text
    assert config.engines.key("http://a:1") == "sk-engine-a-7731"
