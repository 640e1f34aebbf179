"""Loopback ports for tests: one free to listen on, one where nothing listens."""
from __future__ import annotations

from deploy.ports import free_port

__all__ = ["closed_port_address", "free_port"]


def closed_port_address() -> str:
    """A loopback address where nothing listens (connection refused)."""
    return f"127.0.0.1:{free_port()}"
