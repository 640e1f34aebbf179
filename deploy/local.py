"""A whole kvmesh cluster on this machine: Redis/Valkey, service replica(s), N workers.

Every part is a real child process on free loopback ports; ``LocalCluster`` is what ``kvmesh
up``, the demo, the end-to-end benchmarks and the integration tests use, and ``stop()`` ends
every child within ``timeout``. Each child gets only its own credentials (a worker never the
router token, the secret or the Redis URL), always in its environment, never on its command
line. A spec default never overrides what a child reads from its environment. Start failures
a user can fix raise ``LaunchError``.

See docs/architecture.md#local-launcher-and-stopping.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploy.launch_error import ChildExited
from deploy.process import ServerProcess, wait_all
from deploy.redis_cluster import RedisClusterServer, start_redis_cluster
from deploy.redis_server import RedisServer
from deploy.start_checks import check_model, check_redis_url, embedded_redis, port_taken
from deploy.stopping import budget
from deploy.waiting import wait_until
from kvmesh.rpc.auth import worker_access_token
from worker.kv_cache.tier_config import TierConfig

if TYPE_CHECKING:
    from client import KvmeshClient
    from kvmesh.rpc.tls import TlsFiles


@dataclass
class ClusterSpec:
    """What ``LocalCluster`` starts. Secrets travel to children in their environment
    (never on the command line, where ``ps`` would show them); TLS files by path."""

    workers: int = 2
    port: int = 0                 # first service replica's port (0: free)
    service_replicas: int = 1
    redis_url: str | None = None  # None: start an embedded Valkey
    redis_shards: int = 1         # embedded Valkey: > 1 starts a cluster of that many primaries
    insecure_cluster_bus: bool = False  # that cluster without TLS: a plaintext bus allowed
    #                                     (deploy.redis_cluster: anyone local can take it)
    model: str = "tiny"
    block_size: int = 16
    num_blocks: int | None = None
    token: str | None = None          # router token: service Route/Stats (workers: derived)
    worker_token: str | None = None   # shared token of the worker calls (unbound)
    worker_secret: str | None = None  # per-worker tokens bound to their ids (minted here;
    #                                   None and no worker_token: a random one)
    admin_token: str | None = None    # the services' admin calls (pins, tenant quotas)
    tls: TlsFiles | None = None       # every server serves it, every client dials with it
    hash_seed: str | None = None
    heartbeat_s: float = 1.0
    max_batched_tokens: int = 2048
    tiers: TierConfig = TierConfig()  # every worker's; disk files in <disk_dir>/<worker id>
    policy: str | None = None         # None: the service's default (its KVMESH_POLICY, else
    #                                   kvmesh)
    host: str = "127.0.0.1"
    echo: bool = False
    extra_service_args: list[str] = field(default_factory=list)
    # Every service replica's --cost-weight NAME=VALUE (service.config.CostWeights); empty:
    # no flag at all, so a service that predates the flag still starts.
    cost_weights: dict[str, float] = field(default_factory=dict)
    route_log_dir: str | None = None  # replica i logs its routes to <dir>/service-<i>.jsonl
    # Peer KV fetch: the services plan fetches and the workers serve and receive them
    # (--peer-fetch / --no-peer-fetch); None: each child's own default (no flag at all).
    peer_fetch: bool | None = None
    min_fetch_blocks: int | None = None  # the services' --min-fetch-blocks; None: theirs
    # Tenant quotas every replica stores at start (--tenant-quota NAME=FRACTION,
    # --default-tenant-quota); none: no flag, the stored quotas stay.
    tenant_quotas: tuple[tuple[str, float], ...] = ()
    default_tenant_quota: float | None = None
    # Run the service replicas and workers from this source tree (a git revision's, for
    # `kvmesh bench e2e --against`): first on their PYTHONPATH and their working directory.
    # None: this installation's code.
    code_dir: str | None = None


class LocalCluster:
    def __init__(self, spec: ClusterSpec | None = None) -> None:
        spec = spec or ClusterSpec()
        if spec.worker_secret is None and spec.worker_token is None:
            # worker calls then never accept the router token (service.auth)
            spec = dataclasses.replace(spec, worker_secret=secrets.token_urlsafe(32))
        self.spec = spec
        if spec.redis_shards < 1 or (spec.redis_shards > 1 and spec.redis_url):
            raise ValueError("redis_shards: at least 1, and above 1 only for an embedded "
                             "cluster (give a redis+cluster:// redis_url for your own)")
        self.redis: RedisServer | None = None
        self.redis_cluster: RedisClusterServer | None = None
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
        """Start everything; returns once every worker is registered and alive. A failure
        the user can fix raises ``LaunchError`` (see the module docstring), after what was
        started is stopped."""
        try:
            check_model(self.spec.model)
            if self.redis_url is None and self.spec.redis_shards > 1:
                self.redis_cluster = start_redis_cluster(
                    self.spec.redis_shards, host=self.spec.host,
                    allow_plaintext_bus=self.spec.insecure_cluster_bus)
                self.redis_url = self.redis_cluster.url  # redis+cluster://
            elif self.redis_url is None:
                self.redis = embedded_redis(self.spec.host)
                self.redis_url = self.redis.url
            else:
                check_redis_url(self.redis_url)
            for i in range(self.spec.service_replicas):
                self.start_service(i)
            for i in range(self.spec.workers):
                self.add_worker(f"worker-{i}", start=False)
            for w in self.workers:
                w.start(timeout)
            self.wait_ready(timeout)
        except BaseException:
            self.stop(timeout=5.0)  # an interrupted start must end in time too
            raise
        return self

    def _service_args(self, port: int, i: int) -> list[str]:
        s = self.spec
        args = ["--host", s.host, "--port", str(port), *s.extra_service_args]
        if s.policy:  # else the service's own default, KVMESH_POLICY included
            args += ["--policy", s.policy]
        if s.hash_seed:
            args += ["--hash-seed", s.hash_seed]
        for name, value in s.cost_weights.items():
            args += ["--cost-weight", f"{name}={value!r}"]
        if s.route_log_dir:
            args += ["--route-log", str(self.route_log_path(i))]
        if s.peer_fetch is not None:
            args.append(_switch("peer-fetch", s.peer_fetch))
        if s.min_fetch_blocks is not None:
            args += ["--min-fetch-blocks", str(s.min_fetch_blocks)]
        for name, fraction in s.tenant_quotas:
            args += ["--tenant-quota", f"{name}={fraction!r}"]
        if s.default_tenant_quota is not None:
            args += ["--default-tenant-quota", repr(s.default_tenant_quota)]
        return args + _tls_args(s.tls)

    def route_log_path(self, i: int) -> Path:
        """Where service replica ``i`` logs its routes (with ``route_log_dir``)."""
        if self.spec.route_log_dir is None:
            raise ValueError("the cluster has no route_log_dir")
        return Path(os.path.abspath(self.spec.route_log_dir)) / f"service-{i}.jsonl"

    def _child(self, name: str, module: str, args: list[str],
               env: dict[str, str]) -> ServerProcess:
        """A child process, of ``spec.code_dir``'s tree when set (see ``ClusterSpec``)."""
        code = self.spec.code_dir
        if code is not None:
            code = os.path.abspath(code)
            env = {**env, "PYTHONPATH": code}
        return ServerProcess(name, module, args, echo=self.spec.echo, env=env, cwd=code)

    def _service_env(self) -> dict[str, str]:
        """A replica's secrets (see the module docstring)."""
        s = self.spec
        return {"KVMESH_REDIS_URL": self.redis_url or "", "KVMESH_TOKEN": s.token or "",
                "KVMESH_WORKER_TOKEN": s.worker_token or "",
                "KVMESH_WORKER_SECRET": s.worker_secret or "",
                "KVMESH_ADMIN_TOKEN": s.admin_token or "",
                "KVMESH_WORKER_ACCESS_TOKEN": ""}

    def start_service(self, i: int, port: int | None = None) -> ServerProcess:
        """Start (or restart, on its old port) service replica ``i``."""
        if port is None:
            port = (self.spec.port + i) if self.spec.port else 0
        if i < len(self.services):
            proc = self.services[i]
            proc.cmd[3:] = self._service_args(port, i)
        else:
            if self.spec.route_log_dir:
                from kvmesh.ops.file_perms import private_dir

                private_dir(self.spec.route_log_dir, "route_log_dir")
            proc = self._child(f"service-{i}", "service", self._service_args(port, i),
                               self._service_env())
            self.services.append(proc)
        try:
            return proc.start()
        except ChildExited as e:
            if port and "cannot bind" in e.cause:
                raise port_taken(self.spec.host, port, e) from e
            raise

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
        args += tier_args(s, worker_id) + _tls_args(s.tls)
        if s.peer_fetch is not None and _switch("peer-fetch", s.peer_fetch) in worker_flags():
            args.append(_switch("peer-fetch", s.peer_fetch))
        # its own token, never the secret that mints every worker's nor the router token
        env = {"KVMESH_WORKER_TOKEN": self.service_token(worker_id),
               "KVMESH_WORKER_ACCESS_TOKEN": (worker_access_token(s.token, worker_id)
                                              if s.token else ""),
               "KVMESH_TOKEN": "", "KVMESH_WORKER_SECRET": "", "KVMESH_REDIS_URL": "",
               "KVMESH_ADMIN_TOKEN": ""}
        proc = self._child(worker_id, "worker", args, env)
        self.workers.append(proc)
        if start:
            proc.start()
        return proc

    def service_token(self, worker_id: str) -> str:
        """The token worker ``worker_id`` presents to the service: its bound token when the
        spec has a ``worker_secret`` (always, unless a shared ``worker_token`` was given),
        else the shared worker token."""
        s = self.spec
        if s.worker_secret:
            from service.worker_tokens import mint

            return mint(s.worker_secret, worker_id)
        return s.worker_token or ""

    def client(self, **kw: Any) -> KvmeshClient:
        """A ``KvmeshClient`` of this cluster's services with its token and TLS (``kw``: more
        ``KvmeshClient`` options)."""
        from client import KvmeshClient

        return KvmeshClient(self.service_addresses, token=self.spec.token, tls=self.spec.tls,
                            **kw)

    def wait_ready(self, timeout: float = 60.0, workers: int | None = None) -> None:
        """Block until the service reports ``workers`` (default: all started) alive."""
        want = len(self.workers) if workers is None else workers

        def settled(client: KvmeshClient) -> bool | list[ServerProcess]:
            """True once ``want`` workers are alive; before that, the workers that exited."""
            try:
                alive = sum(1 for w in client.stats()["workers"] if w["alive"])
            except Exception:  # the service may still be starting
                alive = 0
            return alive >= want or [w for w in self.workers
                                     if w.proc is not None and not w.alive]

        with self.client() as client:
            outcome = wait_until(lambda: settled(client), timeout, interval=0.1,
                                 what=f"{want} workers registered")
        if outcome is not True:
            raise outcome[0].exited()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop workers, then services, then Redis; everything is gone within ``timeout``
        (each step gets a share of what is left, SIGKILL past it: one deadline, however
        slowly a loaded host lets the children end)."""
        deadline = time.monotonic() + budget(timeout)  # a signal's deadline, if sooner

        def share(part: float) -> float:
            return max(0.1, (deadline - time.monotonic()) * part)

        wait_all(self.workers, share(0.6))
        wait_all(self.services, share(0.7))
        if self.redis is not None:
            self.redis.stop(share(1.0))
        if self.redis_cluster is not None:
            self.redis_cluster.stop(share(1.0))

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def tier_args(s: ClusterSpec, worker_id: str) -> list[str]:
    """The tier flags of worker ``worker_id`` (none when the spec keeps the defaults); its
    disk directory absolute: a worker of another tree (``code_dir``) runs from there."""
    return s.tiers.of_worker(worker_id, absolute=True).argv()


def _switch(name: str, on: bool) -> str:
    return f"--{name}" if on else f"--no-{name}"


@functools.cache
def worker_flags() -> frozenset[str]:
    """Every flag ``kvmesh worker`` takes, read from its command: a worker switch is passed
    only when this tree's worker has it (``--peer-fetch`` came with the worker's data
    plane; a launcher of a tree without it still starts its workers)."""
    import typer

    from worker.cli import register

    scratch = typer.Typer()
    register(scratch)
    command = typer.main.get_command(scratch)
    return frozenset(o for p in command.params
                     for o in [*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ())])


def _tls_args(tls: TlsFiles | None) -> list[str]:
    """``--tls-*`` flags of a child server (``kvmesh service`` and ``kvmesh worker`` alike)."""
    if tls is None:
        return []
    args: list[str] = []
    for flag, path in (("--tls-cert", tls.cert), ("--tls-key", tls.key), ("--tls-ca", tls.ca)):
        if path is not None:
            args += [flag, path]
    return args + (["--tls-client-auth"] if tls.client_auth else [])
