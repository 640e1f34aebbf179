"""What a Ray deployment asks for, and the comparison workload (pure functions, no Ray)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from bench.ray_serve import ROUTERS, SERVE_WORKLOAD, render, router_config
from bench.workload import ceiling_tokens, text_rounds
from deploy.ray.spec import RaySpec, gpus_for_worker, worker_bundle


def test_gpus_follow_the_cluster_unless_given():
    assert gpus_for_worker(RaySpec(), cluster_gpus=0) == 0
    assert gpus_for_worker(RaySpec(), cluster_gpus=8) == 1
    assert gpus_for_worker(RaySpec(gpus_per_worker=0.25), cluster_gpus=8) == 0.25
    assert gpus_for_worker(RaySpec(gpus_per_worker=0), cluster_gpus=8) == 0


def test_bundle_is_exactly_what_the_worker_requests():
    assert worker_bundle(RaySpec(), 0) == {"CPU": 1.0}
    spec = RaySpec(gpus_per_worker=0.5, cpus_per_worker=2, worker_resources={"H100": 0.5})
    assert worker_bundle(spec, 4) == {"CPU": 2.0, "GPU": 0.5, "H100": 0.5}


@pytest.mark.parametrize("kwargs,field", [
    ({"workers": -1}, "workers"), ({"service_replicas": 0}, "service_replicas"),
    ({"gpus_per_worker": -1}, "gpus_per_worker"), ({"gpus_per_worker": 1.5}, "above 1"),
    ({"cpus_per_worker": 0}, "cpus_per_worker"), ({"name": "a b"}, "name"),
    ({"service_placement": "moon"}, "service_placement"),
    ({"placement_strategy": "RANDOM"}, "placement_strategy"), ({"port": 70000}, "port"),
])
def test_bad_specs_are_refused_by_name(kwargs, field):
    with pytest.raises(ValueError, match=field):
        RaySpec(**kwargs)


def test_each_spec_gets_its_own_actor_name_prefix():
    assert RaySpec().name != RaySpec().name


def test_workload_is_deterministic_tenant_salted_and_growing():
    spec = replace(SERVE_WORKLOAD, tenants=2, chats_per_tenant=2, turns_per_chat=2)
    rounds = text_rounds(spec)
    again = text_rounds(spec)
    assert [[r.token_ids for r in b] for b in rounds] == [[r.token_ids for r in b]
                                                         for b in again]
    assert [len(b) for b in rounds] == [4, 4]
    assert {r.salt for b in rounds for r in b} == {"tenant-0", "tenant-1"}
    for req in rounds[0]:
        assert req.token_ids == list(req.prompt.encode()) and max(req.token_ids) < 256
    # turn 2 of a chat extends its turn 1
    firsts = {r.prompt for r in rounds[0]}
    assert all(any(r.prompt.startswith(f) for f in firsts) for r in rounds[1])


def test_ceiling_counts_block_aligned_prefixes_of_the_same_salt_only():
    from deploy.ray.request import ServeRequest

    a = ServeRequest(token_ids=list(range(40)), salt="x")
    b = ServeRequest(token_ids=list(range(40)) + [1], salt="x")
    c = ServeRequest(token_ids=list(range(40)), salt="y")
    assert ceiling_tokens([[a], [b, c]], block_size=16) == 32  # b: 40 shared -> 32; c: 0
    assert ceiling_tokens([[a, a]], block_size=16) == 32        # at most len - 1 = 39


def test_compared_routers_and_the_table():
    assert router_config("kvmesh", ["h:1"]).request_router_kwargs["service_addresses"] == \
        ["h:1"]
    assert router_config("prefix_affinity", []).request_router_class.endswith(
        "PrefixCacheAffinityRouter")
    assert router_config("pow2", []).request_router_class.endswith(
        "PowerOfTwoChoicesRequestRouter")
    with pytest.raises(ValueError):
        router_config("nope", [])
    row = {"hit_rate": 0.5, "ceiling_hit_rate": 0.6, "mean_ttft_ms": 10.0,
           "median_ttft_ms": 9.0, "p90_ttft_ms": 20.0, "replica_ttft_ms": 5.0,
           "per_replica": [2, 1]}
    table = render({name: row for name in ROUTERS})
    assert len(table.splitlines()) == 1 + len(ROUTERS) and "50.0%" in table


def test_the_driver_resolves_the_hash_seed_as_vllm_does(monkeypatch):
    """Actors run with the driver's seed: PYTHONHASHSEED, unless hash_seed is given."""
    from deploy.ray.cluster import RayCluster

    monkeypatch.setenv("PYTHONHASHSEED", "7")
    assert RayCluster(RaySpec())._service_settings()["hash_seed"] == "7"
    assert RayCluster(RaySpec(hash_seed="s"))._service_settings()["hash_seed"] == "s"
    monkeypatch.delenv("PYTHONHASHSEED")
    assert RayCluster(RaySpec())._service_settings()["hash_seed"] == "vllm-none-hash"
