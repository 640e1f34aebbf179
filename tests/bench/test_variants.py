"""Policy variants of the benches (``bench.variants``)."""
from __future__ import annotations

import pytest

from bench.variants import Variant, parse, parse_list
from kvmesh.contract import POLICIES


def test_a_variant_overrides_weights_and_names_its_row() -> None:
    v = parse("kvmesh[saturation_weight=0, wait_weight=0.5]", POLICIES)
    assert v == Variant("kvmesh", {"saturation_weight": 0.0, "wait_weight": 0.5})
    assert v.label == "kvmesh[saturation_weight=0,wait_weight=0.5]"
    assert v.weights().saturation_weight == 0.0 and v.weights().prefill_weight == 2.0
    assert parse("round_robin", POLICIES).label == "round_robin"


def test_a_list_keeps_commas_inside_brackets() -> None:
    got = parse_list("kvmesh,kvmesh[saturation_weight=0,wait_weight=0],round_robin", POLICIES)
    assert [v.label for v in got] == ["kvmesh", "kvmesh[saturation_weight=0,wait_weight=0]",
                                      "round_robin"]


@pytest.mark.parametrize("text, error", [
    ("nope", "unknown policy"), ("kvmesh[bogus=1]", "expected weight=value"),
    ("kvmesh[saturation_weight=x]", "not a number"), ("round_robin[wait_weight=1]", "only kvmesh"),
    ("kvmesh[saturation_weight=-1]", "must be >= 0"), ("kvmesh[cpu_credit=2]", "in \\[0, 1\\]"),
    ("kvmesh[", "expected POLICY")])
def test_a_bad_variant_is_refused_with_the_reason(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse(text, POLICIES)
