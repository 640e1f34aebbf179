"""``AsyncKvmeshClient``: the asyncio twin of ``KvmeshClient`` (grpc.aio), for async routers.

Same contract, same requests and results as the blocking client (see ``client.sync_client``):
service calls fail over between replicas and ``generate`` restarts the request on the next
candidate worker as the retry table (``kvmesh.retry``) says, a stream only before its first
token; every other failure raises ``KvmeshError``. Channels are created on first use inside
the running event loop; use one client per loop and ``await client.close()`` (or
``async with``) when done.
"""
from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable
from contextlib import aclosing
from typing import Any, NamedTuple

import grpc
import grpc.aio

from client.convert import (
    LoraSpec,
    MmSpec,
    StreamAssembler,
    auth_metadata,
    generate_request,
    route_request,
    route_result,
    stats_dict,
    worker_metadata,
    worker_stats_dict,
)
from client.errors import BrokenStream, KvmeshError
from client.failover import CHANNEL_OPTIONS, Failures, no_worker_error, parse_addresses
from client.results import GenerateResult, RouteResult
from kvmesh.retry import Action, ReplicaRing, Source, decide, retried
from kvmesh.tls import TlsFiles
from kvmesh.v1 import index_pb2, index_pb2_grpc, worker_pb2, worker_pb2_grpc


class TokenChunk(NamedTuple):
    """Tokens streamed by ``generate_stream`` and the worker producing them."""

    token_ids: list[int]
    worker_id: str
    address: str


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
        self._credentials = tls.channel_credentials() if tls is not None else None
        self._options = CHANNEL_OPTIONS + (tls.channel_options() if tls is not None else ())
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
            channel = (
                grpc.aio.secure_channel(address, self._credentials, options=self._options)
                if self._credentials is not None
                else grpc.aio.insecure_channel(address, options=self._options))
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
                failures.add(address, err.code(), err.details() or "")
                if not retried(Source.SERVICE, err.code()):
                    raise failures.surface() from None
                continue
            self._ring.mark_good(address)
            return address, response
        raise failures.error()

    async def route(self, token_ids: Iterable[int], salt: str | None = None,
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

    async def _attempts(self, token_ids: Iterable[int], max_tokens: int, salt: str | None,
                        temperature: float, seed: int | None, lora: LoraSpec,
                        mm: Iterable[MmSpec], policy: str | None, ignore_eos: bool,
                        failures: Failures) -> AsyncGenerator[tuple[Any, StreamAssembler, Any],
                                                              None]:
        """Route once, then open a ``Generate`` call on each ranked candidate in turn:
        ``(candidate, assembler, call)``. Candidates without an address are recorded in
        ``failures`` and skipped; the caller decides what a failed call means."""
        rreq = route_request(token_ids, salt, lora, mm, policy)
        routed = await self._route(rreq)
        greq = generate_request(rreq, max_tokens, temperature, seed, ignore_eos)
        for attempt, cand in enumerate(routed.candidates, 1):
            if not cand.address:
                failures.add(cand.worker_id, grpc.StatusCode.UNAVAILABLE, "no address")
                continue
            greq.index_matched_tokens = cand.matched_tokens
            yield cand, StreamAssembler(cand, attempt), self._conn(cand.address).worker.Generate(
                greq, timeout=self.generate_timeout, metadata=self._worker_metadata)

    async def generate(self, token_ids: Iterable[int], max_tokens: int = 16,
                       salt: str | None = None, temperature: float = 0.0,
                       seed: int | None = None, *, lora: LoraSpec = None,
                       mm: Iterable[MmSpec] = (), policy: str | None = None,
                       ignore_eos: bool = False) -> GenerateResult:
        """Route, then generate on the chosen worker with failover to the next candidate;
        returns only a finished generation (see ``KvmeshClient.generate``)."""
        failures = Failures("candidate worker")
        # aclosing: a return from inside the loop closes the attempts generator at once
        async with aclosing(self._attempts(token_ids, max_tokens, salt, temperature, seed,
                                           lora, mm, policy, ignore_eos, failures)) as attempts:
            async for cand, assembler, call in attempts:
                try:
                    async for message in call:
                        assembler.feed(message)
                    return assembler.result()
                except grpc.RpcError as err:
                    try:  # the final message arrived before the transport failed: it is complete
                        return assembler.result()
                    except BrokenStream:
                        pass
                    failures.add(cand.address, err.code(), err.details() or "")
                except BrokenStream as exc:
                    failures.add(cand.address, grpc.StatusCode.UNAVAILABLE, str(exc))
                finally:
                    call.cancel()
                if not retried(Source.WORKER, failures.last_code):
                    raise failures.surface()
        raise failures.error()

    async def generate_stream(self, token_ids: Iterable[int], max_tokens: int = 16,
                              salt: str | None = None, temperature: float = 0.0,
                              seed: int | None = None, *, lora: LoraSpec = None,
                              mm: Iterable[MmSpec] = (), policy: str | None = None,
                              ignore_eos: bool = False,
                              ) -> AsyncGenerator[TokenChunk | GenerateResult, None]:
        """Route, then stream the generation: ``TokenChunk``s as the worker produces them,
        then exactly one ``GenerateResult`` (all tokens and the worker's facts) last.

        Fails over to the next candidate (as the retry table says) only while nothing was
        yielded yet; once tokens went out, any failure raises ``KvmeshError`` (a dropped
        stream as UNAVAILABLE). Closing the iterator early
        (``aclose``) cancels the worker's request.
        """
        failures = Failures("candidate worker")
        # aclosing: a return from inside the loop closes the attempts generator at once
        async with aclosing(self._attempts(token_ids, max_tokens, salt, temperature, seed,
                                           lora, mm, policy, ignore_eos, failures)) as attempts:
            async for cand, assembler, call in attempts:
                started = finished = False
                try:
                    async for message in call:
                        if finished:
                            continue
                        finished = assembler.feed(message)
                        if message.token_ids:
                            started = True
                            yield TokenChunk(list(message.token_ids), cand.worker_id, cand.address)
                    yield assembler.result()
                    return
                except grpc.RpcError as err:
                    if finished:  # the final message arrived before the transport failed
                        yield assembler.result()
                        return
                    failures.add(cand.address, err.code(), err.details() or "")
                except BrokenStream as exc:
                    failures.add(cand.address, grpc.StatusCode.UNAVAILABLE, str(exc))
                finally:
                    call.cancel()
                if decide(Source.WORKER, failures.last_code, delivered=started) is Action.SURFACE:
                    raise failures.surface()
        raise failures.error()

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
