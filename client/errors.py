"""The one exception the kvmesh client raises.

Contract: every failure of a client call surfaces as :class:`KvmeshError`, whose ``code`` is
the gRPC status code (``grpc.StatusCode``) the server or transport reported and whose
``message`` is the server's own text. Which failures are first retried elsewhere (another
service replica, another candidate worker) is decided by ``kvmesh.rpc.retry.TABLE``; only when
every option is spent, or the table surfaces the code, does the caller see an error.
"""
from __future__ import annotations

import grpc


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
