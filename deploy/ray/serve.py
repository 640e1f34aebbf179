"""kvmesh workers as Ray Serve replicas, routed by the kvmesh index.

Every ``KvmeshReplica`` hosts one worker and registers it as ``serve_worker_id(replica_id)``;
``generate`` yields the tokens of each step, then one ``finished=True`` dict with the cache and
timing figures. A replica mints its own tokens at start from the secret it is given, keeping
only those. A request carrying the router's fetch plans (``deploy.ray.request``) has the
replica's worker pull its own plan's blocks first, through the same receiver as the worker's
gRPC Generate (``WorkerServicer.follow``); the final dict's ``cached_tokens_by_tier`` then
counts them as "peer". A request's ``tenant`` goes to the router's Route and to the
replica's engine (blocks it caches are charged to it).

See docs/architecture.md#ray-cluster-and-ray-serve.
"""
from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

from ray import serve
from ray.serve.config import RequestRouterConfig

from deploy.ray.request import ServeRequest, fetch_plan_for, request_field
from deploy.ray.router import ROUTER_PATH, serve_worker_id
from deploy.ray.worker_host import WorkerConfig, WorkerHost
from kvmesh.quota import check_tenant


@serve.deployment(max_ongoing_requests=8, health_check_period_s=5)
class KvmeshReplica:
    """One kvmesh worker per replica; see the module docstring."""

    async def __init__(self, service_addresses: list[str], model: str = "tiny",
                       block_size: int = 16, num_blocks: int | None = None,
                       token: str | None = None, worker_token: str | None = None,
                       worker_secret: str | None = None, hash_seed: str | None = None,
                       heartbeat_s: float = 1.0, max_batched_tokens: int = 2048,
                       warmup: bool = True, peer_fetch: bool = True,
                       data_host: str | None = None) -> None:
        from kvmesh.rpc.auth import worker_access_token
        from service.worker_tokens import mint

        self.worker_id = serve_worker_id(serve.get_replica_context().replica_id)
        service_token = mint(worker_secret, self.worker_id) if worker_secret else worker_token
        self._host = await WorkerHost(WorkerConfig(
            worker_id=self.worker_id, services=tuple(service_addresses), model=model,
            block_size=block_size, num_blocks=num_blocks,
            access_token=worker_access_token(token, self.worker_id) if token else None,
            service_token=service_token, hash_seed=hash_seed,
            heartbeat_s=heartbeat_s, max_batched_tokens=max_batched_tokens,
            warmup=warmup, peer_fetch=peer_fetch, data_host=data_host)).start()

    async def generate(self, request: ServeRequest | dict) -> AsyncIterator[dict[str, Any]]:
        """Stream one request's tokens, then its facts (see the module docstring)."""
        from worker.engine.sequence import SamplingParams

        params = SamplingParams(max_tokens=int(request_field(request, "max_tokens", 1) or 1),
                                ignore_eos=True)
        prompt = [int(t) for t in request_field(request, "token_ids")]
        salt = request_field(request, "salt") or None
        # a refused label fails this call, as the gRPC Generate refuses it; none: default
        tenant = check_tenant(request_field(request, "tenant") or "")
        hook = None
        plan = fetch_plan_for(request, self.worker_id)
        if plan:  # the router's plan for THIS worker: the gRPC Generate's receiver path
            from kvmesh.v1 import index_pb2

            hook = await self._host.servicer.follow(index_pb2.FetchPlan.FromString(plan),
                                                    prompt, params, salt=salt)
        stream = self._host.runner.generate(
            prompt, params, request_id=f"serve-{uuid.uuid4().hex[:12]}", salt=salt,
            on_enqueued=hook, tenant=tenant)
        async for out in stream:
            if not out.finished:
                if out.new_token_ids:
                    yield {"token_ids": list(out.new_token_ids)}
                continue
            seq = out.seq
            yield {"token_ids": list(out.new_token_ids), "finished": True,
                   "num_cached_tokens": seq.num_cached_tokens,
                   "prompt_tokens": seq.num_prompt_tokens, "ttft_s": seq.ttft_s or 0.0,
                   "worker_id": self.worker_id,
                   "cached_tokens_by_tier": dict(seq.cached_tokens_by_tier)}

    async def info(self) -> dict[str, Any]:
        """The hosted worker's id, address, node and registration state."""
        return self._host.info()

    def check_health(self) -> None:
        """Unhealthy once the engine thread died (Serve then replaces the replica)."""
        runner = self._host.runner
        if runner is None or runner.error is not None:
            raise RuntimeError(f"kvmesh engine failed: {runner.error if runner else 'gone'}")

    async def __del__(self) -> None:
        await self._host.stop()


def kvmesh_router_config(service_addresses: list[str], token: str | None = None,
                         **kwargs: Any) -> RequestRouterConfig:
    """``RequestRouterConfig`` that routes through the kvmesh index at ``service_addresses``."""
    return RequestRouterConfig(
        request_router_class=ROUTER_PATH,
        request_router_kwargs={"service_addresses": list(service_addresses), "token": token,
                               **kwargs})


def kvmesh_app(service_addresses: list[str], *, replicas: int = 2,
               router: RequestRouterConfig | None = None, num_cpus: float = 1.0,
               num_gpus: float = 0.0, **replica_kwargs: Any) -> serve.Application:
    """A bound ``KvmeshReplica`` application (default router: the kvmesh index's)."""
    router = router or kvmesh_router_config(service_addresses,
                                            token=replica_kwargs.get("token"))
    return KvmeshReplica.options(
        num_replicas=replicas, request_router_config=router,
        ray_actor_options={"num_cpus": num_cpus, "num_gpus": num_gpus},
    ).bind(service_addresses, **replica_kwargs)
