"""The ``kvmesh`` policy: the least estimated work, in prefill-token units, term by term.

``cost = prefill * N_w + saturation * N_w / P * Q_min + queue * Q_w + decode * D_w +
running * R_w + wait * deficit_w * block_size + evict * evicted_w * block_size``; the
cheapest worker wins (ties at random), and a worker whose pool cannot hold the prompt ranks
last. At saturation (``Q_min > 0``) each recomputed token weighs the fleet's backlog floor,
so a holder keeps its prefix.

See docs/architecture.md#the-cost-model-servicepolicycostpy.
"""
from __future__ import annotations

import random
from collections.abc import Sequence

from service.config import CostWeights
from service.credits import tier_credits
from service.policy import fetch, room
from service.policy.base import Policy, Ranked, WorkerView

# The names of the cost's terms, in the order cost() adds them.
TERMS = ("prefill", "saturation", "queue", "decode", "running", "wait", "evict")


class KvmeshPolicy(Policy):
    """Minimum estimated work (see the module docstring). A CPU/disk match counts as the
    share of its tokens that onboarding saves on that worker (``service.credits``: measured,
    else configured)."""

    name = "kvmesh"

    def __init__(self, weights: CostWeights | None = None,
                 fetch_costs: fetch.FetchCosts | None = None) -> None:
        self.w = weights or CostWeights()
        self.fetch = fetch_costs or fetch.FetchCosts()

    def credited_tokens(self, v: WorkerView) -> float:
        """Matched tokens less what onboarding the lower-tier ones costs on ``v``
        (``service.credits``)."""
        m, bs = v.match, v.block_size
        credit = tier_credits(self.w, v.load, bs)
        return bs * (m.gpu + credit.cpu * m.cpu + credit.disk * m.disk)

    def cost(self, prompt_tokens: int, v: WorkerView, backlog: float = 0.0) -> float:
        """The cost of sending the request to ``v`` while the least loaded candidate has
        ``backlog`` prefill tokens queued (``Q_min``): the sum of :meth:`terms`, added in
        their order."""
        total = 0.0
        for value in self._parts(prompt_tokens, v, backlog):
            total += value
        return total

    def terms(self, prompt_tokens: int, v: WorkerView, backlog: float = 0.0
              ) -> dict[str, float]:
        """The cost's weighted terms, by name (the module docstring's lines), in the order
        :meth:`cost` adds them; the route log records them to say why a worker won."""
        return dict(zip(TERMS, self._parts(prompt_tokens, v, backlog), strict=True))

    def _parts(self, prompt_tokens: int, v: WorkerView, backlog: float
               ) -> tuple[float, ...]:
        # a tuple, not a dict: cost() runs once per worker per Route
        w, load = self.w, v.load
        prefill = max(prompt_tokens - self.credited_tokens(v), 0.0)
        share = prefill / prompt_tokens if prompt_tokens > 0 else 0.0
        wait = room.deficit(prompt_tokens, v) * v.block_size if w.wait_weight else 0
        evict = room.evictions(prompt_tokens, v) * v.block_size if w.evict_weight else 0
        return (w.prefill_weight * prefill, w.saturation_weight * share * backlog,
                w.queue_weight * load.queued_prefill_tokens,
                w.decode_weight * load.decode_tokens, w.running_weight * load.running,
                w.wait_weight * wait, w.evict_weight * evict)

    @staticmethod
    def backlog(workers: Sequence[WorkerView]) -> int:
        """``Q_min``: the least prefill queued on any of ``workers`` (0 if none)."""
        return min((v.load.queued_prefill_tokens for v in workers), default=0)

    def rank(self, prompt_tokens: int, workers: Sequence[WorkerView],
             rng: random.Random, key: bytes = b"") -> list[Ranked]:
        floor = self.backlog(workers)
        if self.fetch.enabled:
            return self._rank_with_fetch(prompt_tokens, workers, rng, floor)
        keyed = [(not room.can_ever_fit(prompt_tokens, v), self.cost(prompt_tokens, v, floor),
                  rng.random(), v) for v in workers]
        keyed.sort(key=lambda k: k[:3])
        return [Ranked(v, cost, v.matched_tokens) for _, cost, _, v in keyed]

    def fetch_cost(self, prompt_tokens: int, v: WorkerView, choice: fetch.FetchChoice,
                   backlog: float = 0.0) -> float:
        """The cost of ``v`` pulling ``choice`` first (``service.policy.fetch``)."""
        return (self.cost(prompt_tokens, fetch.fetched_view(v, choice), backlog)
                + self.w.prefill_weight * fetch.transfer_tokens(v, choice))

    def _rank_with_fetch(self, prompt_tokens: int, workers: Sequence[WorkerView],
                         rng: random.Random, floor: float) -> list[Ranked]:
        by_ns: dict[str, list[WorkerView]] = {}
        for v in workers:
            by_ns.setdefault(v.ns, []).append(v)
        sources = {ns: fetch.holder(views) for ns, views in by_ns.items()}
        keyed = []
        for v in workers:
            cost = self.cost(prompt_tokens, v, floor)
            choice = fetch.plan(v, sources[v.ns], self.fetch)
            if choice is not None:
                with_fetch = self.fetch_cost(prompt_tokens, v, choice, floor)
                if with_fetch < cost:
                    cost = with_fetch
                else:
                    choice = None
            keyed.append((not room.can_ever_fit(prompt_tokens, v), cost, rng.random(), v,
                          choice))
        keyed.sort(key=lambda k: k[:3])
        return [Ranked(v, cost, v.matched_tokens if c is None
                       else (c.start_block + c.blocks) * v.block_size, c)
                for _, cost, _, v, c in keyed]
