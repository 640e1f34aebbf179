"""One kvmesh worker as a Ray async actor (model, KV pool, WorkerService, ServiceLink).

Contract:

- Constructing the actor builds the engine, starts the gRPC server on this node's IP and
  starts registering with the service replicas it was given. ``info()`` answers the
  worker's id, address, node and whether the service has accepted it.
- A restarted actor (node lost, process killed; ``max_restarts``) runs the constructor
  again: same worker id, a new address, an EMPTY pool. Its registration replaces the old
  record and its first snapshot clears what the index believed it held.
- The actor's GPU share comes from its options (``num_gpus``, fractional allowed); the
  engine runs on CUDA only when Ray assigned a GPU that torch can see.
"""
from __future__ import annotations

from typing import Any

import ray

from deploy.ray.worker_host import WorkerConfig, WorkerHost


@ray.remote
class WorkerActor:
    """Hosts one kvmesh worker on the actor's event loop."""

    async def __init__(self, config: WorkerConfig) -> None:
        self._host = await WorkerHost(config).start()

    async def info(self) -> dict[str, Any]:
        """``worker_id``, ``address``, ``pid``, ``node_id``, ``registered``, ``device``."""
        return self._host.info()

    async def stop(self) -> None:
        """Stop heartbeating and serving; idempotent."""
        await self._host.stop()
