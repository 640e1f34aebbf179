"""One small Ray cluster for the whole tests/integration/ray package.

``ray.cluster_utils.Cluster`` with only a head node is a plain local Ray (what
``ray.init(num_cpus=4)`` starts: 4 logical CPUs, no dashboard, an 80 MB object store); the
node tests add worker nodes to it and remove them again. Sharing one cluster keeps the
package to one Ray start on these small shared machines. Everything is shut down at the end.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

STORE = 80 * 1024 * 1024


@pytest.fixture(scope="package")
def ray_cluster() -> Iterator[Any]:
    """A local Ray (head node: 4 logical CPUs, no GPU) the driver is connected to."""
    import ray
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_SCHEDULER_EVENTS", "0")
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 4, "include_dashboard": False, "object_store_memory": STORE})
    ray.init(address=cluster.address, logging_level="warning", log_to_driver=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def kvmesh_actors(prefix: str) -> list[str]:
    """Names of the live named actors of one kvmesh deployment (namespace ``kvmesh``)."""
    import ray

    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["namespace"] == "kvmesh" and a["name"].startswith(prefix + "-"))
