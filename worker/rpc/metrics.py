"""Prometheus metrics of one worker, named after vLLM's where they mean the same thing.

Cache and load figures are read at scrape time from the engine (plain integers, so reading
them from the scrape thread while the engine thread steps is safe enough for a gauge);
time to first token is a histogram observed when each request finishes.

The KV tiers (the KVBoost monitoring set), labelled ``tier`` ("gpu", "cpu", "disk"; only the
enabled ones): capacity, cached blocks and their ratio (the load factor), hit tokens and
hit rate, evictions (dropped) and offloads (moved down) - ``rate()`` gives them per second -,
onboarded blocks and bytes, the onboard latency histogram (one observation per onboard and
tier), and the index's precision (tokens it promised on a tier, and those the worker no
longer had there: ``worker.kv_cache.tier_precision``); plus pinned blocks, the mean matched
prefix per admitted request and, with a disk tier, the block files it deleted as unusable
(``disk_files_rejected``: damaged, or not written under this worker's key).

Peer KV transfer (``worker.rpc.peer_stats``), labelled ``role`` ("receiver", "source"):
fetches, blocks and bytes; fallbacks to recompute and refusals, labelled ``reason``; the
prompt tokens served from a peer's blocks; the fetch latency histogram.

Per tenant (``worker.rpc.tenant_metrics``), labelled ``tenant`` (at most ``TOP_TENANTS`` of
them plus ``(other)``) and ``tier``: cached and quota blocks, hit and evicted blocks,
requests, prompt and cached tokens.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from kvmesh.tier_figures import hit_rate, load_factor
from worker.engine.async_engine import AsyncEngine
from worker.kv_cache.tenant_rows import enabled
from worker.kv_cache.tier_precision import TierPrecision
from worker.kv_cache.tier_stats import engine_tier_figures
from worker.rpc.peer_stats import PeerCounters
from worker.rpc.tenant_metrics import TenantSeries, read_racing, tenant_families

TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0)


class _EngineCollector:
    def __init__(self, runner: AsyncEngine, worker_id: str, precision: TierPrecision,
                 peer: PeerCounters) -> None:
        self.runner = runner
        self.worker_id = worker_id
        self.precision = precision
        self.peer = peer
        self.tenants = TenantSeries()

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
        yield gauge("pinned_blocks", "Device blocks held by pins.", engine.kv.num_pinned_blocks)
        yield gauge("mean_matched_tokens", "Mean cached prefix per admitted request (tokens).",
                    stats.hits / stats.requests if stats.requests else 0.0)
        store = engine.copies.store if engine.copies is not None else None
        if store is not None:
            yield counter("disk_files_rejected", "Disk-tier block files deleted as unusable "
                          "(damaged, forged, or not written by this worker).", store.rejected)
        yield from self._tiers(engine, stats.queries)
        yield from self._peer()
        kv = engine.kv  # read from this thread while the engine steps: see read_racing
        yield from tenant_families(self.tenants, read_racing(kv.tenant_stats),
                                   enabled(read_racing(kv.tier_stats)), self.worker_id)

    def _peer(self):
        """Peer KV transfer, both sides (``role``: "receiver" fetches, "source" serves)."""
        p, worker = self.peer, self.worker_id
        sides = {"fetches": (p.fetches, p.served), "blocks": (p.fetched_blocks, p.served_blocks),
                 "bytes": (p.fetched_bytes, p.served_bytes)}
        for name, (received, served) in sides.items():
            c = CounterMetricFamily(f"kvmesh_worker_peer_{name}",
                                    f"Peer KV fetches: {name} received / served.",
                                    labels=["worker_id", "role"])
            c.add_metric([worker, "receiver"], received)
            c.add_metric([worker, "source"], served)
            yield c
        for name, doc, counts in (
                ("peer_fallbacks", "Fetches that fell back (in part) to recompute, by reason.",
                 p.fallbacks),
                ("peer_refusals", "Fetches refused as source, by reason.", p.refusals)):
            c = CounterMetricFamily(f"kvmesh_worker_{name}", doc,
                                    labels=["worker_id", "reason"])
            for reason, n in sorted(counts.items()):
                c.add_metric([worker, reason], n)
            yield c
        c = CounterMetricFamily("kvmesh_worker_peer_hit_tokens",
                                "Prompt tokens whose KV came from a peer.", labels=["worker_id"])
        c.add_metric([worker], p.peer_hit_tokens)
        yield c
        h = HistogramMetricFamily("kvmesh_worker_peer_fetch_latency_seconds",
                                  "One peer fetch: plan to landed bytes (receiver), request "
                                  "to bytes offered (source).", labels=["worker_id", "role"])
        for role in ("receiver", "source"):
            buckets, total = p.latency.histogram(role)
            h.add_metric([worker, role], buckets, total)
        yield h

    def _tiers(self, engine, queries: int):
        figures = engine_tier_figures(engine, self.precision)
        labels, worker = ["worker_id", "tier"], self.worker_id
        for kind, name, doc, value in _TIER_FAMILIES:
            m = kind(f"kvmesh_worker_{name}", doc, labels=labels)
            for f in figures:
                m.add_metric([worker, f.tier], value(f, queries))
            yield m
        h = HistogramMetricFamily("kvmesh_worker_onboard_latency_seconds",
                                  "Time of one onboard's copies from one tier.", labels=labels)
        for f in figures:
            if f.tier != "gpu":
                buckets, total = engine.onboards.histogram(f.tier)
                h.add_metric([worker, f.tier], buckets, total)
        yield h


def _field(name: str):
    """A family's value: ``TierStats`` field ``name`` as reported."""
    return lambda t, _queries: getattr(t, name)


G, C = GaugeMetricFamily, CounterMetricFamily
# (kind, metric name after kvmesh_worker_, help, value of one tier's TierStats and the
# worker's queried tokens): the figures are Stats', the derived ones kvmesh.tier_figures'
_TIER_FAMILIES = (
    (G, "tier_capacity_blocks", "Blocks the tier can hold.", _field("capacity_blocks")),
    (G, "tier_cached_blocks", "Blocks the tier holds now.", _field("cached_blocks")),
    (G, "tier_load_factor", "Cached blocks / capacity of the tier.",
     lambda t, _q: load_factor(t)),
    (C, "tier_hit_tokens", "Prompt tokens served from the tier.", _field("hit_tokens")),
    (G, "tier_hit_rate", "Tier hit tokens / prompt tokens looked up.", hit_rate),
    (C, "tier_evictions", "Blocks dropped from the tier (not moved down).",
     _field("evictions")),
    (C, "tier_offloads", "Blocks moved from the tier to the next lower one.",
     _field("offloads")),
    (C, "tier_onboard_blocks", "Blocks copied from the tier to the device.",
     _field("onboard_blocks")),
    (C, "tier_onboard_bytes", "Bytes copied from the tier to the device.",
     _field("onboard_bytes")),
    (C, "index_promised_tokens", "Prompt tokens the index promised on the tier.",
     _field("index_promised_tokens")),
    (C, "index_missed_tokens", "Promised tokens the worker no longer had on the tier (or a "
     "faster one).", _field("index_missed_tokens")),
)


class _Included(Collector):
    """Another registry's metrics, collected at scrape time."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self):
        return self.registry.collect()


class WorkerMetrics:
    """One registry per worker (tests run several workers in one process)."""

    def __init__(self, runner: AsyncEngine, worker_id: str,
                 precision: TierPrecision | None = None,
                 peer: PeerCounters | None = None) -> None:
        """``precision``: the server's count of the index's promises per tier (the
        servicer's ``tier_precision``); None: none counted. ``peer``: the servicer's peer
        transfer counters (None: none)."""
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(runner, worker_id,
                                                precision or TierPrecision(),
                                                peer or PeerCounters()))
        self.ttft = Histogram("kvmesh_worker_time_to_first_token_seconds",
                              "Time to first token, measured on the worker.",
                              buckets=TTFT_BUCKETS, registry=self.registry)

    def include(self, registry: CollectorRegistry) -> None:
        """Serve ``registry``'s metrics on this page too (the HTTP API's vLLM page)."""
        self.registry.register(_Included(registry))

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Expose ``/metrics`` over HTTP on ``host``; returns the bound port (``port=0``: a
        free one). The endpoint has no authentication: keep ``host`` on loopback unless the
        network it faces may read the worker's load and cache figures."""
        server, _ = start_http_server(port, addr=host, registry=self.registry)
        return server.server_port
