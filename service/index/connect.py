"""The index's Redis client: one server (the default) or a Redis Cluster, chosen by the URL.

``redis_client(url)`` is ``Redis.from_url`` for a plain URL and a ``RedisCluster`` for
``redis+cluster://``; ``cluster_url``/``plain_url`` switch the scheme. A lost shard never
takes the whole index down: other slots keep working, and a script loads when any primary
loaded it.

See docs/architecture.md#the-redis-layout-serviceindexredis.
"""
from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

__all__ = ["CLUSTER_SCHEMES", "cluster_url", "is_cluster_url", "plain_url", "redis_client"]

# cluster scheme -> the scheme redis-py's cluster client takes
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


class _Cluster(RedisCluster):
    """redis-py's cluster client, whose ``script_load`` survives a lost primary."""

    async def script_load(self, script: str) -> str:  # type: ignore[override]
        """``SCRIPT LOAD`` on every primary; its SHA once any of them has it (raises the
        first error when none does)."""
        if self._initialize:
            await self.initialize()
        done = await asyncio.gather(
            *(self.execute_command("SCRIPT LOAD", script, target_nodes=node)
              for node in self.get_primaries()), return_exceptions=True)
        for res in done:
            if not isinstance(res, BaseException):
                return res
        raise done[0]


def is_cluster_url(url: str) -> bool:
    """True when ``url`` names a Redis Cluster (``redis+cluster://``, ``rediss+cluster://``)."""
    return urlsplit(url).scheme.lower() in CLUSTER_SCHEMES


def cluster_url(url: str) -> str:
    """``url`` with its cluster scheme (``redis://h:p`` -> ``redis+cluster://h:p``)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in CLUSTER_SCHEMES:
        return url
    if scheme not in CLUSTER_SCHEMES.values():
        raise ValueError(f"a Redis Cluster URL is redis:// or rediss://, got {scheme}://")
    return urlunsplit(parts._replace(scheme=scheme + "+cluster"))


def plain_url(url: str) -> str:
    """``url`` without its cluster scheme (unchanged when it has none)."""
    parts = urlsplit(url)
    scheme = CLUSTER_SCHEMES.get(parts.scheme.lower())
    return url if scheme is None else urlunsplit(parts._replace(scheme=scheme))


def redis_client(url: str, **options: Any) -> aioredis.Redis | RedisCluster:
    """redis-py's asyncio client for ``url`` (see the module contract); connects lazily."""
    if not is_cluster_url(url):
        return aioredis.Redis.from_url(url, **options)
    plain = plain_url(url)
    if urlsplit(plain).path not in ("", "/", "/0"):
        raise ValueError("a Redis Cluster has database 0 only: drop the /DB path of the URL")
    return _Cluster.from_url(plain, require_full_coverage=False, **options)
