"""Ray Serve replicas hosting kvmesh workers, routed by KvmeshRequestRouter (local Ray, CPU).

Each replica registers with the kvmesh service under its Serve replica id; the router asks
the index and sends a shared prefix to the replica that holds it, which serves it from its
cache. With the index gone, requests keep being served (power-of-two choices).
"""
from __future__ import annotations

import random
import re

import pytest
import ray
from ray import serve

from client import KvmeshClient
from deploy.ray import RayCluster, RaySpec
from deploy.ray.request import ServeRequest
from deploy.ray.serve import kvmesh_app
from deploy.waiting import wait_until
from tests.cluster_scenarios import holder_settled

SYSTEM = [random.Random(1).randrange(256) for _ in range(200)]  # 12 full blocks + 8
QUIET = {"enable_access_log": False, "log_level": "WARNING"}


def question(i: int, salt: str | None = None) -> ServeRequest:
    tokens = SYSTEM + [random.Random(200 + i).randrange(256) for _ in range(20)]
    return ServeRequest(token_ids=tokens, salt=salt, max_tokens=2)


@pytest.fixture(scope="module")
def index(ray_cluster):
    cluster = RayCluster(RaySpec(workers=0, service_cpus=0.25)).start(timeout=120)
    serve.start(proxy_location="Disabled", logging_config=QUIET)
    yield cluster
    serve.shutdown()
    cluster.stop()


@pytest.fixture(scope="module")
def handle(index):
    app = kvmesh_app(index.service_addresses, replicas=2, num_cpus=0.25, num_blocks=64,
                     worker_secret=index.spec.worker_secret)  # each mints its own token
    return serve.run(app, name="kvm", route_prefix=None, logging_config=QUIET)


def generate(handle, request: ServeRequest) -> dict:
    chunks = list(handle.options(stream=True).generate.remote(request))
    assert chunks[-1]["finished"] and sum(len(c["token_ids"]) for c in chunks) == 2
    return chunks[-1]


def serve_workers(index) -> dict[str, bool]:
    with KvmeshClient(index.service_addresses) as c:
        return {w["worker_id"]: w["alive"] for w in c.stats()["workers"]
                if w["worker_id"].startswith("serve:kvm/")}


def test_replicas_register_under_their_serve_replica_ids(index, handle):
    workers = wait_until(lambda: (lambda w: w if len(w) == 2 and all(w.values()) else None)(
        serve_workers(index)), timeout=30)
    assert all(re.fullmatch(r"serve:kvm/KvmeshReplica/\w+", w) for w in workers)
    info = handle.info.remote().result(timeout_s=30)
    assert info["worker_id"] in workers and info["registered"]


def test_shared_prefix_is_routed_to_its_holder_and_served_from_cache(index, handle):
    first = generate(handle, question(0))
    assert first["num_cached_tokens"] == 0
    holder = first["worker_id"]
    ids = question(1).token_ids
    with KvmeshClient(index.service_addresses) as c:  # the holder's next heartbeat: idle
        wait_until(lambda: holder_settled(c, ids, holder, 192)
                   and c.route(ids, dry_run=True).worker_id == holder, timeout=10)
    for i in (1, 2):
        r = generate(handle, question(i))
        assert (r["worker_id"], r["num_cached_tokens"]) == (holder, 192)
    # Another tenant's salt: the same text shares nothing.
    assert generate(handle, question(3, salt="tenant-b"))["num_cached_tokens"] == 0


def test_requests_are_served_while_the_index_is_down(index, handle):
    for actor in index.services:
        ray.kill(actor, no_restart=True)
    results = [generate(handle, question(10 + i)) for i in range(4)]
    assert all(r["prompt_tokens"] == 220 for r in results)
