"""What one row of a replay runs, named by its label.

- ``kvmesh``, ``prefix_only``, ``approx_tree``, ``oracle`` ...: a policy of ``POLICIES``;
- ``kvmesh[saturation_weight=0,...]``: a variant (``bench.variants``), the live ``kvmesh``
  policy with those ``CostWeights`` fields changed;
- ``kvmesh@REV`` (or ``kvmesh[...]@REV``): the ``kvmesh`` policy of git revision ``REV``
  (``bench.replay.revision_policy``) with REV's own default weights (and the overrides), in the live
  simulator (``--against REV``);
- ``kvmesh+fetch`` (or ``kvmesh[...]+fetch``): the live ``kvmesh`` policy planning peer
  fetches, its workers serving and receiving them (``--peer-fetch``, :mod:`.fetch`).

The label names the row in the table and the JSON lines (``policy``) and, percent-encoded,
the row's index namespace, so rows never share index state.
"""
from __future__ import annotations

from dataclasses import dataclass

from bench.variants import Variant, parse
from service.config import CostWeights
from service.policy import KvmeshPolicy, Policy, make_policies
from service.policy.fetch import FetchCosts

from . import INDEX_POLICIES, POLICIES

FETCH = "+fetch"  # the label suffix of a row that fetches from peers


@dataclass(frozen=True)
class Row:
    """A row: its policy and weight overrides (``variant``), a revision or None, and
    whether it fetches from peers."""

    variant: Variant
    revision: str | None = None
    fetch: bool = False

    @property
    def label(self) -> str:
        at = f"@{self.revision}" if self.revision is not None else ""
        return self.variant.label + (FETCH if self.fetch else "") + at

    @property
    def policy(self) -> str:
        """The policy's name (``kvmesh`` for its variants and revisions)."""
        return self.variant.policy

    def index_policy(self, weights: CostWeights | None = None,
                     fetch: FetchCosts | None = None) -> Policy:
        """A fresh instance of the row's index policy; ``weights`` is the live code's base
        (a revision starts from its own defaults); ``fetch``: a fetch row's settings
        (default: ``FetchCosts(enabled=True)``)."""
        if self.policy not in INDEX_POLICIES:
            raise ValueError(f"{self.label}: not an index policy")
        if self.revision is not None:
            from bench.replay.revision_policy import (
                PolicyAtRevision,  # git and a private import: on use
            )

            return PolicyAtRevision(self.revision, dict(self.variant.overrides))
        if self.variant.overrides:
            weights = self.variant.weights(weights)
        if self.fetch:
            return KvmeshPolicy(weights, fetch or FetchCosts(enabled=True))
        return make_policies(weights)[self.policy]


def parse_row(label: str) -> Row:
    """``"kvmesh[wait_weight=0]@ddf0aed~1"`` -> ``Row``; raises ``ValueError`` naming what is
    wrong (as ``bench.variants.parse``, an empty revision, a revision of another policy)."""
    head, at, rev = label.strip().partition("@")
    head = head.strip()
    fetch = head.endswith(FETCH)
    variant = parse(head.removesuffix(FETCH), POLICIES)
    if fetch and variant.policy != "kvmesh":
        raise ValueError(f"{label!r}: only kvmesh fetches from peers")
    if not at:
        return Row(variant, fetch=fetch)
    if not rev.strip():
        raise ValueError(f"{label!r}: expected POLICY@REV with a git revision")
    if variant.policy != "kvmesh":
        raise ValueError(f"{label!r}: only kvmesh runs at a revision")
    if fetch:
        raise ValueError(f"{label!r}: a revision row runs that revision's policy, without "
                         "peer fetch")
    return Row(variant, rev.strip())


def base_policy(label: str) -> str:
    """The policy a row's label runs (``kvmesh[...]@REV`` -> ``kvmesh``)."""
    return parse_row(label).policy
