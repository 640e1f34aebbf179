"""What a kvmesh cluster on Ray asks for: ``RaySpec`` and the actor resources it implies.

Contract:

- ``RaySpec`` is plain data, validated at construction (``ValueError`` with the field's name).
- ``gpus_per_worker=None`` means "decide from the cluster": 1 GPU per worker when the Ray
  cluster has any GPU resource, none otherwise. Fractions (0.5, 0.25) pack several workers on
  one GPU; 0 forces CPU workers even on a GPU cluster.
- ``worker_bundle(spec, cluster_gpus)`` is exactly what one worker actor requests, both as
  its placement-group bundle and as its own resource options, so a bundle always fits the
  actor that is scheduled into it (also after the bundle is re-placed on another node).
"""
from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field

from kvmesh.contract import POLICIES
from worker.kv_cache.tier_config import TierConfig

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,47}")


def _default_name() -> str:
    return f"kvmesh-{uuid.uuid4().hex[:6]}"


@dataclass
class RaySpec:
    """One kvmesh deployment on a Ray cluster (service replicas, workers, Redis).

    ``name`` prefixes every actor's name (namespace ``kvmesh``), so two deployments can share
    a Ray cluster. Service replica ``i`` binds port ``port+i`` (``port=0``: a port free on
    the head node when the cluster starts).

    ``service_placement="head"`` (default) runs the service replicas on the head node, next
    to Ray's own control plane and the embedded Redis: a restarted replica comes back on the
    same node and port, so clients and workers reconnect to the address they know, and
    losing a worker node never touches the index. ``"spread"`` spreads them over nodes
    instead (a node loss then costs one replica; Ray restarts it elsewhere on a new
    address, which only clients given the new ``service_addresses`` will know).
    """

    workers: int = 2
    service_replicas: int = 1
    redis_url: str | None = None          # None: embedded Valkey in an actor on the head node
    ray_address: str | None = None        # None: RAY_ADDRESS, else start a local Ray
    name: str = field(default_factory=_default_name)
    model: str = "tiny"
    block_size: int = 16
    num_blocks: int | None = None         # None: sized from memory by the engine
    gpus_per_worker: float | None = None  # None: 1 if the cluster has GPUs, else 0
    cpus_per_worker: float = 1.0
    service_cpus: float = 1.0
    worker_resources: dict[str, float] = field(default_factory=dict)  # e.g. a node label
    placement_strategy: str = "SPREAD"
    service_placement: str = "head"       # head | spread (see the class docstring)
    port: int = 0
    token: str | None = None              # router token (workers get a token derived from it)
    worker_token: str | None = None       # shared token of the worker calls (unbound)
    worker_secret: str | None = None      # per-worker bound tokens; None and no worker_token:
    #                                       a random one (the router token never registers)
    hash_seed: str | None = None
    heartbeat_s: float = 1.0
    max_batched_tokens: int = 2048
    max_restarts: int = -1                # -1: restart actors forever
    device: str | None = None             # None: cuda when a GPU was assigned, else cpu
    tiers: TierConfig = TierConfig()      # every worker's; disk files on its node, in
    #                                       <disk_dir>/<worker id>
    policy: str | None = None             # the replicas' default routing policy (None: the
    #                                       driver's KVMESH_POLICY, else kvmesh)
    peer_fetch: bool | None = None        # the replicas plan peer KV fetches (None: theirs, off)
    min_fetch_blocks: int | None = None   # the replicas' smallest fetch (None: theirs)
    tenant_quotas: tuple[tuple[str, float], ...] = ()  # stored by the replicas at start
    default_tenant_quota: float | None = None
    data_host: str | None = None          # where workers' peer-KV data planes listen (None:
    #                                       each worker's node IP, reachable from the other
    #                                       nodes; "127.0.0.1" only on a one-node Ray)
    # local Ray only (ignored when connecting to an existing cluster)
    local_num_cpus: int | None = None
    local_object_store_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.workers < 0:
            raise ValueError(f"workers must be >= 0, got {self.workers}")
        if self.service_replicas < 1:
            raise ValueError(f"service_replicas must be >= 1, got {self.service_replicas}")
        if self.gpus_per_worker is not None and self.gpus_per_worker < 0:
            raise ValueError(f"gpus_per_worker must be >= 0, got {self.gpus_per_worker}")
        if self.gpus_per_worker is not None and self.gpus_per_worker > 1 and \
                self.gpus_per_worker != int(self.gpus_per_worker):
            raise ValueError("gpus_per_worker above 1 must be a whole number, got "
                             f"{self.gpus_per_worker}")
        if self.cpus_per_worker <= 0 or self.service_cpus < 0:
            raise ValueError("cpus_per_worker must be > 0 and service_cpus >= 0")
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"name {self.name!r} must be 1-48 letters, digits, . _ -")
        if self.service_placement not in ("head", "spread"):
            raise ValueError("service_placement must be 'head' or 'spread'")
        if self.placement_strategy not in ("SPREAD", "STRICT_SPREAD", "PACK"):
            raise ValueError("placement_strategy must be SPREAD, STRICT_SPREAD or PACK")
        if self.worker_secret is not None and len(self.worker_secret.encode()) < 16:
            raise ValueError("worker_secret must be at least 16 bytes")
        if self.policy is not None and self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if not 0 <= self.port < 65536 - self.service_replicas:
            raise ValueError(f"port {self.port} is out of range")


def gpus_for_worker(spec: RaySpec, cluster_gpus: float) -> float:
    """GPUs one worker asks for: the spec's value, or 1/0 by whether the cluster has GPUs."""
    if spec.gpus_per_worker is not None:
        return float(spec.gpus_per_worker)
    return 1.0 if cluster_gpus > 0 else 0.0


def worker_bundle(spec: RaySpec, cluster_gpus: float) -> dict[str, float]:
    """The resources of one worker (placement-group bundle == actor request)."""
    bundle: dict[str, float] = {"CPU": float(spec.cpus_per_worker)}
    gpus = gpus_for_worker(spec, cluster_gpus)
    if gpus:
        bundle["GPU"] = gpus
    bundle.update({k: float(v) for k, v in spec.worker_resources.items()})
    return {k: v for k, v in bundle.items() if v > 0}  # CPU > 0: never empty
