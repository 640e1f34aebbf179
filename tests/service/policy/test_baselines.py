"""The baseline policies: prefix_only, least_loaded, round_robin, random; and the contract
every policy keeps (all workers returned, matched tokens as credited)."""
from __future__ import annotations

import random
from collections import Counter

from service.policy import (
    LeastLoadedPolicy,
    PrefixOnlyPolicy,
    RandomPolicy,
    RoundRobinPolicy,
    make_policies,
)

from .views import ids, view


def test_prefix_only_ignores_load() -> None:
    ranked = PrefixOnlyPolicy().rank(
        1000, [view("a", 10), view("b", 50, queued_prefill_tokens=10**6)], random.Random(0))
    assert ids(ranked) == ["b", "a"] and ranked[0].cost == 200.0


def test_least_loaded_counts_requests_then_queued_tokens() -> None:
    ranked = LeastLoadedPolicy().rank(100, [
        view("a", 50, running=3), view("b", running=1, waiting=1, queued_prefill_tokens=900),
        view("c", running=2, queued_prefill_tokens=10)], random.Random(0))
    assert ids(ranked) == ["c", "b", "a"] and ranked[0].cost == 2.0


def test_round_robin_rotates_through_all() -> None:
    p = RoundRobinPolicy()
    workers = [view("c"), view("a"), view("b")]
    firsts = [ids(p.rank(10, workers, random.Random(0))) for _ in range(4)]
    assert firsts == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert p.rank(10, [], random.Random(0)) == []


def test_random_is_a_uniform_permutation() -> None:
    rng = random.Random(3)
    workers = [view(w) for w in "abc"]
    orders = Counter(tuple(ids(RandomPolicy().rank(10, workers, rng))) for _ in range(600))
    assert len(orders) == 6 and min(orders.values()) > 60


def test_every_policy_returns_every_worker() -> None:
    workers = [view("a", 3), view("b"), view("c", 1, running=4)]
    for name, policy in make_policies().items():
        ranked = policy.rank(64, workers, random.Random(1), key=b"k" * 16)
        assert sorted(ids(ranked)) == ["a", "b", "c"], name
        assert all(r.matched_tokens == r.view.match.blocks * 16 for r in ranked)
        assert policy.rank(64, [], random.Random(1)) == [], name
