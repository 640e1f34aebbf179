"""Is anything there? The Ray address a launcher was given, checked before ``ray.init``.

``ray.init(address=HOST:PORT)`` with nothing listening there does not fail: it logs a
warning every few seconds and retries for ever, so ``kvmesh up --backend ray --ray-address``
with a typo would hang. One TCP connection first tells "nothing answers" at once.

Contract: :func:`check_ray_address` raises ``deploy.launch_error.LaunchError`` (naming
``flag``, ``--ray-address`` or ``RAY_ADDRESS``) when ``HOST:PORT`` or ``ray://HOST:PORT``
refuses, times out or does not resolve; ``auto``, ``local`` and anything else it cannot read
as host and port are left to ``ray.init`` (which fails at once for ``auto`` with no Ray
running). A port that accepts is taken as Ray's: what else listens there is ``ray.init``'s
to find out.
"""
from __future__ import annotations

import socket

from deploy.launch_error import LaunchError

CONNECT_TIMEOUT_S = 3.0


def _host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``HOST:PORT`` or ``ray://HOST:PORT``; None for other forms."""
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def check_ray_address(address: str, flag: str = "--ray-address",
                      timeout: float = CONNECT_TIMEOUT_S) -> None:
    """``LaunchError`` when nothing answers at ``address`` (see the module contract)."""
    target = _host_port(address)
    if target is None:
        return
    try:
        with socket.create_connection(target, timeout=timeout):
            return
    except OSError as e:
        why = "timed out" if isinstance(e, TimeoutError) else (e.strerror or str(e))
    raise LaunchError(f"{flag} {address}: nothing answers there ({why}); give the address of a "
                      "running Ray cluster's head node (`ray status` on it prints it), or "
                      "leave --ray-address and RAY_ADDRESS unset to start a local Ray")
