"""The simple policies kvmesh is measured against (and falls back on when the index is down).

- ``prefix_only``: the longest match wins (tokens to prefill, load ignored).
- ``least_loaded``: fewest requests (running + waiting), then fewest queued prefill tokens.
- ``round_robin``: workers in id order, rotating by one per call.
- ``random``: a uniform shuffle.
"""
from __future__ import annotations

import random
from collections.abc import Sequence

from kvmesh.contract import LEAST_LOADED, PREFIX_ONLY, RANDOM, ROUND_ROBIN
from service.policy.base import Policy, Ranked, WorkerView


class PrefixOnlyPolicy(Policy):
    """Longest cached prefix wins; cost = tokens left to prefill."""

    name = PREFIX_ONLY

    def rank(self, prompt_tokens: int, workers: Sequence[WorkerView],
             rng: random.Random, key: bytes = b"") -> list[Ranked]:
        keyed = sorted(((prompt_tokens - v.matched_tokens, rng.random(), v) for v in workers),
                       key=lambda k: k[:2])
        return [Ranked(v, float(cost), v.matched_tokens) for cost, _, v in keyed]


class LeastLoadedPolicy(Policy):
    """Fewest requests in flight (running + waiting), then fewest queued prefill tokens."""

    name = LEAST_LOADED

    def rank(self, prompt_tokens: int, workers: Sequence[WorkerView],
             rng: random.Random, key: bytes = b"") -> list[Ranked]:
        keyed = sorted(((v.load.running + v.load.waiting, v.load.queued_prefill_tokens,
                         rng.random(), v) for v in workers), key=lambda k: k[:3])
        return [Ranked(v, float(reqs), v.matched_tokens) for reqs, _, _, v in keyed]


class RoundRobinPolicy(Policy):
    """Workers sorted by id, rotated by one position per call (per service replica)."""

    name = ROUND_ROBIN

    def __init__(self) -> None:
        self._next = 0

    def rank(self, prompt_tokens: int, workers: Sequence[WorkerView],
             rng: random.Random, key: bytes = b"") -> list[Ranked]:
        if not workers:
            return []
        ordered = sorted(workers, key=lambda v: v.worker_id)
        k = self._next % len(ordered)
        self._next += 1
        rotated = ordered[k:] + ordered[:k]
        return [Ranked(v, float(i), v.matched_tokens) for i, v in enumerate(rotated)]


class RandomPolicy(Policy):
    """A uniformly random order."""

    name = RANDOM

    def rank(self, prompt_tokens: int, workers: Sequence[WorkerView],
             rng: random.Random, key: bytes = b"") -> list[Ranked]:
        order = list(workers)
        rng.shuffle(order)
        return [Ranked(v, float(i), v.matched_tokens) for i, v in enumerate(order)]
