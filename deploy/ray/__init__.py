"""kvmesh on Ray: the cluster launcher (actors) and the Ray Serve request router.

``RayCluster(RaySpec(...)).start()`` runs Redis, service replicas and workers as Ray actors;
``deploy.ray.serve`` hosts workers in Ray Serve replicas and routes to them with
``deploy.ray.router.KvmeshRequestRouter``. ``kvmesh up --backend ray`` is the command line.

Importing this package does not import Ray (``kvmesh --help`` stays fast): the names below
load their modules on first use.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deploy.ray.cluster import NAMESPACE, RayCluster
    from deploy.ray.spec import RaySpec

__all__ = ["NAMESPACE", "RayCluster", "RaySpec"]
_WHERE = {"NAMESPACE": "deploy.ray.cluster", "RayCluster": "deploy.ray.cluster",
          "RaySpec": "deploy.ray.spec"}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'deploy.ray' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_WHERE[name]), name)
