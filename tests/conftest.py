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

import asyncio
import gc
import os
import sys
import threading
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


@pytest.fixture(autouse=True)
def _no_grpc_aio_left_between_tests() -> Iterator[None]:
    """Free what a test's ``asyncio.run`` left of gRPC's aio state before the next test.

    grpc.aio shares one poller thread among every event loop of a process, for as long as
    any aio channel, server or call is alive. A call caught in a reference cycle (an error's
    traceback, a done callback) outlives its loop until the cyclic collector happens to run;
    until then every later test's loop shares a poller bound to dead loops, and the old
    server is finalized at a random point, possibly inside another test's loop. CI saw both
    as a service stop that never returned and as a segfault. A process in production has
    one loop for its life; tests have one per test, so they collect here, between tests,
    while no loop runs. (The product's own per-call cycle is gone: ``kvmesh.rpc.guarded``.)
    """
    yield
    if any(t.name.endswith("(_poll_wrapper)") for t in threading.enumerate()):
        gc.collect()


@pytest.fixture(autouse=True)
def _report_hung_tasks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Shortly before pytest-timeout fails a test, print the stack of every pending asyncio
    task: its own report shows threads only, so a hung ``asyncio.run`` shows nothing but the
    event loop waiting in ``select``."""
    mark = request.node.get_closest_marker("timeout")
    limit = float(mark.args[0] if mark and mark.args else request.config.getini("timeout") or 0)
    if limit <= 20:
        yield
        return
    timer = threading.Timer(limit - 15, _print_pending_tasks, args=(request.node.nodeid,))
    timer.daemon = True
    timer.start()
    yield
    timer.cancel()


def _print_pending_tasks(nodeid: str) -> None:
    tasks = [o for o in gc.get_objects() if isinstance(o, asyncio.Task) and not o.done()]
    print(f"\n+++ {nodeid}: {len(tasks)} pending asyncio task(s), 15 s before the timeout",
          file=sys.stderr, flush=True)
    for task in tasks:  # the whole await chain (a task's own stack stops at its coroutine)
        print(f"{task!r} awaits:", file=sys.stderr)
        link = task.get_coro()
        while link is not None:
            frame = getattr(link, "cr_frame", None) or getattr(link, "ag_frame", None)
            if frame is not None:
                code = frame.f_code
                print(f"  {code.co_filename}:{frame.f_lineno} in {code.co_name}",
                      file=sys.stderr)
            nxt = getattr(link, "cr_await", None) or getattr(link, "ag_await", None)
            if nxt is not None and frame is not None and not hasattr(nxt, "cr_frame"):
                # an async generator's athrow/asend hides its generator: contextlib's is .gen
                nxt = getattr(frame.f_locals.get("self"), "gen", None) or nxt
            link = nxt if nxt is not link else None


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
