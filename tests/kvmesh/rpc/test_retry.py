"""The shared failover pieces of ``kvmesh.rpc.retry``: ``Backoff`` (bounds, growth, cap,
jitter) and ``ReplicaRing`` rotation on failure."""
from __future__ import annotations

import random

import pytest

from kvmesh.rpc.retry import Backoff, ReplicaRing


def test_backoff_grows_to_its_cap_within_bounds_and_resets() -> None:
    backoff = Backoff(base=0.1, cap=1.0, rand=random.Random(7))
    ceilings = []
    for _ in range(8):
        ceiling = backoff.ceiling
        wait = backoff.next()
        assert 0.0 <= wait <= ceiling
        ceilings.append(ceiling)
    assert ceilings == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 1.0])
    backoff.reset()
    assert backoff.ceiling == 0.1 and backoff.next() <= 0.1


def test_backoff_jitter_is_full_and_seeded() -> None:
    waits = [Backoff(base=1.0, cap=1.0, rand=random.Random(3)).next() for _ in range(3)]
    assert len(set(waits)) == 1  # the same seed, the same draw
    spread = Backoff(base=1.0, cap=1.0, rand=random.Random(5))
    draws = [spread.next() for _ in range(200)]
    assert min(draws) < 0.1 and max(draws) > 0.9  # full jitter: anywhere in [0, ceiling]


def test_backoff_refuses_nonsense() -> None:
    for kwargs in ({"base": 0}, {"base": 2.0, "cap": 1.0}, {"factor": 0.5}):
        with pytest.raises(ValueError):
            Backoff(**kwargs)


def test_ring_moves_past_a_failed_current_replica_only() -> None:
    ring = ReplicaRing(["a", "b", "c"])
    ring.mark_failed("a")
    assert ring.current == "b" and ring.order() == ["b", "c", "a"]
    ring.mark_failed("a")  # a stale report (the other task already moved): nothing changes
    assert ring.current == "b"
    ring.mark_failed("b")
    ring.mark_failed("c")
    assert ring.current == "a"
    with pytest.raises(ValueError):
        ReplicaRing([])
