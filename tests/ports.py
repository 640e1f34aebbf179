"""Loopback ports for tests: one free to listen on, one where nothing listens."""
from __future__ import annotations

import socket

from deploy.ports import free_port

__all__ = ["closed_port_address", "free_port"]

_held: list[socket.socket] = []  # closed ports stay bound, never listening, until exit


def closed_port_address() -> str:
    """A loopback address where nothing listens (connection refused) for the rest of the
    test session. A port merely found free can be handed to the next server that binds port
    0 (a test saw UNIMPLEMENTED there, from another test's gRPC server): this one stays bound
    by a socket that never listens, without ``SO_REUSEADDR``/``SO_REUSEPORT``, so no server
    can bind it and a connection is refused."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    _held.append(s)
    return f"127.0.0.1:{s.getsockname()[1]}"
