"""The goals the replay prints (kvmesh against the peers, the oracle and its past), judged
from one run's rows."""
from __future__ import annotations

import dataclasses

from bench.replay.replay import PolicyResult
from bench.replay.report import targets


def _result(policy: str, hit: float, ttft: float) -> PolicyResult:
    return PolicyResult(policy=policy, requests=10, rejected=0, prompt_tokens=10_000,
                        hit_tokens=int(hit * 10_000), prefill_tokens=0,
                        per_worker_prefill=[1.0, 1.0], ttfts=[ttft] * 10, busy_s=1.0,
                        sim_s=1.0, evictions=0, wall_s=0.0)


def test_replay_targets_hold_kvmesh_to_the_peers_the_oracle_and_its_past() -> None:
    res = [_result("kvmesh", 0.53, 0.3), _result("kvmesh@abc", 0.52, 0.4),
           _result("ray_prefix_tree", 0.55, 2.0), _result("oracle", 0.535, 0.2),
           _result("round_robin", 0.2, 3.0)]
    got = {name: met for name, met, _ in targets(res)}
    said = {name: text for name, _, text in targets(res)}
    assert got["hit rate >= 1x ray_prefix_tree"] is False
    assert got["hit rate within 0.01 of oracle"] is True
    assert said["hit rate within 0.01 of oracle"].endswith("(0.0050 below)")
    above = [dataclasses.replace(r, hit_tokens=5_400) if r.policy == "kvmesh" else r
             for r in res]
    said = {name: text for name, _, text in targets(above)}
    assert said["hit rate within 0.01 of oracle"].endswith("(0.0050 above)")
    assert got["hit rate >= kvmesh@abc"] and got["p99 TTFT <= kvmesh@abc"]
    assert got["hit rate >= 2x round_robin"] and got["lowest p90 TTFT"]
    res[1] = dataclasses.replace(res[1], ttfts=[0.1] * 10)
    assert not {n: m for n, m, _ in targets(res)}["p99 TTFT <= kvmesh@abc"]


def test_the_fetch_row_is_held_to_the_oracle_and_to_kvmesh_without_fetch() -> None:
    res = [_result("kvmesh", 0.50, 1.0), _result("kvmesh+fetch", 0.53, 0.8),
           _result("oracle", 0.535, 0.7), _result("round_robin", 0.2, 3.0)]
    got = {name: met for name, met, _ in targets(res)}
    said = {name: text for name, _, text in targets(res)}
    assert got["fetch: hit rate >= 0.99x oracle"] is True  # 0.53 / 0.535 = 0.9907
    assert got["fetch: mean TTFT >= 15% below kvmesh"] is True
    assert said["fetch: mean TTFT >= 15% below kvmesh"].endswith("(+20.0% cut)")
    assert got["lowest p90 TTFT"]  # the fetch row is kvmesh's, never a rival
    res[1] = _result("kvmesh+fetch", 0.52, 0.9)
    got = {name: met for name, met, _ in targets(res)}
    assert not got["fetch: hit rate >= 0.99x oracle"]
    assert not got["fetch: mean TTFT >= 15% below kvmesh"]
