"""``KvmeshPolicy.terms``: the cost's terms by name, whose sum is ``cost`` to the bit."""
from __future__ import annotations

import random

from service.config import CostWeights
from service.policy import KvmeshPolicy, room

from .views import view


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
