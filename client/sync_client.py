"""``KvmeshClient``: the blocking router-side client of a kvmesh cluster.

Service calls fail over between replicas as the retry table says; ``generate`` restarts a
failed request on the next ranked worker, returns only a finished result and never runs a
finished request twice (``generate_stream`` fails over only before its first token). The
router token goes to service calls only; each worker gets its own access token. With a TLS
``ca`` every channel is TLS. Failures raise ``KvmeshError`` listing every attempt.
Thread-safe: channels are created once and shared.

See docs/architecture.md#the-client.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import closing
from typing import Any

import grpc

from client.base import BaseClient
from client.convert import (
    LoraSpec,
    MmSpec,
    pin_result,
    route_request,
    stats_dict,
    wire_tenant,
    worker_stats_dict,
)
from client.errors import BrokenStream, KvmeshError
from client.failover import Failures
from client.results import GenerateResult, PinResult, RouteResult, TokenChunk
from kvmesh.quota import Quotas
from kvmesh.rpc.retry import Source
from kvmesh.v1 import index_pb2, worker_pb2


class KvmeshClient(BaseClient):
    """Blocking client: ``route``, ``generate``, ``generate_stream``, ``stats``,
    ``worker_stats``, ``pin``, ``unpin``, ``set_tenant_quota``, ``get_tenant_quotas`` (the
    same methods and signatures as ``AsyncKvmeshClient``).

    ``timeout`` bounds each service call and ``worker_stats`` (seconds); ``generate_timeout``
    bounds one attempt of a Generate stream on one worker; ``pin_timeout`` a pin or unpin
    (it waits for every worker). ``admin_token`` is sent on ``pin``/``unpin`` only (the
    router token when none is given). ``packed_tokens=False`` sends prompts in the
    repeated ``token_ids`` field, for a service older than ``token_ids_packed``.
    """

    def _dial(self, address: str) -> grpc.Channel:
        return self._dialer.sync(address)

    def _service_call(self, method: str, request: Any, *, admin: bool = False
                      ) -> tuple[str, Any]:
        """Call ``IndexService.<method>``, failing over between replicas per the retry table
        (``admin``: with the admin token, and the pin deadline)."""
        failures = Failures("service replica")
        metadata = self._admin_metadata if admin else self._metadata
        timeout = self.pin_timeout if admin else self.timeout
        for address in self._ring.order():
            rpc = getattr(self._conn(address).index, method)
            try:
                response = rpc(request, timeout=timeout, metadata=metadata)
            except grpc.RpcError as err:
                failures.failed(Source.SERVICE, address, err)
                continue
            self._ring.mark_good(address)
            return address, response
        raise failures.error()

    def route(self, token_ids: Iterable[int], salt: str | None = None, *,
              lora: LoraSpec = None, mm: Iterable[MmSpec] = (), policy: str | None = None,
              max_candidates: int = 0, dry_run: bool = False,
              worker_id: str | None = None,
              tenant: str | None = None) -> RouteResult:
        """Ask the service which worker should serve this prompt (best candidate first).

        Raises ``KvmeshError(UNAVAILABLE)`` when no worker can take it. ``dry_run`` asks the
        same question without the side effects routing has on the service (provisional
        entries for the chosen worker, its estimated load): use it to inspect. ``worker_id``
        answers only that worker (NOT_FOUND when it is not live), with the peer fetch the
        service may plan for it. ``tenant``: whom the request is for (quotas and accounting;
        None: the default tenant); a name ``kvmesh.quota.check_tenant`` refuses raises
        ``ValueError`` before anything is sent.
        """
        request = route_request(token_ids, salt, lora, mm, policy, max_candidates,
                                dry_run=dry_run, packed=self.packed_tokens,
                                worker_id=worker_id, tenant=tenant)
        return self._route(request)

    def _route(self, request: index_pb2.RouteRequest) -> RouteResult:
        _, response = self._service_call("Route", request)
        return self._routed(response)

    def generate(self, token_ids: Iterable[int], max_tokens: int = 16, salt: str | None = None,
                 temperature: float = 0.0, seed: int | None = None, *, lora: LoraSpec = None,
                 mm: Iterable[MmSpec] = (), policy: str | None = None,
                 ignore_eos: bool = False, routed: RouteResult | None = None,
                 worker_id: str | None = None, tenant: str | None = None,
                 ) -> GenerateResult:
        """Route the prompt, then generate on the chosen worker, restarting the request on
        the next candidate when the retry table says so (``kvmesh.rpc.retry``) or the stream ends
        early. ``routed``: a ``route`` answer for this very prompt (same salt, LoRA and mm)
        to use instead of routing again; ``worker_id``: run on that worker only (see
        :meth:`route`). Each worker called gets its own candidate's peer fetch plan;
        ``tenant`` goes to the service and to every worker tried (see :meth:`route`).

        Returns only a finished generation; raises ``KvmeshError`` when every candidate failed
        (code of the last failure) or on an error the table surfaces.
        """
        with closing(self._generation(token_ids, max_tokens, salt, temperature, seed, lora,
                                      mm, policy, ignore_eos, stream=False,
                                      routed=routed, worker_id=worker_id,
                                      tenant=tenant)) as run:
            result = next(run)
        assert isinstance(result, GenerateResult)
        return result

    def generate_stream(self, token_ids: Iterable[int], max_tokens: int = 16,
                        salt: str | None = None, temperature: float = 0.0,
                        seed: int | None = None, *, lora: LoraSpec = None,
                        mm: Iterable[MmSpec] = (), policy: str | None = None,
                        ignore_eos: bool = False, routed: RouteResult | None = None,
                        worker_id: str | None = None, tenant: str | None = None,
                        ) -> Iterator[TokenChunk | GenerateResult]:
        """Route, then stream the generation: ``TokenChunk``s as the worker produces them,
        then exactly one ``GenerateResult`` (all tokens and the worker's facts) last.

        Fails over to the next candidate (as the retry table says) only while nothing was
        yielded yet; once tokens went out, any failure raises ``KvmeshError`` (a dropped
        stream as UNAVAILABLE). Closing the iterator early (``close()``) cancels the
        worker's request. ``routed``, ``tenant``: as for :meth:`generate` (a bad tenant
        raises ``ValueError`` here, not at the first ``next``).
        """
        wire_tenant(tenant)
        return self._generation(token_ids, max_tokens, salt, temperature, seed, lora, mm,
                                policy, ignore_eos, stream=True, routed=routed,
                                worker_id=worker_id, tenant=tenant)

    def _generation(self, token_ids: Iterable[int], max_tokens: int, salt: str | None,
                    temperature: float, seed: int | None, lora: LoraSpec,
                    mm: Iterable[MmSpec], policy: str | None, ignore_eos: bool, *,
                    stream: bool, routed: RouteResult | None = None,
                    worker_id: str | None = None, tenant: str | None = None,
                    ) -> Iterator[TokenChunk | GenerateResult]:
        """Route once (unless ``routed`` is given), then drive
        :class:`client.failover.Candidates` over blocking calls: chunks (when ``stream``),
        then the one result."""
        rreq = route_request(token_ids, salt, lora, mm, policy, packed=self.packed_tokens,
                             worker_id=worker_id, tenant=tenant)
        plan = self._plan(routed or self._route(rreq), rreq, max_tokens, temperature, seed,
                          ignore_eos, stream)
        for attempt in plan:
            call = self._conn(attempt.cand.address).worker.Generate(
                attempt.request, timeout=self.generate_timeout,
                metadata=self._worker_metadata(attempt.cand.worker_id))
            try:
                for message in call:
                    chunk = attempt.feed(message)
                    if chunk is not None:
                        yield chunk
                result = attempt.result()
            except (grpc.RpcError, BrokenStream) as err:
                result = plan.failed(attempt, err)
            finally:
                call.cancel()
            if result is not None:
                yield result
                return
        raise plan.error()

    def pin(self, token_ids: Iterable[int] | None, salt: str | None = None, *,
              ttl_s: float = 0.0, max_workers: int = 0, lora: LoraSpec = None,
              mm: Iterable[MmSpec] = (), model: str | None = None,
              block_hashes: Iterable[bytes] | None = None) -> PinResult:
        """Keep a prefix in the device tier of the workers that hold it (admin token).

        The prefix is ``token_ids`` (+ ``salt``, ``lora``, ``mm``, hashed as a request's
        prompt) or, with ``token_ids=None``, its chain ``block_hashes``. ``ttl_s`` (0: the
        service's default) is refreshed whenever a request uses the prefix.
        ``max_workers`` 0: every live worker holding (part of) it; N: the N best holders,
        and other workers warmed (they prefill it) when fewer hold it. The result lists
        each worker called; a worker that failed has an ``error`` (the call still
        succeeds). Raises ``KvmeshError`` (UNAUTHENTICATED without the admin token).
        """
        method, request = self._pin_request(token_ids, salt, lora, mm, model, block_hashes,
                                            ttl_s, max_workers, unpin=False)
        _, response = self._service_call(method, request, admin=True)
        return pin_result(response)

    def unpin(self, token_ids: Iterable[int] | None, salt: str | None = None, *,
                lora: LoraSpec = None, mm: Iterable[MmSpec] = (), model: str | None = None,
                block_hashes: Iterable[bytes] | None = None) -> PinResult:
        """Release a pinned prefix on every live worker (admin token); the result lists
        each worker with the blocks it unpinned (see :meth:`pin` for the prefix)."""
        method, request = self._pin_request(token_ids, salt, lora, mm, model, block_hashes,
                                            0.0, 0, unpin=True)
        _, response = self._service_call(method, request, admin=True)
        return pin_result(response)

    def set_tenant_quota(self, tenant: str, *, gpu: float | None = None,
                         cpu: float | None = None, disk: float | None = None,
                         clear: bool = False) -> Quotas:
        """Set ``tenant``'s cache quota (admin token): a fraction of each tier given (at
        least one; the others fall back to the default's), replacing its quota; or remove it
        with ``clear``. ``tenant`` ``"*"`` (``kvmesh.quota.ALL_TENANTS``) is the default of
        every tenant. Workers apply it within a few seconds. Returns every quota after the
        change; raises ``KvmeshError`` (INVALID_ARGUMENT for a bad tenant or fraction)."""
        request = self._quota_request(tenant, gpu, cpu, disk, clear)
        _, response = self._service_call("SetTenantQuota", request, admin=True)
        return Quotas.from_proto(response.quotas)

    def get_tenant_quotas(self) -> Quotas:
        """Every tenant quota the service stores (admin token); ``Quotas()``: none."""
        _, response = self._service_call("GetTenantQuotas",
                                             index_pb2.GetTenantQuotasRequest(), admin=True)
        return Quotas.from_proto(response.quotas)

    def stats(self) -> dict[str, Any]:
        """The service's view: ``workers`` (``worker_id``, ``address``, ``alive``, load fields,
        ``indexed_blocks`` ...), ``counters``, ``degraded`` and the answering ``service``."""
        address, response = self._service_call("Stats", index_pb2.StatsRequest())
        return stats_dict(response, address)

    def worker_stats(self, address: str, worker_id: str | None = None,
                     ) -> dict[str, Any]:
        """One worker's own statistics (``WorkerService.Stats``): load, cache, precision.

        ``worker_id``: the worker at ``address`` (its access token is minted for its id);
        None: the id the service lists at ``address`` (one more call; none on an open
        cluster). Raises ``KvmeshError`` (NOT_FOUND when the service lists no worker there).
        """
        if self._needs_worker_id(worker_id):
            worker_id = self._worker_at(self.stats(), address)
        try:
            response = self._conn(address).worker.Stats(
                worker_pb2.WorkerStatsRequest(), timeout=self.timeout,
                metadata=self._worker_metadata(worker_id or ""))
        except grpc.RpcError as err:
            raise KvmeshError.from_rpc(err) from None
        return worker_stats_dict(response, address)

    def close(self) -> None:
        """Close every channel; further calls raise ``RuntimeError``. Idempotent."""
        for channel in self._close_all():
            channel.close()

    def __enter__(self) -> KvmeshClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
