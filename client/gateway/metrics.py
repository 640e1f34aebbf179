"""The gateway's Prometheus metrics: ``GET /metrics`` on the API port for the metrics key
only, or a listener of their own (``--metrics-port``, loopback by default).

The figures sum every tenant's requests, so no tenant key opens them. Labels are bounded
(an unknown path is ``other``). Each app has its own registry.

See docs/architecture.md#the-openai-gateway.
"""
from __future__ import annotations

import hmac

from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvmesh.openai.errors import OpenAIError

# Seconds: a cached prefix answers in milliseconds, a cold long prompt in seconds.
_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/models", "/health",
                   "/ping", "/metrics"})
_MODEL_PATH = "/v1/models/"
CONTENT_TYPE = CONTENT_TYPE_LATEST


class GatewayMetrics:
    """The gateway's counters and histogram in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("kvmesh_gateway_requests_total", "HTTP answers, by route "
                                "and status code", ("path", "status"), registry=self.registry)
        self.ttft = Histogram("kvmesh_gateway_ttft_seconds", "Time to first token of each "
                              "generation", buckets=_TTFT_BUCKETS, registry=self.registry)
        self.prompt_tokens = Counter("kvmesh_gateway_prompt_tokens_total",
                                     "Prompt tokens generated for", registry=self.registry)
        self.cached_tokens = Counter("kvmesh_gateway_cached_tokens_total", "Prompt tokens "
                                     "served from a worker's prefix cache (as reported to "
                                     "callers)", registry=self.registry)
        self.shared_cached_tokens = Counter(
            "kvmesh_gateway_shared_cache_cached_tokens_total", "Prompt tokens served from a "
            "worker's prefix cache to requests in the shared cache of --insecure-shared-cache "
            "(hidden from those callers; not in kvmesh_gateway_cached_tokens_total)",
            registry=self.registry)
        self.admitted = Gauge("kvmesh_gateway_admitted_prompts", "Prompts holding one of "
                              "the gateway's --max-concurrent slots", registry=self.registry)
        self.waiting = Gauge("kvmesh_gateway_waiting_requests", "Requests waiting for a slot "
                             "(weighted fair admission under --max-concurrent)",
                             registry=self.registry)
        self.forwards = Counter("kvmesh_gateway_engine_forwards_total", "Requests forwarded "
                                "to HTTP engines, by outcome: relayed (an engine answered), "
                                "exhausted (every engine failed), failover (one engine "
                                "failed, the next was tried), refused (an HTTP engine not "
                                "in the engine list, never contacted)", ("outcome",),
                                registry=self.registry)

    def generation(self, ttft_s: float | None, prompt_tokens: int,
                   cached_tokens: int | None, hidden_cached: int = 0) -> None:
        """Record one finished generation (``ttft_s`` None: not measured): its cached
        tokens as reported to the caller, and those hidden from it (shared cache)."""
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
        self.prompt_tokens.inc(prompt_tokens)
        self.cached_tokens.inc(cached_tokens or 0)
        self.shared_cached_tokens.inc(hidden_cached)

    def render(self) -> bytes:
        """The text exposition format of every metric."""
        return generate_latest(self.registry)

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` on a listener of its own (a daemon thread); returns the bound
        port (``port=0``: a free one). No authentication: keep ``host`` on loopback unless
        the network it faces may read every tenant's figures."""
        server, _ = start_http_server(port, addr=host, registry=self.registry)
        return server.server_port


def check_metrics_key(metrics_key: str | None, authorization: str | None) -> None:
    """Raise ``OpenAIError`` unless ``authorization`` is ``Bearer <metrics_key>`` (404 when
    the gateway has no metrics key: its API port serves no metrics)."""
    if metrics_key is None:
        raise OpenAIError(404, "metrics are not served on this port: start the gateway with "
                          "--metrics-key (and send it as a Bearer key) or --metrics-port",
                          code="metrics_not_served")
    given = (authorization or "").encode()
    if not hmac.compare_digest(given, f"Bearer {metrics_key}".encode()):
        raise OpenAIError(401, "GET /metrics needs 'Authorization: Bearer <metrics key>' "
                          "(the gateway's --metrics-key; tenant keys do not open it)",
                          code="invalid_api_key", type_="invalid_request_error")


def install_metrics_route(app: FastAPI, metrics: GatewayMetrics,
                          metrics_key: str | None) -> None:
    """``GET`` and ``HEAD /metrics`` on ``app``, for the metrics key only (see the module)."""

    @app.api_route("/metrics", methods=["GET", "HEAD"])
    async def render(request: Request) -> Response:
        check_metrics_key(metrics_key, request.headers.get("authorization"))
        return Response(metrics.render(), media_type=CONTENT_TYPE)


def path_label(path: str) -> str:
    """The ``path`` label of a request path: a route, ``/v1/models/{id}``, or ``other``."""
    if path in PATHS:
        return path
    return "/v1/models/{id}" if path.startswith(_MODEL_PATH) else "other"


class CountRequests:
    """ASGI middleware: counts each HTTP answer by route and status code."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = path_label(scope["path"])

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(path, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counted)
