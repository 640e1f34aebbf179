"""``kvmesh up --backend ray``: a kvmesh cluster on Ray, in the foreground.

Contract:

- Connects to the Ray cluster at ``--ray-address`` (or ``RAY_ADDRESS``), else starts a local
  Ray; starts the actors (see ``deploy.ray.cluster``); prints one line per service replica
  (``service  host:port``) and per worker, then ``ready: ...``.
- Runs until SIGINT/SIGTERM, then removes every actor and placement group it created and
  prints ``stopped``. A signal during start-up aborts the start and cleans up the same way.
  Either way the process is gone within ``deploy.stopping.DEADLINE_S`` of the signal and
  leaves no process behind: with a Ray of its own, its GCS, raylet and Ray workers (and
  their children) are this process's descendants, which it ends last.
- While running it reports workers leaving routing and coming back (``worker ... left`` /
  ``worker ... alive``), checked every 2 s.
"""
from __future__ import annotations

import threading
import time

from deploy.ray.cluster import NAMESPACE, RayCluster
from deploy.ray.spec import RaySpec
from deploy.stopping import StopDeadline, end_descendants
from kvmesh.ops.redact import redact_url
from worker.kv_cache.tier_config import TierConfig


def _watch(cluster: RayCluster, stop: threading.Event, every_s: float = 2.0) -> None:
    known = set(cluster.worker_ids)
    while not stop.wait(every_s):
        try:
            alive = cluster.alive_workers()
        except Exception as e:  # every replica down for a moment: say so, keep going
            print(f"service unreachable: {e}", flush=True)
            continue
        for wid in sorted(known - set(alive)):
            print(f"worker   {wid} left routing", flush=True)
        for wid in sorted(set(alive) - known):
            print(f"worker   {alive[wid]}  ({wid}) alive", flush=True)
        known = set(alive)


def run_up(workers: int, port: int, redis_url: str | None, model: str, *,
           ray_address: str | None = None, gpus_per_worker: float | None = None,
           service_replicas: int = 1, block_size: int = 16, num_blocks: int | None = None,
           token: str | None = None, worker_secret: str | None = None,
           name: str | None = None, tiers: TierConfig = TierConfig(),
           policy: str | None = None, stop: threading.Event | None = None,
           peer_fetch: bool | None = None, min_fetch_blocks: int | None = None,
           tenant_quotas: tuple[tuple[str, float], ...] = (),
           default_tenant_quota: float | None = None, data_host: str | None = None) -> None:
    """Run kvmesh on Ray until a signal (or ``stop``) arrives; always cleans up, within
    ``deploy.stopping``'s deadline of the signal, its own Ray's processes included. A start
    that fails for a reason the user can fix raises ``LaunchError`` (after the clean-up)."""
    deadline = StopDeadline(on_kill=_say_killed)
    if stop is not None:  # a caller's event stops it as a signal would
        deadline.stop = stop
    spec = RaySpec(workers=workers, service_replicas=service_replicas, redis_url=redis_url,
                   ray_address=ray_address, model=model, block_size=block_size,
                   num_blocks=num_blocks, gpus_per_worker=gpus_per_worker, port=port,
                   token=token, worker_secret=worker_secret, policy=policy,
                   tiers=tiers, peer_fetch=peer_fetch, min_fetch_blocks=min_fetch_blocks,
                   tenant_quotas=tenant_quotas, default_tenant_quota=default_tenant_quota,
                   data_host=data_host, **({"name": name} if name else {}))
    cluster = RayCluster(spec)
    deadline.install()
    try:
        try:
            cluster.start()
        except KeyboardInterrupt:
            print("interrupted during start; removed what was created", flush=True)
            return
        deadline.install()  # ray.init may have replaced the handlers
        deadline.ready()
        import ray

        print(f"ray      {ray.get_runtime_context().gcs_address}", flush=True)
        print(f"actors   {spec.name}-* in namespace {NAMESPACE} "
              f"(worker resources {cluster.bundle})", flush=True)
        print(f"redis    {redact_url(cluster.redis_url or '')}"
              + ("" if redis_url else " (embedded)"),
              flush=True)
        for address in cluster.service_addresses:
            print(f"service  {address}  (policy {cluster.policy})", flush=True)
        for info in cluster.worker_infos():
            print(f"worker   {info['address']}  ({info['worker_id']}, {info['device']})",
                  flush=True)
        print(f"ready: kvmesh stats --service {','.join(cluster.service_addresses)}",
              flush=True)
        # the watch calls the service, which a loaded host may answer slowly: off the main
        # thread, so a signal is acted on at once
        threading.Thread(target=_watch, args=(cluster, deadline.stop), daemon=True).start()
        deadline.stop.wait()
    finally:
        deadline.ready()  # a signal now only hurries the stop, never cuts it
        cluster.stop(timeout=max(1.0, deadline.remaining(reserve_s=2.5)))
        end_descendants(deadline=time.monotonic() + deadline.remaining(reserve_s=0.5))
        print("stopped", flush=True)


def _say_killed(count: int) -> None:
    print(f"stop deadline passed: killed {count} process(es)", flush=True)
