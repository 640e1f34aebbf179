"""Failover ordering shared by the sync and asyncio clients (no I/O here).

Service replicas are stateless and interchangeable: calls go to the last replica that
answered, and on UNAVAILABLE rotate through the others in their configured order. Workers are
tried in the service's ranking order (best candidate first).
"""
from __future__ import annotations

from collections.abc import Iterable

import grpc

from client.errors import KvmeshError

# Reconnect quickly to a replica or worker that comes back, and accept large responses.
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
)


def parse_addresses(addresses: str | Iterable[str]) -> list[str]:
    """``"h1:p1,h2:p2"`` or a list of such strings -> unique, stripped ``host:port`` list.

    Raises ``ValueError`` when no address is left.
    """
    parts = [addresses] if isinstance(addresses, str) else list(addresses)
    out: list[str] = []
    for part in parts:
        for addr in str(part).split(","):
            addr = addr.strip()
            if addr and addr not in out:
                out.append(addr)
    if not out:
        raise ValueError("no service address given (expected host:port[,host:port...])")
    return out


class ReplicaRing:
    """Rotation order over service replicas that starts at the last one that answered."""

    def __init__(self, addresses: list[str]) -> None:
        self.addresses = list(addresses)
        self._preferred = 0

    def order(self) -> list[str]:
        """All replicas, the last good one first, then the rest in configured order."""
        start = self._preferred
        return self.addresses[start:] + self.addresses[:start]

    def mark_good(self, address: str) -> None:
        """Remember ``address`` as the replica to ask first next time."""
        self._preferred = self.addresses.index(address)


class Failures:
    """Collects the failures of one failover loop and turns them into the final error."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.errors: list[tuple[str, grpc.StatusCode, str]] = []

    def add(self, where: str, code: grpc.StatusCode, message: str) -> None:
        """Record that ``where`` failed with ``code``/``message``."""
        self.errors.append((where, code, message))

    def error(self) -> KvmeshError:
        """A ``KvmeshError`` with the last failure's code and every failure in the message."""
        if not self.errors:
            return KvmeshError(grpc.StatusCode.UNAVAILABLE, f"no {self.what} to try")
        detail = "; ".join(f"{where}: {code.name} {msg}" for where, code, msg in self.errors)
        n = len(self.errors)
        return KvmeshError(self.errors[-1][1], f"all {n} {self.what}(s) failed ({detail})")


def no_worker_error() -> KvmeshError:
    """The error for a routing answer without any candidate worker."""
    return KvmeshError(grpc.StatusCode.UNAVAILABLE,
                       "no live worker can take this request (the service returned no "
                       "candidates)")
