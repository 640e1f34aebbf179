"""Failover bookkeeping shared by the sync and asyncio clients (no I/O here).

Service replicas are stateless and interchangeable: calls go to the last replica that
answered (``kvmesh.retry.ReplicaRing``) and rotate through the others when the retry table
(``kvmesh.retry.TABLE``) says so. Workers are tried in the service's ranking order (best
candidate first). :class:`Failures` turns the failed attempts of one call into the error the
caller sees, naming every attempt.
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


class Failures:
    """Collects the failures of one failover loop and turns them into the final error."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.errors: list[tuple[str, grpc.StatusCode, str]] = []

    def add(self, where: str, code: grpc.StatusCode, message: str) -> None:
        """Record that ``where`` failed with ``code``/``message``."""
        self.errors.append((where, code, message))

    @property
    def last_code(self) -> grpc.StatusCode | None:
        """The code of the latest failure (None before any)."""
        return self.errors[-1][1] if self.errors else None

    def _detail(self, errors: list[tuple[str, grpc.StatusCode, str]]) -> str:
        return "; ".join(f"{where}: {code.name} {msg}" for where, code, msg in errors)

    def error(self) -> KvmeshError:
        """Every option failed: a ``KvmeshError`` with the last failure's code and every
        failure in the message."""
        if not self.errors:
            return KvmeshError(grpc.StatusCode.UNAVAILABLE, f"no {self.what} to try")
        n = len(self.errors)
        return KvmeshError(self.errors[-1][1],
                           f"all {n} {self.what}(s) failed ({self._detail(self.errors)})")

    def surface(self) -> KvmeshError:
        """The last failure is not retried: its code and message, followed by the earlier
        failures when there were any (the message is the server's own text otherwise)."""
        if not self.errors:
            return self.error()
        *earlier, (_, code, message) = self.errors
        if earlier:
            message = (f"{message} (after {len(earlier)} failed {self.what}(s): "
                       f"{self._detail(earlier)})")
        return KvmeshError(code, message)


def no_worker_error() -> KvmeshError:
    """The error for a routing answer without any candidate worker."""
    return KvmeshError(grpc.StatusCode.UNAVAILABLE,
                       "no live worker can take this request (the service returned no "
                       "candidates)")
