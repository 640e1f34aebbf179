"""The vLLM metrics of ``kvmesh worker --http-port``, in vLLM's metric names.

Served on the worker's metrics listener (loopback by default), never on the HTTP API's port,
with vLLM's labels, so whatever reads a vLLM engine's page reads a worker's the same way.
Figures are read at scrape time from the engine's plain integers.

See docs/architecture.md#worker-vllm-face.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from worker.engine.async_engine import AsyncEngine

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PROMPT_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000)
LABELS = ("model_name", "engine")


class _Engine:
    def __init__(self, runner: AsyncEngine, labels: list[str]) -> None:
        self.runner = runner
        self.labels = labels

    def collect(self):
        engine = self.runner.engine
        load, stats, kv = self.runner.load, engine.kv.stats, engine.kv
        values = self.labels

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=LABELS)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=LABELS)
            c.add_metric(values, value)
            return c

        yield gauge("vllm:num_requests_running", "Requests in the running batch.",
                    load["running"])
        yield gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.",
                    load["waiting"])
        yield gauge("vllm:kv_cache_usage_perc", "Fraction of KV blocks held by requests.",
                    kv.usage)
        tiers = kv.tier_stats()
        info = GaugeMetricFamily("vllm:cache_config_info", "The KV cache configuration.",
                                 labels=[*LABELS, "block_size", "num_gpu_blocks",
                                         "num_cpu_blocks", "enable_prefix_caching"])
        cpu = tiers["cpu"].capacity_blocks if "cpu" in tiers else 0
        info.add_metric([*values, str(kv.block_size), str(kv.num_blocks), str(cpu),
                         str(kv.enable_caching)], 1.0)
        yield info
        yield counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix "
                      "cache.", stats.queries)
        yield counter("vllm:prefix_cache_hits", "Prompt tokens served from the prefix cache.",
                      stats.hits)
        yield counter("vllm:num_preemptions", "Preempted requests.",
                      engine.scheduler.num_preemptions)


class VllmMetrics:
    """The page of one worker; ``finished`` records a request served over HTTP."""

    def __init__(self, runner: AsyncEngine, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.labels = [model_name, "0"]
        self.registry.register(_Engine(runner, self.labels))
        self.prompt_hist = Histogram("vllm:request_prompt_tokens", "Prompt tokens per request.",
                                     LABELS, buckets=PROMPT_BUCKETS, registry=self.registry)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens processed.", LABELS,
                                     registry=self.registry)
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated.", LABELS,
                                         registry=self.registry)

    def finished(self, prompt_tokens: int, generated: int) -> None:
        self.prompt_hist.labels(*self.labels).observe(prompt_tokens)
        self.prompt_tokens.labels(*self.labels).inc(prompt_tokens)
        self.generation_tokens.labels(*self.labels).inc(generated)

    def render(self) -> bytes:
        return generate_latest(self.registry)
