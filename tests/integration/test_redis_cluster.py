"""A whole kvmesh cluster (service replicas, worker processes) over a real 3-primary Redis
Cluster started by ``kvmesh up --redis-shards 3`` / ``LocalCluster(redis_shards=3)``.

Every test here but the flag checks is ``cluster_layout`` (every index script single-slot:
with the first index layout no worker could register, so the cluster never got ready): the
usual scenarios hold on a cluster, and losing one primary while routing yields degraded
answers, never errors, and the index is whole again (by resync) once the shard is back.
"""
from __future__ import annotations

import random
import threading

import pytest
import redis
from redis.crc import key_slot
from typer.testing import CliRunner

from client.cli import app
from deploy.local import ClusterSpec, LocalCluster
from deploy.waiting import wait_until
from service.index.connect import is_cluster_url
from tests.cluster_scenarios import (
    another_salt_never_matches,
    generate_on,
    holder_match,
    question,
    replicas_agree,
    shared_prefix_goes_to_its_holder,
)
from tests.kvmesh_up import Up

SHARDS = 3
START_S = 45.0  # a tiny cluster is ready in ~10 s; failing, this is what a test waits


@pytest.fixture(scope="module")
def sharded():
    c = LocalCluster(ClusterSpec(workers=2, service_replicas=2, num_blocks=64, block_size=16,
                                 redis_shards=SHARDS, insecure_cluster_bus=True))
    c.start(timeout=START_S)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def client(sharded: LocalCluster):
    with sharded.client() as c:
        yield c


def test_up_rejects_shards_it_cannot_start() -> None:
    for args in (["--redis-shards", "0"],
                 ["--redis-shards", "3", "--redis-url", "redis://127.0.0.1:1/0"],
                 ["--redis-shards", "3", "--backend", "ray"]):
        res = CliRunner().invoke(app, ["up", *args], env={"COLUMNS": "300"})
        assert res.exit_code == 2 and "--redis-shards" in res.output, (args, res.output)
    with pytest.raises(ValueError, match="redis_shards"):
        LocalCluster(ClusterSpec(redis_shards=2, redis_url="redis://127.0.0.1:1/0"))


@pytest.mark.cluster_layout
def test_shared_prefix_goes_to_its_holder(client) -> None:
    shared_prefix_goes_to_its_holder(client)


@pytest.mark.cluster_layout
def test_another_salt_never_matches(client) -> None:
    another_salt_never_matches(client)


@pytest.mark.cluster_layout
def test_two_service_replicas_agree(sharded: LocalCluster, client) -> None:
    replicas_agree(client, sharded.service_addresses)


@pytest.mark.cluster_layout
def test_a_cluster_service_counts_merged_batches(client) -> None:
    assert client.stats()["counters"]["index_merged_batches_total"] >= 0


def _keys(url: str) -> int:
    with redis.Redis.from_url(url, socket_timeout=2) as c:
        return int(c.dbsize())


@pytest.mark.cluster_layout
@pytest.mark.parametrize("lost", ["busiest", "control"])
def test_a_lost_primary_degrades_routes_never_fails_them_and_resync_refills_it(
        sharded: LocalCluster, client, lost: str) -> None:
    shards = sharded.redis_cluster
    assert shards is not None and is_cluster_url(sharded.redis_url)
    holder = client.generate(question(20), max_tokens=2).worker_id
    wait_until(lambda: holder_match(client, question(21), holder) >= 192, 10,
               what="the shared prefix indexed")
    if lost == "busiest":  # the shard holding most of the index: its loss must hurt
        victim = max(range(SHARDS), key=lambda i: _keys(shards.node_urls[i]))
    else:  # the control slot's (registry, records, handles): workers register again
        victim = next(i for i, (a, z) in enumerate(shards.ranges)
                      if a <= key_slot(b"ctl") <= z)
    answers: list = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def keep_routing() -> None:
        with sharded.client() as c:
            while not stop.is_set():
                try:
                    answers.append(c.route(question(21), dry_run=True))
                except Exception as e:  # the failure this test is about
                    errors.append(e)

    router = threading.Thread(target=keep_routing, daemon=True)
    router.start()
    try:
        wait_until(lambda: len(answers) >= 5 or errors, 10, what="routes before the loss")
        shards.kill_node(victim)
        lost_at = len(answers)
        wait_until(lambda: any(a.degraded for a in answers[lost_at:]) or errors, 10,
                   what="a degraded answer while the shard is down")
        wait_until(lambda: len(answers) >= lost_at + 20 or errors, 20,
                   what="routes during the loss")
        shards.restart_node(victim)  # back EMPTY: its part of the index is gone
        back_at = len(answers)

        def whole() -> bool:
            r = client.route(question(21), dry_run=True)
            return not r.degraded and holder_match(client, question(21), holder) >= 192

        wait_until(whole, 30, interval=0.2, what="the index whole again after the resync")
        wait_until(lambda: len(answers) >= back_at + 5 or errors, 10, what="routes after")
    finally:
        stop.set()
        router.join(10)
    assert not errors, errors[:3]
    assert not answers[-1].degraded
    assert all(w["alive"] for w in client.stats()["workers"])


@pytest.mark.cluster_layout
def test_kvmesh_up_redis_shards_serves_routes() -> None:
    up = Up("--redis-shards", str(SHARDS), "--workers", "1", "--port", "0",
            "--num-blocks", "64", "--insecure-cluster-bus")
    try:
        ready = up.wait_ready(60)
        assert ready, up.tail()
        redis_line = next(ln for ln in up.lines if ln.startswith("redis "))
        assert "+cluster://:***@" in redis_line and f"{SHARDS} shards" in redis_line
        from client import KvmeshClient

        with KvmeshClient(up.field("service")) as c:
            assert [w["alive"] for w in c.stats()["workers"]] == [True]
            assert c.generate(question(30), max_tokens=2).worker_id == "worker-0"
        assert up.stop() == 0
    finally:
        up.kill()


def _prompt_on_one_shard(shards, avoid: int, blocks: int, block_size: int) -> tuple[list[int], int]:
    """Tokens whose first ``blocks`` blocks all live on one shard other than ``avoid``, and
    that shard."""
    from kvmesh.hashing import block_hashes
    from service.index.cluster import TAG_SLOTS
    from service.index.redis import keys

    def node(slot: int) -> int:
        return next(i for i, (a, z) in enumerate(shards.ranges) if a <= slot <= z)

    for seed in range(10_000):
        tokens = [random.Random(7_000 + seed).randrange(256) for _ in range(200)]
        where = {node(TAG_SLOTS[keys.tag(h)])
                 for h in block_hashes(tokens, block_size)[:blocks]}
        if len(where) == 1 and avoid not in where:
            return tokens, where.pop()
    raise AssertionError("no such prompt")


@pytest.mark.cluster_layout
def test_a_shard_back_older_is_resynced_and_claims_nothing_evicted(
        sharded: LocalCluster, client, tmp_path) -> None:
    """A block shard restarted from a dump taken before the worker evicted a prompt (what a
    promoted replica or a restart from RDB/AOF serves): the service replicas' janitors see
    another server process behind its slots, move the generation, the worker (its real
    service link) resyncs, and the index stops claiming the evicted blocks."""
    from tests.reliability.test_index_cluster_rollback import restart_from_dump, save_dump

    shards = sharded.redis_cluster
    assert shards is not None
    ctl = next(i for i, (a, z) in enumerate(shards.ranges) if a <= key_slot(b"ctl") <= z)
    tokens, victim = _prompt_on_one_shard(shards, ctl, 4, 16)
    worker = sharded.workers[0]
    generate_on(worker.address, tokens)
    wait_until(lambda: holder_match(client, tokens, worker.name) >= 64, 15,
               what="the prompt indexed")
    save_dump(shards.node_urls[victim], tmp_path)  # the shard's last persist
    for i in range(40):  # other prompts evict it from the worker's 64 blocks
        if holder_match(client, tokens, worker.name) == 0:
            break
        generate_on(worker.address, [random.Random(9_000 + i).randrange(256)
                                     for _ in range(200)])
    wait_until(lambda: holder_match(client, tokens, worker.name) == 0, 15,
               what="the eviction indexed")
    restart_from_dump(shards, victim, tmp_path)  # back with the evicted prompt's entries

    def claims_nothing() -> bool:
        r = client.route(tokens, dry_run=True)
        return not r.degraded and holder_match(client, tokens, worker.name) == 0

    wait_until(claims_nothing, 30, interval=0.2, what="the evicted prompt claimed no more")
    assert all(w["alive"] for w in client.stats()["workers"])
