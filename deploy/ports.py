"""A free TCP port for launchers and benchmarks that must name a port before a child binds it."""
from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at ``host`` now (bound, then released: another process could
    take it before the caller's child does, which on one machine's loopback it does not)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def in_use(host: str, port: int) -> bool:
    """Whether a listener holds ``host:port`` now: it cannot be bound the way a server binds
    it (``SO_REUSEADDR``, as gRPC and Valkey do, so connections of a past server in TIME_WAIT
    do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
        return False
