"""The routing policy names: part of the contract (``RouteRequest.policy`` names one).

The service implements them (``service/policy/``); clients and every CLI offer exactly
these, so the list is written once, here, where every package may import it.
"""
from __future__ import annotations

DEFAULT_POLICY = "kvmesh"
POLICIES = (DEFAULT_POLICY, "prefix_only", "consistent_hash", "least_loaded", "round_robin",
            "random")
