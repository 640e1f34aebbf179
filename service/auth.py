"""The metadata service's access policy, enforced by ``kvmesh.rpc.auth.BearerAuth``.

Roles: *router* (Route, Stats, reflection), *admin* (pins, tenant quotas), *worker*
(register, heartbeat, publish, sync: a bound token for its own id, or the shared worker
token). The router token is never a worker credential. A role with no token is open; a
service with a router token but no worker credential refuses to start
(:func:`check_credentials`).

See docs/architecture.md#the-service-process.
"""
from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from kvmesh.rpc.auth import BearerAuth, Grant, Verifier, shared_token
from service import worker_tokens

if TYPE_CHECKING:  # service.config calls check_credentials
    from service.config import ServiceConfig

SERVICE = "/kvmesh.v1.IndexService/"
WORKER_METHODS = frozenset(SERVICE + m for m in
                           ("RegisterWorker", "Heartbeat", "PublishEvents", "SyncWorker"))
ADMIN_METHODS = frozenset(SERVICE + m for m in ("PinPrefix", "UnpinPrefix", "SetTenantQuota",
                                                 "GetTenantQuotas"))
_FINGERPRINT_LABEL = b"kvmesh credential fingerprint v1\x00"


def role_of(method: str) -> str:
    """``"worker"`` for the worker calls, ``"admin"`` for pins and quotas, ``"router"`` for
    everything else."""
    if method in WORKER_METHODS:
        return "worker"
    return "admin" if method in ADMIN_METHODS else "router"


def check_credentials(token: str | None, worker_token: str | None,
                      worker_secret: str | None, admin_token: str | None = None) -> None:
    """Raise ``ValueError`` for a credential set that would let the router token act as a
    worker, or leave workers unable to join: a router token with no worker credential, or a
    worker credential equal to the router token; or an admin token equal to any other."""
    if admin_token and admin_token in (token, worker_token, worker_secret):
        raise ValueError("the admin token must differ from the router token and the worker "
                         "token / worker secret")
    if not token:
        return
    if not worker_token and not worker_secret:
        raise ValueError(
            "a router token (--token) needs a worker credential too: --worker-secret S (each "
            "worker presents `kvmesh worker-token --worker-id ID` as its --service-token) or "
            "--worker-token W; the router token is never accepted on worker calls")
    if token in (worker_token, worker_secret):
        raise ValueError("the worker token / worker secret must differ from the router token")


def fingerprint(token: str) -> str:
    """A short, one-way name of the credential ``token`` ("" for none): SHA-256 under a
    label, 128 bits in hex. Records store this, never the token."""
    if not token:
        return ""
    return hashlib.sha256(_FINGERPRINT_LABEL + token.encode()).hexdigest()[:32]


def service_auth(cfg: ServiceConfig) -> BearerAuth | None:
    """The interceptor for ``cfg``, or ``None`` when no token of any role is configured."""
    router: list[Verifier] = [shared_token("router", cfg.token)] if cfg.token else []
    worker: list[Verifier] = []
    if cfg.worker_secret:
        worker.append(worker_tokens.verifier("worker", cfg.worker_secret))
    if cfg.worker_token:
        worker.append(shared_token("worker", cfg.worker_token))
    # A role without verifiers is open: with a router token and no admin token, the admin
    # calls get a verifier that accepts nothing (closed), never open.
    admin: list[Verifier] = ([shared_token("admin", cfg.admin_token)] if cfg.admin_token
                             else [_nobody] if cfg.token else [])
    if not router and not worker and not admin:
        return None
    return BearerAuth(role_of, {"router": router, "worker": worker, "admin": admin})


def _nobody(_token: str) -> Grant | None:
    """The verifier of a role nobody may take (no admin token configured)."""
    return None
