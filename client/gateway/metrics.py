"""The gateway's Prometheus metrics, served at ``GET /metrics`` on its own HTTP port.

``kvmesh_gateway_requests_total{path,status}`` counts every HTTP answer (``path`` is one of
the gateway's routes or ``other``, so a scanner cannot grow the label set);
``kvmesh_gateway_ttft_seconds`` is each generation's time to first token as the gateway's
kvmesh client saw it; ``kvmesh_gateway_prompt_tokens_total`` and
``kvmesh_gateway_cached_tokens_total`` sum the prompt tokens and the cached ones *reported to
callers*: a request whose cached count is hidden (``--insecure-shared-cache``) adds 0, so the
unauthenticated endpoint is no better a timing oracle than the answers themselves (requests
an HTTP engine answered are not in these: their usage is the engine's, relayed unread);
``kvmesh_gateway_engine_forwards_total{outcome}`` counts what forwarding to HTTP engines did.

Each app has its own registry, so several gateways in one process (tests) do not collide.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Seconds: a cached prefix answers in milliseconds, a cold long prompt in seconds.
_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/models", "/health",
                   "/metrics"})
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
        self.forwards = Counter("kvmesh_gateway_engine_forwards_total", "Requests forwarded "
                                "to HTTP engines, by outcome: relayed (an engine answered), "
                                "exhausted (every engine failed), failover (one engine "
                                "failed, the next was tried)", ("outcome",),
                                registry=self.registry)

    def generation(self, ttft_s: float | None, prompt_tokens: int,
                   cached_tokens: int | None) -> None:
        """Record one finished generation (``ttft_s`` None: not measured)."""
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
        self.prompt_tokens.inc(prompt_tokens)
        self.cached_tokens.inc(cached_tokens or 0)

    def render(self) -> bytes:
        """The text exposition format of every metric."""
        return generate_latest(self.registry)


class CountRequests:
    """ASGI middleware: counts each HTTP answer by route and status code."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"] if scope["path"] in PATHS else "other"

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(path, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counted)
