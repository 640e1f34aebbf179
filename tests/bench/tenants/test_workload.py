"""`bench.tenants.workload`: the victims' shared prompts, the flood's unique ones, the seed."""
from __future__ import annotations

import pytest

from bench.tenants.workload import FLOOD, TenantLoad, requests

LOAD = TenantLoad(victims=3, system_tokens=64, question_tokens=8, victim_rate=4.0,
                  flood_tokens=128, flood_rate=6.0, duration_s=5.0, max_tokens=2, seed=3)


def test_seeded_and_in_arrival_order() -> None:
    a = requests(LOAD)
    assert a == requests(LOAD)
    assert a != requests(TenantLoad(**{**LOAD.__dict__, "seed": 4}))
    times = [r.arrival_s for r in a]
    assert times == sorted(times) and times[0] == 0.0 and times[-1] < LOAD.duration_s


def test_victims_share_their_own_prompt_and_the_flood_shares_nothing() -> None:
    reqs = requests(LOAD)
    by: dict[str, list[tuple[int, ...]]] = {}
    for r in reqs:
        assert r.salt == r.tenant and r.max_tokens == 2 and max(r.tokens) < 256
        by.setdefault(r.tenant, []).append(r.tokens)
    assert sorted(by) == ["alpha", "beta", FLOOD, "gamma"]
    systems = set()
    for name in ("alpha", "beta", "gamma"):
        prompts = by[name]
        assert all(len(p) == 72 and p[:64] == prompts[0][:64] for p in prompts)
        assert len({p[64:] for p in prompts}) == len(prompts)  # unique questions
        systems.add(prompts[0][:64])
    assert len(systems) == 3
    flood = by[FLOOD]
    assert all(len(p) == 128 for p in flood)
    assert len({p[:16] for p in flood}) == len(flood)  # not even a block in common
    # Poisson at the configured rates: the flood sends more than any one victim
    assert len(flood) > max(len(by[n]) for n in ("alpha", "beta", "gamma"))


def test_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="victims"):
        TenantLoad(victims=0)
    with pytest.raises(ValueError, match="positive"):
        TenantLoad(flood_rate=0.0)
    with pytest.raises(ValueError, match="at least 1"):
        TenantLoad(system_tokens=0)
