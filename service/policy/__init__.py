"""Routing policies: rank the live workers of one request, best first.

One interface (``base.Policy.rank``), one small unit per policy, each with its own test
(``tests/service/policy/``):

- ``kvmesh`` (``cost``): the cost model, term by term; ``room``: the room check behind its
  wait term.
- ``consistent_hash`` (``consistent_hash``): a ring keyed by the prompt's first tokens and
  salt, with bounded loads; the static partition a plain L7 balancer gives.
- ``prefix_only``, ``least_loaded``, ``round_robin``, ``random`` (``baselines``).
"""
from __future__ import annotations

from service.config import CostWeights
from service.policy.base import Policy, Ranked, WorkerView
from service.policy.baselines import (
    LeastLoadedPolicy,
    PrefixOnlyPolicy,
    RandomPolicy,
    RoundRobinPolicy,
)
from service.policy.consistent_hash import ConsistentHashPolicy
from service.policy.cost import KvmeshPolicy
from service.policy.fetch import FetchCosts

__all__ = ["ConsistentHashPolicy", "KvmeshPolicy", "LeastLoadedPolicy", "Policy",
           "PrefixOnlyPolicy", "RandomPolicy", "Ranked", "RoundRobinPolicy", "WorkerView",
           "make_policies"]


def make_policies(weights: CostWeights | None = None,
                  fetch_costs: FetchCosts | None = None) -> dict[str, Policy]:
    """One instance of every policy, by name (``fetch_costs``: the kvmesh policy's peer
    fetch settings; default: off)."""
    policies: list[Policy] = [KvmeshPolicy(weights, fetch_costs), PrefixOnlyPolicy(),
                              ConsistentHashPolicy(),
                              LeastLoadedPolicy(), RoundRobinPolicy(), RandomPolicy()]
    return {p.name: p for p in policies}
