"""One metadata-service replica as a Ray async actor.

The replica's grpc.aio server runs on the actor's own event loop (Ray async actors run every
``async def`` method, the constructor included, on one loop), so the actor IS the service
process: ``address()`` answers ``host:port`` on this node's IP.

Contract:

- Without a ``host`` the replica listens on the node's IP (the address it advertises) and
  on loopback, on the same port, so ``127.0.0.1:PORT`` works on its own node as it does
  with the local backend. With a ``host`` it listens there only.
- Constructing the actor starts serving; a restarted actor (``max_restarts``) serves again
  with the same arguments. All state lives in Redis, so a restarted replica is immediately
  as good as the old one; with a fixed ``port`` it even comes back on the same address.
- ``stop()`` stops serving (1 s grace) and closes the Redis connection; idempotent.
"""
from __future__ import annotations

from typing import Any

import ray

LOOPBACK = "127.0.0.1"


def _listen_too(grpc_server: Any, address: str, config: Any) -> None:
    """Add ``address`` to a created (not started) server, with the same credentials."""
    creds = config.tls.server_credentials() if config.tls is not None else None
    try:
        port = (grpc_server.add_secure_port(address, creds) if creds is not None
                else grpc_server.add_insecure_port(address))
    except RuntimeError as e:
        raise RuntimeError(f"cannot bind {address}: {e}") from e
    if port == 0:
        raise RuntimeError(f"cannot bind {address}")


@ray.remote
class ServiceActor:
    """A kvmesh IndexService replica over the shared Redis."""

    async def __init__(self, redis_url: str, port: int = 0, host: str | None = None,
                       settings: dict[str, Any] | None = None) -> None:
        from service.config import ServiceConfig
        from service.server import create_server

        config = ServiceConfig(backend="redis", redis_url=redis_url, **(settings or {}))
        node_ip = ray.util.get_node_ip_address()
        self._server, bound = await create_server(f"{host or node_ip}:{port}", config)
        if host is None and node_ip != LOOPBACK:
            try:
                _listen_too(self._server.grpc_server, f"{LOOPBACK}:{bound}", config)
            except BaseException:
                await self._server.backend.close()
                raise
        await self._server.start()
        self._address = f"{host or node_ip}:{bound}"

    async def address(self) -> str:
        """``host:port`` of this replica's IndexService."""
        return self._address

    async def stop(self) -> None:
        """Stop serving; idempotent."""
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(grace=1.0)
