"""Index backends: ``memory`` (in-process) and ``redis`` (Redis / Valkey); see ``base.py``."""
from __future__ import annotations

from service.index.base import IndexBackend, IndexUnavailable, StaleIncarnation

__all__ = ["IndexBackend", "IndexUnavailable", "StaleIncarnation", "open_backend"]


def open_backend(kind: str, redis_url: str | None = None, timeout_s: float = 0.5,
                 cluster: bool = False) -> IndexBackend:
    """A backend by name: ``memory``, or ``redis`` on ``redis_url`` (connects lazily).

    ``redis_url`` is any URL redis-py's ``from_url`` takes, passed through unchanged: a
    password (``redis://:PASSWORD@host:port/0``, or ``user:PASSWORD@`` with ACLs) and TLS
    (``rediss://...?ssl_ca_certs=CA.pem``, also ``ssl_certfile``/``ssl_keyfile`` for a
    client certificate). It carries a secret: never log it unredacted (kvmesh.ops.redact).
    A ``redis+cluster://`` (``rediss+cluster://``) URL, or ``cluster=True`` with a plain one,
    names a node of a Redis Cluster: the backend then uses redis-py's cluster client
    (``service.index.connect``).
    """
    if kind == "memory":
        from service.index.memory import MemoryBackend

        return MemoryBackend()
    if kind == "redis":
        if not redis_url:
            raise ValueError("the redis backend needs a URL (redis://[:PASSWORD@]host:port/db)")
        from service.index.connect import cluster_url
        from service.index.redis import RedisBackend

        return RedisBackend.from_url(cluster_url(redis_url) if cluster else redis_url, timeout_s)
    raise ValueError(f"unknown index backend {kind!r}; valid: memory, redis")
