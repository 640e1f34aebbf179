"""A whole kvmesh cluster on this machine: Redis/Valkey, service replica(s), N workers.

Everything is a real process: an embedded Valkey (or ``--redis-url``), ``python -m
service`` and ``python -m worker`` children on free loopback ports. ``LocalCluster`` is what
``kvmesh up``, ``kvmesh demo``, the end-to-end benchmarks and the integration tests use.
``stop()`` ends every child within ``timeout`` seconds (SIGTERM, then SIGKILL).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from deploy.process import ServerProcess, wait_all
from deploy.redis_server import RedisServer, start_redis


@dataclass
class ClusterSpec:
    workers: int = 2
    port: int = 0                 # first service replica's port (0: free)
    service_replicas: int = 1
    redis_url: str | None = None  # None: start an embedded Valkey
    model: str = "tiny"
    block_size: int = 16
    num_blocks: int | None = None
    token: str | None = None
    worker_token: str | None = None
    hash_seed: str | None = None
    heartbeat_s: float = 1.0
    max_batched_tokens: int = 2048
    policy: str = "kvmesh"
    host: str = "127.0.0.1"
    echo: bool = False
    extra_service_args: list[str] = field(default_factory=list)


class LocalCluster:
    def __init__(self, spec: ClusterSpec | None = None) -> None:
        self.spec = spec or ClusterSpec()
        self.redis: RedisServer | None = None
        self.redis_url: str | None = self.spec.redis_url
        self.services: list[ServerProcess] = []
        self.workers: list[ServerProcess] = []

    # --- addresses ------------------------------------------------------------------

    @property
    def service_addresses(self) -> list[str]:
        return [s.address for s in self.services if s.address]

    @property
    def worker_addresses(self) -> list[str]:
        return [w.address for w in self.workers if w.address]

    # --- life cycle -----------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> LocalCluster:
        """Start everything; returns once every worker is registered and alive."""
        try:
            if self.redis_url is None:
                self.redis = start_redis(host=self.spec.host)
                self.redis_url = self.redis.url
            for i in range(self.spec.service_replicas):
                self.start_service(i)
            for i in range(self.spec.workers):
                self.add_worker(f"worker-{i}", start=False)
            for w in self.workers:
                w.start(timeout)
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _service_args(self, port: int) -> list[str]:
        s = self.spec
        args = ["--host", s.host, "--port", str(port), "--redis-url", self.redis_url,
                "--policy", s.policy, *s.extra_service_args]
        if s.token:
            args += ["--token", s.token]
        if s.worker_token:
            args += ["--worker-token", s.worker_token]
        if s.hash_seed:
            args += ["--hash-seed", s.hash_seed]
        return args

    def start_service(self, i: int, port: int | None = None) -> ServerProcess:
        """Start (or restart, on its old port) service replica ``i``."""
        if port is None:
            port = (self.spec.port + i) if self.spec.port else 0
        if i < len(self.services):
            proc = self.services[i]
            proc.cmd[3:] = self._service_args(port)
        else:
            proc = ServerProcess(f"service-{i}", "service", self._service_args(port),
                                 echo=self.spec.echo)
            self.services.append(proc)
        return proc.start()

    def add_worker(self, worker_id: str, *, start: bool = True,
                   port: int = 0) -> ServerProcess:
        s = self.spec
        args = ["--host", s.host, "--port", str(port), "--model", s.model,
                "--block-size", str(s.block_size), "--worker-id", worker_id,
                "--service", ",".join(self.service_addresses),
                "--heartbeat-s", str(s.heartbeat_s),
                "--max-batched-tokens", str(s.max_batched_tokens)]
        if s.num_blocks:
            args += ["--num-blocks", str(s.num_blocks)]
        if s.hash_seed:
            args += ["--hash-seed", s.hash_seed]
        env = {"KVMESH_WORKER_TOKEN": s.worker_token or s.token or ""}
        proc = ServerProcess(worker_id, "worker", args, echo=s.echo, env=env)
        self.workers.append(proc)
        if start:
            proc.start()
        return proc

    def wait_ready(self, timeout: float = 60.0, workers: int | None = None) -> None:
        """Block until the service reports ``workers`` (default: all started) alive."""
        from client import KvmeshClient

        want = len(self.workers) if workers is None else workers
        deadline = time.monotonic() + timeout
        alive = 0
        with KvmeshClient(self.service_addresses, token=self.spec.token) as client:
            while time.monotonic() < deadline:
                try:
                    alive = sum(1 for w in client.stats()["workers"] if w["alive"])
                except Exception:  # the service may still be starting
                    alive = 0
                if alive >= want:
                    return
                for w in self.workers:
                    if w.proc is not None and not w.alive:
                        raise RuntimeError(f"{w.name} exited:\n{w.tail()}")
                time.sleep(0.1)
        raise TimeoutError(f"only {alive} of {want} workers registered within {timeout}s")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop workers, then services, then Redis; everything is gone within ``timeout``."""
        deadline = time.monotonic() + timeout
        wait_all(self.workers, max(1.0, (deadline - time.monotonic()) * 0.6))
        wait_all(self.services, max(1.0, (deadline - time.monotonic()) * 0.7))
        if self.redis is not None:
            self.redis.stop(max(0.5, deadline - time.monotonic()))

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
