"""A Ray Serve request router that asks the kvmesh index where a prompt's KV cache lives.

Each replica registers as worker ``serve_worker_id(replica_id)``, so the index's ranking maps
to Serve ranks, best first (unknown replicas last). The ranked candidates' peer fetch plans
travel in the request (``deploy.ray.request.set_fetch_plans``), each for its own replica.
Power-of-two choices decides whenever the index cannot help (no address, no token ids,
unreachable, degraded, no live replica named).
TLS files are read at ``initialize_state``: a bad one raises there.

See docs/architecture.md#ray-cluster-and-ray-serve.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import re
import time
from typing import Any

from ray.serve._private.common import ReplicaID
from ray.serve._private.request_router import PowerOfTwoChoicesRequestRouter
from ray.serve._private.request_router.common import PendingRequest
from ray.serve._private.request_router.replica_wrapper import RunningReplica
from ray.serve._private.request_router.request_router import (
    LocalityMixin,
    MultiplexMixin,
    RequestRouter,
)

from client.convert import fetch_message
from client.errors import KvmeshError
from deploy.ray.request import request_field, set_fetch_plans
from kvmesh.rpc.channel import parse_addresses
from kvmesh.rpc.retry import Source, retried
from kvmesh.rpc.tls import TlsFiles

log = logging.getLogger("kvmesh.ray.router")
_BAD = re.compile(r"[^A-Za-z0-9._:@/-]")
ROUTER_PATH = "deploy.ray.router:KvmeshRequestRouter"


def serve_worker_id(replica_id: ReplicaID) -> str:
    """The kvmesh worker id of a Serve replica (valid for the service, unique per replica)."""
    dep = replica_id.deployment_id
    raw = f"serve:{dep.app_name or 'default'}/{dep.name}/{replica_id.unique_id}"
    return _BAD.sub("-", raw)[-128:]


def request_prompt(pending: PendingRequest | None,
                   ) -> tuple[list[int], str | None, str | None] | None:
    """``(token_ids, salt, tenant)`` of a pending request, or None when it carries no token
    ids (``salt``/``tenant`` None when unset or empty)."""
    if pending is None:
        return None
    for arg in [*(pending.args or ()), *(pending.kwargs or {}).values()]:
        tokens = request_field(arg, "token_ids")
        if tokens:
            return (list(tokens), request_field(arg, "salt") or None,
                    request_field(arg, "tenant") or None)
    return None


class KvmeshRequestRouter(LocalityMixin, MultiplexMixin, RequestRouter):
    """Routes by the kvmesh index (longest cached prefix weighed by load); see module doc."""

    def initialize_state(self, service_addresses: list[str] | str = (),
                         token: str | None = None, index_timeout_s: float = 0.5,
                         retry_after_s: float = 1.0, max_ranks: int = 8,
                         tls_ca: str | None = None, tls_cert: str | None = None,
                         tls_key: str | None = None, tls_server_name: str | None = None
                         ) -> None:
        """Called by Serve with ``request_router_kwargs``."""
        self._tls: TlsFiles | None = None
        if tls_ca or tls_cert or tls_key:
            self._tls = TlsFiles(cert=tls_cert, key=tls_key, ca=tls_ca,
                                 server_name=tls_server_name)
            self._tls.channel_credentials()  # unreadable files or no CA: fail now, loudly
        # no address at all: power-of-two choices (see the module docstring)
        self._addresses = parse_addresses(service_addresses) if service_addresses else []
        self._token = token
        self._timeout = index_timeout_s
        self._retry_after = retry_after_s
        self._max_ranks = max_ranks
        self._client: Any = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._skip_until = 0.0
        self._asked: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.counters: collections.Counter[str] = collections.Counter()

    def _index(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:  # grpc.aio is per loop
            from client import AsyncKvmeshClient

            self._client = AsyncKvmeshClient(self._addresses, self._token, tls=self._tls,
                                             timeout=self._timeout / len(self._addresses))
            self._client_loop = loop
        return self._client

    def _first_ask(self, pending: PendingRequest) -> bool:
        rid = pending.metadata.internal_request_id
        if rid in self._asked:
            return False
        self._asked[rid] = None
        while len(self._asked) > 4096:
            self._asked.popitem(last=False)
        return True

    async def _fallback(self, why: str, candidates: list[RunningReplica],
                        pending: PendingRequest | None) -> list[list[RunningReplica]]:
        self.counters[f"fallback_{why}"] += 1
        return await PowerOfTwoChoicesRequestRouter.choose_replicas(
            self, candidate_replicas=candidates, pending_request=pending)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        """Ranks of replicas, best first (see the module docstring)."""
        prompt = request_prompt(pending_request)
        if not self._addresses:
            return await self._fallback("no_index", candidate_replicas, pending_request)
        if prompt is None:
            return await self._fallback("no_tokens", candidate_replicas, pending_request)
        if time.monotonic() < self._skip_until:
            return await self._fallback("unreachable", candidate_replicas, pending_request)
        assert pending_request is not None
        tokens, salt, tenant = prompt
        try:
            result = await asyncio.wait_for(
                self._index().route(tokens, salt=salt, tenant=tenant,
                                    dry_run=not self._first_ask(pending_request)),
                self._timeout)
        except Exception as e:  # KvmeshError, timeout, transport: Ray's default decides
            # the request's own fault (a refused tenant name is a ValueError before any
            # call): this request falls back, the index stays in use for the others
            if isinstance(e, ValueError) or (isinstance(e, KvmeshError)
                                             and not retried(Source.SERVICE, e.code)):
                return await self._fallback("refused", candidate_replicas, pending_request)
            if self.counters["fallback_unreachable"] == 0:
                log.warning("kvmesh index unreachable (%s); power-of-two choices for %.1fs",
                            e, self._retry_after)
            self._skip_until = time.monotonic() + self._retry_after
            return await self._fallback("unreachable", candidate_replicas, pending_request)
        if result.degraded:
            return await self._fallback("degraded", candidate_replicas, pending_request)
        by_worker = {serve_worker_id(r.replica_id): r for r in candidate_replicas}
        ranks = [[by_worker[c.worker_id]] for c in result.candidates
                 if c.worker_id in by_worker][: self._max_ranks]
        if not ranks:
            return await self._fallback("unknown", candidate_replicas, pending_request)
        self.counters["index"] += 1
        plans = {c.worker_id: fetch_message(c.fetch).SerializeToString()
                 for c in result.candidates if c.fetch is not None and c.worker_id in by_worker}
        if plans and set_fetch_plans([*(pending_request.args or ()),
                                      *(pending_request.kwargs or {}).values()], plans):
            self.counters["fetch_plans"] += 1
        ranked = {r[0].replica_id for r in ranks}
        rest = [r for r in candidate_replicas if r.replica_id not in ranked]
        return ranks + ([rest] if rest else [])
