"""The embedded Valkey of a Ray deployment, owned by an actor pinned to the head node.

The head node is the one node whose loss ends the Ray cluster anyway, so it is the natural
home of the single stateful process. The actor is pinned there with the head node's
``node:__internal_head__`` resource and asks for no CPU.

Contract:

- The constructor starts a Valkey/Redis child bound to this node's IP (``start_redis``):
  other nodes' service replicas must reach it, so it cannot stay on loopback; it requires a
  random password instead (protected mode on). ``url()`` answers
  ``redis://:PASSWORD@<head-ip>:<port>/0``: a secret, which Ray hands to the service actors
  as an argument (never a command line) and which is printed only redacted.
- ``stop()`` ends the child gracefully; the child also dies with the actor's process when
  Ray ends it. The actor is NOT restarted (``max_restarts=0``): a new Valkey would come back
  empty on another port, which no running service replica knows. Production clusters pass
  ``redis_url`` (a managed Redis/Valkey) instead.
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
