"""What a worker's registered address says about how to reach it.

A worker registers one address with the index. Two kinds of workers exist, and the address
says which, so every caller can tell them apart from a ``Route`` answer alone:

- a kvmesh worker: ``host:port`` of its gRPC ``WorkerService`` (``Generate``, ``Pin``);
- an HTTP engine (a vLLM server the bridge registers, or a kvmesh worker's
  ``--http-port``): ``http://host:port`` or ``https://host:port``, the base URL of its
  OpenAI-compatible server (``/v1/completions``, ``/v1/chat/completions``).

Nothing else is ever registered: no path, no user info (``service.validate.address``
checks the ``host:port`` part).
"""
from __future__ import annotations

SCHEMES = ("http://", "https://")


def is_http(address: str) -> bool:
    """Whether ``address`` is an HTTP engine's base URL (not a gRPC ``host:port``)."""
    return address.startswith(SCHEMES)


def host_port(address: str) -> str:
    """The ``host:port`` part of either kind of address."""
    for scheme in SCHEMES:
        if address.startswith(scheme):
            return address[len(scheme):]
    return address


def http_address(host_port_: str, *, tls: bool = False) -> str:
    """The registered address of an HTTP engine listening on ``host_port_``."""
    return f"{SCHEMES[1] if tls else SCHEMES[0]}{host_port_}"
