"""What the blocking and the asyncio client share: settings, one connection per address,
and turning a call's arguments into requests (no I/O here).

Each client adds only its I/O: how a channel is dialled (:meth:`BaseClient._dial`, sync or
``grpc.aio``) and the loops that drive ``kvmesh.rpc.retry`` (replicas) and
``client.failover.Candidates`` (workers). Invariant: at most one channel per address, made
on first use and shared by service and worker stubs; none after :meth:`BaseClient._close_all`.
"""
from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any, NamedTuple

import grpc

from client.convert import (
    LoraSpec,
    MmSpec,
    auth_metadata,
    generate_request,
    prefix_ref,
    route_result,
    worker_metadata,
)
from client.errors import KvmeshError
from client.failover import Candidates, no_worker_error
from client.results import RouteResult
from kvmesh.rpc.auth import WorkerAccess
from kvmesh.rpc.channel import Dialer, parse_addresses
from kvmesh.rpc.retry import ReplicaRing
from kvmesh.rpc.tls import TlsFiles
from kvmesh.v1 import index_pb2, index_pb2_grpc, worker_pb2_grpc


class Conn(NamedTuple):
    """One address's channel (``grpc.Channel`` or ``grpc.aio.Channel``) and its stubs."""

    channel: Any
    index: index_pb2_grpc.IndexServiceStub
    worker: worker_pb2_grpc.WorkerServiceStub


class BaseClient:
    """Settings and connections of a client (see ``KvmeshClient`` for the contract)."""

    def __init__(self, addresses: str | list[str], token: str | None = None, *,
                 timeout: float = 5.0, generate_timeout: float = 120.0,
                 tls: TlsFiles | None = None, admin_token: str | None = None,
                 pin_timeout: float = 60.0, packed_tokens: bool = True) -> None:
        self._ring = ReplicaRing(parse_addresses(addresses))
        self._metadata = auth_metadata(token)
        # pins take the admin token; a cluster without one may leave them to the router's
        self._admin_metadata = auth_metadata(admin_token or token)
        self.pin_timeout = pin_timeout  # a pin waits for every worker's answer (warming)
        # Route prompts as RouteRequest.token_ids_packed; False: the repeated token_ids, for
        # services older than the packed field (they would see an empty prompt)
        self.packed_tokens = packed_tokens
        # mints each worker's own access token (the router token is not kept for it)
        self._worker_access = WorkerAccess(token) if token else None
        self._dialer = Dialer.from_tls(tls)
        self.timeout = timeout
        self.generate_timeout = generate_timeout
        self._conns: dict[str, Conn] = {}
        self._lock = threading.Lock()  # the blocking client is shared between threads
        self._closed = False

    @property
    def addresses(self) -> list[str]:
        """The service replicas, in configured order."""
        return list(self._ring.addresses)

    def _dial(self, address: str) -> Any:
        raise NotImplementedError

    def _conn(self, address: str) -> Conn:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{type(self).__name__} is closed")
            conn = self._conns.get(address)
            if conn is None:
                channel = self._dial(address)
                conn = Conn(channel, index_pb2_grpc.IndexServiceStub(channel),
                            worker_pb2_grpc.WorkerServiceStub(channel))
                self._conns[address] = conn
            return conn

    def _close_all(self) -> list[Any]:
        """Mark the client closed; the channels the caller must now close."""
        with self._lock:
            self._closed = True
            conns, self._conns = list(self._conns.values()), {}
        return [conn.channel for conn in conns]

    @staticmethod
    def _pin_request(token_ids: Iterable[int] | None, salt: str | None, lora: LoraSpec,
                     mm: Iterable[MmSpec], model: str | None,
                     block_hashes: Iterable[bytes] | None, ttl_s: float, max_workers: int,
                     unpin: bool) -> tuple[str, Any]:
        """The service method and request of a pin (or an unpin)."""
        if (token_ids is None) == (block_hashes is None):
            raise ValueError("give the prefix as token_ids or as block_hashes (one of them)")
        ref = prefix_ref(token_ids, salt, lora, mm, model, block_hashes)
        if unpin:
            return "UnpinPrefix", index_pb2.UnpinPrefixRequest(prefix=ref)
        return "PinPrefix", index_pb2.PinPrefixRequest(prefix=ref, ttl_s=float(ttl_s),
                                                       max_workers=max(0, int(max_workers)))

    @staticmethod
    def _quota_request(tenant: str, gpu: float | None, cpu: float | None, disk: float | None,
                       clear: bool) -> index_pb2.SetTenantQuotaRequest:
        """A SetTenantQuota request (the service validates it: INVALID_ARGUMENT)."""
        fractions = {t: float(v) for t, v in (("gpu", gpu), ("cpu", cpu), ("disk", disk))
                     if v is not None}
        return index_pb2.SetTenantQuotaRequest(
            quota=index_pb2.TenantQuota(tenant=tenant, **fractions), clear=clear)

    def _worker_metadata(self, worker_id: str) -> tuple[tuple[str, str], ...]:
        """The metadata of a call to worker ``worker_id``: that worker's own access token
        (valid on no other worker), or none on an open cluster."""
        return worker_metadata(self._worker_access, worker_id)

    def _needs_worker_id(self, worker_id: str | None) -> bool:
        """True when a worker call must first learn the id of the worker it calls (its
        token is minted for that id; an open cluster needs none)."""
        return not worker_id and self._worker_access is not None

    @staticmethod
    def _worker_at(stats: dict[str, Any], address: str) -> str:
        """The id the service lists at ``address`` (a live one first); raises
        ``KvmeshError(NOT_FOUND)`` when it lists none: no token can be minted for it."""
        listed = [w for w in stats.get("workers", ()) if w.get("address") == address]
        listed.sort(key=lambda w: not w.get("alive"))
        if not listed or not listed[0].get("worker_id"):
            raise KvmeshError(grpc.StatusCode.NOT_FOUND, (
                f"the service lists no worker at {address}: give its worker_id (a worker's "
                "access token is minted for its id)"))
        return str(listed[0]["worker_id"])

    @staticmethod
    def _routed(response: index_pb2.RouteResponse) -> RouteResult:
        """A Route answer as a result; raises ``KvmeshError(UNAVAILABLE)`` without any
        candidate."""
        result = route_result(response)
        if not result.candidates:
            raise no_worker_error()
        return result

    @staticmethod
    def _plan(routed: RouteResult, rreq: index_pb2.RouteRequest, max_tokens: int,
              temperature: float, seed: int | None, ignore_eos: bool,
              stream: bool) -> Candidates:
        """The candidate loop of one generation, routed as ``rreq`` was."""
        return Candidates(routed, generate_request(rreq, max_tokens, temperature, seed,
                                                   ignore_eos), stream=stream)
