"""kvmesh client: route prompts to the worker holding their KV prefix, and generate.

``KvmeshClient`` (blocking) and ``AsyncKvmeshClient`` (asyncio) talk to the metadata-service
replicas and the workers over gRPC; failures surface as ``KvmeshError``.

The names are loaded on first access, so importing ``client.cli`` (the ``kvmesh`` command)
does not pay for grpc until a verb needs it.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from client.async_client import AsyncKvmeshClient
    from client.errors import KvmeshError
    from client.results import Candidate, GenerateResult, PinResult, RouteResult
    from client.sync_client import KvmeshClient
    from kvmesh.rpc.tls import TlsFiles

_EXPORTS = {
    "AsyncKvmeshClient": "client.async_client",
    "KvmeshClient": "client.sync_client",
    "KvmeshError": "client.errors",
    "Candidate": "client.results",
    "GenerateResult": "client.results",
    "PinResult": "client.results",
    "RouteResult": "client.results",
    "TlsFiles": "kvmesh.rpc.tls",
}

__all__ = ["AsyncKvmeshClient", "Candidate", "GenerateResult", "KvmeshClient", "KvmeshError",
           "PinResult", "RouteResult", "TlsFiles"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'client' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
