"""The index in action over real processes (issue: metadata service, section 7)."""
from __future__ import annotations

import random
import time

import grpc
import pytest
import redis

from client import KvmeshClient, KvmeshError
from kvmesh.v1 import worker_pb2, worker_pb2_grpc
from tests.integration.conftest import wait_for

SYSTEM = [random.Random(0).randrange(256) for _ in range(200)]  # 12 full blocks + 8


def question(i: int) -> list[int]:
    return SYSTEM + [random.Random(100 + i).randrange(256) for _ in range(20)]


@pytest.fixture(scope="module")
def client(cluster):
    with KvmeshClient(cluster.service_addresses) as c:
        yield c


def generate_on(address: str, tokens: list[int], max_tokens: int = 2):
    with grpc.insecure_channel(address) as ch:
        stub = worker_pb2_grpc.WorkerServiceStub(ch)
        msgs = list(stub.Generate(worker_pb2.GenerateRequest(
            token_ids=tokens, sampling=worker_pb2.SamplingParams(max_tokens=max_tokens,
                                                                 ignore_eos=True))))
    return msgs[-1]


def _try(fn):
    try:
        return fn()
    except KvmeshError:
        return None


def holder_match(client, tokens, worker_id, salt=None) -> int:
    for c in client.route(tokens, salt=salt, dry_run=True).candidates:
        if c.worker_id == worker_id:
            return c.matched_tokens
    return 0


def test_shared_prefix_goes_to_its_holder_and_skips_prefill(client):
    first = client.generate(question(0), max_tokens=4)
    assert first.num_cached_tokens == 0
    holder = first.worker_id
    # Until the holder's next heartbeat the service counts the routed prompt as work queued
    # on it (so a burst spreads); once the heartbeat shows it idle, its cached prefix wins.
    time.sleep(1.5)
    wait_for(lambda: holder_match(client, question(1), holder) >= 192)
    route = client.route(question(1))
    # >= : the route above may have left provisional entries for its own new blocks.
    assert route.worker_id == holder and route.matched_tokens >= 192
    second = client.generate(question(1), max_tokens=4)
    assert second.worker_id == holder and second.num_cached_tokens == 192


def test_another_salt_never_matches(client):
    route = client.route(question(2), salt="tenant-b")
    assert all(c.matched_tokens == 0 for c in route.candidates)
    salted = client.generate(question(2), max_tokens=2, salt="tenant-b")
    assert salted.num_cached_tokens == 0


def test_two_service_replicas_agree(cluster, client):
    # The first route records provisional entries for the chosen worker's new blocks (shared
    # through Redis, so both replicas see them); compare the answers after it.
    client.route(question(3))
    answers = []
    for addr in cluster.service_addresses:
        with KvmeshClient(addr) as c:
            r = c.route(question(3), dry_run=True)
            answers.append(sorted((x.worker_id, x.matched_tokens) for x in r.candidates))
    assert answers[0] == answers[1] and max(m for _, m in answers[0]) >= 192


def test_eviction_on_the_worker_removes_index_entries(cluster, client):
    holder = client.route(question(4)).worker_id
    address = next(w.address for w in cluster.workers if w.name == holder)
    # 64 blocks of 16 tokens: six 300-token prompts evict everything cached before them.
    rng = random.Random(5)
    for _ in range(6):
        generate_on(address, [rng.randrange(256) for _ in range(300)])
    wait_for(lambda: holder_match(client, question(4), holder) == 0)
    # The worker is the truth: it had nothing either.
    assert generate_on(address, question(4)).num_cached_tokens == 0


def test_emptied_redis_is_rebuilt_by_resync(cluster, client):
    first = client.generate(question(6), max_tokens=2)
    wait_for(lambda: holder_match(client, question(7), first.worker_id) >= 192)
    redis.Redis.from_url(cluster.redis_url).flushall()
    assert holder_match(client, question(7), first.worker_id) == 0
    # Heartbeats find the worker records gone: workers re-register and send snapshots.
    wait_for(lambda: holder_match(client, question(7), first.worker_id) >= 192, timeout=10)
    assert all(w["alive"] for w in client.stats()["workers"])


def test_service_restart_loses_nothing(cluster, client):
    before = client.route(question(7), dry_run=True)
    cluster.services[0].kill()
    # The client fails over to the other replica meanwhile.
    during = client.route(question(7), dry_run=True)
    assert during.worker_id == before.worker_id
    assert during.matched_tokens == before.matched_tokens
    cluster.start_service(0, port=int(cluster.services[0].address.rpartition(":")[2]))
    with KvmeshClient(cluster.services[0].address) as c:
        # gRPC may still hold the old connection's back-off for a moment: retry until it
        # reconnects to the restarted replica.
        after = wait_for(lambda: _try(lambda: c.route(question(7), dry_run=True)))
    assert after.matched_tokens == before.matched_tokens


def test_killed_worker_leaves_routing_within_3s(cluster, client):
    victim = cluster.workers[1]
    victim.kill()
    t0 = time.monotonic()
    wait_for(lambda: all(c.worker_id != victim.name
                         for c in client.route(question(8)).candidates), timeout=3.5,
             interval=0.05)
    assert time.monotonic() - t0 <= 3.5
    # Requests keep completing on the survivor.
    assert client.generate(question(8), max_tokens=2).worker_id == cluster.workers[0].name
    alive = {w["worker_id"]: w["alive"] for w in client.stats()["workers"]}
    assert alive.get(victim.name) in (False, None)
