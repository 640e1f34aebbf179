"""kvmesh as Ray actors on a local Ray (CPU): the same routing as with local processes.

Mirrors tests/integration/test_cluster.py (which runs workers as processes): a shared
prefix is routed to the worker holding it and served from its cache, a salt never matches
another tenant's blocks; plus what Ray adds: placement, restarts with re-registration.
"""
from __future__ import annotations

import pytest
import ray

from client import KvmeshClient
from deploy.ray import RayCluster, RaySpec
from deploy.waiting import wait_until
from tests.cluster_scenarios import (
    another_salt_never_matches,
    generate_on,
    holder_match,
    question,
    replicas_agree,
    shared_prefix_goes_to_its_holder,
)
from tests.integration.ray.conftest import kvmesh_actors


@pytest.fixture(scope="module")
def cluster(ray_cluster):
    c = RayCluster(RaySpec(workers=2, service_replicas=2, num_blocks=64,
                           cpus_per_worker=0.5, service_cpus=0.25)).start(timeout=120)
    yield c
    name = c.spec.name
    c.stop()
    wait_until(lambda: not kvmesh_actors(name), timeout=10)


@pytest.fixture(scope="module")
def client(cluster):
    with KvmeshClient(cluster.service_addresses) as c:
        yield c


def test_actors_report_addresses_and_cpu_placement(cluster):
    assert len(cluster.service_addresses) == 2 and len(set(cluster.service_addresses)) == 2
    assert cluster.bundle == {"CPU": 0.5}  # no GPU in this cluster: CPU workers
    infos = cluster.worker_infos()
    assert [i["worker_id"] for i in infos] == cluster.worker_ids
    assert all(i["registered"] and i["device"] == "cpu" for i in infos)
    assert len({i["address"] for i in infos}) == 2
    names = kvmesh_actors(cluster.spec.name)
    assert names == sorted([f"{cluster.spec.name}-{p}" for p in
                            ("redis", "service-0", "service-1", "worker-0", "worker-1")])
    assert set(cluster.alive_workers()) == set(cluster.worker_ids)


def test_shared_prefix_goes_to_its_holder_and_skips_prefill(client):
    shared_prefix_goes_to_its_holder(client)


def test_another_salt_never_matches(client):
    another_salt_never_matches(client)


def test_both_service_replicas_agree(cluster, client):
    replicas_agree(client, cluster.service_addresses)


def test_restarted_worker_reregisters_with_an_empty_pool(cluster, client):
    first = client.generate(question(5), max_tokens=2)
    holder = first.worker_id
    index = cluster.worker_ids.index(holder)
    before = cluster.worker_infos()[index]
    wait_until(lambda: holder_match(client, question(5), holder) >= 192, timeout=10)
    ray.kill(cluster.workers[index], no_restart=False)  # a crash: Ray restarts the actor
    after = wait_until(lambda: (lambda i: i if i["pid"] != before["pid"] and i["registered"]
                                else None)(ray.get(cluster.workers[index].info.remote(),
                                                   timeout=5)),
                       timeout=90, interval=0.5)
    assert after["worker_id"] == holder and after["address"] != before["address"]
    wait_until(lambda: cluster.alive_workers().get(holder) == after["address"], timeout=10)
    # Its first snapshot after registering told the index that nothing is cached any more.
    assert holder_match(client, question(5), holder) == 0
    assert generate_on(after["address"], question(5)).num_cached_tokens == 0


def test_restarted_service_replica_keeps_its_address(cluster, client):
    before = client.route(question(1), dry_run=True)
    old = ray.get(cluster.services[0].address.remote(), timeout=10)
    ray.kill(cluster.services[0], no_restart=False)
    # Meanwhile the client fails over to the other replica.
    during = client.route(question(1), dry_run=True)
    assert (during.worker_id, during.matched_tokens) == (before.worker_id,
                                                          before.matched_tokens)
    # Pinned to the head node on a fixed port: it comes back where clients look for it.
    assert wait_until(lambda: ray.get(cluster.services[0].address.remote(), timeout=5),
                      timeout=60, interval=0.5) == old
    with KvmeshClient(old) as c:
        after = wait_until(lambda: c.route(question(1), dry_run=True), timeout=20)
    assert after.matched_tokens == before.matched_tokens


def test_worker_calls_need_a_minted_token_and_redis_its_password(cluster):
    """Attack on a Ray deployment with no flags: register as a worker, or write the index,
    without any credential. The generated worker secret and Redis password refuse both."""
    import grpc
    import redis

    from kvmesh.v1 import index_pb2, index_pb2_grpc

    assert cluster.spec.worker_secret and len(cluster.spec.worker_secret) >= 32
    with grpc.insecure_channel(cluster.service_addresses[0]) as ch:
        with pytest.raises(grpc.RpcError) as err:
            # wait_for_ready: the replica the test before restarted may still be coming up
            # (a reset connection is UNAVAILABLE, not the answer this test is about)
            index_pb2_grpc.IndexServiceStub(ch).RegisterWorker(index_pb2.RegisterWorkerRequest(
                worker_id="impostor", address="127.0.0.1:1"), timeout=30, wait_for_ready=True)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    args = redis.connection.parse_url(cluster.redis_url)
    assert args["password"]
    with redis.Redis(host=args["host"], port=args["port"], protocol=2) as anyone, \
            pytest.raises(redis.AuthenticationError):
        anyone.hset(f"kvmesh:w:{cluster.worker_ids[0]}", "address", "127.0.0.1:1")
