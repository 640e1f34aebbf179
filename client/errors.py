"""The one exception the kvmesh client raises, and which gRPC failures it retries.

Contract: every failure of a client call surfaces as :class:`KvmeshError`, whose ``code`` is
the gRPC status code (``grpc.StatusCode``) the server or transport reported and whose
``message`` is the server's own text. Transport failures are retried elsewhere first (another
service replica, another candidate worker); only when every option is spent does the caller
see an error.
"""
from __future__ import annotations

import grpc

# A service replica that answers UNAVAILABLE is down or unreachable: ask the next replica.
SERVICE_RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE})

# A worker that is down, hangs past the deadline, or drops the stream (CANCELLED by the
# server, e.g. on shutdown) gets the request restarted on the next candidate.
WORKER_RETRYABLE = frozenset({
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
})


class KvmeshError(Exception):
    """A kvmesh call failed: ``code`` is a ``grpc.StatusCode``, ``message`` the reason."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message

    @classmethod
    def from_rpc(cls, err: grpc.RpcError) -> KvmeshError:
        """Wrap a ``grpc.RpcError`` (sync or aio), keeping its code and details."""
        code = err.code() if callable(getattr(err, "code", None)) else None
        details = err.details() if callable(getattr(err, "details", None)) else None
        return cls(code or grpc.StatusCode.UNKNOWN, details or str(err))


class BrokenStream(Exception):
    """A Generate stream ended without its final message (internal: triggers failover)."""
