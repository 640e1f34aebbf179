"""consistent_hash: a stable ring with virtual nodes, an even spread, minimal moves when a
worker leaves, bounded loads, every worker returned."""
from __future__ import annotations

import math
import os
import random
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import xxhash

from service.policy import ConsistentHashPolicy, make_policies
from service.route_steps import KEY_TOKENS, prompt_key

from .views import ids, view

WORKERS = [f"w{i}" for i in range(8)]


def keys(n: int, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(16) for _ in range(n)]


def home(policy: ConsistentHashPolicy, key: bytes, workers: list[str] = WORKERS) -> str:
    return ids(policy.rank(100, [view(w) for w in workers], random.Random(0), key=key))[0]


def test_same_key_same_worker_across_calls_and_instances() -> None:
    a, b = ConsistentHashPolicy(), ConsistentHashPolicy()
    rng = random.Random(0)
    for key in keys(50):
        first = ids(a.rank(10, [view(w) for w in WORKERS], rng, key=key))
        # the order of the views and the rng never matter
        shuffled = [view(w) for w in reversed(WORKERS)]
        assert ids(a.rank(10, shuffled, random.Random(7), key=key)) == first
        assert ids(b.rank(10, [view(w) for w in WORKERS], rng, key=key)) == first


CHILD = """
import random
from service.policy import ConsistentHashPolicy
from service.policy.base import WorkerView
from service.route_steps import prompt_key
key = prompt_key(list(range(300)), "tenant", ("sql", "/a"))
ws = [WorkerView(f"w{i}") for i in range(8)]
print(key.hex(), [r.view.worker_id for r in ConsistentHashPolicy().rank(1, ws,
      random.Random(0), key=key)])
"""


@pytest.mark.slow
def test_keys_and_rings_are_the_same_in_every_process() -> None:
    """No Python ``hash()`` (randomized per process) anywhere: two interpreters with
    different hash seeds agree."""
    out = {subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          check=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout
           for seed in ("1", "2")}
    assert len(out) == 1
    key = prompt_key(list(range(300)), "tenant", ("sql", "/a"))
    order = ids(ConsistentHashPolicy().rank(1, [view(w) for w in WORKERS], random.Random(0),
                                            key=key))
    assert out == {f"{key.hex()} {order}\n"}


def test_the_order_is_the_ring_walked_clockwise() -> None:
    """Against a plain walk: every (point, worker) sorted, from the key's point onward
    (wrapping at 2**64), each worker where its first point is met."""
    ring = sorted((xxhash.xxh3_64_intdigest(f"{w}#{i}".encode()), w)
                  for w in WORKERS for i in range(160))
    p = ConsistentHashPolicy()
    for key in keys(50, seed=4):
        at = xxhash.xxh3_64_intdigest(key)
        walk = [w for pt, w in ring if pt >= at] + [w for pt, w in ring if pt < at]
        expected = list(dict.fromkeys(walk))
        assert ids(p.rank(10, [view(w) for w in WORKERS], random.Random(0), key=key)) == expected


def test_the_ring_is_pinned() -> None:
    """A change of the key or the ring's derivation moves every prefix to another worker
    (and splits them between service replicas of two versions during an upgrade): change
    these values only on purpose."""
    key = prompt_key(list(range(300)), "tenant", ("sql", "/a"))
    assert key.hex() == "3ca3d7ed6d9153e114edad6a3a97dac0"
    order = ids(ConsistentHashPolicy().rank(1, [view(w) for w in WORKERS], random.Random(0),
                                            key=key))
    assert order == ["w4", "w7", "w6", "w5", "w3", "w1", "w0", "w2"]


def test_keys_spread_evenly() -> None:
    p = ConsistentHashPolicy()
    counts = Counter(home(p, k) for k in keys(4000))
    mean = 4000 / len(WORKERS)
    assert set(counts) == set(WORKERS)
    assert all(abs(c - mean) <= 0.25 * mean for c in counts.values()), counts


@pytest.mark.slow
def test_removing_a_worker_moves_only_its_keys() -> None:
    p = ConsistentHashPolicy()
    ks = keys(4000, seed=1)
    before = {k: home(p, k) for k in ks}
    after = {k: home(p, k, [w for w in WORKERS if w != "w3"]) for k in ks}
    moved = [k for k in ks if before[k] != after[k]]
    assert all(before[k] == "w3" for k in moved)          # nobody else's key moved
    assert len(moved) == sum(w == "w3" for w in before.values())
    assert abs(len(moved) / len(ks) - 1 / len(WORKERS)) < 0.04  # about 1/n
    # and a worker joining takes keys from the others, never reshuffles them
    back = {k: home(p, k) for k in ks}
    assert back == before


def test_a_full_worker_is_skipped_to_the_next_on_the_ring() -> None:
    p = ConsistentHashPolicy(balance=1.25)
    key = keys(1)[0]
    ring_order = ids(p.rank(10, [view(w) for w in WORKERS], random.Random(0), key=key))
    owner, successor = ring_order[0], ring_order[1]
    # 8 in flight: the bound is ceil(1.25 * 9 / 8) = 2; the owner holds 2: full
    loads = {w: 1 for w in WORKERS}
    loads[owner], loads[ring_order[-1]] = 2, 0
    views = [view(w, running=loads[w]) for w in WORKERS]
    ranked = ids(p.rank(10, views, random.Random(0), key=key))
    assert ranked[0] == successor and ranked[-1] == owner
    assert ranked[:-1] == [w for w in ring_order if w != owner]  # ring order otherwise
    # one below the bound, the owner keeps its key
    loads[owner], loads[ring_order[-1]] = 1, 1
    views = [view(w, waiting=loads[w]) for w in WORKERS]
    assert ids(p.rank(10, views, random.Random(0), key=key)) == ring_order
    # no bound: the owner keeps it at any load
    hot = [view(w, running=50 if w == owner else 0) for w in WORKERS]
    assert ids(ConsistentHashPolicy(balance=math.inf).rank(10, hot, random.Random(0),
                                                          key=key))[0] == owner


def test_one_hot_key_spills_to_its_successors_within_the_bound() -> None:
    """Every request has the same key, placed one after another on the loads the earlier
    ones left: no worker ever holds more than ceil(c * m / n) with m requests in flight, and
    the spill goes down the key's ring order (the owner holds the most, then its successor,
    ...), never all over the cluster: with c = 1.25, about n / c workers take it."""
    p = ConsistentHashPolicy(balance=1.25)
    key = keys(1)[0]
    ring_order = ids(p.rank(10, [view(w) for w in WORKERS], random.Random(0), key=key))
    load = dict.fromkeys(WORKERS, 0)
    for m in range(1, 401):
        views = [view(w, running=load[w]) for w in WORKERS]
        load[ids(p.rank(10, views, random.Random(0), key=key))[0]] += 1
        assert max(load.values()) <= math.ceil(1.25 * m / len(WORKERS))
    along = [load[w] for w in ring_order]
    assert along == sorted(along, reverse=True), along
    assert along[0] == math.ceil(1.25 * 400 / 8) and along[-1] == 0, along


def test_every_worker_returned_with_its_position_and_match() -> None:
    p = ConsistentHashPolicy()
    views = [view("a", 3), view("b"), view("c", 1, running=40), view("a", 2)]  # "a" twice
    ranked = p.rank(64, views, random.Random(0), key=b"some key")
    assert sorted(ids(ranked)) == ["a", "a", "b", "c"]
    assert [r.cost for r in ranked] == [0.0, 1.0, 2.0, 3.0]
    assert ids(ranked)[-1] == "c"  # over the bound of ceil(1.25 * 41 / 3) = 18
    assert all(r.matched_tokens == r.view.match.blocks * 16 for r in ranked)
    assert p.rank(64, [], random.Random(0), key=b"k") == []


def test_empty_key_is_one_stable_order() -> None:
    p = ConsistentHashPolicy()
    orders = {tuple(ids(p.rank(10, [view(w) for w in WORKERS], random.Random(s))))
              for s in range(5)}
    assert len(orders) == 1 and sorted(next(iter(orders))) == WORKERS


def test_the_ring_is_built_once_per_set_of_workers() -> None:
    p = ConsistentHashPolicy()
    first = p.ring(frozenset(WORKERS))
    p.rank(10, [view(w) for w in reversed(WORKERS)], random.Random(0), key=b"k")
    assert p.ring(frozenset(WORKERS)) is first
    assert first.points.shape == (len(WORKERS), 160)
    assert p.ring(frozenset(WORKERS[:3])) is not first


def test_bad_parameters_are_refused() -> None:
    for kw in ({"balance": 0.9}, {"balance": math.nan}, {"vnodes": 0}):
        with pytest.raises(ValueError):
            ConsistentHashPolicy(**kw)  # type: ignore[arg-type]


def test_the_prompt_key_is_the_salt_lora_and_first_tokens() -> None:
    p = list(range(KEY_TOKENS + 50))
    base = prompt_key(p, None, None)
    assert prompt_key(p[:KEY_TOKENS] + [9] * 900, None, None) == base    # the tail is not key
    assert prompt_key(p[:KEY_TOKENS - 1] + [0], None, None) != base      # the head is
    assert prompt_key(p, "", None) == base                                # "" is no salt
    assert len({base, prompt_key(p, "t1", None), prompt_key(p, "t2", None),
                prompt_key(p, None, ("sql", "/a")), prompt_key(p, "sql", None)}) == 5
    assert prompt_key(p, None, ("sql", "/a")) == prompt_key(p, None, ("sql", "/b"))  # name
    for dtype in (np.uint32, np.uint64):  # the array type never matters
        assert prompt_key(np.asarray(p, dtype=dtype), None, None) == base


def test_only_consistent_hash_reads_the_key() -> None:
    assert [n for n, p in make_policies().items() if p.reads_key] == ["consistent_hash"]
