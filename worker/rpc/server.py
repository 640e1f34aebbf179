"""The worker's gRPC server: ``WorkerService`` (Generate, Stats, Pin) plus standard health.

``Generate`` streams each step's tokens as they come and ends with one message carrying
``finished=True`` and the request's facts (cached tokens, time to first token measured on
the worker, the worker id). Bad requests are refused before they reach the engine:
INVALID_ARGUMENT for what the caller must fix, RESOURCE_EXHAUSTED for a request bigger than
this worker's whole KV pool; the worker keeps serving either way. A request whose engine
step failed (``StepFailed``: the worker's fault) is answered INTERNAL, which clients fail
over on; no handler ever answers UNKNOWN (``worker.rpc.internal_errors``).
"""
from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kvmesh.hashing import Lora, MMItem
from kvmesh.quota import check_tenant
from kvmesh.rpc.auth import BearerAuth, shared_token
from kvmesh.rpc.channel import Dialer
from kvmesh.rpc.limits import RequestLimits, server_options
from kvmesh.v1 import index_pb2, worker_pb2, worker_pb2_grpc
from worker.engine.async_engine import AsyncEngine
from worker.engine.engine import RequestError, StepFailed
from worker.engine.sequence import SamplingParams, Seq
from worker.kv_cache import Pinned
from worker.kv_cache.tenant_rows import tenant_rows
from worker.kv_cache.tier_precision import TierPrecision
from worker.kv_cache.tier_stats import engine_tier_figures
from worker.rpc.fetch_call import PeerSource, Refused
from worker.rpc.internal_errors import InternalErrors
from worker.rpc.metrics import WorkerMetrics
from worker.rpc.peer_fetch import PeerFetcher
from worker.rpc.peer_stats import PeerCounters
from worker.rpc.pin_call import pin_call
from worker.rpc.prompt_keys import prompt_keys

MAX_MESSAGE_BYTES = 16 << 20  # --max-message-bytes
DEFAULT_MAX_INFLIGHT = 1024  # --max-inflight-per-conn (calls in flight per connection)
MAX_MM_ITEMS = 64  # multimodal items per request: hashing costs blocks x items
PIN_METHOD = "/kvmesh.v1.WorkerService/Pin"
FETCH_METHOD = "/kvmesh.v1.WorkerService/FetchBlocks"  # the ticket is its credential


@dataclass
class PrecisionCounter:
    """How much of what the index promised the worker really had (tokens)."""

    promised: int = 0
    served: int = 0

    def add(self, promised: int, cached: int) -> None:
        if promised:
            self.promised += promised
            self.served += min(promised, cached)


def cached_by_tier(seq: Seq) -> dict[str, int]:
    """``seq.num_cached_tokens`` split by the tier the blocks came from (set at first
    admission, "peer" included when non-zero; empty only for a request never admitted)."""
    if seq.cached_tokens_by_tier:
        return dict(seq.cached_tokens_by_tier)
    return {"gpu": max(seq.num_cached_tokens, 0), "cpu": 0, "disk": 0}


class WorkerServicer(worker_pb2_grpc.WorkerServiceServicer):
    def __init__(self, runner: AsyncEngine, worker_id: str, model_name: str,
                 max_mm_items: int = MAX_MM_ITEMS, *, peer_fetch: bool = True,
                 credential: str | None = None, dialer: Dialer | None = None,
                 host: str = "127.0.0.1") -> None:
        """``peer_fetch``: serve peers and follow fetch plans (``runner``'s load says so);
        ``credential``: what this worker presents to the service (its peer key's root);
        ``dialer``: how it reaches peers; ``host``: where its data plane listens."""
        self.runner = runner
        self.max_mm_items = max_mm_items
        self.worker_id = worker_id
        self.model_name = model_name
        self.precision = PrecisionCounter()
        self.tier_precision = TierPrecision()  # per tier; read by Stats and the metrics
        self.metrics: WorkerMetrics | None = None  # set by the process that serves them
        runner.engine.peer_fetch = peer_fetch
        self.peer = PeerCounters()
        self.peer_source = PeerSource(runner, credential=credential, enabled=peer_fetch,
                                      host=host, counters=self.peer)
        self.peer_fetcher = PeerFetcher(runner, credential=credential, enabled=peer_fetch,
                                        dialer=dialer, counters=self.peer)

    async def Generate(self, request: worker_pb2.GenerateRequest, context):
        sp = request.sampling
        params = SamplingParams(max_tokens=sp.max_tokens, temperature=sp.temperature,
                                seed=sp.seed if sp.HasField("seed") else None,
                                ignore_eos=sp.ignore_eos)
        try:
            lora, mm = prompt_keys(request, self.max_mm_items)
            tenant = check_tenant(request.tenant)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        # Unique per attempt: a client retrying with the same id must not collide with a
        # half-aborted earlier attempt.
        rid = f"{request.request_id or 'req'}-{uuid.uuid4().hex[:8]}"
        start = time.perf_counter()
        try:
            prompt = list(request.token_ids)
            hook = None
            if request.HasField("fetch"):
                hook = await self.follow(request.fetch, prompt, params,
                                         salt=request.salt or None, lora=lora, mm=mm)
            stream = self.runner.generate(prompt, params, request_id=rid,
                                          salt=request.salt or None, lora=lora, mm=mm,
                                          tenant=tenant, on_enqueued=hook)
            async for out in stream:
                if not out.finished:
                    yield worker_pb2.GenerateResponse(token_ids=out.new_token_ids)
                    continue
                seq = out.seq
                # a promise beyond the prompt is capped: the counters are uint64 on the wire
                self.precision.add(min(request.index_matched_tokens, seq.num_prompt_tokens),
                                   seq.num_cached_tokens)
                self.tier_precision.add(request.index_matched_tokens_by_tier,
                                        seq.cached_tokens_by_tier, seq.num_prompt_tokens)
                if self.metrics is not None and seq.ttft_s is not None:
                    self.metrics.ttft.observe(seq.ttft_s)
                self.peer.peer_hit_tokens += seq.cached_tokens_by_tier.get("peer", 0)
                yield worker_pb2.GenerateResponse(
                    token_ids=out.new_token_ids, finished=True, finish_reason=seq.finish_reason,
                    num_cached_tokens=seq.num_cached_tokens,
                    prompt_tokens=seq.num_prompt_tokens, ttft_s=seq.ttft_s or 0.0,
                    e2e_s=time.perf_counter() - start, worker_id=self.worker_id,
                    cached_tokens_by_tier=cached_by_tier(seq))
        except RequestError as exc:
            code = (grpc.StatusCode.RESOURCE_EXHAUSTED if exc.too_large
                    else grpc.StatusCode.INVALID_ARGUMENT)
            await context.abort(code, str(exc))
        except StepFailed as exc:
            await context.abort(grpc.StatusCode.INTERNAL,
                                f"worker {self.worker_id}: {exc}; this request was not "
                                "served here and may be retried on another worker")

    async def Pin(self, request: worker_pb2.PinRequest, context) -> worker_pb2.PinResponse:
        """Pin (or, with ``unpin``, unpin) a prefix in the device tier: ``worker.pin``. A pin
        answers the blocks pinned, of how many, and whether the pin cap cut it short."""
        try:
            pin = pin_call(request, self.max_mm_items)
            if pin.token_ids:  # the same checks as a prompt (vocabulary, context, pool)
                self.runner.engine.validate(list(pin.token_ids), SamplingParams(max_tokens=1))
        except RequestError as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED if exc.too_large
                                else grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            blocks = await pin.apply(self.runner)
        except RequestError as exc:  # the engine refused the prefix
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except StepFailed as exc:  # the warming prefill failed: the worker's fault
            await context.abort(grpc.StatusCode.INTERNAL, f"worker {self.worker_id}: {exc}")
        if not isinstance(blocks, Pinned):  # an unpin: the blocks released
            return worker_pb2.PinResponse(pinned_blocks=blocks)
        return worker_pb2.PinResponse(pinned_blocks=blocks, chain_blocks=blocks.of,
                                      cap_reached=blocks.capped)

    async def Stats(self, request, context) -> worker_pb2.WorkerStatsResponse:
        stats = await self.runner.call(lambda e: (
            e.kv.stats, e.load(), e.requests_done,
            engine_tier_figures(e, self.tier_precision), e.kv.num_pinned_blocks,
            e.kv.tenant_stats()))
        cache, load, done, tiers, pinned, tenants = stats
        from kvmesh.v1 import index_pb2

        return worker_pb2.WorkerStatsResponse(
            worker_id=self.worker_id, model=self.model_name, load=index_pb2.WorkerLoad(**load),
            cache=worker_pb2.CacheStats(
                queries=cache.queries, hits=cache.hits, hit_rate=cache.hit_rate,
                evictions=cache.evictions, used_blocks=cache.blocks_used,
                cached_blocks=cache.blocks_cached, free_blocks=cache.blocks_free,
                total_blocks=cache.blocks_total, cached_hashes=cache.hashes_cached),
            requests_done=done, index_promised_tokens=self.precision.promised,
            index_served_tokens=self.precision.served,
            tiers=tiers,
            pinned_blocks=pinned,
            mean_matched_tokens=cache.hits / cache.requests if cache.requests else 0.0,
            peer=self.peer.to_pb(),
            tenants=tenant_rows(tenants, [t.tier for t in tiers]))

    async def close_peers(self) -> None:
        """Close the data plane and the channels to peers (with the gRPC server)."""
        await self.peer_source.close()
        await self.peer_fetcher.close()

    async def FetchBlocks(self, request: worker_pb2.FetchBlocksRequest, context):
        """Serve a peer the blocks its ticket grants (``worker.rpc.fetch_call``)."""
        try:
            yield await self.peer_source.serve(request, self.worker_id)
        except Refused as e:
            await context.abort(e.code, f"worker {self.worker_id}: {e}")

    async def follow(self, plan: index_pb2.FetchPlan, prompt: list[int],
                     params: SamplingParams, *, salt: str | None = None,
                     lora: Lora | None = None, mm: tuple[MMItem, ...] = ()):
        """Pull ``plan``'s blocks for ``prompt`` (``worker.rpc.peer_fetch``); the
        ``on_enqueued`` hook importing what landed, or None (the request recomputes).
        Every host of this worker that takes fetch plans (its gRPC Generate, a Ray Serve
        replica) goes through here. Raises ``RequestError`` for a request the engine
        refuses (nothing is fetched for it)."""
        self.runner.engine.validate(prompt, params)
        landed = await self.peer_fetcher.fetch(plan, prompt, worker_id=self.worker_id,
                                               salt=salt, lora=lora, mm=mm)
        return landed.import_into(self.peer) if landed is not None else None


def access_auth(access_token: str | Callable[[], str | None] | None,
                pin_token: str | None = None) -> BearerAuth:
    """The worker's access policy: every WorkerService call needs THIS worker's access token
    (``kvmesh.rpc.auth.worker_access_token`` of the cluster's router token and this worker's
    id: a token minted for another worker is refused, never the router token itself),
    except ``Pin``, which needs ``pin_token`` when one is set (the metadata service's
    credential, ``kvmesh.rpc.auth.worker_pin_token``: routers cannot pin directly), and
    ``FetchBlocks``, which reaches its handler from any caller: its credential is the
    service's ticket and the requester's proof, checked there (no bearer token, the
    router's included, is worth anything to it); a role without a token is open; gRPC
    health stays open. ``access_token`` may be a function (``kvmesh.rpc.auth.shared_token``)
    for a token known only once the port is bound."""
    client = [shared_token("client", access_token)] if access_token else []
    pin = [shared_token("pin", pin_token)] if pin_token else []

    def role_of(method: str) -> str | None:
        if method == FETCH_METHOD:
            return None
        return "pin" if method == PIN_METHOD and pin else "client"

    return BearerAuth(role_of, {"client": client, "pin": pin})


async def create_server(address: str, runner: AsyncEngine, *, worker_id: str,
                        model_name: str, interceptors=(),
                        credentials: grpc.ServerCredentials | None = None,
                        access_token: str | Callable[[], str | None] | None = None,
                        pin_token: str | None = None,
                        max_inflight_per_conn: int = DEFAULT_MAX_INFLIGHT,
                        max_message_bytes: int = MAX_MESSAGE_BYTES,
                        max_mm_items: int = MAX_MM_ITEMS, peer_fetch: bool = True,
                        credential: str | None = None, dialer: Dialer | None = None,
                        data_host: str | None = None,
                        ) -> tuple[grpc.aio.Server, int, WorkerServicer]:
    """Build (not start) the server; bind ``host:0`` for a free port. Returns the port.

    Interceptors, outermost first: ``InternalErrors`` (nothing answers UNKNOWN), request
    limits (``kvmesh.rpc.limits``: calls in flight per connection, request bytes, undecodable
    requests -> INVALID_ARGUMENT), then the ``access_token`` / ``pin_token`` if given
    (``access_auth``), then ``interceptors``. ``credentials``: serve TLS. ``peer_fetch``,
    ``credential`` (what the worker presents to the service) and ``dialer`` (how it dials
    peers): see :class:`WorkerServicer`; ``await servicer.close_peers()`` with the server.
    ``data_host``: where the data plane listens and what its endpoints name (peers must
    reach it there); default: ``address``'s host.
    """
    chain: list[grpc.aio.ServerInterceptor] = [InternalErrors(), RequestLimits(
        max_inflight=max_inflight_per_conn, max_message_bytes=max_message_bytes)]
    if access_token or pin_token:
        chain.append(access_auth(access_token, pin_token))
    server = grpc.aio.server(interceptors=[*chain, *interceptors],
                             options=server_options(max_message_bytes, max_inflight_per_conn))
    servicer = WorkerServicer(runner, worker_id, model_name, max_mm_items,
                              peer_fetch=peer_fetch, credential=credential, dialer=dialer,
                              host=data_host or address.rpartition(":")[0].strip("[]")
                              or "127.0.0.1")
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    await health_servicer.set("kvmesh.v1.WorkerService", health_pb2.HealthCheckResponse.SERVING)
    port = (server.add_secure_port(address, credentials) if credentials
            else server.add_insecure_port(address))
    return server, port, servicer
