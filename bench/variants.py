"""Policy variants: one policy with some of its cost weights changed, as one row of a bench.

A bench's ``--policies`` list may name ``kvmesh[saturation_weight=0,wait_weight=0]``: the
``kvmesh`` policy run with those ``service.config.CostWeights`` fields overridden, shown as
a row of its own beside the plain ``kvmesh`` one. Every change to the cost model is judged
this way, before and after in one run (docs/benchmarks.md). Only ``kvmesh`` has weights.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from service.config import CostWeights

_VARIANT = re.compile(r"(?P<policy>[a-z_]+)(?:\[(?P<args>[^\]]*)\])?")


@dataclass(frozen=True)
class Variant:
    """A policy and its weight overrides (``label`` is how the row is named)."""

    policy: str
    overrides: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        if not self.overrides:
            return self.policy
        args = ",".join(f"{k}={v:g}" for k, v in self.overrides.items())
        return f"{self.policy}[{args}]"

    def weights(self, base: CostWeights | None = None) -> CostWeights:
        """``base`` (default weights) with the overrides applied; raises ``ValueError`` for
        a value ``CostWeights`` refuses."""
        return dataclasses.replace(base or CostWeights(), **self.overrides)


def _weight_names() -> set[str]:
    return {f.name for f in dataclasses.fields(CostWeights) if "float" in str(f.type)}


def parse(text: str, policies: tuple[str, ...]) -> Variant:
    """``"kvmesh[saturation_weight=0]"`` -> ``Variant``; raises ``ValueError`` naming what is
    wrong (an unknown policy or weight, a value that is not a number, weights on a policy
    that has none)."""
    m = _VARIANT.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"{text!r}: expected POLICY or POLICY[weight=value,...]")
    policy, args = m["policy"], m["args"]
    if policy not in policies:
        raise ValueError(f"unknown policy {policy!r}; valid: {', '.join(policies)}")
    overrides: dict[str, float] = {}
    for part in filter(None, (args or "").split(",")):
        name, eq, value = part.partition("=")
        name = name.strip()
        if not eq or name not in _weight_names():
            raise ValueError(f"{part!r} in {text!r}: expected weight=value with a weight of "
                             f"{', '.join(sorted(_weight_names()))}")
        try:
            overrides[name] = float(value)
        except ValueError:
            raise ValueError(f"{part!r} in {text!r}: {value!r} is not a number") from None
    if overrides and policy != "kvmesh":
        raise ValueError(f"{text!r}: only kvmesh has cost weights")
    variant = Variant(policy, overrides)
    variant.weights()  # CostWeights validates the values
    return variant


def parse_list(text: str, policies: tuple[str, ...]) -> list[Variant]:
    """A comma-separated list whose items may carry ``[...]`` (commas inside brackets
    belong to the item)."""
    return [parse(item, policies) for item in split_list(text)]


def split_list(text: str) -> list[str]:
    """The non-empty items of a comma-separated list, commas inside ``[...]`` kept."""
    items, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    return [item for item in items if item.strip()]
