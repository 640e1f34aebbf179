"""`kvmesh up`: a whole cluster in the foreground (`kvmesh demo` lives in ``bench/demo.py``).

Every failure a user can cause ends the command with one line on stderr, ``error: ...``,
naming the cause and the flag to change: flags that cannot work (exit 2, before anything
starts) and ``deploy.launch_error.LaunchError`` from the start (exit 1, after what was
started is stopped). Anything else is a bug and prints its traceback.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, NoReturn

import typer

from kvmesh.ops import cli_options as opt
from worker.kv_cache.tier_config import TierConfig

_TIERS = TierConfig()  # the tier defaults, written there only

if TYPE_CHECKING:
    from kvmesh.rpc.tls import TlsFiles


def register(app: typer.Typer) -> None:
    @app.command("up")
    def up(
        workers: int = typer.Option(2, help="number of worker processes"),
        port: int = typer.Option(50051, help="service port (0: a free one)"),
        redis_url: opt.RedisUrl = None,
        redis_shards: int = typer.Option(1, help="embedded Valkey: above 1, a Redis Cluster "
                                         "of this many primaries (slots split evenly)"),
        insecure_cluster_bus: opt.InsecureClusterBus = False,
        model: str = typer.Option("tiny", help="'tiny' or a Hugging Face model directory"),
        block_size: int = typer.Option(16),
        num_blocks: int = typer.Option(None, help="KV blocks per worker (default: memory)"),
        token: opt.Token = None,
        policy: opt.Policy = None,  # None: the service's default (KVMESH_POLICY, else kvmesh)
        service_replicas: int = typer.Option(1, help="service replicas over one Redis"),
        backend: str = typer.Option("local", help="local (processes) or ray"),
        ray_address: str = typer.Option(None, help="ray backend: an existing Ray cluster "
                                        "('auto', host:port; default RAY_ADDRESS, else a "
                                        "new local Ray)"),
        gpus_per_worker: float = typer.Option(None, help="ray backend: GPUs per worker, "
                                              "fractions allowed (default: 1 if the "
                                              "cluster has GPUs, else 0)"),
        worker_secret: opt.WorkerSecret = None,  # default: a random one
        admin_token: opt.AdminToken = None,  # local backend: every replica's admin calls
        tls_cert: opt.TlsCert = None,  # local backend: every server serves it and presents it
        tls_key: opt.TlsKey = None,
        tls_ca: opt.TlsCa = None,      # every process verifies its peers with it
        tls_client_auth: opt.TlsClientAuth = False,
        cpu_blocks: opt.CpuBlocks = _TIERS.cpu_blocks,
        disk_blocks: opt.DiskBlocks = _TIERS.disk_blocks,
        disk_dir: opt.DiskDir = _TIERS.disk_dir,  # each worker's files: <disk-dir>/<worker id>
        eviction: opt.Eviction = _TIERS.eviction,
        auto_pin: opt.AutoPin = _TIERS.auto_pin,
        peer_fetch: bool = typer.Option(None, "--peer-fetch/--no-peer-fetch", show_default=False,
                                        help="peer KV fetch: the service plans fetches and "
                                        "the workers serve and receive them (default: each "
                                        "process's own; the service's is off)"),
        min_fetch_blocks: int = typer.Option(None, min=1, help="service: plan a peer fetch "
                                             "only for at least this many blocks (default 4)"),
        data_host: str = typer.Option(None, help="ray backend: where every worker's peer-KV "
                                      "data plane listens and what its endpoints name "
                                      "(default: each worker's node IP)"),
        tenant_quota: opt.TenantQuota = None,  # every service replica's, stored at start
        default_tenant_quota: opt.DefaultTenantQuota = None,
        verbose: bool = typer.Option(False, help="echo every child's output"),
    ) -> None:
        """Start Redis/Valkey, the service and N workers; Ctrl-C or SIGTERM stops them all."""
        import time
        import traceback

        from kvmesh.ops.redact import redact_url
        from kvmesh.quota import check_fraction, parse_assignment
        from kvmesh.rpc.tls import tls_files
        from service.worker_tokens import MIN_SECRET_BYTES

        tiers = TierConfig(cpu_blocks=cpu_blocks, disk_blocks=disk_blocks, disk_dir=disk_dir,
                           eviction=eviction, auto_pin=auto_pin)
        try:
            tiers.check()
            tls = tls_files(tls_cert, tls_key, tls_ca, tls_client_auth)
            quotas = tuple(parse_assignment(q) for q in tenant_quota or ())
            if default_tenant_quota is not None:
                check_fraction(default_tenant_quota, "--default-tenant-quota")
        except ValueError as e:
            _refuse(str(e))
        if backend not in ("local", "ray"):
            _refuse(f"--backend {backend}: choose local or ray")
        if backend == "ray" and tls is not None:
            _refuse("TLS needs --backend local")
        if backend == "local" and data_host:
            _refuse("--data-host needs --backend ray (local workers serve their data planes "
                    "on loopback)")
        if backend == "ray" and admin_token:
            _refuse("--admin-token needs --backend local (on Ray, set quotas with "
                    "--tenant-quota / --default-tenant-quota)")
        if redis_shards < 1:
            _refuse("--redis-shards must be at least 1")
        if redis_shards > 1 and (redis_url or backend == "ray"):
            _refuse("--redis-shards starts an embedded cluster with --backend local; for your "
                    "own cluster give --redis-url redis+cluster://HOST:PORT")
        bus_warning = _cluster_bus_check(redis_shards, insecure_cluster_bus)
        if worker_secret and len(worker_secret.encode()) < MIN_SECRET_BYTES:
            _refuse(f"--worker-secret needs at least {MIN_SECRET_BYTES} bytes")
        if tls is not None and (tls.cert is None or tls.ca is None):
            # every process serves with the certificate and dials its peers with the CA
            _refuse("TLS needs --tls-cert, --tls-key and --tls-ca")
        if backend == "ray":
            from deploy.launch_error import LaunchError
            from deploy.ray.cli import run_up  # issue: Ray backend

            try:
                run_up(workers=workers, port=port, redis_url=redis_url, model=model,
                       ray_address=ray_address, gpus_per_worker=gpus_per_worker,
                       service_replicas=service_replicas, block_size=block_size,
                       num_blocks=num_blocks, token=token, worker_secret=worker_secret or None,
                       policy=policy, tiers=tiers, peer_fetch=peer_fetch,
                       min_fetch_blocks=min_fetch_blocks, tenant_quotas=quotas,
                       default_tenant_quota=default_tenant_quota, data_host=data_host)
            except LaunchError as e:
                _say_error(str(e))
                _exit_now(1)
            _exit_now(0)
        from deploy.launch_error import LaunchError
        from deploy.local import ClusterSpec, LocalCluster
        from deploy.stopping import StopDeadline, end_descendants

        # one deadline from the first signal to nothing left (deploy.stopping)
        deadline = StopDeadline(on_kill=_say_killed).install()
        cluster = LocalCluster(ClusterSpec(
            workers=workers, port=port, redis_url=redis_url, model=model,
            block_size=block_size, num_blocks=num_blocks, token=token, policy=policy,
            service_replicas=service_replicas, echo=verbose,
            worker_secret=worker_secret or None, admin_token=admin_token or None, tls=tls,
            redis_shards=redis_shards,
            insecure_cluster_bus=insecure_cluster_bus, tiers=tiers, peer_fetch=peer_fetch,
            min_fetch_blocks=min_fetch_blocks, tenant_quotas=quotas,
            default_tenant_quota=default_tenant_quota))
        if bus_warning:
            print(f"WARNING: {bus_warning}", flush=True)
        code = 1
        try:
            try:
                cluster.start()
            except KeyboardInterrupt:
                print("interrupted during start; stopping", flush=True)
                code = 0
                return
            deadline.ready()
            shards = f", {redis_shards} shards" if redis_shards > 1 else ""
            if cluster.redis_cluster is not None:
                shards += (", mutual TLS" if cluster.redis_cluster.secure
                           else ", PLAINTEXT bus")
            print(f"redis    {redact_url(cluster.redis_url or '')}"
                  + ("" if redis_url else f" (embedded{shards})"))
            for s in cluster.services:
                print(f"service  {s.address}  (policy {_policy_of(s.ready_line)})")
            for w in cluster.workers:
                print(f"worker   {w.address}  ({w.name})")
            print(f"ready: kvmesh stats --service {','.join(cluster.service_addresses)}"
                  + _tls_hint(tls), flush=True)
            while not deadline.stop.wait(0.5):
                dead = [p.name for p in cluster.services + cluster.workers if not p.alive]
                if dead:
                    print(f"child process(es) exited: {', '.join(dead)}; stopping")
                    break
            else:
                code = 0
        finally:
            failure = sys.exc_info()[1]
            if failure is not None and not isinstance(failure, KeyboardInterrupt | LaunchError):
                traceback.print_exc()  # _exit_now would lose it
            deadline.ready()  # a signal now only hurries the stop, never cuts it
            cluster.stop(timeout=max(1.0, deadline.remaining(reserve_s=2.5)))
            end_descendants(deadline=time.monotonic() + deadline.remaining(reserve_s=0.5))
            if isinstance(failure, LaunchError):
                _say_error(str(failure))  # the last line: what to change
            else:
                print("stopped", flush=True)
            _exit_now(code)


def _say_error(line: str) -> None:
    print(f"error: {line}", file=sys.stderr, flush=True)


def _refuse(line: str) -> NoReturn:
    """Refuse flags that cannot work: one ``error:`` line, exit 2, nothing started."""
    _say_error(line)
    raise typer.Exit(2)


def _policy_of(ready_line: str | None) -> str:
    """The policy a service replica runs, from its ``listening on`` line (its own word, so
    a ``KVMESH_POLICY`` it read shows too)."""
    import re

    found = re.search(r"policy (\w+)", ready_line or "")
    return found.group(1) if found else "?"


def _exit_now(code: int) -> NoReturn:
    """End the process now that every child is gone: the interpreter's own exit would run
    gRPC's (and Ray's) finalizers, which on a loaded host take seconds (15 s and more with
    Ray), past the stop deadline and out of its watchdog's reach (no thread runs then)."""
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _say_killed(count: int) -> None:
    print(f"stop deadline passed: killed {count} process(es)", flush=True)


def _cluster_bus_check(shards: int, allow_plaintext: bool) -> str | None:
    """For ``--redis-shards`` above 1: None when the cluster's bus will be TLS, the warning
    to print when it will be plaintext and ``--insecure-cluster-bus`` allows it; refuses
    (an ``error:`` line, exit 2) a plaintext bus without that flag (``deploy.redis_cluster``)."""
    if shards <= 1:
        return None
    from deploy.redis_cluster import PLAINTEXT_BUS_WARNING, cluster_bus_secure

    try:
        secure, exe = cluster_bus_secure()
    except FileNotFoundError as e:
        _refuse(f"--redis-shards: {e}")
    if secure:
        return None
    warning = PLAINTEXT_BUS_WARNING.format(exe=exe)
    if not allow_plaintext:
        _refuse(f"--redis-shards: {warning}. Pass --insecure-cluster-bus to start it anyway.")
    return warning


def _tls_hint(tls: TlsFiles | None) -> str:
    """The ``kvmesh stats`` flags that reach a cluster served with ``tls`` (paths only)."""
    if tls is None or not tls.dials_tls:
        return ""
    mutual = f" --tls-cert {tls.cert} --tls-key {tls.key}" if tls.client_auth else ""
    return f" --tls-ca {tls.ca}{mutual}"
