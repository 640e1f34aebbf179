"""The index in action over real processes (issue: metadata service, section 7)."""
from __future__ import annotations

import random
import time

import pytest
import redis

from client import KvmeshClient
from deploy.waiting import wait_until
from tests.cluster_scenarios import (
    another_salt_never_matches,
    generate_on,
    holder_match,
    question,
    replicas_agree,
    shared_prefix_goes_to_its_holder,
)


@pytest.fixture(scope="module")
def client(cluster):
    with KvmeshClient(cluster.service_addresses) as c:
        yield c


def test_shared_prefix_goes_to_its_holder_and_skips_prefill(client):
    shared_prefix_goes_to_its_holder(client)


def test_another_salt_never_matches(client):
    another_salt_never_matches(client)


def test_two_service_replicas_agree(cluster, client):
    replicas_agree(client, cluster.service_addresses)


def test_eviction_on_the_worker_removes_index_entries(cluster, client):
    holder = client.route(question(4)).worker_id
    address = next(w.address for w in cluster.workers if w.name == holder)
    # 64 blocks of 16 tokens: six 300-token prompts evict everything cached before them.
    rng = random.Random(5)
    for _ in range(6):
        generate_on(address, [rng.randrange(256) for _ in range(300)])
    wait_until(lambda: holder_match(client, question(4), holder) == 0, timeout=10)
    # The worker is the truth: it had nothing either.
    assert generate_on(address, question(4)).num_cached_tokens == 0


def test_emptied_redis_is_rebuilt_by_resync(cluster, client):
    first = client.generate(question(6), max_tokens=2)
    wait_until(lambda: holder_match(client, question(7), first.worker_id) >= 192, timeout=10)
    redis.Redis.from_url(cluster.redis_url).flushall()
    assert holder_match(client, question(7), first.worker_id) == 0
    # Heartbeats find the worker records gone: workers re-register and send snapshots.
    wait_until(lambda: holder_match(client, question(7), first.worker_id) >= 192, timeout=10)
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
        # reconnects to the restarted replica (an error counts as not yet).
        after = wait_until(lambda: c.route(question(7), dry_run=True), timeout=10)
    assert after.matched_tokens == before.matched_tokens


def test_killed_worker_leaves_routing_within_3s(cluster, client):
    victim = cluster.workers[1]
    victim.kill()
    t0 = time.monotonic()
    wait_until(lambda: all(c.worker_id != victim.name
                           for c in client.route(question(8)).candidates), timeout=3.5,
               interval=0.05)
    assert time.monotonic() - t0 <= 3.5
    # Requests keep completing on the survivor.
    assert client.generate(question(8), max_tokens=2).worker_id == cluster.workers[0].name
    alive = {w["worker_id"]: w["alive"] for w in client.stats()["workers"]}
    assert alive.get(victim.name) in (False, None)
