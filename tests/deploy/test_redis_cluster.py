"""deploy.redis_cluster: a real 3-primary cluster with every slot assigned, one password on
every node, and a node that comes back empty with its id and slots after a crash."""
from __future__ import annotations

from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster

from deploy.redis_cluster import SLOTS, RedisClusterServer, slot_ranges
from service.index.connect import plain_url


def test_slot_ranges_cover_every_slot_once() -> None:
    for shards in (1, 2, 3, 7, 16384):
        ranges = slot_ranges(shards)
        assert len(ranges) == shards and ranges[0][0] == 0 and ranges[-1][1] == SLOTS - 1
        assert all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
        sizes = [hi - lo + 1 for lo, hi in ranges]
        assert max(sizes) - min(sizes) <= 1
    assert slot_ranges(3) == [(0, 5460), (5461, 10921), (10922, 16383)]  # as valkey-cli
    for bad in (0, -1, SLOTS + 1):
        with pytest.raises(ValueError):
            slot_ranges(bad)


def _slots(url: str) -> list[tuple[int, int, int]]:
    """``(first, last, port)`` of every range the node at ``url`` knows."""
    with redis.Redis.from_url(url) as c:  # [[lo, hi, [host, port, id, {}], replicas...]...]
        return sorted((lo, hi, int(primary[1]))
                      for lo, hi, primary, *_ in c.execute_command("CLUSTER SLOTS"))


def test_every_node_is_ok_and_agrees_on_the_slot_map(redis_cluster: RedisClusterServer,
                                                     redis_cluster_url: str) -> None:
    assert redis_cluster.ok()
    want = sorted((lo, hi, n.port) for (lo, hi), n in zip(redis_cluster.ranges,
                                                           redis_cluster.nodes, strict=True))
    for url in redis_cluster.node_urls:
        assert _slots(url) == want
        with redis.Redis.from_url(url, decode_responses=True) as c:
            info = c.execute_command("CLUSTER INFO")
            assert info["cluster_state"] == "ok" and int(info["cluster_known_nodes"]) == 3
            assert c.config_get("cluster-require-full-coverage") == {
                "cluster-require-full-coverage": "no"}
    # rediss+cluster:// (mutual TLS) when the Valkey binary has TLS (deploy.redis_cluster)
    assert redis_cluster_url.startswith("rediss+cluster://:" if redis_cluster.secure
                                        else "redis+cluster://:")
    # a cluster client reaches every shard through the URL of one node
    with RedisCluster.from_url(plain_url(redis_cluster_url)) as rc:
        for i in range(60):
            rc.set(f"key-{i}", i)
    sizes = []
    for url in redis_cluster.node_urls:
        with redis.Redis.from_url(url) as c:
            sizes.append(c.dbsize())
    assert sum(sizes) == 60 and min(sizes) > 0


def test_every_node_refuses_a_client_without_the_password(
        redis_cluster: RedisClusterServer) -> None:
    # TLS-only nodes refuse a plaintext client before it can even try (tests/integration/
    # test_cluster_bus.py); a plaintext cluster refuses it the password
    refused = redis.ConnectionError if redis_cluster.secure else redis.AuthenticationError
    for node in redis_cluster.nodes:
        with redis.Redis(host=node.host, port=node.port) as anyone, pytest.raises(refused):
            anyone.set("x", "attacker")
        cmdline = Path(f"/proc/{node.pid}/cmdline").read_bytes().decode()
        assert redis_cluster.password not in cmdline
        with redis.Redis.from_url(node.url, decode_responses=True) as owner:
            assert owner.config_get("cluster-enabled") == {"cluster-enabled": "yes"}
    assert redis_cluster.password not in repr(redis_cluster)


def test_a_killed_node_comes_back_empty_with_its_id_and_slots(
        redis_cluster: RedisClusterServer, redis_cluster_url: str) -> None:
    victim = redis_cluster.nodes[1]
    with redis.Redis.from_url(victim.url) as c:
        node_id = c.execute_command("CLUSTER MYID")
    with RedisCluster.from_url(plain_url(redis_cluster_url), require_full_coverage=False) as rc:
        keys = [f"key-{i}" for i in range(30)]
        for k in keys:
            rc.set(k, "v")
        lost = [k for k in keys if redis_cluster.ranges[1][0] <= rc.keyslot(k)
                <= redis_cluster.ranges[1][1]]
        assert lost and len(lost) < len(keys)
        redis_cluster.kill_node(1)
        assert not redis_cluster.alive and not redis_cluster.ok()
        # the other shards keep serving their slots (no full coverage required)
        assert all(rc.get(k) == b"v" for k in keys if k not in lost)
        redis_cluster.restart_node(1)
        assert redis_cluster.ok()
        with redis.Redis.from_url(victim.url) as c:
            assert c.execute_command("CLUSTER MYID") == node_id and c.dbsize() == 0
        assert all(rc.get(k) is None for k in lost)
        assert all(rc.get(k) == b"v" for k in keys if k not in lost)
    for url in redis_cluster.node_urls:  # the map is back as it was
        assert [r[:2] for r in _slots(url)] == redis_cluster.ranges
