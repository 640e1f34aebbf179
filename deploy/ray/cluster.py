"""A whole kvmesh cluster on Ray: Redis, service replicas and workers as actors.

``start()`` connects to Ray (an address where nothing answers raises ``LaunchError`` at once),
starts Redis, the replicas and the workers, and returns once every worker is alive, removing
what it created on any failure. Actors restart on failure (not the embedded Redis); each
worker gets only its own tokens. ``stop()`` is idempotent and safe after a failed start.

See docs/architecture.md#ray-cluster-and-ray-serve.
"""
from __future__ import annotations

import dataclasses
import math
import os
import secrets
from typing import Any

import ray

from deploy.launch_error import LaunchError, cause_of
from deploy.ray.address import check_ray_address
from deploy.ray.placement import (
    ON_HEAD,
    actor_resources,
    free_ports_on_head,
    in_bundle,
    release,
    reserve,
)
from deploy.ray.redis_actor import RedisActor
from deploy.ray.service_actor import ServiceActor
from deploy.ray.spec import RaySpec, worker_bundle
from deploy.ray.worker_actor import WorkerActor
from deploy.ray.worker_host import WorkerConfig
from deploy.start_checks import check_model
from deploy.stopping import budget
from deploy.waiting import wait_until
from kvmesh.contract import DEFAULT_ALGO, DEFAULT_POLICY, POLICIES
from kvmesh.hashing import resolve_seed
from kvmesh.rpc.auth import worker_access_token

NAMESPACE = "kvmesh"


class RayCluster:
    """kvmesh on Ray; see the module docstring for the contract."""

    def __init__(self, spec: RaySpec | None = None, **overrides: Any) -> None:
        self.spec = dataclasses.replace(spec or RaySpec(), **overrides)
        if self.spec.worker_secret is None and self.spec.worker_token is None:
            self.spec = dataclasses.replace(self.spec, worker_secret=secrets.token_urlsafe(32))
        self.redis_url: str | None = self.spec.redis_url
        self.service_addresses: list[str] = []
        self.services: list[Any] = []      # ServiceActor handles
        self.workers: list[Any] = []       # WorkerActor handles, index = worker number
        self.worker_ids: list[str] = []
        self.bundle: dict[str, float] = {}
        self._redis: Any = None
        self._groups: list[Any] = []
        self._owns_ray = False

    # --- life cycle -----------------------------------------------------------------

    def start(self, timeout: float = 180.0) -> RayCluster:
        """Start everything; returns once every worker is registered and alive."""
        try:
            self._connect()
            self.bundle = worker_bundle(self.spec, ray.cluster_resources().get("GPU", 0.0))
            if self.redis_url is None:
                self._redis = RedisActor.options(name=self._name("redis"),
                                                 namespace=NAMESPACE).remote()
                self.redis_url = ray.get(self._redis.url.remote(), timeout=timeout)
            self._start_services(timeout)
            if self.spec.workers:
                self.add_workers(self.spec.workers, timeout=timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _connect(self) -> None:
        """Connect to the spec's Ray (see the module contract). ``LaunchError`` when its
        address does not answer; with a Ray of its own, the model is checked here first (a
        cluster's nodes may hold a path the driver lacks, a local one may not)."""
        if ray.is_initialized():
            return
        flag = "--ray-address" if self.spec.ray_address else "RAY_ADDRESS"
        address = self.spec.ray_address or os.environ.get("RAY_ADDRESS") or None
        if address:
            check_ray_address(address, flag)
            try:
                ray.init(address=address, logging_level="warning")
            except ConnectionError as e:  # 'auto' with no Ray running, a refused client
                raise LaunchError(f"{flag} {address}: {e}") from None
        else:
            check_model(self.spec.model)
            ray.init(num_cpus=self._local_cpus(), include_dashboard=False,
                     object_store_memory=self.spec.local_object_store_bytes,
                     logging_level="warning")
        self._owns_ray = True

    def _local_cpus(self) -> int:
        """Logical CPUs of a local Ray: enough to place what the spec asks for (they only
        gate scheduling; a laptop runs a 4-worker cluster the same way processes would)."""
        s = self.spec
        if s.local_num_cpus is not None:
            return s.local_num_cpus
        need = s.service_replicas * s.service_cpus + s.workers * s.cpus_per_worker
        return max(os.cpu_count() or 1, math.ceil(need))

    def _name(self, part: str) -> str:
        return f"{self.spec.name}-{part}"

    def _service_settings(self) -> dict[str, Any]:
        s = self.spec
        out: dict[str, Any] = {"token": s.token, "worker_token": s.worker_token,
                               "worker_secret": s.worker_secret,
                               "heartbeat_interval_s": s.heartbeat_s,
                               "liveness_timeout_s": max(3.0, 3 * s.heartbeat_s),
                               "purge_after_s": max(10.0, 10 * s.heartbeat_s)}
        # Resolved once on the driver (vLLM's rule) so that every replica and worker actor
        # runs with the driver's seed, whatever environment Ray gives the actors.
        out["hash_seed"] = resolve_seed(None, s.hash_seed)
        # The same for the policy: a replica started by the local backend reads
        # KVMESH_POLICY, an actor sees none of the driver's environment.
        out["policy"] = self.policy
        # unset: the replicas' defaults
        for name in ("peer_fetch", "min_fetch_blocks", "default_tenant_quota"):
            if getattr(s, name) is not None:
                out[name] = getattr(s, name)
        if s.tenant_quotas:
            out["tenant_quotas"] = tuple(s.tenant_quotas)
        return out

    @property
    def policy(self) -> str:
        """The routing policy the service replicas run when a request names none: the
        spec's, else the driver's ``KVMESH_POLICY``, else ``kvmesh``."""
        chosen = self.spec.policy or os.environ.get("KVMESH_POLICY") or DEFAULT_POLICY
        if chosen not in POLICIES:
            raise ValueError(f"KVMESH_POLICY={chosen}: not one of {', '.join(POLICIES)}")
        return chosen

    def _start_services(self, timeout: float) -> None:
        s = self.spec
        on_head = s.service_placement == "head"
        if not on_head:
            ports = [s.port + i if s.port else 0 for i in range(s.service_replicas)]
        else:
            ports = ([s.port + i for i in range(s.service_replicas)] if s.port
                     else free_ports_on_head(s.service_replicas, timeout))
        where = ON_HEAD if on_head else {"scheduling_strategy": "SPREAD"}
        for i, port in enumerate(ports):
            self.services.append(ServiceActor.options(
                name=self._name(f"service-{i}"), namespace=NAMESPACE, num_cpus=s.service_cpus,
                max_restarts=s.max_restarts, **where,
            ).remote(self.redis_url, port, None, self._service_settings()))
        self.service_addresses = ray.get([a.address.remote() for a in self.services],
                                         timeout=timeout)

    def add_workers(self, count: int, *, timeout: float = 180.0,
                    wait: bool = True) -> list[str]:
        """Start ``count`` more workers in a new placement group; returns their ids."""
        s = self.spec
        group = reserve(self.bundle, count, strategy=s.placement_strategy,
                        name=self._name(f"pg-{len(self._groups)}"), timeout=timeout)
        self._groups.append(group)
        ids = []
        for i in range(count):
            number = len(self.workers)
            worker_id = self._name(f"w{number}")
            config = WorkerConfig(
                worker_id=worker_id, services=tuple(self.service_addresses), model=s.model,
                block_size=s.block_size, num_blocks=s.num_blocks,
                access_token=worker_access_token(s.token, worker_id) if s.token else None,
                service_token=self.service_token(worker_id),
                hash_seed=resolve_seed(DEFAULT_ALGO, s.hash_seed),
                heartbeat_s=s.heartbeat_s, max_batched_tokens=s.max_batched_tokens,
                device=s.device, tiers=s.tiers.of_worker(worker_id),
                # workers serve and follow fetches unless the cluster turned peer fetch off
                peer_fetch=s.peer_fetch is not False, data_host=s.data_host)
            self.workers.append(WorkerActor.options(
                name=self._name(f"worker-{number}"), namespace=NAMESPACE,
                max_restarts=s.max_restarts, scheduling_strategy=in_bundle(group, i),
                **actor_resources(self.bundle)).remote(config))
            self.worker_ids.append(worker_id)
            ids.append(worker_id)
        if wait:
            self.wait_ready(timeout, worker_ids=ids)
        return ids

    def service_token(self, worker_id: str) -> str | None:
        """What worker ``worker_id`` presents to the service: its token minted from the
        worker secret, else the shared worker token."""
        if self.spec.worker_secret:
            from service.worker_tokens import mint

            return mint(self.spec.worker_secret, worker_id)
        return self.spec.worker_token

    def worker_infos(self, timeout: float = 60.0) -> list[dict[str, Any]]:
        """``WorkerActor.info()`` of every worker (waits for restarting ones)."""
        return ray.get([w.info.remote() for w in self.workers], timeout=timeout)

    def alive_workers(self) -> dict[str, str]:
        """worker id -> address of this cluster's workers the service counts alive now."""
        from client import KvmeshClient

        with KvmeshClient(self.service_addresses, token=self.spec.token) as client:
            rows = client.stats()["workers"]
        mine = set(self.worker_ids)
        return {w["worker_id"]: w["address"] for w in rows
                if w["alive"] and w["worker_id"] in mine}

    def wait_ready(self, timeout: float = 120.0, worker_ids: list[str] | None = None) -> None:
        """Block until the service counts ``worker_ids`` (default: all) alive. A worker
        actor whose constructor failed (a model path its node lacks, say) raises
        ``LaunchError`` with its cause at once: Ray does not restart it, so waiting on
        could only end in a timeout."""
        want = set(self.worker_ids if worker_ids is None else worker_ids)
        started = {wid: self.workers[self.worker_ids.index(wid)].info.remote() for wid in want}

        def settled() -> bool | LaunchError:
            return (_failed_start(started) or want <= set(self.alive_workers()))

        outcome = wait_until(settled, timeout, interval=0.2,  # a replica may still be starting
                             what=f"workers {sorted(want)} alive")
        if isinstance(outcome, LaunchError):
            raise outcome

    def stop(self, timeout: float = 15.0) -> None:
        """Stop and remove every actor and placement group this cluster created; the
        graceful ``stop()`` calls get half of ``timeout`` (on a loaded host an actor may
        not answer in time: it is killed anyway), then kills, releases, disconnects."""
        timeout = budget(timeout)  # a signal's deadline (deploy.stopping), if sooner
        actors = [*self.workers, *self.services] + ([self._redis] if self._redis else [])
        if ray.is_initialized() and actors:
            pending = [a.stop.remote() for a in actors]
            ray.wait(pending, num_returns=len(pending), timeout=timeout / 2)
            for actor in actors:
                ray.kill(actor, no_restart=True)
            for group in self._groups:
                release(group)
        self.workers, self.services, self._redis, self._groups = [], [], None, []
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
        self._owns_ray = False

    def __enter__(self) -> RayCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _failed_start(started: dict[str, Any]) -> LaunchError | None:
    """The failure of the first worker whose constructor raised, among ``started`` (worker
    id -> the ref of an ``info()`` call made once it was created); None while none did."""
    done, _ = ray.wait(list(started.values()), num_returns=len(started), timeout=0)
    for worker_id, ref in started.items():
        if ref not in done:
            continue
        try:
            ray.get(ref, timeout=0)
        except ray.exceptions.RayActorError as e:
            return LaunchError(f"worker {worker_id} could not start: "
                               f"{cause_of(str(e).splitlines())} (check --model and the "
                               "worker flags: the model path must exist on every worker node)")
    return None
