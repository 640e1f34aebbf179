"""Loopback ports for tests: one free to listen on, one where nothing listens."""
from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port with nothing listening on it (bound, then released: another process
    could take it before the caller does, which on a test machine it does not)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def closed_port_address() -> str:
    """A loopback address where nothing listens (connection refused)."""
    return f"127.0.0.1:{free_port()}"
