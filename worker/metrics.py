"""Prometheus metrics of one worker, named after vLLM's where they mean the same thing.

Cache and load figures are read at scrape time from the engine (plain integers, so reading
them from the scrape thread while the engine thread steps is safe enough for a gauge);
time to first token is a histogram observed when each request finishes.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from worker.async_engine import AsyncEngine

TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0)


class _EngineCollector:
    def __init__(self, runner: AsyncEngine, worker_id: str) -> None:
        self.runner = runner
        self.worker_id = worker_id

    def collect(self):
        engine = self.runner.engine
        stats, load = engine.kv.stats, self.runner.load
        labels = ["worker_id"]
        ids = [self.worker_id]

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(f"kvmesh_worker_{name}", doc, labels=labels)
            c.add_metric(ids, value)
            return c

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(f"kvmesh_worker_{name}", doc, labels=labels)
            g.add_metric(ids, value)
            return g

        yield counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                      stats.queries)
        yield counter("prefix_cache_hits", "Prompt tokens served from the prefix cache.",
                      stats.hits)
        yield counter("prefix_cache_evictions", "Cached blocks evicted for reuse.",
                      stats.evictions)
        yield counter("requests_finished", "Requests completed.", engine.requests_done)
        yield counter("preemptions", "Sequences preempted by recompute.",
                      engine.scheduler.num_preemptions)
        yield gauge("kv_blocks_total", "KV blocks in the pool.", stats.blocks_total)
        yield gauge("kv_blocks_used", "KV blocks held by running requests.", stats.blocks_used)
        yield gauge("kv_blocks_cached", "KV blocks holding a cached hash.", stats.blocks_cached)
        yield gauge("kv_cache_usage_perc", "Fraction of KV blocks in use.",
                    stats.blocks_used / stats.blocks_total if stats.blocks_total else 0.0)
        yield gauge("num_requests_running", "Sequences running.", load["running"])
        yield gauge("num_requests_waiting", "Sequences waiting.", load["waiting"])
        yield gauge("queued_prefill_tokens", "Prompt tokens not computed yet.",
                    load["queued_prefill_tokens"])


class WorkerMetrics:
    """One registry per worker (tests run several workers in one process)."""

    def __init__(self, runner: AsyncEngine, worker_id: str) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(runner, worker_id))
        self.ttft = Histogram("kvmesh_worker_time_to_first_token_seconds",
                              "Time to first token, measured on the worker.",
                              buckets=TTFT_BUCKETS, registry=self.registry)

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Expose ``/metrics`` over HTTP on ``host``; returns the bound port (``port=0``: a
        free one). The endpoint has no authentication: keep ``host`` on loopback unless the
        network it faces may read the worker's load and cache figures."""
        server, _ = start_http_server(port, addr=host, registry=self.registry)
        return server.server_port
