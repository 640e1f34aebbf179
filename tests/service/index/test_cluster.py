"""The index on a real 3-primary Redis Cluster, every script on one slot.

Lookups and provisional entries across shards (``test_single_slot_operations_run_on_the_
cluster``), and losing one primary costs only its slots (``test_a_lost_primary_fails_only_
its_slots_and_fast``).

Tests marked ``cluster_layout`` need every index script single-slot (``ClusterBackend``,
``service/index/cluster.py``); with the first layout they failed at the first ``register``
(redis-py: ``EVALSHA - all keys must map to the same key slot``):

- every semantics test of ``tests.service.index.test_base`` and the redis/memory/model
  property test, on the cluster;
- the spread: on a workload where every chain shares one system prompt (as every request
  of the Mooncake conversation trace does), no shard holds more than 1.5x the mean number
  of keys nor spends more than 1.5x the mean Redis time on lookups.

The split itself, attacked (a wave cut midway, shards back empty, the sweep racing a late
writer): ``tests/reliability/test_index_cluster_split.py``.
"""
from __future__ import annotations

import asyncio
import hashlib
import inspect
import time
from collections.abc import Callable

import pytest
import redis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from deploy.redis_cluster import RedisClusterServer
from deploy.waiting import eventually
from service.index.base import (
    BlockMatch,
    IndexBackend,
    IndexEvent,
    IndexStored,
    IndexUnavailable,
    WorkerRecord,
    namespace,
)
from service.index.redis import RedisBackend
from tests.service.index import test_base as semantics
from tests.service.index.test_backend_property import check, ops
from tests.service.index.test_base import NS, T0, H

SHARDS = 3
SPREAD_BAR = 1.5  # no shard above 1.5x the mean keys / lookup time


@pytest.fixture
def backend_factory(redis_cluster_url: str) -> Callable[[], IndexBackend]:
    """Overrides the fixture of ``tests.service.index.test_base`` for the tests imported
    below: the cluster."""
    return lambda: RedisBackend.from_url(redis_cluster_url)


# Every semantics test of tests.service.index.test_base that takes a backend, collected again
# in this module, where ``backend_factory`` is the cluster.
for _name, _test in inspect.getmembers(semantics, inspect.isfunction):
    if _name.startswith("test_") and "backend_factory" in inspect.signature(_test).parameters:
        globals()[_name] = pytest.mark.cluster_layout(_test)


def test_single_slot_operations_run_on_the_cluster(redis_cluster_url: str) -> None:
    """Provisional entries and lookups over every shard, before any registration."""
    chains = [H(100 + i, 1, 2, 3) for i in range(12)]  # 12 first blocks: every shard

    async def main() -> None:
        b = RedisBackend.from_url(redis_cluster_url)
        try:
            await b.ping()
            await b.load_scripts()
            assert await b.workers() == [] and await b.lookup(NS, chains[0], T0) == {}
            for c in chains:
                await b.add_provisional(NS, c, "w1", 1, T0, 2000)
                await b.add_provisional(NS, c, "w2", 0, T0, 4000)
            for c in chains:
                assert await b.lookup(NS, c, T0 + 1) == {"w2": BlockMatch(4, 4)}  # w1: no 0
                assert await b.lookup(NS, c, T0 + 1, ["w1"]) == {}
                assert await b.lookup(NS, c, T0 + 3000) == {"w2": BlockMatch(4, 4)}
                assert await b.lookup(NS, c, T0 + 4000) == {}
        finally:
            await b.close()

    asyncio.run(main())


def test_a_lost_primary_fails_only_its_slots_and_fast(redis_cluster: RedisClusterServer,
                                                     redis_cluster_url: str) -> None:
    """While one primary is down, a lookup that needs its slots raises IndexUnavailable
    (the service answers degraded) within the socket timeout, the others still answer;
    once it is back (empty), what it held is gone and the rest is intact."""
    chains = [H(200 + i, 1, 2) for i in range(24)]  # 24 first blocks: every shard
    full = {"w": BlockMatch(3, 3)}

    async def main() -> None:
        b = RedisBackend.from_url(redis_cluster_url)
        try:
            for c in chains:
                await b.add_provisional(NS, c, "w", 0, T0, 60_000)
            redis_cluster.kill_node(1)
            served, failed = [], []
            for c in chains:
                t0 = time.monotonic()
                try:
                    got = await b.lookup(NS, c, T0 + 1)
                except IndexUnavailable:
                    failed.append(c)
                else:
                    assert got == full
                    served.append(c)
                assert time.monotonic() - t0 < 2.0
            assert served and failed  # one shard's loss costs its slots, not the index
            redis_cluster.restart_node(1)
            for c in served:
                assert await b.lookup(NS, c, T0 + 1) == full
            for c in failed:  # answered again, without what the lost shard held
                got = await eventually(lambda c=c: b.lookup(NS, c, T0 + 1), lambda _: True,
                                       within=10)
                assert got != full
        finally:
            await b.close()

    asyncio.run(main())


@pytest.mark.cluster_layout
# no shrinking: on a cluster each example costs ~0.1 s; shrink a failure with the
# single-server twin (test_backend_property), which runs the same streams
@settings(max_examples=30, deadline=None, derandomize=True,
          phases=(Phase.explicit, Phase.reuse, Phase.generate),
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(stream=st.lists(ops, min_size=6, max_size=30))
def test_redis_memory_and_model_agree_on_a_cluster(redis_cluster_url: str,
                                                   stream: list[tuple]) -> None:
    asyncio.run(check(redis_cluster_url, stream))


def _node_counts(cluster: RedisClusterServer) -> tuple[list[int], list[int]]:
    """Keys and commandstats microseconds of every node."""
    keys, usec = [], []
    for url in cluster.node_urls:
        with redis.Redis.from_url(url) as c:
            keys.append(c.dbsize())
            usec.append(sum(int(s["usec"]) for s in c.info("commandstats").values()))
    return keys, usec


def _chains(n: int, shared: int, own: int) -> list[list[bytes]]:
    """``n`` chains of ``shared + own`` blocks whose first ``shared`` blocks are the same."""
    def link(parent: bytes, x: object) -> bytes:
        return hashlib.sha256(parent + repr(x).encode()).digest()

    prefix = [b""]
    for i in range(shared):
        prefix.append(link(prefix[-1], ("system", i)))
    out = []
    for j in range(n):
        c = prefix[1:]
        for i in range(own):
            c.append(link(c[-1], (j, i)))
        out.append(c)
    return out


@pytest.mark.cluster_layout
def test_one_shared_system_prompt_spreads_over_every_shard(
        redis_cluster: RedisClusterServer, redis_cluster_url: str) -> None:
    # as on the conversation trace: one 512-token system prompt (32 blocks of 16) first in
    # every chain (shorter chains than its ~750 blocks, to stay fast)
    chains = _chains(24, shared=32, own=64)
    workers = ("w0", "w1", "w2")
    ns = namespace("spread", 16, "sha256_cbor")

    async def main() -> None:
        b = RedisBackend.from_url(redis_cluster_url, timeout_s=5.0)
        try:
            for w in workers:
                await b.register(WorkerRecord(w, ns, f"{w}:1", "spread", 16, "sha256_cbor",
                                              heartbeat_ms=T0))
            for k, w in enumerate(workers):  # each holds 8 chains, all sharing the prompt
                mine = chains[k::3]
                events = [IndexEvent(1 + i, IndexStored(tuple(c), b"")) for i, c in enumerate(mine)]
                await b.apply_events(w, events)
            keys, _ = _node_counts(redis_cluster)
            # per shard, the cheapest of 5 rounds: a shard's Redis descheduled in the middle
            # of a command (a loaded host) only ever adds time
            spent = [float("inf")] * SHARDS
            for _ in range(5):
                _, before = _node_counts(redis_cluster)
                for k, c in enumerate(chains):
                    got = await b.lookup(ns, c, T0)
                    assert got[workers[k % 3]] == BlockMatch(96, 96)
                    assert all(m.blocks == 32 for w, m in got.items() if w != workers[k % 3])
                _, after = _node_counts(redis_cluster)
                spent = [min(s, a - z) for s, a, z in zip(spent, after, before, strict=True)]
        finally:
            await b.close()
        assert max(keys) <= SPREAD_BAR * sum(keys) / SHARDS, f"keys per shard {keys}"
        assert max(spent) <= SPREAD_BAR * sum(spent) / SHARDS, f"lookup usec per shard {spent}"

    asyncio.run(main())
