"""Routing policies: rank the live workers of one request, best first.

Interface: ``Policy.rank(prompt_tokens, workers, rng) -> list[Ranked]``. Every policy returns
EVERY worker it was given (callers fail over down the list) with a ``cost`` (lower is better;
its unit depends on the policy) and the matched tokens it credited. Ties are broken with
``rng`` so that a miss never lands on the same replica every time. Policies are pure apart
from ``round_robin``'s counter; the service keeps one instance per replica.

- ``kvmesh``: the cost model of :class:`service.config.CostWeights`, with a free-block guard.
- ``prefix_only``: the longest match wins (tokens to prefill, load ignored).
- ``least_loaded``: fewest requests (running + waiting), then fewest queued prefill tokens.
- ``round_robin``: workers in id order, rotating by one per call.
- ``random``: a uniform shuffle.
"""
from __future__ import annotations

import abc
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from service.config import CostWeights
from service.credits import tier_credits
from service.index.base import BlockMatch, WorkerLoad


@dataclass(frozen=True, slots=True)
class WorkerView:
    """What a policy sees of one live worker for one request."""

    worker_id: str
    address: str = ""
    load: WorkerLoad = field(default_factory=WorkerLoad)
    match: BlockMatch = field(default_factory=BlockMatch)
    block_size: int = 16
    ns: str = ""

    @property
    def matched_tokens(self) -> int:
        return self.match.blocks * self.block_size

    @property
    def matched_tokens_by_tier(self) -> dict[str, int]:
        """``matched_tokens`` split by the tier holding each block."""
        m, bs = self.match, self.block_size
        return {"gpu": m.gpu * bs, "cpu": m.cpu * bs, "disk": m.disk * bs}


@dataclass(frozen=True, slots=True)
class Ranked:
    view: WorkerView
    cost: float
    matched_tokens: int


class Policy(abc.ABC):
    """Ranks workers for one request; see the module docstring for the contract."""

    name: ClassVar[str]

    @abc.abstractmethod
    def rank(self, prompt_tokens: int, workers: Sequence[WorkerView],
             rng: random.Random) -> list[Ranked]:
        """All of ``workers``, best first."""


class KvmeshPolicy(Policy):
    """Minimum estimated work: uncached prefill + queued prefill + decode load. A CPU/disk
    match counts as the share of its tokens that onboarding saves on that worker
    (``service.credits``: measured, else configured).

    A worker whose free blocks (when it reports ``total_blocks``) cannot hold the request's
    uncached blocks ranks after all workers that can.
    """

    name = "kvmesh"

    def __init__(self, weights: CostWeights | None = None) -> None:
        self.w = weights or CostWeights()

    def credited_tokens(self, v: WorkerView) -> float:
        """Matched tokens less what onboarding the lower-tier ones costs on ``v``
        (``service.credits``)."""
        m, bs = v.match, v.block_size
        credit = tier_credits(self.w, v.load, bs)
        return bs * (m.gpu + credit.cpu * m.cpu + credit.disk * m.disk)

    def cost(self, prompt_tokens: int, v: WorkerView) -> float:
        w, load = self.w, v.load
        prefill = max(prompt_tokens - self.credited_tokens(v), 0.0)
        return (w.prefill_weight * prefill + w.queue_weight * load.queued_prefill_tokens
                + w.decode_weight * load.decode_tokens + w.running_weight * load.running)

    def fits(self, prompt_tokens: int, v: WorkerView) -> bool:
        """Whether ``v`` can admit the request now: its free blocks, less the request's own
        cache hits that may be among them, cover the blocks it must allocate.

        A worker's free count includes its cached blocks that no request holds; admitting
        the request takes its free hits off the free queue too, so they are no room for
        its new blocks (counting them as room credits each free hit twice). The load report
        does not say which hits are free, so up to ``min(hits, free)`` of them are assumed
        to be: a worker that fits can admit the request without waiting. (Hits held by
        running requests are thereby under-credited, which only demotes a nearly full
        worker behind one with room.)
        """
        if not self.w.free_block_guard or v.load.total_blocks == 0:
            return True  # no capacity reported: nothing to guard
        hits, free = v.match.gpu, v.load.free_blocks
        needed = math.ceil(prompt_tokens / v.block_size) - hits
        return free - min(hits, free) >= needed

    def rank(self, prompt_tokens: int, workers: Sequence[WorkerView],
             rng: random.Random) -> list[Ranked]:
        keyed = [(not self.fits(prompt_tokens, v), self.cost(prompt_tokens, v), rng.random(), v)
                 for v in workers]
        keyed.sort(key=lambda k: k[:3])
        return [Ranked(v, cost, v.matched_tokens) for _, cost, _, v in keyed]


class PrefixOnlyPolicy(Policy):
    """Longest cached prefix wins; cost = tokens left to prefill."""

    name = "prefix_only"

    def rank(self, prompt_tokens: int, workers: Sequence[WorkerView],
             rng: random.Random) -> list[Ranked]:
        keyed = sorted(((prompt_tokens - v.matched_tokens, rng.random(), v) for v in workers),
                       key=lambda k: k[:2])
        return [Ranked(v, float(cost), v.matched_tokens) for cost, _, v in keyed]


class LeastLoadedPolicy(Policy):
    """Fewest requests in flight (running + waiting), then fewest queued prefill tokens."""

    name = "least_loaded"

    def rank(self, prompt_tokens: int, workers: Sequence[WorkerView],
             rng: random.Random) -> list[Ranked]:
        keyed = sorted(((v.load.running + v.load.waiting, v.load.queued_prefill_tokens,
                         rng.random(), v) for v in workers), key=lambda k: k[:3])
        return [Ranked(v, float(reqs), v.matched_tokens) for reqs, _, _, v in keyed]


class RoundRobinPolicy(Policy):
    """Workers sorted by id, rotated by one position per call (per service replica)."""

    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def rank(self, prompt_tokens: int, workers: Sequence[WorkerView],
             rng: random.Random) -> list[Ranked]:
        if not workers:
            return []
        ordered = sorted(workers, key=lambda v: v.worker_id)
        k = self._next % len(ordered)
        self._next += 1
        rotated = ordered[k:] + ordered[:k]
        return [Ranked(v, float(i), v.matched_tokens) for i, v in enumerate(rotated)]


class RandomPolicy(Policy):
    """A uniformly random order."""

    name = "random"

    def rank(self, prompt_tokens: int, workers: Sequence[WorkerView],
             rng: random.Random) -> list[Ranked]:
        order = list(workers)
        rng.shuffle(order)
        return [Ranked(v, float(i), v.matched_tokens) for i, v in enumerate(order)]


def make_policies(weights: CostWeights | None = None) -> dict[str, Policy]:
    """One instance of every policy, by name."""
    policies: list[Policy] = [KvmeshPolicy(weights), PrefixOnlyPolicy(), LeastLoadedPolicy(),
                              RoundRobinPolicy(), RandomPolicy()]
    return {p.name: p for p in policies}
