"""A real Valkey/Redis Cluster of N primaries as child processes (``kvmesh up --redis-shards``).

``start_redis_cluster`` returns once every node reports ``cluster_state:ok`` with the slots in
contiguous ranges. One password for all nodes; only cluster configs persist, so a restarted
node comes back EMPTY with its id and slots. Valkey's cluster bus has no password, so the bus
is mutual TLS under a CA made at start, or :class:`InsecureClusterBus` is raised unless
``allow_plaintext_bus=True``.

See docs/architecture.md#embedded-redis-and-valkey.
"""
from __future__ import annotations

import contextlib
import logging
import secrets
import tempfile
import time
from collections.abc import Iterator

from deploy.ports import free_port
from deploy.redis_server import RedisServer, find_redis_binary
from deploy.redis_tls import RedisTls, make_redis_tls, tls_support
from deploy.waiting import wait_until
from kvmesh.ops.redact import redact_url

__all__ = ["PLAINTEXT_BUS_WARNING", "SLOTS", "InsecureClusterBus", "RedisClusterServer",
           "cluster_bus_secure", "slot_ranges", "start_redis_cluster"]

log = logging.getLogger(__name__)

PLAINTEXT_BUS_WARNING = (
    "the Redis Cluster bus runs in plaintext with no authentication ({exe} has no TLS): any "
    "local user can join the cluster, take its slots and collect its password; use it only "
    "on a host where every local user is trusted, or set KVMESH_REDIS_SERVER to a "
    "valkey-server / redis-server built with TLS")


class InsecureClusterBus(Exception):
    """The server binary has no TLS, and a plaintext cluster bus was not allowed."""

SLOTS = 16384
# How long a silent node takes to be flagged failing. Short, so a test that kills a shard
# sees the cluster settle quickly; long enough that a loaded 2-core host does not flap.
NODE_TIMEOUT_MS = 2000


def slot_ranges(shards: int) -> list[tuple[int, int]]:
    """Inclusive ``(first, last)`` slot ranges, contiguous, sizes differing by at most 1."""
    if not 1 <= shards <= SLOTS:
        raise ValueError(f"shards must be in [1, {SLOTS}], got {shards}")
    edges = [SLOTS * i // shards for i in range(shards + 1)]
    return [(edges[i], edges[i + 1] - 1) for i in range(shards)]


def cluster_bus_secure(executable: str | None = None) -> tuple[bool, str]:
    """``(secure, binary)``: whether a cluster started with ``executable`` (default: the
    binary :class:`RedisClusterServer` would pick) gets an authenticated (TLS) bus."""
    exe = executable or find_redis_binary(tls=True)
    return tls_support(exe), exe


def _info(node: RedisServer) -> dict[str, str]:
    """``CLUSTER INFO`` of one node as a dict (empty when it does not answer)."""
    import redis

    try:
        with redis.Redis.from_url(node.url, socket_timeout=1, socket_connect_timeout=1,
                                  decode_responses=True) as c:
            info = c.execute_command("CLUSTER INFO")  # redis-py parses it into a dict
    except (redis.RedisError, OSError):
        return {}
    return {str(k): str(v) for k, v in info.items()}


class RedisClusterServer:
    """``shards`` Redis/Valkey primaries forming one cluster on ``host`` (restartable)."""

    def __init__(self, shards: int = 3, *, host: str = "127.0.0.1",
                 executable: str | None = None, password: str | None = None,
                 node_timeout_ms: int = NODE_TIMEOUT_MS,
                 allow_plaintext_bus: bool = False) -> None:
        self.ranges = slot_ranges(shards)
        self.host = host
        self.password = password or secrets.token_urlsafe(24)
        self.executable = executable
        self.allow_plaintext_bus = allow_plaintext_bus
        self.tls: RedisTls | None = None  # set by start() when the binary has TLS
        self.node_timeout_ms = node_timeout_ms
        self.nodes: list[RedisServer] = []
        self._bus: dict[int, int] = {}  # node port -> its cluster bus port
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    # --- addresses ------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``redis+cluster://:PASSWORD@host:port/0`` of the first node: a secret (see the
        module contract); the cluster client discovers the other nodes from it."""
        node = self.nodes[0]
        if self.tls is None:
            return f"redis+cluster://:{self.password}@{node.host}:{node.port}/0"
        return (f"rediss+cluster://:{self.password}@{node.host}:{node.port}/0?"
                + self.tls.url_query())

    @property
    def secure(self) -> bool:
        """True when bus and clients are mutual TLS (see the module contract)."""
        return self.tls is not None

    @property
    def node_urls(self) -> list[str]:
        """Every node's own URL (``redis://``, or ``rediss://`` with TLS), in slot order
        (node i serves range i)."""
        return [n.url for n in self.nodes]

    @property
    def alive(self) -> bool:
        """True while every node runs."""
        return bool(self.nodes) and all(n.alive for n in self.nodes)

    # --- life cycle -----------------------------------------------------------------

    def _node(self, workdir: str) -> RedisServer:
        port = free_port(self.host)
        bus = self._bus[port] = free_port(self.host)
        args = ("--cluster-enabled", "yes", "--cluster-port", str(bus),
                "--cluster-config-file", f"{workdir}/nodes-{port}.conf",
                "--cluster-node-timeout", str(self.node_timeout_ms),
                "--cluster-require-full-coverage", "no")
        return RedisServer(port, host=self.host, executable=self.executable,
                           extra_args=args, password=self.password, tls=self.tls)

    def start(self, timeout: float = 30.0) -> RedisClusterServer:
        """Start every node, assign the slots, join them; returns once the cluster is ok."""
        if self.nodes:
            raise RuntimeError("already started")
        import redis

        secure, self.executable = cluster_bus_secure(self.executable)
        if not secure:
            if not self.allow_plaintext_bus:
                raise InsecureClusterBus(PLAINTEXT_BUS_WARNING.format(exe=self.executable))
            log.warning(PLAINTEXT_BUS_WARNING.format(exe=self.executable))
        self._dir = tempfile.TemporaryDirectory(prefix="kvmesh-cluster-")  # mode 0700
        try:
            if secure:
                self.tls = make_redis_tls(self._dir.name, self.host)
            self.nodes = [self._node(self._dir.name) for _ in self.ranges]
            for node in self.nodes:
                node.start(timeout)
            first = self.nodes[0]
            for epoch, (node, (lo, hi)) in enumerate(zip(self.nodes, self.ranges, strict=True), 1):
                with redis.Redis.from_url(node.url, socket_timeout=5) as c:
                    # distinct epochs up front: no collision to resolve after the join
                    c.execute_command("CLUSTER SET-CONFIG-EPOCH", epoch)
                    c.execute_command("CLUSTER ADDSLOTSRANGE", lo, hi)
                    if node is not first:  # the first node meets everyone; gossip does the rest
                        c.execute_command("CLUSTER MEET", first.host, first.port,
                                          self._bus[first.port])
            self.wait_ok(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def ok(self) -> bool:
        """Every node runs, knows every node, sees all slots assigned, and says ``ok``."""
        want = {"cluster_state": "ok", "cluster_slots_assigned": str(SLOTS),
                "cluster_known_nodes": str(len(self.nodes))}
        return self.alive and all(
            all(_info(n).get(k) == v for k, v in want.items()) for n in self.nodes)

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Block until :meth:`ok`; ``TimeoutError`` (with each node's state) if not in time."""
        try:
            wait_until(self.ok, timeout, interval=0.05, what="the cluster ok")
        except TimeoutError as e:
            states = [_info(n).get("cluster_state", "down") for n in self.nodes]
            raise TimeoutError(f"{e}; node states {states}") from None

    def kill_node(self, i: int) -> None:
        """SIGKILL node ``i`` (a crash): its slots fail, the other shards keep serving."""
        self.nodes[i].kill()

    def restart_node(self, i: int, timeout: float = 30.0) -> None:
        """Start node ``i`` again (same port, id and slots; its data gone) and wait until
        the cluster is ok again."""
        self.nodes[i].start(timeout)
        self.wait_ok(timeout)

    def flushall(self) -> None:
        """Empty every node (a test's fresh start)."""
        import redis

        for url in self.node_urls:
            with redis.Redis.from_url(url, socket_timeout=5) as c:
                c.flushall()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop every node (graceful, SIGKILL of those left after ``timeout``: one deadline
        for all, not one each); idempotent."""
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            node.terminate()
        for node in self.nodes:
            node.stop(max(0.1, deadline - time.monotonic()))
        self.nodes = []
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None
        self.tls = None

    def __enter__(self) -> RedisClusterServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __iter__(self) -> Iterator[RedisServer]:
        return iter(self.nodes)

    def __repr__(self) -> str:
        where = redact_url(self.url) if self.nodes else "stopped"
        return f"RedisClusterServer({len(self.ranges)} shards, {where})"


def start_redis_cluster(shards: int = 3, *, host: str = "127.0.0.1",
                        executable: str | None = None, password: str | None = None,
                        timeout: float = 30.0,
                        allow_plaintext_bus: bool = False) -> RedisClusterServer:
    """Start a ``shards``-primary cluster on free ports of ``host`` and wait until it is ok.

    Raises ``FileNotFoundError`` when no server binary exists, :class:`InsecureClusterBus`
    when it has no TLS and ``allow_plaintext_bus`` is False (see the module contract), and
    ``RuntimeError`` / ``TimeoutError`` when a node or the cluster does not come up.
    """
    def make() -> RedisClusterServer:
        return RedisClusterServer(shards, host=host, executable=executable, password=password,
                                  allow_plaintext_bus=allow_plaintext_bus)

    with contextlib.suppress(RuntimeError):  # a port taken between pick and bind: once more
        return make().start(timeout)
    return make().start(timeout)
