"""Per-tenant quotas through the engine (tiny model): a flood of unique prompts from one
tenant evicts another tenant's system prompt without quotas and leaves it cached with a quota
on the flooder, set at the start or at run time; greedy outputs are the same either way; a
tenant at (or with a zero) quota still runs."""
from __future__ import annotations

import random

import pytest

from kvmesh.quota import Quota, Quotas
from worker import Engine

BS = 4
SYS = list(range(10, 26))  # tenant a's 16-token system prompt: 4 blocks
FLOOD = Quotas(tenants={"flood": Quota(gpu=0.25)})  # 10 of the pool's 40 blocks


def prompts(n: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(30, 250) for _ in range(length)] for _ in range(n)]


def flood(quotas: Quotas | None, at: int = 0):
    """Tenant a caches its system prompt, "flood" sends 12 unique 20-token prompts (about 72
    blocks through a 40-block pool; ``quotas`` set before flood prompt ``at``), then a comes
    back. Returns the engine, the flood's outputs and a's second completion."""
    engine = Engine.from_pretrained("tiny", block_size=BS, num_blocks=40)
    engine.generate([SYS + [30, 31, 32]], max_tokens=2, tenant="a")
    outs = []
    for i, p in enumerate(prompts(12, 20, seed=1)):
        if quotas is not None and i == at:
            assert engine.kv.tenant_stats()["a"].tiers["gpu"].blocks == 5  # still all there
            engine.kv.set_quotas(quotas)
        outs += engine.generate([p], max_tokens=4, tenant="flood", ignore_eos=True)
    again = engine.generate([SYS + [40, 41, 42]], max_tokens=2, tenant="a")[0]
    return engine, outs, again


def test_a_flood_evicts_a_system_prompt_without_quotas_and_not_with_them():
    plain, plain_outs, lost = flood(None)
    assert lost.num_cached_tokens == 0
    assert plain.kv.tenant_stats()["a"].tiers["gpu"].evicted_blocks >= 4
    for at in (0, 3):  # set at the start, or at run time (takes effect at the next eviction)
        engine, outs, kept = flood(FLOOD, at)
        assert kept.num_cached_tokens == len(SYS)
        assert [c.token_ids for c in outs] == [c.token_ids for c in plain_outs]
        stats = engine.kv.tenant_stats()
        assert stats["a"].tiers["gpu"].evicted_blocks == 0
        assert stats["flood"].tiers["gpu"].quota_blocks == 10
        assert stats["flood"].tiers["gpu"].evicted_blocks > 0  # it evicted its own
        assert stats["flood"].requests == 12 and stats["a"].requests == 2
        assert stats["a"].cached_tokens == len(SYS)


@pytest.mark.parametrize("fraction", [0.0, 0.1])
def test_a_tenant_at_its_quota_still_runs_in_a_tight_pool(fraction):
    engine = Engine.from_pretrained("tiny", block_size=BS, num_blocks=12)
    engine.kv.set_quotas(Quotas(Quota(gpu=fraction)))
    batch = prompts(4, 30, seed=2)  # 8 blocks each with the output: they queue
    want = Engine.from_pretrained("tiny", block_size=BS, num_blocks=64).generate(
        batch, max_tokens=8, ignore_eos=True)
    got = engine.generate(batch, max_tokens=8, ignore_eos=True, tenant="t")
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    assert engine.kv.tenant_stats()["t"].tiers["gpu"].evicted_blocks > 0
