"""Unit tests of every routing policy (pure functions of the worker views)."""
from __future__ import annotations

import random
from collections import Counter

from service.config import CostWeights
from service.index.base import BlockMatch, WorkerLoad
from service.policy import (
    KvmeshPolicy,
    LeastLoadedPolicy,
    PrefixOnlyPolicy,
    RandomPolicy,
    RoundRobinPolicy,
    WorkerView,
    make_policies,
)


def view(wid: str, blocks: int = 0, cpu: int = 0, bs: int = 16, **load: int) -> WorkerView:
    return WorkerView(wid, f"{wid}:1", WorkerLoad(**load),
                      BlockMatch(blocks, blocks - cpu, cpu, 0), bs)


def ids(ranked: list) -> list[str]:
    return [r.view.worker_id for r in ranked]


def test_kvmesh_prefers_the_longest_prefix_when_idle() -> None:
    ranked = KvmeshPolicy().rank(1000, [view("a", 10), view("b", 50), view("c")],
                                 random.Random(0))
    assert ids(ranked) == ["b", "a", "c"]
    assert ranked[0].matched_tokens == 800 and ranked[0].cost == 2.0 * 200  # prefill_weight 2


def test_kvmesh_weighs_queued_prefill_and_decode_load() -> None:
    busy = view("busy", 50, queued_prefill_tokens=5000)     # holds 800 tokens, 5000 queued
    idle = view("idle", 0)
    assert ids(KvmeshPolicy().rank(1000, [busy, idle], random.Random(0))) == ["idle", "busy"]
    decoding = view("dec", 50, decode_tokens=20000, running=10)
    cost = KvmeshPolicy().cost(1000, decoding)
    assert cost == 2.0 * 200 + 0.1 * 20000 + 16.0 * 10
    w = CostWeights(decode_weight=0.0, running_weight=0.0)
    assert ids(KvmeshPolicy(w).rank(1000, [decoding, idle], random.Random(0)))[0] == "dec"


def test_kvmesh_gives_cpu_matches_partial_credit() -> None:
    gpu, cpu = view("gpu", 40), view("cpu", 60, cpu=60)
    p = KvmeshPolicy(CostWeights(cpu_credit=0.5))
    assert p.credited_tokens(cpu) == 480 and p.credited_tokens(gpu) == 640
    assert ids(p.rank(1000, [cpu, gpu], random.Random(0))) == ["gpu", "cpu"]
    assert ids(KvmeshPolicy(CostWeights(cpu_credit=1.0)).rank(
        1000, [cpu, gpu], random.Random(0))) == ["cpu", "gpu"]


def test_kvmesh_free_block_guard_skips_full_workers_unless_all_are() -> None:
    full = view("full", 50, free_blocks=2, total_blocks=100)    # needs 63 - 50 = 13 blocks
    roomy = view("roomy", 0, free_blocks=100, total_blocks=100)
    assert ids(KvmeshPolicy().rank(1000, [full, roomy], random.Random(0))) == ["roomy", "full"]
    alone = KvmeshPolicy().rank(1000, [full], random.Random(0))
    assert ids(alone) == ["full"]                                # still a candidate
    no_guard = KvmeshPolicy(CostWeights(free_block_guard=False))
    assert ids(no_guard.rank(1000, [full, roomy], random.Random(0)))[0] == "full"
    unknown = view("unknown", 50)                                # reports no capacity
    assert KvmeshPolicy().fits(1000, unknown)


def test_kvmesh_free_block_guard_does_not_count_free_hits_as_room() -> None:
    # An idle worker: its 30 cached hit blocks are free, so they are among its 40 free
    # blocks. Admitting a 63-block prompt takes the 30 hits AND 33 new blocks off the
    # free queue: 63 > 40, it cannot hold it (the old guard saw 40 >= 63 - 30 and said yes).
    idle = view("idle", 30, free_blocks=40, total_blocks=40)
    assert not KvmeshPolicy().fits(1000, idle)
    cold = view("cold", 0, free_blocks=70, total_blocks=100)
    assert ids(KvmeshPolicy().rank(1000, [idle, cold], random.Random(0))) == ["cold", "idle"]
    # room for the new blocks besides the hits: it fits and its prefix wins
    roomy = view("roomy", 30, free_blocks=63, total_blocks=100)
    assert KvmeshPolicy().fits(1000, roomy)
    assert ids(KvmeshPolicy().rank(1000, [roomy, cold], random.Random(0))) == ["roomy", "cold"]
    whole = view("whole", 63, free_blocks=10, total_blocks=100)  # fully cached prompt
    assert KvmeshPolicy().fits(1000, whole)


def test_kvmesh_breaks_ties_at_random() -> None:
    workers = [view(w) for w in "abcd"]
    rng = random.Random(7)
    firsts = Counter(ids(KvmeshPolicy().rank(100, workers, rng))[0] for _ in range(400))
    assert set(firsts) == set("abcd") and min(firsts.values()) > 50


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
        ranked = policy.rank(64, workers, random.Random(1))
        assert sorted(ids(ranked)) == ["a", "b", "c"], name
        assert all(r.matched_tokens == r.view.match.blocks * 16 for r in ranked)
