"""``kvmesh gateway --tokenizer`` in front of two HTTP engines, on real processes: tiny
``kvmesh worker --http-port --vllm-events`` engines, indexed by ``kvmesh bridge vllm`` from
their vLLM events into a service on Valkey, and the official ``openai`` package as the
caller. A prefix goes to the engine holding it (salts, LoRA and chat templates included),
answers pass through unchanged (but for the cached-token counts of unsalted requests, which
this ``--insecure-shared-cache`` gateway hides), and a failing or dead engine is skipped for
the next one. The gateway forwards to the engines it lists (``--engine-allow``: the bridge
config's addresses)."""
from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import openai
import pytest

from client.gateway.cli import build_config
from client.sync_client import KvmeshClient
from deploy.process import ServerProcess
from deploy.redis_server import RedisServer
from deploy.waiting import wait_until
from kvmesh.openai.tokenizer import VllmTokenizer
from tests.bridge.cluster import BridgeProcess
from tests.client.gateway.conftest import LiveGateway
from tests.client.gateway.flaky_front import FlakyFront
from tests.http_engines import BS, HttpWorker
from tests.tokenizer_dirs import HEADERS, byte_tokenizer_dir

pytestmark = pytest.mark.integration

LORA = ("sql", "/adapters/sql")
WITHIN = 30.0


class Fleet:
    def __init__(self, tmp: Path, redis: RedisServer) -> None:
        self.tok = byte_tokenizer_dir(tmp / "tok", HEADERS)
        flags = ("--tokenizer", str(self.tok), "--lora-modules", f"{LORA[0]}={LORA[1]}")
        self.service = ServerProcess("gw-service", "service", [
            "--port", "0", "--log-level", "warning"],
            env={"KVMESH_REDIS_URL": redis.url}).start()
        self.a = HttpWorker("ea", *flags).start()
        self.b = HttpWorker("eb", *flags).start()
        self.front = FlakyFront(self.a.url)  # engine a is reached through it
        cfg = tmp / "fleet.yaml"
        cfg.write_text(json.dumps({"engines": [
            {"worker-id": "ea", "address": self.front.url, "events": self.a.events,
             "replay": self.a.replay, "block-size": BS, "lora": {LORA[0]: LORA[1]},
             "metrics-url": self.a.metrics_url},
            {"worker-id": "eb", "address": self.b.url, "events": self.b.events,
             "replay": self.b.replay, "block-size": BS, "lora": {LORA[0]: LORA[1]},
             "metrics-url": self.b.metrics_url}]}))
        self.bridge = BridgeProcess("--service", self.service.address, "--config", str(cfg))
        self.gateway = LiveGateway(build_config(
            self.service.address, tokenizer_dir=self.tok, served_model_name="tiny",
            shared_cache=True, max_model_len=8192, loras={LORA[0]: LORA[1]},
            engine_allow=[self.front.url, self.b.url], metrics_key="mk"))
        self.index = KvmeshClient(self.service.address)
        wait_until(lambda: {c.worker_id for c in self.route([1] * BS).candidates} == {
            "ea", "eb"}, WITHIN, what="both engines registered")

    def route(self, ids: list[int], **kw):
        return self.index.route(ids, dry_run=True, **kw)

    def holds(self, worker: str, ids: list[int], **kw) -> bool:
        """Whether the index says ``worker`` holds every full block of ``ids``."""
        want = (len(ids) // BS) * BS
        got = {c.worker_id: c.matched_tokens for c in self.route([*ids, 0], **kw).candidates}
        return got.get(worker) == want

    def close(self) -> None:
        self.gateway.stop()
        self.index.close()
        self.bridge.stop()
        self.front.stop()
        for w in (self.a, self.b):
            w.stop()
        self.service.stop()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, redis_server: RedisServer):
    if not redis_server.alive:
        redis_server.start()
    f = Fleet(tmp_path_factory.mktemp("fleet"), redis_server)
    yield f
    f.close()


def engine(w: HttpWorker) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{w.url}/v1", api_key="x", max_retries=0, timeout=60)


def warm(fleet: Fleet, w: HttpWorker, ids: list[int], **body) -> None:
    """Serve ``ids`` on ``w`` directly, then wait until the index says it holds them."""
    model = body.pop("model", "tiny")
    engine(w).completions.create(model=model, prompt=ids, max_tokens=1, temperature=0,
                                 extra_body=body)
    kw = {}
    if "cache_salt" in body:
        kw["salt"] = body["cache_salt"]
    if model == LORA[0]:
        kw["lora"] = LORA
    wait_until(lambda: fleet.holds(w.name, ids, **kw), WITHIN, what=f"{w.name} indexed")


def via_gateway(fleet: Fleet, ids: list[int], **kw):
    raw = fleet.gateway.openai().completions.with_raw_response.create(
        model=kw.pop("model", "tiny"), prompt=ids, max_tokens=2, temperature=0, **kw)
    return raw.headers["x-kvmesh-worker"], raw.parse()


def test_a_prefix_goes_to_its_holder_and_the_answer_is_the_engines(fleet: Fleet) -> None:
    pa, pb = list(range(20, 20 + 6 * BS)), list(range(60, 60 + 6 * BS))
    warm(fleet, fleet.a, pa)
    warm(fleet, fleet.b, pb)
    for ids, holder in ((pa, "ea"), (pb, "eb")):
        worker, answer = via_gateway(fleet, [*ids, 7, 8, 9])
        assert worker == holder
        # an unsalted request in a shared cache: the engine's hits are hidden from it
        assert answer.usage.prompt_tokens_details.cached_tokens == 0
        direct = engine(fleet.a if holder == "ea" else fleet.b).completions.create(
            model="tiny", prompt=[*ids, 7, 8, 9], max_tokens=2, temperature=0)
        assert answer.choices[0].text == direct.choices[0].text


def test_salted_and_lora_prefixes_go_to_their_own_holder(fleet: Fleet) -> None:
    p = list(range(100, 100 + 5 * BS))
    warm(fleet, fleet.a, p, cache_salt="tenant-x")
    warm(fleet, fleet.b, p, model=LORA[0])
    worker, answer = via_gateway(fleet, [*p, 1], extra_body={"cache_salt": "tenant-x"})
    assert worker == "ea"  # its own salt: the engine's count is the caller's to see
    assert answer.usage.prompt_tokens_details.cached_tokens == len(p)
    worker, answer = via_gateway(fleet, [*p, 1], model=LORA[0])
    assert worker == "eb" and answer.usage.prompt_tokens_details.cached_tokens == 0
    assert answer.model == LORA[0]


def test_chat_is_tokenized_as_the_engine_does_and_streams_pass_through(fleet: Fleet) -> None:
    """Chats warmed on each engine through its own chat template come back to it through the
    gateway's: with other ids (another template) nothing would match and load would decide."""
    tok = VllmTokenizer.load(fleet.tok)
    chats = {}
    for i in range(6):
        w = (fleet.a, fleet.b)[i % 2]
        messages = [{"role": "system", "content": f"You are terse ({i})."},
                    {"role": "user", "content": "Name three prime numbers, in order."}]
        engine(w).chat.completions.create(model="tiny", messages=messages, max_tokens=1,
                                          temperature=0)
        ids = tok.chat_ids(messages)  # = transformers' ids (tests/kvmesh/test_chat_template)
        wait_until(lambda w=w, ids=ids: fleet.holds(w.name, ids[:-1]), WITHIN,
                   what="chat indexed")
        chats[w.name, i] = messages, ids
    for (holder, _), (messages, ids) in chats.items():
        raw = fleet.gateway.openai().chat.completions.with_raw_response.create(
            model="tiny", messages=messages, max_tokens=3, temperature=0, stream=True,
            stream_options={"include_usage": True})
        assert raw.headers["x-kvmesh-worker"] == holder
        chunks = list(raw.parse())
        assert chunks[0].choices[0].delta.role == "assistant"
        assert chunks[-1].usage.prompt_tokens == len(ids)
        assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 0  # unsalted: hidden


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_an_engine_answering_500_is_skipped_for_the_next(fleet: Fleet, stream: bool) -> None:
    p = list(range(140 + 40 * stream, 140 + 40 * stream + 5 * BS))
    warm(fleet, fleet.a, p)
    fleet.front.failing = True
    refused = fleet.front.refused
    try:
        if stream:
            raw = fleet.gateway.openai().completions.with_raw_response.create(
                model="tiny", prompt=[*p, 3], max_tokens=2, temperature=0, stream=True)
            assert raw.headers["x-kvmesh-worker"] == "eb"
            assert [c.choices[0].finish_reason for c in raw.parse()][-1] == "length"
        else:
            assert via_gateway(fleet, [*p, 3])[0] == "eb"
    finally:
        fleet.front.failing = False
    assert fleet.front.refused == refused + 1  # a, the holder, was tried first and failed


def test_a_dead_engine_is_skipped_for_the_next(fleet: Fleet) -> None:
    """Last in the module: engine b is killed (SIGKILL) while the index still routes to it."""
    p = list(range(220, 220 + 5 * BS))
    warm(fleet, fleet.b, p)
    fleet.b.kill()
    worker, answer = via_gateway(fleet, [*p, 5])
    assert worker == "ea" and answer.usage.prompt_tokens_details.cached_tokens == 0
    metrics = urllib.request.urlopen(urllib.request.Request(
        f"{fleet.gateway.url}/metrics", headers={"authorization": "Bearer mk"}),
        timeout=5).read().decode()
    assert 'kvmesh_gateway_engine_forwards_total{outcome="failover"}' in metrics
