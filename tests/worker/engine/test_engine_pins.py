"""Pins and layered eviction through the engine: a hot system prompt stays resident under
pressure with automatic pinning (and is evicted without it), explicit and warm pins, and
greedy output unchanged by either."""
from __future__ import annotations

import random

import pytest

from worker import Engine, RequestError
from worker.engine.sequence import SamplingParams, SeqStatus
from worker.kv_cache.tier_config import TierConfig

BS = 4
SYS = list(range(10, 26))  # a 16-token system prompt: 4 blocks


def tiny(num_blocks: int, **tiers) -> Engine:
    return Engine.from_pretrained("tiny", block_size=BS, num_blocks=num_blocks,
                                  tiers=TierConfig(**tiers))


def prompts(n: int, length: int, seed: int, prefix=()) -> list[list[int]]:
    rng = random.Random(seed)
    return [list(prefix) + [rng.randrange(30, 250) for _ in range(length)] for _ in range(n)]


@pytest.mark.parametrize("auto_pin", [True, False])
def test_a_shared_system_prompt_stays_resident_with_auto_pin(auto_pin):
    engine = tiny(40, auto_pin=auto_pin)  # pin cap: 4 blocks
    for p in prompts(9, 3, seed=1, prefix=SYS):  # 1 computes it, 8 hit it: hot
        engine.generate([p], max_tokens=2)
    # Unrelated long prompts: together they need more blocks than the pool has.
    for p in prompts(2, 124, seed=2):
        engine.generate([p], max_tokens=1)
    again = engine.generate(prompts(1, 3, seed=3, prefix=SYS), max_tokens=2)[0]
    if auto_pin:
        assert engine.kv.num_pinned_blocks == 4
        assert again.num_cached_tokens == len(SYS)
    else:
        assert engine.kv.num_pinned_blocks == 0
        assert again.num_cached_tokens == 0
    assert engine.kv.stats.evictions > 0


def test_greedy_output_is_unchanged_by_pins_and_layered_eviction():
    shared = prompts(1, 13, seed=4)[0]
    batch = (prompts(4, 9, seed=5, prefix=shared) + prompts(3, 21, seed=6)
             + prompts(3, 5, seed=7, prefix=shared))
    want = tiny(512).generate(batch, max_tokens=12)
    engine = tiny(30, eviction="layered", auto_pin=True)  # tight: preemption happens
    engine.generate([shared + [1]], max_tokens=1)
    assert engine.pin(shared, ttl_s=600) == 3
    got = engine.generate(batch, max_tokens=12)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    assert engine.scheduler.num_preemptions > 0
    assert engine.kv.num_pinned_blocks >= 3
    # And once more, everything from a warm cache.
    assert [c.token_ids for c in engine.generate(batch, max_tokens=12)] == [
        c.token_ids for c in want]


def test_pins_yield_to_a_request_that_needs_the_whole_pool():
    engine = tiny(20, auto_pin=True)  # cap: 2 blocks
    engine.generate([SYS + [1]], max_tokens=1)
    assert engine.pin(SYS, ttl_s=600) == 2
    big = prompts(1, 70, seed=8)[0]  # 70 + 10 tokens = all 20 blocks
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    seq = engine.add_request(big, params)
    for _ in range(100):  # bounded: a pool pins could starve would loop forever
        if not engine.has_work():
            break
        engine.step()
    assert seq.status is SeqStatus.FINISHED and seq.finish_reason == "length"
    want = tiny(64).generate([big], max_tokens=10, ignore_eos=True)[0]
    assert seq.output_ids == want.token_ids
    assert engine.kv.num_pinned_blocks < 2


def test_pin_by_tokens_or_hashes_unpin_and_warm():
    engine = tiny(40)
    assert engine.pin(SYS, ttl_s=60) == 0  # not held here
    assert engine.pin(SYS, ttl_s=60, warm=True) == 0  # prefilled as a request of its own
    while engine.has_work():
        engine.step()
    engine.step()  # the next step's tick pins it (before anything could evict it)
    assert engine.kv.num_pinned_blocks == 4
    hashes = list(engine.kv.pins._pins)
    assert engine.pin(block_hashes=hashes[:2], ttl_s=60) == 2  # a refresh
    assert engine.unpin(block_hashes=hashes[3:]) == 1
    assert engine.unpin(SYS) == 3
    assert engine.pin(SYS, salt="other", ttl_s=60) == 0  # another chain
    with pytest.raises(RequestError):
        engine.pin(ttl_s=60)
    with pytest.raises(RequestError):
        engine.pin(SYS, ttl_s=0)
    with pytest.raises(RequestError):
        engine.pin(block_hashes=[b"not held"], ttl_s=60, warm=True)  # no tokens to prefill
