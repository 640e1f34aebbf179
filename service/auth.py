"""The metadata service's access policy, enforced by ``kvmesh.auth.BearerAuth``.

Roles:

* *router* (``token``): Route, Stats and server reflection.
* *worker*: RegisterWorker, Heartbeat, PublishEvents and SyncWorker. Accepted tokens:
  a token minted from ``worker_secret`` for the request's own worker id (bound: acting for
  another id is PERMISSION_DENIED, see ``service.worker_tokens``); the shared
  ``worker_token`` if set (unbound); and, only when neither ``worker_token`` nor
  ``worker_secret`` is configured, the router ``token`` (one token for everything).

A role with no token configured is open; the gRPC health service is always open. Missing or
wrong tokens get UNAUTHENTICATED before any handler runs.
"""
from __future__ import annotations

from kvmesh.auth import BearerAuth, Verifier, shared_token
from service import worker_tokens
from service.config import ServiceConfig

SERVICE = "/kvmesh.v1.IndexService/"
WORKER_METHODS = frozenset(SERVICE + m for m in
                           ("RegisterWorker", "Heartbeat", "PublishEvents", "SyncWorker"))


def role_of(method: str) -> str:
    """``"worker"`` for the worker calls, ``"router"`` for everything else."""
    return "worker" if method in WORKER_METHODS else "router"


def service_auth(cfg: ServiceConfig) -> BearerAuth | None:
    """The interceptor for ``cfg``, or ``None`` when no token of any role is configured."""
    router: list[Verifier] = [shared_token("router", cfg.token)] if cfg.token else []
    worker: list[Verifier] = []
    if cfg.worker_secret:
        worker.append(worker_tokens.verifier("worker", cfg.worker_secret))
    if cfg.worker_token:
        worker.append(shared_token("worker", cfg.worker_token))
    elif cfg.token and not cfg.worker_secret:
        worker.append(shared_token("worker", cfg.token))
    if not router and not worker:
        return None
    return BearerAuth(role_of, {"router": router, "worker": worker})
