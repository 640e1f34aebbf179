"""The bridge's integration tests: one real service process (on the session's Valkey) per
test module, so a module's engines and registrations never meet another module's."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from deploy.redis_server import RedisServer
from tests.bridge.cluster import start_service


@pytest.fixture(scope="module")
def service(redis_server: RedisServer) -> Iterator[str]:
    """The address of a service process on ``redis_server`` (restarted if a test stopped it)."""
    if not redis_server.alive:
        redis_server.start()
    proc = start_service(redis_server)
    try:
        yield proc.address
    finally:
        proc.stop()
