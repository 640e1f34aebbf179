"""Session fixtures for every test package: one real Valkey/Redis, emptied per test, and one
real 3-primary Valkey cluster (``redis_cluster`` / ``redis_cluster_url``), emptied per test.

The server requires a password, as every Valkey kvmesh starts does: tests reach it through
``redis_url`` / ``redis_server.url`` (``redis://:PASSWORD@127.0.0.1:PORT/0``).

Marker ``integration``: a test that starts real processes, Redis, Ray or a cluster. Using one
of :data:`INTEGRATION_FIXTURES` or living in ``tests/integration/`` marks a test by itself
(:func:`pytest_collection_modifyitems`); a test that starts processes inline says so with
``@pytest.mark.integration`` (or a module's ``pytestmark``). Marker ``slow``: an in-process
test that costs a second or more (a bench run, a timer, a big batch). ``make test-fast`` runs
neither, under the hypothesis profile ``fast``; ``make test`` runs all under ``full``.

Profile ``fast`` caps every property test's examples and stateful steps, explicit
``@settings`` included (:func:`_lighten`): the edit loop tries each property a few times, the
full run as often as its test asks.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from deploy.redis_cluster import RedisClusterServer, start_redis_cluster
from deploy.redis_server import RedisServer, start_redis

# A Ray driver replaces the process's SIGSEGV handler with its own, which writes to Ray's
# session log (closed again by ray.shutdown): a crash in any later test would then end the
# run with no trace at all. Keep Python's faulthandler (pytest enables it) in charge.
os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")

INTEGRATION_FIXTURES = frozenset({"redis_server", "redis_url", "ray_cluster", "redis_cluster",
                                  "redis_cluster_url"})
CLUSTER_SHARDS = 3
_INTEGRATION_DIR = Path(__file__).parent / "integration"

settings.register_profile("full", settings.get_profile("default"))
settings.register_profile("fast", max_examples=8, stateful_step_count=15)

# Worker and service processes take their root hash seed from PYTHONHASHSEED when it is set
# (as vLLM does); tests compute roots with none_hash(algo), the default seed, so the processes
# they start must not inherit a seed from the shell that runs pytest.
for _var in ("PYTHONHASHSEED", "KVMESH_HASH_SEED"):
    os.environ.pop(_var, None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "cluster_layout: runs on a real Redis Cluster and needs every index script "
        "to touch one slot (the single-slot layout); fails with the first layout, by design")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``integration`` every test that needs a real server by its fixtures or place;
    under profile ``fast``, cap the examples of every property test."""
    light = settings.get_current_profile_name() == "fast"
    for item in items:
        if (INTEGRATION_FIXTURES.intersection(getattr(item, "fixturenames", ()))
                or item.path.is_relative_to(_INTEGRATION_DIR)):
            item.add_marker(pytest.mark.integration)
        if light:
            _lighten(item)


def _lighten(item: pytest.Item) -> None:
    """Cap a property test's own settings at the loaded profile's examples and steps: an
    explicit ``@settings(max_examples=300)`` wins over any profile, so the cap is applied to
    the settings hypothesis reads when the test runs (``@given``'s, or a state machine's
    ``TestCase.settings``). ``@given``'s is a private attribute: should hypothesis rename it,
    the cap stops applying and the loop gets slower, never weaker."""
    cap = settings.default
    fn = getattr(item, "obj", None)
    fn = getattr(fn, "__func__", fn)  # a method's function carries the settings
    if getattr(fn, "_hypothesis_state_machine_class", None) is not None and item.cls:
        target, attr = item.cls, "settings"
    elif hasattr(fn, "_hypothesis_internal_use_settings"):
        target, attr = fn, "_hypothesis_internal_use_settings"
    else:
        return
    own = getattr(target, attr)
    setattr(target, attr, settings(
        own, max_examples=min(own.max_examples, cap.max_examples),
        stateful_step_count=min(own.stateful_step_count, cap.stateful_step_count)))


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A real Redis-protocol server (embedded Valkey) shared by the whole session."""
    server = start_redis()
    yield server
    server.stop()


def _flushall(server: RedisServer) -> None:
    import redis

    with redis.Redis.from_url(server.url, socket_timeout=5) as client:
        assert client.flushall()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """URL of the session server, running (restarted if a test killed it) and empty."""
    if not redis_server.alive:
        redis_server.start()
    _flushall(redis_server)
    return redis_server.url


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterServer]:
    """A real Redis Cluster of 3 primaries (embedded Valkey) shared by the whole session."""
    # mutual TLS when the Valkey binary has it; else the plaintext bus a test host allows
    cluster = start_redis_cluster(CLUSTER_SHARDS, allow_plaintext_bus=True)
    yield cluster
    cluster.stop()


@pytest.fixture
def redis_cluster_url(redis_cluster: RedisClusterServer) -> str:
    """``redis+cluster://`` URL of the session cluster: every node running (restarted if a
    test killed one), the cluster ``ok``, every node empty."""
    for i, node in enumerate(redis_cluster.nodes):
        if not node.alive:
            redis_cluster.restart_node(i)
    redis_cluster.wait_ok()
    redis_cluster.flushall()
    return redis_cluster.url


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory):
    """A private CA with server (127.0.0.1, localhost) and client certificates, and an
    unrelated CA; skipped where the ``cryptography`` package is missing."""
    pytest.importorskip("cryptography")
    from tests.certificates import make_certs

    return make_certs(tmp_path_factory.mktemp("tls"))
