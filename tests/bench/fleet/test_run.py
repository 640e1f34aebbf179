"""kvmesh bench fleet: the simulated worker's events are its real manager's, the lag is
counted once the service applied them, and a short run over one Redis (and, with the
single-slot layout, over a 3-shard cluster) measures what it says."""
from __future__ import annotations

import math

import pytest

from bench.fleet.run import FleetConfig, run, synthetic_trace
from bench.fleet.sim import FleetWorker
from bench.replay.trace import CHUNK_TOKENS, TokenSynth
from kvmesh.events.pool import PoolRemoved, PoolStored
from kvmesh.hashing import none_hash


def test_synthetic_trace_shares_one_first_chunk_and_is_prefix_dependent() -> None:
    reqs = synthetic_trace(300, seed=1)
    assert len(reqs) == 300 and all(r.hash_ids[0] == 0 for r in reqs)
    seen: dict[int, tuple[int, ...]] = {}
    for r in reqs:
        assert len(r.hash_ids) * CHUNK_TOKENS >= r.input_length > 0
        for j, h in enumerate(r.hash_ids):  # an id always follows the same prefix
            assert seen.setdefault(h, r.hash_ids[:j]) == r.hash_ids[:j]
    assert synthetic_trace(300, seed=1) == reqs and synthetic_trace(300, seed=2) != reqs


def test_a_fleet_worker_publishes_its_managers_real_events() -> None:
    synth = TokenSynth(16)
    reqs = synthetic_trace(12)
    w = FleetWorker("w", reqs, synth, services=["127.0.0.1:1"], token="t",
                    root_hash=none_hash(synth.algo), num_blocks=1024, chunk_tokens=512)
    events = []
    original = w.kv.take_events

    def spy():
        got = original()
        events.extend(got)
        return got

    w.kv.take_events = spy
    while w.prefilled < 5 * 1024 * 16:  # five pools' worth: evictions for sure
        w.step()
    stored = [h for e in events if isinstance(e, PoolStored) for h in e.block_hashes]
    removed = [h for e in events if isinstance(e, PoolRemoved) for h in e.block_hashes]
    assert removed and w.made == len(stored) + len(removed)
    assert set(stored) <= {h for r in reqs for h in synth.chain(r)}
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert w.applied == 0 and not w.lags  # nothing reached a service
    w.link.outbox.drop_through(events[len(events) // 2].seq)
    assert 0 < w.applied < w.made and all(x >= 0 for x in w.lags)
    w.link.outbox.drop_through(events[-1].seq)
    assert w.applied == w.made


def _check(res: dict, shards: int) -> dict:
    phases = {p["phase"]: p for p in res["phases"]}
    assert phases["idle"]["entries"] == 0 and phases["routes"]["entries"] == 0
    assert phases["events"]["entries"] > 0 and phases["mixed"]["entries"] > 0
    for name in ("routes", "mixed"):
        p = phases[name]
        assert p["routes"] > 0 and p["errors"] == 0 and p["degraded"] == 0, p
        assert 0 < p["route_p50_ms"] <= p["route_p99_ms"]
    assert 0 < phases["events"]["event_lag_p50_ms"] <= phases["events"]["event_lag_p99_ms"]
    assert len(res["usec_per_entry"]) == len(res["usec_per_route"]) == shards
    assert all(x > 0 and math.isfinite(x) for x in res["usec_per_entry"])
    assert sum(res["usec_per_route"]) > 0 and sum(res["keys"]) > 0
    assert res["overflows"] == 0
    # batches merged into other workers' waves: a cluster's group commit, never one server's
    assert 0 <= res["merged_batches"] <= res["batches"] and res["batches"] > 0
    if shards == 1:
        assert res["merged_batches"] == 0
    return phases


SHORT = dict(workers=2, tokens_per_s=20_000, routes_per_s=20, phase_s=0.6, warmup_s=0.3,
             num_blocks=256, limit=40, register_timeout_s=15)


@pytest.mark.integration
def test_a_short_fleet_run_over_one_redis() -> None:
    _check(run(FleetConfig(shards=1, **SHORT)), 1)


@pytest.mark.integration
@pytest.mark.cluster_layout
def test_a_short_fleet_run_over_three_shards_spreads_keys_and_lookups() -> None:
    """The single-slot layout spreads load: through 3 shards, with one system prompt shared by
    every request, no shard
    holds more than 1.5x the mean keys or spends more than 1.5x the mean time on routes."""
    # 512 blocks: the third worker's share of this trace has no prompt under 4,096 tokens
    # a plaintext bus when the Valkey has no TLS: a test host (deploy.redis_cluster)
    res = run(FleetConfig(shards=3, insecure_cluster_bus=True,
                          **{**SHORT, "workers": 3, "limit": 90, "num_blocks": 512,
                             # phases of several janitor rounds (1 s: shard identity checks,
                             # sweep steps), so their bursts average out of a shard's share
                             "phase_s": 2.5, "warmup_s": 0.5}))
    _check(res, 3)
    keys, route = res["keys"], res["usec_per_route"]
    assert max(keys) <= 1.5 * sum(keys) / 3, keys
    assert max(route) <= 1.5 * sum(route) / 3, route
