"""Worker tokens bound to one worker id: ``<worker_id>:<hex HMAC-SHA256(secret, worker_id)>``.

The service holds one secret (``--worker-secret``); an operator mints each worker's token
with ``kvmesh worker-token --worker-id ID`` (or :func:`mint`) and gives the worker only its
own token. The service recomputes the MAC, so it needs no table of tokens, new workers join
without touching the service, and every replica accepts the same tokens. A worker that
holds only its own token cannot forge another id's MAC, so it can act only for itself
(``kvmesh.rpc.auth`` enforces the request's ``worker_id`` equals the bound id).

Revoking one worker means rotating the secret (and re-minting the others' tokens).
"""
from __future__ import annotations

import hashlib
import hmac

from kvmesh.rpc.auth import Grant, Verifier

MIN_SECRET_BYTES = 16
_LABEL = b"kvmesh worker token v1\x00"  # domain separation: this MAC means nothing else


def _mac(secret: str, worker_id: str) -> str:
    return hmac.new(secret.encode(), _LABEL + worker_id.encode(), hashlib.sha256).hexdigest()


def mint(secret: str, worker_id: str) -> str:
    """The token binding ``worker_id`` under ``secret``. Raises ``ValueError`` for a secret
    shorter than :data:`MIN_SECRET_BYTES` bytes or an empty worker id."""
    if len(secret.encode()) < MIN_SECRET_BYTES:
        raise ValueError(f"the worker secret must be at least {MIN_SECRET_BYTES} bytes")
    if not worker_id:
        raise ValueError("worker_id is empty")
    return f"{worker_id}:{_mac(secret, worker_id)}"


def bound_worker(secret: str, token: str) -> str | None:
    """The worker id ``token`` is bound to, or ``None`` if its MAC does not verify."""
    worker_id, sep, mac = token.rpartition(":")
    if not sep or not worker_id:
        return None
    return worker_id if hmac.compare_digest(mac.encode(), _mac(secret, worker_id).encode()) \
        else None


def verifier(role: str, secret: str) -> Verifier:
    """A ``kvmesh.rpc.auth`` verifier granting ``role`` bound to the token's worker id."""

    def verify(token: str) -> Grant | None:
        worker_id = bound_worker(secret, token)
        return None if worker_id is None else Grant(role, identity=worker_id)

    return verify
