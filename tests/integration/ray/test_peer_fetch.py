"""Peer KV fetch between Ray-hosted workers (``kvmesh up --backend ray``, local Ray, CPU).

Each worker actor's data plane listens on its node's IP (what other nodes reach; here the
head node's), its peer key is that of the token it presents to the service (minted from the
cluster's worker secret), and a request pinned to the worker without the prefix pulls it
from its holder with the route's ticket: "peer" tokens, the holder's output. Where the node IP
is not loopback (as on the hosts this ran on), those data planes are CURVE-encrypted: this is
then also the encrypted plane between real processes.
"""
from __future__ import annotations

import pytest
import ray

from deploy.ray import RayCluster, RaySpec
from deploy.waiting import wait_until
from tests.integration.ray.conftest import kvmesh_actors


@pytest.fixture(scope="module")
def cluster(ray_cluster):
    c = RayCluster(RaySpec(workers=2, num_blocks=64, cpus_per_worker=0.5, service_cpus=0.25,
                           token="router-token-ray", peer_fetch=True, min_fetch_blocks=2,
                           heartbeat_s=0.3)).start(timeout=120)
    yield c
    name = c.spec.name
    c.stop()
    wait_until(lambda: not kvmesh_actors(name), timeout=10)


def test_data_planes_listen_on_the_node_ip(cluster):
    node_ip = ray.util.get_node_ip_address()
    for info in cluster.worker_infos():
        assert info["data_host"] == node_ip == info["address"].rpartition(":")[0]


def test_a_request_pinned_to_a_cold_worker_fetches_the_prefix_from_its_holder(cluster):
    from client import KvmeshClient

    holder, cold = cluster.worker_ids
    prompt = [(11 * i) % 250 + 1 for i in range(200)]  # 12 full blocks of 16
    with KvmeshClient(cluster.service_addresses, token=cluster.spec.token,
                      generate_timeout=120) as client:
        first = client.generate(prompt, max_tokens=4, worker_id=holder)
        assert first.worker_id == holder and first.cached_tokens_by_tier.get("peer", 0) == 0
        assert wait_until(lambda: client.route(prompt, worker_id=cold, dry_run=True)
                          .candidates[0].fetch is not None, 30, interval=0.2,
                          what=f"a fetch plan for {cold}") is True
        plan = client.route(prompt, worker_id=cold, dry_run=True).candidates[0].fetch
        assert plan.source_worker_id == holder and plan.blocks == 12
        second = client.generate(prompt, max_tokens=4, worker_id=cold)
        assert second.worker_id == cold and second.token_ids == first.token_ids
        assert second.cached_tokens_by_tier.get("peer", 0) == plan.tokens > 0
        peer = {w["worker_id"]: client.worker_stats(w["address"], w["worker_id"])["peer"]
                for w in client.stats()["workers"]}
        assert peer[holder]["served"] == 1 and peer[cold]["fetches"] == 1
