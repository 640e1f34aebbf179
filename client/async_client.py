"""``AsyncKvmeshClient``: the asyncio twin of ``KvmeshClient`` (grpc.aio), for async routers.

Same contract, same requests and results as the blocking client (see ``client.sync_client``):
service calls fail over between replicas and ``generate`` restarts the request on the next
candidate worker as the retry table (``kvmesh.retry``) says, a stream only before its first
token; every other failure raises ``KvmeshError``. Channels are created on first use inside
the running event loop; use one client per loop and ``await client.close()`` (or
``async with``) when done.
"""
from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from contextlib import aclosing
from typing import Any, NamedTuple

import grpc
import grpc.aio

from client.convert import (
    LoraSpec,
    MmSpec,
    auth_metadata,
    generate_request,
    route_request,
    route_result,
    stats_dict,
    worker_metadata,
    worker_stats_dict,
)
from client.errors import BrokenStream, KvmeshError
from client.failover import Candidates, Failures, no_worker_error
from client.results import GenerateResult, RouteResult, TokenChunk
from kvmesh.channel import Dialer, parse_addresses
from kvmesh.retry import ReplicaRing, Source
from kvmesh.tls import TlsFiles
from kvmesh.v1 import index_pb2, index_pb2_grpc, worker_pb2, worker_pb2_grpc

__all__ = ["AsyncKvmeshClient", "TokenChunk"]


class _Conn(NamedTuple):
    channel: grpc.aio.Channel
    index: index_pb2_grpc.IndexServiceStub
    worker: worker_pb2_grpc.WorkerServiceStub


class AsyncKvmeshClient:
    """Asyncio client: ``await route(...)``, ``generate``, ``stats``, ``worker_stats``, and
    ``async for`` over ``generate_stream(...)``.

    ``timeout`` bounds each service call and ``worker_stats`` (seconds); ``generate_timeout``
    bounds one attempt of a Generate stream on one worker.
    """

    def __init__(self, addresses: str | list[str], token: str | None = None, *,
                 timeout: float = 5.0, generate_timeout: float = 120.0,
                 tls: TlsFiles | None = None) -> None:
        self._ring = ReplicaRing(parse_addresses(addresses))
        self._metadata = auth_metadata(token)
        self._worker_metadata = worker_metadata(token)
        self._dialer = Dialer.from_tls(tls)
        self.timeout = timeout
        self.generate_timeout = generate_timeout
        self._conns: dict[str, _Conn] = {}
        self._closed = False

    @property
    def addresses(self) -> list[str]:
        """The service replicas, in configured order."""
        return list(self._ring.addresses)

    def _conn(self, address: str) -> _Conn:
        if self._closed:
            raise RuntimeError("AsyncKvmeshClient is closed")
        conn = self._conns.get(address)
        if conn is None:
            channel = self._dialer.aio(address)
            conn = _Conn(channel, index_pb2_grpc.IndexServiceStub(channel),
                         worker_pb2_grpc.WorkerServiceStub(channel))
            self._conns[address] = conn
        return conn

    async def _service_call(self, method: str, request: Any) -> tuple[str, Any]:
        """Call ``IndexService.<method>``, failing over between replicas per the retry table."""
        failures = Failures("service replica")
        for address in self._ring.order():
            rpc = getattr(self._conn(address).index, method)
            try:
                response = await rpc(request, timeout=self.timeout, metadata=self._metadata)
            except grpc.RpcError as err:
                failures.failed(Source.SERVICE, address, err)
                continue
            self._ring.mark_good(address)
            return address, response
        raise failures.error()

    async def route(self, token_ids: Iterable[int], salt: str | None = None, *,
                    lora: LoraSpec = None, mm: Iterable[MmSpec] = (),
                    policy: str | None = None, max_candidates: int = 0,
                    dry_run: bool = False) -> RouteResult:
        """Ask the service which worker should serve this prompt (best candidate first).

        Raises ``KvmeshError(UNAVAILABLE)`` when no worker can take it. ``dry_run`` asks the
        same question without the side effects routing has on the service (provisional
        entries for the chosen worker, its estimated load): use it to inspect.
        """
        request = route_request(token_ids, salt, lora, mm, policy, max_candidates,
                                dry_run=dry_run)
        return await self._route(request)

    async def _route(self, request: index_pb2.RouteRequest) -> RouteResult:
        _, response = await self._service_call("Route", request)
        result = route_result(response)
        if not result.candidates:
            raise no_worker_error()
        return result

    async def generate(self, token_ids: Iterable[int], max_tokens: int = 16,
                       salt: str | None = None, temperature: float = 0.0,
                       seed: int | None = None, *, lora: LoraSpec = None,
                       mm: Iterable[MmSpec] = (), policy: str | None = None,
                       ignore_eos: bool = False) -> GenerateResult:
        """Route, then generate on the chosen worker with failover to the next candidate;
        returns only a finished generation (see ``KvmeshClient.generate``)."""
        # aclosing: the call is cancelled and the generator closed as soon as we return
        async with aclosing(self._generation(token_ids, max_tokens, salt, temperature, seed,
                                             lora, mm, policy, ignore_eos,
                                             stream=False)) as run:
            result = await anext(run)
        assert isinstance(result, GenerateResult)
        return result

    def generate_stream(self, token_ids: Iterable[int], max_tokens: int = 16,
                        salt: str | None = None, temperature: float = 0.0,
                        seed: int | None = None, *, lora: LoraSpec = None,
                        mm: Iterable[MmSpec] = (), policy: str | None = None,
                        ignore_eos: bool = False,
                        ) -> AsyncIterator[TokenChunk | GenerateResult]:
        """Route, then stream the generation: ``TokenChunk``s as the worker produces them,
        then exactly one ``GenerateResult`` (all tokens and the worker's facts) last.

        Fails over to the next candidate (as the retry table says) only while nothing was
        yielded yet; once tokens went out, any failure raises ``KvmeshError`` (a dropped
        stream as UNAVAILABLE). Closing the iterator early
        (``aclose``) cancels the worker's request.
        """
        return self._generation(token_ids, max_tokens, salt, temperature, seed, lora, mm,
                                policy, ignore_eos, stream=True)

    async def _generation(self, token_ids: Iterable[int], max_tokens: int, salt: str | None,
                          temperature: float, seed: int | None, lora: LoraSpec,
                          mm: Iterable[MmSpec], policy: str | None, ignore_eos: bool, *,
                          stream: bool) -> AsyncGenerator[TokenChunk | GenerateResult, None]:
        """Route once, then drive :class:`client.failover.Candidates` over ``grpc.aio``
        calls: chunks (when ``stream``), then the one result (``KvmeshClient._generation``
        is the blocking twin)."""
        rreq = route_request(token_ids, salt, lora, mm, policy)
        plan = Candidates(await self._route(rreq),
                          generate_request(rreq, max_tokens, temperature, seed, ignore_eos),
                          stream=stream)
        for attempt in plan:
            call = self._conn(attempt.cand.address).worker.Generate(
                attempt.request, timeout=self.generate_timeout, metadata=self._worker_metadata)
            try:
                async for message in call:
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

    async def stats(self) -> dict[str, Any]:
        """The service's view: ``workers``, ``counters``, ``degraded``, ``service``."""
        address, response = await self._service_call("Stats", index_pb2.StatsRequest())
        return stats_dict(response, address)

    async def worker_stats(self, address: str) -> dict[str, Any]:
        """One worker's own statistics (``WorkerService.Stats``): load, cache, precision."""
        try:
            response = await self._conn(address).worker.Stats(
                worker_pb2.WorkerStatsRequest(), timeout=self.timeout,
                metadata=self._worker_metadata)
        except grpc.RpcError as err:
            raise KvmeshError.from_rpc(err) from None
        return worker_stats_dict(response, address)

    async def close(self) -> None:
        """Close every channel; further calls raise ``RuntimeError``. Idempotent."""
        self._closed = True
        conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            await conn.channel.close()

    async def __aenter__(self) -> AsyncKvmeshClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
