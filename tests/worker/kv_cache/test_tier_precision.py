"""The index's precision per tier: promised vs served tokens, fastest tier first."""
from __future__ import annotations

import pytest

from worker.kv_cache.tier_precision import TierPrecision, missed_by_tier


@pytest.mark.parametrize(("promised", "served", "missed"), [
    ({"gpu": 64}, {"gpu": 64}, {"gpu": 0}),                      # kept
    ({"gpu": 64}, {}, {"gpu": 64}),                              # gone
    ({"gpu": 64}, {"cpu": 64}, {"gpu": 64}),                     # demoted: a slower tier
    ({"cpu": 64}, {"gpu": 64}, {"cpu": 0}),                      # onboarded meanwhile
    ({"gpu": 32, "cpu": 32}, {"gpu": 16, "cpu": 48}, {"gpu": 16, "cpu": 0}),
    ({"gpu": 32, "cpu": 32}, {"gpu": 48}, {"gpu": 0, "cpu": 16}),
    ({"cpu": 32, "disk": 32}, {"gpu": 16, "disk": 16}, {"cpu": 16, "disk": 16}),
    ({"disk": 48}, {"gpu": 16, "cpu": 16, "disk": 16}, {"disk": 0}),
    ({"gpu": 16}, {"gpu": 64, "cpu": 64}, {"gpu": 0}),           # served more than promised
    ({}, {"gpu": 64}, {}),
])
def test_missed_by_tier(promised: dict[str, int], served: dict[str, int],
                        missed: dict[str, int]) -> None:
    assert missed_by_tier(promised, served) == missed


def test_counters_accumulate_and_missed_never_exceeds_promised() -> None:
    p = TierPrecision()
    p.add({"gpu": 32, "cpu": 64}, {"gpu": 32, "cpu": 16}, 100)
    p.add({"cpu": 16, "disk": 16}, {}, 100)
    p.add({}, {"gpu": 100}, 100)
    assert p.promised == {"gpu": 32, "cpu": 80, "disk": 16}
    assert p.missed == {"gpu": 0, "cpu": 64, "disk": 16}


def test_a_promise_is_capped_at_the_prompt() -> None:
    """A wire value up to 2^64 - 1 must not overflow the uint64 counters of Stats."""
    p = TierPrecision()
    for _ in range(3):
        p.add({"gpu": 2**64 - 1, "cpu": 2**64 - 1}, {"gpu": 48}, 50)
    assert p.promised == {"gpu": 150, "cpu": 150, "disk": 0}
    assert p.missed == {"gpu": 6, "cpu": 150, "disk": 0}
