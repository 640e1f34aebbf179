"""``kvmesh worker --http-port --vllm-events --vllm-replay`` as a real process, read by clients
built for vLLM: the ``openai`` package, the bridge's metrics parser and its event decoder."""
from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import openai
import pytest
import zmq

from bridge.engine_load import parse_load
from bridge.engine_state import EngineState
from deploy.waiting import wait_until
from kvmesh.events import vllm as ve
from kvmesh.hashing import block_hashes, resolve_seed
from tests.http_engines import BS, HttpWorker
from tests.ports import free_port
from tests.tokenizer_dirs import HEADERS, byte_tokenizer_dir

pytestmark = pytest.mark.integration  # a real worker process
LORA = ("sql", "/adapters/sql")
PROMPT = list(range(10, 10 + 5 * BS + 1))


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    tok = byte_tokenizer_dir(tmp_path_factory.mktemp("tok"), HEADERS)
    w = HttpWorker("vp", "--tokenizer", str(tok), "--lora-modules", f"{LORA[0]}={LORA[1]}",
                   "--served-model-name", "tiny-chat").start()
    yield w
    w.stop()


def client(w: HttpWorker) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{w.url}/v1", api_key="unused", max_retries=0, timeout=60)


def bridge_view(batches: list[tuple[int, bytes]]) -> EngineState:
    state = EngineState(block_size=BS, algo="sha256_cbor", seed=resolve_seed("sha256_cbor"),
                        loras={LORA[0]: LORA[1]})
    for seq, payload in batches:
        state.ingest(seq, payload)
    return state


def test_completions_report_the_cache_as_vllm_does(worker):
    c = client(worker)
    first = c.completions.create(model="tiny-chat", prompt=PROMPT, max_tokens=3,
                                 temperature=0)
    again = c.completions.create(model="tiny-chat", prompt=PROMPT, max_tokens=3,
                                 temperature=0)
    assert first.choices[0].text == again.choices[0].text  # greedy
    assert first.usage.prompt_tokens == len(PROMPT) and first.usage.completion_tokens == 3
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == 5 * BS
    salted = c.completions.create(model="tiny-chat", prompt=PROMPT, max_tokens=1,
                                  temperature=0, extra_body={"cache_salt": "other"})
    assert salted.usage.prompt_tokens_details.cached_tokens == 0
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="nope", prompt=PROMPT, max_tokens=1)
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model="tiny-chat", prompt=[999999], max_tokens=1)


def test_text_streams_and_chat_use_the_tokenizer_as_vllm_does(worker, tmp_path: Path):
    import transformers

    c = client(worker)
    text = c.completions.create(model="tiny-chat", prompt="héllo wörld", max_tokens=2,
                                temperature=0)
    assert text.usage.prompt_tokens == 1 + len("héllo wörld".encode())  # <s> + bytes
    chunks = list(c.completions.create(model="tiny-chat", prompt="héllo wörld", max_tokens=4,
                                       temperature=0, stream=True,
                                       stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens == 4 and chunks[-1].choices == []
    hf = transformers.AutoTokenizer.from_pretrained(str(byte_tokenizer_dir(tmp_path, HEADERS)))
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    want = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    chat = c.chat.completions.create(model="tiny-chat", messages=messages, max_tokens=2,
                                     temperature=0)
    assert chat.usage.prompt_tokens == len(want["input_ids"])
    assert chat.choices[0].message.role == "assistant"
    streamed = list(c.chat.completions.create(model="tiny-chat", messages=messages,
                                              max_tokens=2, temperature=0, stream=True))
    assert streamed[0].choices[0].delta.role == "assistant"
    assert streamed[-1].choices[0].finish_reason == "length"


def test_chat_defaults_continuous_usage_and_model_cards_as_vllm(worker):
    """The same vLLM behaviours as the gateway's: a chat without max_tokens runs to the
    context (here the 64 x 4-token pool, which holds less than the model's context), usage on
    every chunk with ``continuous_usage_stats``, and ``models.retrieve``."""
    c = client(worker)
    messages = [{"role": "user", "content": "hi"}]
    chat = c.chat.completions.create(model="tiny-chat", messages=messages, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert chat.usage.prompt_tokens + chat.usage.completion_tokens == 64 * BS
    assert chat.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError):  # nothing left to generate
        c.chat.completions.create(model="tiny-chat", temperature=0,
                                  messages=[{"role": "user", "content": "x" * 64 * BS}])
    chunks = list(c.chat.completions.create(
        model="tiny-chat", messages=messages, max_tokens=3, temperature=0, stream=True,
        extra_body={"ignore_eos": True},
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    done = [ch.usage.completion_tokens for ch in chunks]
    assert done[0] == 0 and done == sorted(done) and done[-1] == 3
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens_details is not None
    card = c.models.retrieve(LORA[0])
    assert (card.id, card.model_extra["parent"]) == (LORA[0], "tiny-chat")
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("nope")


def test_the_metrics_page_reads_as_a_vllm_engines(worker):
    def idle_load():
        # the worker is shared by this module's tests: one may still be finishing a request
        page = urllib.request.urlopen(worker.metrics_url, timeout=10).read().decode()
        load = parse_load(page, 0, block_size=BS)
        return load if load is not None and load.running == 0 else None

    load = wait_until(idle_load, 30, what="an idle engine on the metrics page")
    assert load.total_blocks == 64 and load.block_size == BS
    assert load.model == "tiny-chat" and load.free_blocks == 64
    models = json.loads(urllib.request.urlopen(f"{worker.url}/v1/models", timeout=10).read())
    assert [m["id"] for m in models["data"]] == ["tiny-chat", LORA[0]]


def test_the_event_stream_is_what_the_bridge_needs(worker):
    """Live batches and the replay buffer carry the same bytes; the bridge's decoder rebuilds
    the prompt's kvmesh hashes from them, salted and LoRA ones under their own keys."""
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(worker.events)
    c = client(worker)
    prompt = list(range(100, 100 + 3 * BS + 1))
    live: dict[int, bytes] = {}
    for _ in range(100):  # a SUB joins late: publish until one batch arrives live
        c.completions.create(model="tiny-chat", prompt=prompt, max_tokens=1, temperature=0,
                             extra_body={"cache_salt": f"probe-{len(live)}"})
        while sub.poll(200):
            _, seq, payload = ve.unpack_message(sub.recv_multipart())
            live[seq] = payload
        if live:
            break
    c.completions.create(model=LORA[0], prompt=prompt, max_tokens=1, temperature=0)
    while sub.poll(500):
        _, seq, payload = ve.unpack_message(sub.recv_multipart())
        live[seq] = payload
    sub.close(linger=0)
    replayed = worker.replayed(0)
    assert [s for s, _ in replayed] == list(range(len(replayed)))  # seq from 0, no holes
    assert live and all(dict(replayed)[s] == p for s, p in live.items())
    state = bridge_view(replayed)
    algo, seed = "sha256_cbor", resolve_seed("sha256_cbor")
    salted = block_hashes(prompt, BS, algo=algo, seed=seed, salt="probe-0")
    lora = block_hashes(prompt, BS, algo=algo, seed=seed, lora=LORA)
    plain = block_hashes(prompt, BS, algo=algo, seed=seed)
    assert all(state.held(h) == {"gpu"} for h in salted + lora)
    assert not any(state.held(h) for h in plain)  # never asked unsalted without LoRA here
    assert state.stats.unroutable == {}


def test_a_restarted_worker_numbers_its_batches_from_zero_again():
    pub, rep = free_port(), free_port()
    endpoints = ("--vllm-events", f"tcp://127.0.0.1:{pub}", "--vllm-replay",
                 f"tcp://127.0.0.1:{rep}")
    payloads = []
    for run in range(2):
        w = HttpWorker(f"restart-{run}", *endpoints, events=False).start()
        w.replay = f"tcp://127.0.0.1:{rep}"
        try:
            client(w).completions.create(model="tiny", prompt=[run + 1] * (2 * BS + 1),
                                         max_tokens=1, temperature=0)
            batches = w.replayed(0)
        finally:
            w.stop()
        assert batches and batches[0][0] == 0
        payloads.append(batches[0][1])
    assert payloads[0] != payloads[1]
