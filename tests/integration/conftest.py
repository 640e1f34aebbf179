"""A real local cluster: embedded Valkey, service replicas and worker processes."""
from __future__ import annotations

import pytest

from deploy.local import ClusterSpec, LocalCluster


@pytest.fixture(scope="module")
def cluster():
    c = LocalCluster(ClusterSpec(workers=2, service_replicas=2, num_blocks=64, block_size=16))
    c.start(timeout=120)
    yield c
    c.stop()
