"""A kvmesh worker living inside a Ray process (an actor or a Ray Serve replica).

The same worker as ``python -m worker``, on the hosting process's loop: ``start`` returns once
the gRPC server accepts calls (registration follows in the background); a fresh host always
has an EMPTY pool; ``stop`` is idempotent.

See docs/architecture.md#ray-cluster-and-ray-serve.
"""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from worker.kv_cache.tier_config import TierConfig


@dataclass
class WorkerConfig:
    """How to build one hosted worker (picklable: it travels to the actor)."""

    worker_id: str
    services: tuple[str, ...]
    model: str = "tiny"
    block_size: int = 16
    num_blocks: int | None = None
    access_token: str | None = None   # what its WorkerService requires (None: open): launchers
    #                                   give worker_access_token(router token, worker_id),
    #                                   valid on this worker only; never the router token
    service_token: str | None = None  # what it presents to the service (its minted token)
    hash_seed: str | None = None
    heartbeat_s: float = 1.0
    max_batched_tokens: int = 2048
    device: str | None = None
    host: str | None = None   # None: this Ray node's IP
    data_host: str | None = None  # where its peer-KV data plane listens and what its
    #                               endpoints name (None: ``host``); peers on other nodes
    #                               must reach it there, so loopback only on one node
    peer_fetch: bool = True   # serve peers' fetches and follow fetch plans (calibrated)
    port: int = 0
    warmup: bool = False      # run one salted request first (first-call costs off the clock)
    tiers: TierConfig = TierConfig()  # its own (disk_dir on this worker's node)


def pick_device(requested: str | None) -> str:
    """``requested`` if given, else cuda when this Ray process owns a visible GPU."""
    if requested:
        return requested
    import ray
    import torch

    return "cuda" if ray.get_gpu_ids() and torch.cuda.is_available() else "cpu"


class WorkerHost:
    """Engine + WorkerService + ServiceLink on the current event loop."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.address = ""
        self.runner: Any = None      # worker.engine.async_engine.AsyncEngine once started
        self.link: Any = None        # worker.index_link.ServiceLink
        self._server: Any = None
        self.servicer: Any = None    # worker.rpc.server.WorkerServicer (fetch plans go here)
        self._link_task: asyncio.Task[None] | None = None

    async def start(self) -> WorkerHost:
        """Build and serve; returns once the gRPC server is up (address known)."""
        import ray

        from kvmesh.contract import DEFAULT_ALGO
        from kvmesh.hashing import none_hash, resolve_seed
        from worker.engine.async_engine import AsyncEngine
        from worker.engine.engine import Engine
        from worker.engine.scheduler import SchedulerConfig
        from worker.index_link import ServiceLink
        from worker.rpc.server import create_server

        cfg = self.config
        # vLLM's rule, read in this process: --hash-seed, else PYTHONHASHSEED, else the default.
        seed = resolve_seed(DEFAULT_ALGO, cfg.hash_seed)
        engine = Engine.from_pretrained(
            cfg.model, block_size=cfg.block_size, num_blocks=cfg.num_blocks,
            device=pick_device(cfg.device), hash_seed=seed,
            scheduler=SchedulerConfig(max_batched_tokens=cfg.max_batched_tokens),
            tiers=cfg.tiers)
        if cfg.warmup:  # its blocks carry a salt no request uses: they never match
            engine.generate([list(range(1, 2 * cfg.block_size + 2))], max_tokens=2,
                            salt="kvmesh-warmup")
        self.runner = AsyncEngine(engine).start()
        host = cfg.host or ray.util.get_node_ip_address()
        # its peer key is that of the credential it presents to the service (the tickets
        # the service mints for its fetches are bound to it)
        self._server, port, self.servicer = await create_server(
            f"{host}:{cfg.port}", self.runner, worker_id=cfg.worker_id, model_name=cfg.model,
            access_token=cfg.access_token, peer_fetch=cfg.peer_fetch,
            credential=cfg.service_token or "", data_host=cfg.data_host)
        if cfg.peer_fetch:  # before registering: its first load reports real fetch costs
            from worker.rpc.fetch_calibration import calibrate

            await calibrate(self.servicer.peer_source, self.runner)
        await self._server.start()
        self.address = f"{host}:{port}"
        if cfg.services:
            self.link = ServiceLink(
                list(cfg.services), self.runner, worker_id=cfg.worker_id,
                address=self.address, model=cfg.model, token=cfg.service_token,
                heartbeat_s=cfg.heartbeat_s,
                root_hash=none_hash(DEFAULT_ALGO, seed))
            self._link_task = asyncio.create_task(self.link.run())
        return self

    @property
    def registered(self) -> bool:
        """True once the service accepted this worker (and has not asked it to re-register)."""
        return bool(self.link is not None and self.link.registered and self.link.connected)

    def info(self) -> dict[str, Any]:
        """Identity and state, for launchers and tests."""
        import os

        import ray

        return {"worker_id": self.config.worker_id, "address": self.address,
                "pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(),
                "registered": self.registered,
                "data_host": self.servicer.peer_source.host if self.servicer else "",
                "device": str(self.runner.engine.device) if self.runner else "",
                "num_blocks": self.runner.engine.kv.num_blocks if self.runner else 0}

    async def stop(self) -> None:
        """Leave the index's view (heartbeats stop), stop serving, stop the engine."""
        if self.link is not None:
            await self.link.close()
            self.link = None
        if self._link_task is not None:
            self._link_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._link_task
            self._link_task = None
        if self._server is not None:
            await self._server.stop(grace=1.0)
            self._server = None
        if self.servicer is not None:  # its data plane goes with the server
            await self.servicer.close_peers()
            self.servicer = None
        if self.runner is not None:
            runner, self.runner = self.runner, None
            await asyncio.get_running_loop().run_in_executor(None, runner.stop)
