"""The ``kvmesh`` cost model (``service.policy.cost``), term by term: prefill, queue, decode,
lower-tier credit, the wait for room, and the saturation rule."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from service.config import CostWeights
from service.policy import KvmeshPolicy, room

from .views import ids, view


def rank(workers: list, prompt: int = 1000, weights: CostWeights | None = None) -> list[str]:
    return ids(KvmeshPolicy(weights).rank(prompt, workers, random.Random(0)))


def test_prefers_the_longest_prefix_when_idle() -> None:
    ranked = KvmeshPolicy().rank(1000, [view("a", 10), view("b", 50), view("c")],
                                 random.Random(0))
    assert ids(ranked) == ["b", "a", "c"]
    assert ranked[0].matched_tokens == 800 and ranked[0].cost == 2.0 * 200  # prefill_weight 2


def test_weighs_queued_prefill_and_decode_load() -> None:
    busy = view("busy", 50, queued_prefill_tokens=5000)     # holds 800 tokens, 5000 queued
    idle = view("idle", 0)
    assert rank([busy, idle]) == ["idle", "busy"]
    decoding = view("dec", 50, decode_tokens=20000, running=10)
    assert KvmeshPolicy().cost(1000, decoding) == 2.0 * 200 + 0.1 * 20000 + 16.0 * 10
    w = CostWeights(decode_weight=0.0, running_weight=0.0)
    assert rank([decoding, idle], weights=w)[0] == "dec"


def test_gives_cpu_matches_partial_credit() -> None:
    gpu, cpu = view("gpu", 40), view("cpu", 60, cpu=60)
    p = KvmeshPolicy(CostWeights(cpu_credit=0.5))
    assert p.credited_tokens(cpu) == 480 and p.credited_tokens(gpu) == 640
    assert ids(p.rank(1000, [cpu, gpu], random.Random(0))) == ["gpu", "cpu"]
    assert rank([cpu, gpu], weights=CostWeights(cpu_credit=1.0)) == ["cpu", "gpu"]


def test_a_holder_short_of_room_waits_instead_of_being_dropped() -> None:
    # The holder has 2 free blocks for the 13 it needs: 11 blocks to wait for cost 11 * 16
    # tokens, far less than recomputing 800 matched tokens on the roomy worker.
    full = view("full", 50, free_blocks=2, free_empty_blocks=2, total_blocks=100)
    roomy = view("roomy", 0, free_blocks=100, free_empty_blocks=100, total_blocks=100)
    p = KvmeshPolicy(CostWeights(evict_weight=0))  # the wait alone
    assert p.cost(1000, full) == 2.0 * 200 + 11 * 16
    assert rank([full, roomy]) == ["full", "roomy"]
    # with a small hit, waiting costs more than the recompute it saves
    short = view("short", 2, free_blocks=0, total_blocks=100)
    assert rank([short, roomy]) == ["roomy", "short"]
    # the wait term off: room no longer matters
    off = CostWeights(wait_weight=0, evict_weight=0)
    assert KvmeshPolicy(off).cost(1000, short) == 2.0 * 968


def test_a_full_pool_pays_for_the_cached_blocks_it_evicts() -> None:
    # Both workers idle and cold for this prompt; one has 63 empty free blocks, the other's
    # free blocks all hold other prefixes: admitting the 63 new blocks there evicts them.
    empty = view("empty", 0, free_blocks=100, free_empty_blocks=63, total_blocks=100)
    full = view("full", 0, free_blocks=100, free_empty_blocks=0, total_blocks=100)
    p = KvmeshPolicy()
    assert p.terms(1000, full)["evict"] == 63 * 16 and p.terms(1000, empty)["evict"] == 0
    assert rank([full, empty]) == ["empty", "full"]
    # a holder needs few new blocks: it evicts little even in a full pool, so moving its
    # tenant to the cold worker costs the recompute AND the evictions there
    holder = view("holder", 60, queued_prefill_tokens=5000, free_blocks=100,
                  total_blocks=100)
    cold = view("cold", 0, free_blocks=100, total_blocks=100)
    assert rank([holder, cold]) == ["holder", "cold"]
    assert rank([holder, cold], weights=CostWeights(evict_weight=0)) == ["cold", "holder"]


def test_a_pool_smaller_than_the_prompt_ranks_last_even_with_the_prefix() -> None:
    tiny = view("tiny", 30, free_blocks=40, total_blocks=40)   # 63 blocks never fit in 40
    cold = view("cold", 0, queued_prefill_tokens=50_000, free_blocks=70, total_blocks=100)
    assert rank([tiny, cold]) == ["cold", "tiny"]
    assert rank([tiny]) == ["tiny"]                           # still a candidate


def test_an_idle_worker_takes_a_busy_holders_request() -> None:
    # Below saturation the trade is queueing vs recomputing: 6,000 queued tokens on the
    # holder outweigh recomputing 1,000 tokens on an idle worker.
    holder = view("holder", 62, queued_prefill_tokens=6000)
    idle = view("idle", 0)
    assert rank([holder, idle]) == ["idle", "holder"]


def test_at_saturation_the_holder_keeps_its_prefix() -> None:
    # Every worker has a backlog: the fleet's floor (4,000 tokens) is charged to each token
    # recomputed, so the cold worker now costs 2*1000 + 4000 + 0.5*4000 against the
    # holder's 2*8 + 4000*8/1000 + 0.5*12000.
    holder = view("holder", 62, queued_prefill_tokens=12_000)
    cold = view("cold", 0, queued_prefill_tokens=4000)
    p = KvmeshPolicy()
    assert p.backlog([holder, cold]) == 4000
    assert p.cost(1000, cold, 4000) == 2.0 * 1000 + 4000 + 0.5 * 4000
    assert rank([holder, cold]) == ["holder", "cold"]
    assert rank([holder, cold], weights=CostWeights(saturation_weight=0)) == ["cold", "holder"]


def test_at_saturation_a_skewed_holder_still_sheds_load() -> None:
    # The floor is low (the others are nearly idle): the hot holder's 20,000 queued tokens
    # move the request even though every worker has some backlog.
    hot = view("hot", 62, queued_prefill_tokens=20_000)
    others = [view(f"w{i}", 0, queued_prefill_tokens=500) for i in range(3)]
    assert rank([hot, *others])[-1] == "hot"


def test_breaks_ties_at_random() -> None:
    workers = [view(w) for w in "abcd"]
    rng = random.Random(7)
    firsts = Counter(ids(KvmeshPolicy().rank(100, workers, rng))[0] for _ in range(400))
    assert set(firsts) == set("abcd") and min(firsts.values()) > 50


@pytest.mark.parametrize("name", ["prefill_weight", "saturation_weight", "wait_weight"])
def test_a_negative_weight_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match=name):
        CostWeights(**{name: -1.0})


# --- ``KvmeshPolicy.terms``: the cost's terms by name, whose sum is ``cost`` to the bit.

def _cost_as_one_expression(p: KvmeshPolicy, prompt: int, v, backlog: float) -> float:
    """The cost as ``cost`` computed it before it was split into terms (commit 09eda54)."""
    w, load = p.w, v.load
    prefill = max(prompt - p.credited_tokens(v), 0.0)
    share = prefill / prompt if prompt > 0 else 0.0
    wait = room.deficit(prompt, v) * v.block_size if w.wait_weight else 0
    evict = room.evictions(prompt, v) * v.block_size if w.evict_weight else 0
    return (w.prefill_weight * prefill + w.saturation_weight * share * backlog
            + w.queue_weight * load.queued_prefill_tokens
            + w.decode_weight * load.decode_tokens + w.running_weight * load.running
            + w.wait_weight * wait + w.evict_weight * evict)


def test_the_terms_add_up_to_the_cost_exactly() -> None:
    rng = random.Random(3)
    for _ in range(2000):
        weights = CostWeights(prefill_weight=rng.choice((2.0, 1.3)),
                              saturation_weight=rng.choice((0.0, 1.0, 0.7)),
                              wait_weight=rng.choice((0.0, 1.0)),
                              evict_weight=rng.choice((0.0, 0.5, 1.0)), cpu_credit=rng.random())
        p = KvmeshPolicy(weights)
        blocks = rng.randrange(80)
        free = rng.randrange(120)
        v = view("w", blocks, cpu=rng.randrange(blocks + 1), running=rng.randrange(20),
                 queued_prefill_tokens=rng.randrange(20_000),
                 decode_tokens=rng.randrange(50_000), free_blocks=free,
                 free_empty_blocks=rng.randrange(free + 1), total_blocks=120)
        prompt, backlog = rng.randrange(1, 1500), float(rng.randrange(8000))
        terms = p.terms(prompt, v, backlog)
        assert list(terms) == ["prefill", "saturation", "queue", "decode", "running", "wait",
                               "evict"]
        assert p.cost(prompt, v, backlog) == _cost_as_one_expression(p, prompt, v, backlog)


def test_each_term_is_its_line_of_the_model() -> None:
    v = view("w", 50, queued_prefill_tokens=300, decode_tokens=1000, running=2,
             free_blocks=2, free_empty_blocks=2, total_blocks=100)
    t = KvmeshPolicy().terms(1000, v, backlog=500.0)
    assert t == {"prefill": 2.0 * 200, "saturation": 200 / 1000 * 500.0, "queue": 0.5 * 300,
                 "decode": 0.1 * 1000, "running": 16.0 * 2, "wait": 11 * 16, "evict": 11 * 16}
