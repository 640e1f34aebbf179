"""A free TCP port for launchers and benchmarks that must name a port before a child binds it."""
from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at ``host`` now (bound, then released: another process could
    take it before the caller's child does, which on one machine's loopback it does not)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
