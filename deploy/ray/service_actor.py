"""One metadata-service replica as a Ray async actor.

The actor IS the service process (its server runs on the actor's loop); all state lives in
Redis, so a restarted replica is as good as the old one, and with a fixed port keeps its
address. ``stop()`` is idempotent.

See docs/architecture.md#ray-cluster-and-ray-serve.
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
