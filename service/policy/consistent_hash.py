"""The ``consistent_hash`` policy: a static partition of prefixes over the workers, with
bounded loads: the honest bar at saturation.

A ring of ``vnodes`` xxh3 points per worker (stable across processes); a request's order is
the ring walked clockwise from its key's point; a worker at or over ``ceil(c * (m + 1) / n)``
of the ``m`` requests in flight moves after every worker that is not. Every worker is
returned, cost = its position; the index is never read.

See docs/architecture.md#routing-policies.
"""
from __future__ import annotations

import math
import random
from collections.abc import Sequence

import numpy as np
import xxhash

from kvmesh.contract import CONSISTENT_HASH
from service.policy.base import Policy, Ranked, WorkerView

DEFAULT_VNODES = 160
"""Points per worker: the share of the ring a worker owns varies by about 1/sqrt(vnodes)
(8% at 160: 8 workers own 0.87-1.10 of an even share); a ring is built only when the set of
workers changes (about 3 ms for 8 workers, 25 ms for 64) and a rank reads all its points
(in numpy, see :meth:`Ring.walk`), so more would cost every route for little gain."""

DEFAULT_BALANCE = 1.25
"""``c``: a worker may hold 25% more requests in flight than the mean before its keys spill.
Low enough that a hot prefix cannot queue one worker while the others idle; high enough that
the ordinary jitter of in-flight counts (a few requests either way) does not push keys off
their home worker, whose cache holds their prefix. Vimeo's production choice for the same
algorithm, and the usual default of HAProxy's and other balancers' factor (125%)."""

MAX_RINGS = 64  # rings kept, one per set of live workers seen (sets change rarely)


def point(data: bytes) -> int:
    """A 64-bit position on the ring (xxh3, seed 0: the same in every process)."""
    return xxhash.xxh3_64_intdigest(data)


class Ring:
    """The points of a set of workers: row ``k`` holds the ``vnodes`` points of ``ids[k]``
    (worker ids sorted). Never changed: another set of workers builds another ring."""

    def __init__(self, worker_ids: frozenset[str], vnodes: int) -> None:
        self.ids = tuple(sorted(worker_ids))
        self.points = np.array([[point(f"{wid}#{i}".encode()) for i in range(vnodes)]
                                for wid in self.ids], dtype=np.uint64).reshape(-1, vnodes)

    def walk(self, at: int) -> list[str]:
        """Every worker id once, clockwise from position ``at``, each at its first point.

        Vectorized rather than walked: a worker's first point clockwise is the one at the
        least distance ``(point - at) mod 2**64`` (uint64 arithmetic wraps), so the order is
        the workers sorted by that least distance: O(n * vnodes) in numpy, about 15 us for 64
        workers, where a walk point by point costs a Python step per point passed."""
        dist = (self.points - np.uint64(at)).min(axis=1)
        return [self.ids[k] for k in np.argsort(dist, kind="stable").tolist()]


class ConsistentHashPolicy(Policy):
    """The worker owning ``key``'s arc of the ring, unless full (see the module docstring)."""

    name = CONSISTENT_HASH
    reads_key = True

    def __init__(self, balance: float = DEFAULT_BALANCE, vnodes: int = DEFAULT_VNODES) -> None:
        if not balance >= 1.0:  # also refuses NaN
            raise ValueError(f"balance must be >= 1 (math.inf: no bound), got {balance}")
        if vnodes < 1:
            raise ValueError(f"vnodes must be >= 1, got {vnodes}")
        self.balance, self.vnodes = balance, vnodes
        self._rings: dict[frozenset[str], Ring] = {}

    def ring(self, worker_ids: frozenset[str]) -> Ring:
        """The ring of ``worker_ids``, built once per distinct set."""
        ring = self._rings.get(worker_ids)
        if ring is None:
            if len(self._rings) >= MAX_RINGS:
                del self._rings[next(iter(self._rings))]  # the oldest
            ring = self._rings[worker_ids] = Ring(worker_ids, self.vnodes)
        return ring

    def bound(self, in_flight: int, n_workers: int) -> float:
        """Requests in flight from which a worker is full: ``ceil(c * (m + 1) / n)``."""
        if math.isinf(self.balance):
            return math.inf
        return math.ceil(self.balance * (in_flight + 1) / n_workers)

    def rank(self, prompt_tokens: int, workers: Sequence[WorkerView],
             rng: random.Random, key: bytes = b"") -> list[Ranked]:
        if not workers:
            return []
        order = self.ring(frozenset(v.worker_id for v in workers)).walk(
            point(key) if key else 0)
        at = {wid: i for i, wid in enumerate(order)}
        in_flight = [v.load.running + v.load.waiting for v in workers]
        full = self.bound(sum(in_flight), len(workers))
        # the non-full in ring order, then the full in ring order (a stable sort: a view
        # given twice comes back twice, in the order given)
        keyed = sorted(zip(workers, in_flight, strict=True),
                       key=lambda vl: (vl[1] >= full, at[vl[0].worker_id]))
        return [Ranked(v, float(i), v.matched_tokens) for i, (v, _) in enumerate(keyed)]
