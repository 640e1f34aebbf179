"""service.index.connect: one Redis by default, redis-py's cluster client for a
``redis+cluster://`` URL or ``--redis-cluster``; the choice reaches the service's backend."""
from __future__ import annotations

import asyncio
import hashlib

import pytest
import redis.asyncio as aioredis
import typer
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import MovedError
from typer.testing import CliRunner

from deploy.redis_cluster import RedisClusterServer
from service.cli import config_of, register
from service.config import ServiceConfig
from service.index import IndexUnavailable, open_backend
from service.index.base import BlockMatch, namespace
from service.index.connect import cluster_url, is_cluster_url, plain_url, redis_client

NS = namespace("m", 4, "sha256_cbor")
NONE = dict(token=None, worker_token=None, worker_secret=None)


def chain(n: int, seed: int = 0) -> list[bytes]:
    return [hashlib.sha256(f"{seed}/{i}".encode()).digest() for i in range(n)]


def test_cluster_urls_keep_everything_but_the_scheme() -> None:
    url = "redis://:p%40ss@10.0.0.1:7000/0?socket_keepalive=1"
    assert cluster_url(url) == "redis+cluster://:p%40ss@10.0.0.1:7000/0?socket_keepalive=1"
    assert plain_url(cluster_url(url)) == url and plain_url(url) == url
    assert cluster_url("rediss://h:1") == "rediss+cluster://h:1"
    assert cluster_url(cluster_url(url)) == cluster_url(url)
    assert is_cluster_url("REDIS+CLUSTER://h:1") and not is_cluster_url(url)
    with pytest.raises(ValueError, match="redis:// or rediss://"):
        cluster_url("unix:///tmp/redis.sock")


def test_the_scheme_picks_the_client_and_options_reach_it() -> None:
    async def main() -> None:
        one = redis_client("redis://:pw@127.0.0.1:1/0", socket_timeout=0.25)
        assert type(one) is aioredis.Redis
        assert one.connection_pool.connection_kwargs["socket_timeout"] == 0.25
        await one.aclose()
        many = redis_client("redis+cluster://:pw@127.0.0.1:1/0", socket_timeout=0.25,
                            decode_responses=True)
        assert isinstance(many, RedisCluster)
        assert many.connection_kwargs["socket_timeout"] == 0.25
        assert many.connection_kwargs["password"] == "pw"
        assert many.nodes_manager.require_full_coverage is False
        await many.aclose()
        with pytest.raises(ValueError, match="database 0 only"):
            redis_client("redis+cluster://127.0.0.1:1/3")

    asyncio.run(main())


def test_open_backend_and_the_config_take_the_cluster_flag() -> None:
    async def main() -> None:
        for url, flag, kind in (("redis://h:1/0", False, aioredis.Redis),
                                ("redis://h:1/0", True, RedisCluster),
                                ("redis+cluster://h:1/0", False, RedisCluster)):
            b = open_backend("redis", url, cluster=flag)
            assert isinstance(b.client, kind) and isinstance(b.client, RedisCluster) == (
                kind is RedisCluster), (url, flag)
            await b.close()

    asyncio.run(main())
    with pytest.raises(ValueError, match="redis_cluster needs backend 'redis'"):
        ServiceConfig(redis_cluster=True)
    cfg = config_of("auto", None, redis_url="redis://h:1/0", redis_cluster=True, **NONE)
    assert cfg.backend == "redis" and cfg.redis_cluster
    assert not config_of("auto", None, redis_url="redis://h:1/0", **NONE).redis_cluster
    app = typer.Typer()
    register(app)
    res = CliRunner().invoke(app, ["service", "--help"])
    assert res.exit_code == 0 and "--redis-cluster" in res.output


def test_a_plain_client_on_a_cluster_node_fails_where_the_cluster_client_succeeds(
        redis_cluster: RedisClusterServer, redis_cluster_url: str) -> None:
    """The flag matters: one node's URL read as a single server gets MOVED for the other
    shards' slots (the index unavailable), the cluster client follows the slot map. A
    lookup reads the control slot and the slots of every block's tag, so on 3 shards a
    plain client never gets one through."""
    node = redis_cluster.nodes[0].url
    chains = [chain(4, seed) for seed in range(12)]  # 12 roots: slots on every shard

    async def main() -> None:
        plain, clustered = open_backend("redis", node), open_backend("redis", node, cluster=True)
        try:
            for c in chains:
                await clustered.add_provisional(NS, c, "w0", 0, 1_000, 5_000)
            for c in chains:
                assert await clustered.lookup(NS, c, 2_000) == {"w0": BlockMatch(4, 4)}
            refused = 0
            for c in chains:
                try:
                    await plain.lookup(NS, c, 2_000)
                except IndexUnavailable as e:
                    assert isinstance(e.__cause__, MovedError)
                    refused += 1
            assert refused == len(chains)
        finally:
            await plain.close()
            await clustered.close()

    asyncio.run(main())
