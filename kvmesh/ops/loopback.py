"""Whether only this host can reach an endpoint: the rule that lets a socket carrying
prompts (the vLLM event sockets, the peer KV data plane) go without encryption.

See docs/security.md.
"""
from __future__ import annotations

import ipaddress


def is_local(endpoint: str) -> bool:
    """Whether only this host can reach ``endpoint``: ``ipc://``/``inproc://``, or tcp bound
    to a loopback address (``127.0.0.0/8``, ``::1``, ``localhost``). ``tcp://*``, the
    unspecified addresses, interface names and every other address are not local. Anything
    that is not one of those forms is not local either (the caller refuses rather than
    guesses)."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep:
        return False
    if scheme in ("ipc", "inproc"):
        return True
    if scheme != "tcp":
        return False  # pgm/epgm/udp/ws...: multicast or other transports, never "local"
    host = rest.rpartition(":")[0]
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if ";" in host:  # tcp://source;dest: the bound part is what follows
        host = host.rpartition(";")[2]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # "*", an interface name, a host name
