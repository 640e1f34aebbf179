"""The embedded Valkey of a Ray deployment, owned by an actor pinned to the head node.

It binds the node's IP with a random password (``url()`` is a secret, printed only redacted),
and is never restarted: a new Valkey would be empty on a port nobody knows.

See docs/architecture.md#ray-cluster-and-ray-serve.
"""
from __future__ import annotations

import ray

from deploy.ray.placement import HEAD_RESOURCE


@ray.remote(num_cpus=0, max_restarts=0, resources={HEAD_RESOURCE: 0.001})
class RedisActor:
    """Owns one Valkey process on the head node."""

    def __init__(self, port: int = 0) -> None:
        from deploy.redis_server import start_redis

        self._server = start_redis(port, host=ray.util.get_node_ip_address())

    def url(self) -> str:
        """Where the index lives, with its password: ``redis://:PASSWORD@host:port/0``."""
        return self._server.url

    def stop(self) -> None:
        """Stop Valkey (SIGTERM, then SIGKILL); idempotent."""
        self._server.stop()
