"""A real local cluster: embedded Valkey, service replicas and worker processes."""
from __future__ import annotations

import time

import pytest

from deploy.local import ClusterSpec, LocalCluster


def wait_for(fn, timeout: float = 10.0, interval: float = 0.1):
    """Poll ``fn`` until it returns something truthy; return it, or fail with the last value."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s (last: {last!r})")


@pytest.fixture(scope="module")
def cluster():
    c = LocalCluster(ClusterSpec(workers=2, service_replicas=2, num_blocks=64, block_size=16))
    c.start(timeout=120)
    yield c
    c.stop()
