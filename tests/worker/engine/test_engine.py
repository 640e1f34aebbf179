"""The engine: greedy output equals transformers', with and without prefix-cache hits."""
from __future__ import annotations

import asyncio
import math
import random

import pytest
import torch

from tests.worker.hf_models import VOCAB, make_hf_model
from worker import Engine, RequestError
from worker.engine.async_engine import AsyncEngine
from worker.engine.scheduler import SchedulerConfig
from worker.engine.sequence import SamplingParams

BS = 4


@pytest.fixture(scope="module", params=["LlamaForCausalLM", "Qwen2ForCausalLM"])
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    hf = make_hf_model(request.param, path)
    return hf, path


def hf_greedy(hf, prompt: list[int], n: int) -> list[int]:
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                      pad_token_id=0, attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return out[0, len(prompt):].tolist()


def rand_prompts(n: int, lengths, seed: int = 0, prefix: list[int] | None = None,
                 vocab: int = VOCAB):
    rng = random.Random(seed)
    return [(prefix or []) + [rng.randrange(3, vocab) for _ in range(length)]
            for length in lengths[:n]]


def test_greedy_equals_transformers_fresh_and_cached(checkpoint):
    hf, path = checkpoint
    engine = Engine.from_pretrained(path, block_size=BS, num_blocks=256)
    shared = rand_prompts(1, [23], seed=1)[0]  # 5 full blocks + 3 tokens
    fresh = rand_prompts(3, [5, 17, 30], seed=2)
    # One batch: fresh prompts and two that share `shared` (cached as soon as it is full, so
    # the later one in the same batch may reuse what the earlier one filled).
    batch = fresh + [shared + [7, 8, 9], shared + [11]]
    got = engine.generate(batch, max_tokens=10)
    for prompt, c in zip(batch, got, strict=True):
        assert c.token_ids == hf_greedy(hf, prompt, 10)[:len(c.token_ids)]
        assert len(c.token_ids) == 10 or c.token_ids[-1] == 2
    # Across calls: the whole shared prefix is served from the cache now.
    again = engine.generate([shared + [13, 14, 15, 16, 17]], max_tokens=10)[0]
    assert again.num_cached_tokens >= 20
    assert again.token_ids == hf_greedy(hf, shared + [13, 14, 15, 16, 17], 10)[
        :len(again.token_ids)]
    # The same prompt twice: everything but the last token comes from cache.
    first = engine.generate([fresh[2]], max_tokens=6)[0]
    assert first.num_cached_tokens == (len(fresh[2]) - 1) // BS * BS
    assert first.token_ids == got[2].token_ids[:6]


def test_batched_equals_one_by_one(checkpoint):
    _, path = checkpoint
    prompts = rand_prompts(5, [3, 9, 16, 21, 40], seed=3)
    batched = Engine.from_pretrained(path, block_size=BS, num_blocks=256).generate(
        prompts, max_tokens=12, ignore_eos=True)
    for p, c in zip(prompts, batched, strict=True):
        alone = Engine.from_pretrained(path, block_size=BS, num_blocks=256).generate(
            [p], max_tokens=12, ignore_eos=True)[0]
        assert c.token_ids == alone.token_ids


def test_preemption_and_chunked_prefill_keep_outputs(checkpoint):
    _, path = checkpoint
    prompts = rand_prompts(6, [30, 25, 33, 18, 27, 22], seed=4)
    roomy = Engine.from_pretrained(path, block_size=BS, num_blocks=512)
    want = [c.token_ids for c in roomy.generate(prompts, max_tokens=16, ignore_eos=True)]
    # 24 blocks hold about two sequences at once: the rest must wait or be preempted, and
    # an 8-token budget forces every prompt through chunked prefill.
    tight = Engine.from_pretrained(path, block_size=BS, num_blocks=24,
                                   scheduler=SchedulerConfig(max_batched_tokens=8))
    got = tight.generate(prompts, max_tokens=16, ignore_eos=True)
    assert [c.token_ids for c in got] == want
    assert tight.scheduler.num_preemptions > 0
    assert tight.kv.num_free_blocks == 24  # everything released at the end


def test_refused_requests_change_nothing():
    engine = Engine.from_pretrained("tiny", block_size=BS, num_blocks=8)
    before = engine.kv.stats
    with pytest.raises(RequestError, match="outside the vocabulary"):
        engine.generate([[1, 2, 999_999]], max_tokens=2)
    with pytest.raises(RequestError, match="empty"):
        engine.generate([[]], max_tokens=2)
    with pytest.raises(RequestError, match="max_tokens"):
        engine.generate([[1, 2]], max_tokens=0)
    with pytest.raises(RequestError, match="blocks") as err:
        engine.generate([[5] * 40], max_tokens=2)  # 42 tokens need 11 blocks of 4 > 8
    assert err.value.too_large
    with pytest.raises(RequestError, match="context"):
        engine.generate([[5] * 9000], max_tokens=1)
    assert engine.kv.stats == before and not engine.has_work()


def test_seeded_sampling_is_reproducible():
    engine = Engine.from_pretrained("tiny", block_size=BS, num_blocks=64)
    p = [[10, 20, 30, 40, 50]]
    a = engine.generate(p, max_tokens=8, temperature=1.0, seed=7, ignore_eos=True)[0]
    b = engine.generate(p, max_tokens=8, temperature=1.0, seed=7, ignore_eos=True)[0]
    assert a.token_ids == b.token_ids


def test_a_denormal_temperature_is_greedy_and_harms_no_batch_mate():
    """A crafted temperature of 1e-39 once overflowed the logits to inf (softmax: NaN) and
    failed the whole step, batch-mates included. Below ``SAMPLING_EPS`` it is greedy now;
    inf and NaN are refused up front."""
    engine = Engine.from_pretrained("tiny", block_size=BS, num_blocks=64)
    p = [[10, 20, 30, 40, 50], [7, 8, 9]]
    want = engine.generate(p, max_tokens=6, ignore_eos=True)
    got = [engine.add_request(q, SamplingParams(6, temperature=t, ignore_eos=True))
           for q, t in zip(p, (1e-39, 0.0), strict=True)]
    while engine.has_work():
        engine.step()
    assert [s.output_ids for s in got] == [o.token_ids for o in want]
    for bad in (math.inf, math.nan, -1.0):
        with pytest.raises(RequestError, match="temperature"):
            engine.add_request([1, 2], SamplingParams(2, temperature=bad))


def test_async_engine_serves_concurrent_requests():
    engine = Engine.from_pretrained("tiny", block_size=BS, num_blocks=128)
    prompts = rand_prompts(4, [12, 30, 7, 19], seed=5, vocab=256)
    want = Engine.from_pretrained("tiny", block_size=BS, num_blocks=128).generate(
        prompts, max_tokens=6, ignore_eos=True)
    runner = AsyncEngine(engine).start()

    async def one(i: int, p: list[int]) -> list[int]:
        toks = []
        async for out in runner.generate(p, SamplingParams(6, ignore_eos=True),
                                         request_id=f"r{i}"):
            toks += out.new_token_ids
        return toks

    async def main():
        with pytest.raises(RequestError):
            async for _ in runner.generate([], SamplingParams(2), request_id="bad"):
                pass
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))

    try:
        got = asyncio.run(main())
    finally:
        runner.stop()
    assert got == [c.token_ids for c in want]
    assert engine.kv.num_free_blocks == 128


def test_reported_queue_counts_only_prefill_still_to_do():
    engine = Engine.from_pretrained("tiny", block_size=BS, num_blocks=64)
    prompt = list(range(10, 50))  # 40 tokens: 10 full blocks
    engine.generate([prompt], max_tokens=1)
    engine.add_request(prompt + [1, 2, 3], SamplingParams(1))  # 40 of 43 tokens cached
    engine.add_request([7] * 9, SamplingParams(1))              # nothing cached
    assert engine.load()["queued_prefill_tokens"] == 3 + 9


def test_a_burst_sharing_a_new_prefix_counts_its_prefill_once():
    # Three requests with one new 40-token prefix arrive together: the first computes it,
    # the others will find it cached when they run, so the queue counts it once. The
    # router must not see the holder of a burst as three times busier than it is.
    engine = Engine.from_pretrained("tiny", block_size=BS, num_blocks=64)
    prefix = list(range(10, 50))
    for tail in ([1, 2, 3], [4, 5, 6], [7, 8, 9]):
        engine.add_request(prefix + tail, SamplingParams(1))
    assert engine.load()["queued_prefill_tokens"] == 43 + 3 + 3
    engine.add_request(list(range(10, 30)) + [9] * 5, SamplingParams(1))  # 20 shared tokens
    assert engine.load()["queued_prefill_tokens"] == 43 + 3 + 3 + 5
    while engine.has_work():
        engine.step()
    assert engine.load()["queued_prefill_tokens"] == 0
    assert not engine.scheduler._promised  # every promise left with its sequence


def test_a_waiting_request_keeps_its_prefix_through_the_admissions_ahead_of_it():
    # P was cached first (older), A after it: LRU would evict P first. X, queued ahead of
    # R (which hits P), needs more blocks than are empty; R's place in the queue keeps P
    # warm, so X evicts A and R still hits all of P.
    engine = Engine.from_pretrained("tiny", block_size=BS, num_blocks=24)
    p_prompt, a_prompt = list(range(10, 50)), list(range(60, 100))
    engine.generate([p_prompt + [1]], max_tokens=1)
    engine.generate([a_prompt + [2]], max_tokens=1)
    x = [7] * 35
    got = engine.generate([x, p_prompt + [3]], max_tokens=1)
    assert got[1].num_cached_tokens == 40
    again = engine.generate([a_prompt + [4]], max_tokens=1)
    assert again[0].num_cached_tokens < 40  # A paid for X's blocks instead


def test_the_reported_free_empty_blocks_are_the_free_blocks_without_a_hash():
    engine = Engine.from_pretrained("tiny", block_size=BS, num_blocks=64)
    assert engine.load()["free_empty_blocks"] == 64
    engine.generate([list(range(10, 50)) + [1]], max_tokens=2)  # 10 full blocks stay cached
    load = engine.load()
    assert load["free_blocks"] == 64 and load["free_empty_blocks"] == 54


def test_an_empty_lora_is_no_lora_as_on_the_wire():
    """Engine(lora=("", "")) hashes like no LoRA, as the worker and service read the message
    (kvmesh.hashing.lora_key): a library user and the index agree on the blocks."""
    engine = Engine.from_pretrained("tiny", block_size=BS, num_blocks=32)
    prompt = list(range(3, 16))
    engine.generate([prompt], max_tokens=1)
    [again] = engine.generate([prompt], max_tokens=1, lora=("", ""))
    assert again.num_cached_tokens == 12
    [named] = engine.generate([prompt], max_tokens=1, lora=("adapter", ""))
    assert named.num_cached_tokens == 0


def test_tier_arguments_one_by_one_are_the_same_as_a_tier_config(tmp_path):
    """The engine's own tier arguments (its API before ``TierConfig``) still work, and
    override a given ``TierConfig`` field by field."""
    from worker.kv_cache.tier_config import TierConfig

    prompt = list(range(1, 41))
    whole = Engine.from_pretrained("tiny", block_size=4, num_blocks=64,
                                   tiers=TierConfig(cpu_blocks=16))
    single = Engine.from_pretrained("tiny", block_size=4, num_blocks=64, cpu_blocks=16)
    mixed = Engine.from_pretrained("tiny", block_size=4, num_blocks=64,
                                   tiers=TierConfig(cpu_blocks=4), cpu_blocks=16)
    outs = [e.generate([prompt], max_tokens=4)[0].token_ids for e in (whole, single, mixed)]
    assert outs[0] == outs[1] == outs[2]
    assert [e.kv.tier_stats()["cpu"].capacity_blocks for e in (whole, single, mixed)] == [16] * 3
    with pytest.raises(ValueError, match="--disk-dir"):
        Engine.from_pretrained("tiny", block_size=4, num_blocks=64, cpu_blocks=4, disk_blocks=4)
    for e in (whole, single, mixed):
        e.close()
