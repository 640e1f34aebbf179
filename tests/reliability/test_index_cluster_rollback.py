"""A block shard of a real 3-primary Redis Cluster that comes back OLDER (its process
restarted from a dump taken before the last writes, as a promoted replica or a restart
from RDB/AOF would serve): the generation moves, every worker is asked for a snapshot,
and once it lands the index claims nothing the worker removed (``shard_identity.py``)."""
from __future__ import annotations

import shutil
from pathlib import Path

import redis

from deploy.redis_cluster import RedisClusterServer
from service.index.base import (
    ApplyStatus,
    BlockMatch,
    IndexEvent,
    IndexRemoved,
    IndexStored,
    WorkerLoad,
)
from service.index.cluster import CTL_SLOT, ClusterBackend
from service.index.redis import RedisBackend, keys
from tests.reliability.test_index_cluster_split import _chain_on, _node_of, run
from tests.service.index.test_base import NS, T0, rec


def restart_from_dump(cluster: RedisClusterServer, i: int, dump_dir: Path) -> None:
    """Node ``i`` killed and started again from the RDB in ``dump_dir`` (its id and slots
    kept: the cluster config file is elsewhere), as a restart from an older dump."""
    node = cluster.nodes[i]
    cluster.kill_node(i)
    plain = node.extra_args
    node.extra_args = (*plain, "--dir", str(dump_dir))
    try:
        cluster.restart_node(i)
    finally:
        node.extra_args = plain  # a later restart comes back empty again


def save_dump(url: str, into: Path) -> None:
    """``SAVE`` on the node at ``url``; its RDB copied into ``into``."""
    with redis.Redis.from_url(url, decode_responses=True) as c:
        c.save()
        src = Path(c.config_get("dir")["dir"]) / c.config_get("dbfilename")["dbfilename"]
    into.mkdir(parents=True, exist_ok=True)
    shutil.copy(src, into / "dump.rdb")


def test_a_shard_back_older_makes_every_worker_resync(redis_cluster: RedisClusterServer,
                                                      redis_cluster_url: str,
                                                      tmp_path: Path) -> None:
    victim = next(i for i in range(3) if i != _node_of(redis_cluster, CTL_SLOT))
    chain = _chain_on(redis_cluster, {victim}, 6, 1)  # every block on the victim shard
    kept = {"w": BlockMatch(2, 2)}

    async def body(b: ClusterBackend) -> None:
        await b.register(rec("w"))
        assert (await b.apply_events("w", [IndexEvent(1, IndexStored(tuple(chain)))])).applied == 1
        await b.sweep()  # the janitor: sentinels stamped, nothing changed
        gen = await b.client.get(keys.CTL + "gen")
        save_dump(redis_cluster.node_urls[victim], tmp_path)  # the shard's last persist
        assert (await b.apply_events("w", [IndexEvent(2, IndexRemoved(tuple(chain[2:])))])).applied
        assert await b.lookup(NS, chain, T0) == kept
        assert (await b.heartbeat("w", WorkerLoad(), 2, T0)).last_seq == 2
        restart_from_dump(redis_cluster, victim, tmp_path)  # back with the removed blocks
        assert (await b.lookup(NS, chain, T0))["w"].blocks == 6  # the over-claim
        await b.sweep()
        assert await b.client.get(keys.CTL + "gen") != gen
        hb = await b.heartbeat("w", WorkerLoad(), 2, T0)
        assert hb.known and hb.last_seq < hb.prev_reported_seq  # the service asks a snapshot
        assert (await b.apply_events("w", [IndexEvent(3, IndexRemoved((chain[1],)))])).status \
            is ApplyStatus.GAP
        assert await b.sync_worker("w", 2, [IndexStored(tuple(chain[:2]))]) == 2
        assert await b.lookup(NS, chain, T0) == kept  # the removed blocks count no more
        await b.sweep()  # stamped: no new generation
        assert (await b.heartbeat("w", WorkerLoad(), 2, T0)).last_seq == 2

    run(redis_cluster_url, body)


def test_a_restart_that_lost_nothing_costs_one_generation_not_more(
        redis_cluster: RedisClusterServer, redis_cluster_url: str, tmp_path: Path) -> None:
    """A restart from a dump of everything (nothing lost: a false positive) moves the
    generation once; a second service replica's janitor then finds the tags stamped."""
    victim = next(i for i in range(3) if i != _node_of(redis_cluster, CTL_SLOT))

    async def body(b: ClusterBackend) -> None:
        other = RedisBackend.from_url(redis_cluster_url)  # a second service replica
        try:
            await b.register(rec("w"))
            await b.sweep()
            save_dump(redis_cluster.node_urls[victim], tmp_path)
            restart_from_dump(redis_cluster, victim, tmp_path)  # a new run_id, same data
            gen = await b.client.get(keys.CTL + "gen")
            await b.sweep()
            moved = await b.client.get(keys.CTL + "gen")
            assert moved != gen
            await other.sweep()
            assert await b.client.get(keys.CTL + "gen") == moved
        finally:
            await other.close()

    run(redis_cluster_url, body)
