"""Quotas over real processes: Valkey, a service with an admin token, one worker process.

A tenant's flood of unique prompts evicts another tenant's cached system prompt while no
quota is set (the test's control: the same flood, the same pool); once the admin caps the
flood at a quarter of the device tier through the service, the worker picks the quota up
from its heartbeat answer and the same flood leaves the system prompt cached.
"""
from __future__ import annotations

import random

import pytest

from deploy.local import ClusterSpec, LocalCluster
from deploy.waiting import wait_until

ADMIN = "quota-flood-admin"
BS, BLOCKS = 16, 24
SYSTEM = [(5 * i + 3) % 251 for i in range(3 * BS)]  # 3 full blocks: tenant a's prompt


@pytest.fixture(scope="module")
def cluster():
    c = LocalCluster(ClusterSpec(workers=1, num_blocks=BLOCKS, block_size=BS,
                                 admin_token=ADMIN))
    c.start(timeout=120)
    yield c
    c.stop()


def victim(client, question: int) -> int:
    """Tenant a's system prompt with a one-token question; its prompt tokens from cache."""
    return client.generate(SYSTEM + [question], max_tokens=1, tenant="a").num_cached_tokens


def flood(client, rng: random.Random, n: int = 8) -> None:
    """``n`` unique 4-block prompts of tenant flood: 32 blocks' worth on a 24-block pool."""
    for _ in range(n):
        client.generate([rng.randrange(256) for _ in range(4 * BS + 1)], max_tokens=1,
                        tenant="flood")


def flood_quota(client, address: str) -> int:
    rows = client.worker_stats(address).get("tenants") or []
    tiers = next((r.get("tiers") or [] for r in rows if r["tenant"] == "flood"), [])
    return next((t.get("quota_blocks", 0) for t in tiers if t["tier"] == "gpu"), 0)


def test_a_flood_evicts_a_prompt_until_its_tenant_has_a_quota(cluster: LocalCluster) -> None:
    rng = random.Random(27)
    (worker,) = cluster.workers
    with cluster.client(admin_token=ADMIN) as client:
        victim(client, 1)
        assert victim(client, 2) == 3 * BS  # cached
        flood(client, rng)
        assert victim(client, 3) == 0  # no quota: LRU let the flood take it

        client.set_tenant_quota("flood", gpu=0.25)
        wait_until(lambda: flood_quota(client, worker.address) == BLOCKS // 4, timeout=15)
        assert victim(client, 4) == 3 * BS  # cached again by the previous request
        flood(client, rng)
        assert victim(client, 5) == 3 * BS  # the flood evicted its own blocks instead
