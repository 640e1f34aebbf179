"""Workers on GPU nodes of a multi-node Ray cluster; losing a node.

The package's local Ray (head: CPUs only) gets two worker nodes, each with one LOGICAL GPU
and a custom resource ``kvmesh_gpu_node``. Workers ask for half a GPU and half that custom
resource, so they may only run on those nodes, and the placement group (SPREAD) puts one on
each. Removing a node kills its worker: the service takes it out of routing once its
heartbeats stop (liveness: 3 s), Ray re-places the lost bundle on the surviving GPU node,
and the restarted worker registers again, with an empty pool, under the same id.

Not covered here: real CUDA (a logical GPU on this CPU machine runs the engine on the CPU;
the worker reports device ``cpu``), and nodes on different hosts (all nodes share this
machine's IP; only ports differ).
"""
from __future__ import annotations

import random
import time

import pytest
import ray

from client import KvmeshClient
from deploy.ray import RayCluster, RaySpec
from deploy.waiting import wait_until
from tests.integration.ray.conftest import STORE

NODE = {"num_cpus": 1, "num_gpus": 1, "resources": {"kvmesh_gpu_node": 1},
        "object_store_memory": STORE}
PROMPT = [random.Random(7).randrange(256) for _ in range(120)]


@pytest.fixture(scope="module")
def gpu_nodes(ray_cluster):
    nodes = [ray_cluster.add_node(**NODE) for _ in range(2)]
    ray_cluster.wait_for_nodes()
    yield nodes
    for node in nodes:
        if node in ray_cluster.worker_nodes:
            ray_cluster.remove_node(node)


def test_lost_node_leaves_routing_and_its_worker_is_replaced(ray_cluster, gpu_nodes):
    cluster = RayCluster(RaySpec(workers=2, gpus_per_worker=0.5, cpus_per_worker=0.5,
                                 worker_resources={"kvmesh_gpu_node": 0.5}, service_cpus=0.25,
                                 num_blocks=64)).start(timeout=120)
    try:
        assert cluster.bundle == {"CPU": 0.5, "GPU": 0.5, "kvmesh_gpu_node": 0.5}
        infos = cluster.worker_infos()
        node_ids = {n.node_id for n in gpu_nodes}
        assert {i["node_id"] for i in infos} == node_ids  # spread: one worker per node
        assert all(i["device"] == "cpu" for i in infos)   # logical GPU, no CUDA here
        with KvmeshClient(cluster.service_addresses) as client:
            survivor_id = client.generate(PROMPT, max_tokens=2).worker_id
            survivor = next(i for i in infos if i["worker_id"] == survivor_id)
            victim = next(i for i in infos if i["worker_id"] != survivor_id)
            lost = next(n for n in gpu_nodes if n.node_id == victim["node_id"])

            ray_cluster.remove_node(lost)
            t0 = time.monotonic()

            def victim_out() -> bool:
                routed = client.route(PROMPT, dry_run=True).candidates
                return all(c.address != victim["address"] for c in routed)

            wait_until(victim_out, timeout=5.0, interval=0.1)
            assert time.monotonic() - t0 < 5.0  # 3 s liveness + heartbeat + refresh slack
            # The survivor keeps serving what it cached.
            wait_until(lambda: client.route(PROMPT, dry_run=True).matched_tokens >= 112,
                       timeout=10)
            again = client.generate(PROMPT, max_tokens=2)
            assert again.worker_id == survivor_id and again.num_cached_tokens == 112

            # The replacement: same id, re-placed on the surviving GPU node, empty pool.
            wait_until(lambda: cluster.alive_workers().get(victim["worker_id"], victim["address"])
                       != victim["address"], timeout=90, interval=0.5)
            index = cluster.worker_ids.index(victim["worker_id"])
            replaced = ray.get(cluster.workers[index].info.remote(), timeout=30)
            assert replaced["node_id"] == survivor["node_id"]
            assert replaced["address"] != victim["address"]
            routed = client.route(PROMPT, dry_run=True).candidates
            assert {c.worker_id for c in routed} == set(cluster.worker_ids)
            assert next(c.matched_tokens for c in routed
                        if c.worker_id == victim["worker_id"]) == 0
    finally:
        cluster.stop()
