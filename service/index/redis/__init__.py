"""The Redis / Valkey backends' shared package: the single-server backend
(:class:`RedisBackend`, ``backend.py``), the key layout (``keys.py``), the Lua scripts
(``lua/*.lua``, loaded by ``lua.py``), the hand-packed commands of the hot path
(``resp.py``) and the lookup's walk (``walk.py``). The multi-shard Redis Cluster backend
builds on these (``service.index.cluster``)."""
from __future__ import annotations

from service.index.redis.backend import REGISTRY, RedisBackend, worker_key

__all__ = ["REGISTRY", "RedisBackend", "worker_key"]
