"""Prometheus metrics of one service replica (its own registry, so several servers can live
in one process), exported over HTTP with ``--metrics-port`` and summarized in Stats."""
from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily

_LATENCY_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)


class ServiceMetrics:
    """Counters and histograms named ``kvmesh_*``; values are per replica."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.routes = Counter("kvmesh_routes", "Route answers", ["policy", "degraded"],
                              registry=r)
        self.route_latency = Histogram("kvmesh_route_latency_seconds",
                                       "Route handling time in the service", registry=r,
                                       buckets=_LATENCY_BUCKETS)
        self.prompt_tokens = Counter("kvmesh_route_prompt_tokens",
                                     "Prompt tokens of routed requests", registry=r)
        self.matched_tokens = Counter("kvmesh_route_matched_tokens",
                                      "Cached tokens of the chosen worker", registry=r)
        self.fetch_plans = Counter("kvmesh_route_fetch_plans", "Peer fetch plans in Route "
                                   "answers, by the candidate's rank (chosen: the first)",
                                   ["rank"], registry=r)
        self.fetch_blocks = Counter("kvmesh_route_fetch_blocks", "Blocks the chosen "
                                    "candidates' fetch plans pull from a peer", registry=r)
        self.lookups = Counter("kvmesh_index_lookups", "Index lookups", ["result"], registry=r)
        self.events = Counter("kvmesh_events_applied", "KV events applied to the index",
                              registry=r)
        self.resyncs = Counter("kvmesh_resyncs", "Resync / re-register requests sent",
                               ["reason"], registry=r)
        self.live_workers = Gauge("kvmesh_live_workers", "Workers alive (heartbeating)",
                                  registry=r)
        self.degraded = Counter("kvmesh_degraded_answers", "Route/Stats answered without "
                                "the index", registry=r)

    def count_merges(self, writes: Any) -> None:
        """Export ``writes.merged`` (a cluster backend's ``GroupCommit``: batches that went
        in a wave of several) as ``kvmesh_index_merged_batches_total``, read at scrape."""
        self.registry.register(_Merged(writes))

    def summary(self) -> dict[str, float]:
        """Totals by metric family (labels summed), for StatsResponse.counters."""
        out: dict[str, float] = {}
        for family in self.registry.collect():
            for s in family.samples:
                if s.name.endswith("_created") or s.name.endswith("_bucket"):
                    continue
                key = s.name.removeprefix("kvmesh_")
                out[key] = out.get(key, 0.0) + float(s.value)
        return out


class _Merged:
    """Collector of a ``GroupCommit``'s merged batches (a counter it keeps itself)."""

    def __init__(self, writes: Any) -> None:
        self.writes = writes

    def collect(self) -> Any:
        yield CounterMetricFamily("kvmesh_index_merged_batches", "Event batches written in "
                                  "a wave with other workers' (cluster backend: group "
                                  "commit)", value=self.writes.merged)
