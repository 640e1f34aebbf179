"""Prometheus metrics of one bridge process, per engine rank (label ``worker_id``).

Read at scrape time from the objects that keep the counts (nothing counted twice);
``kvmesh_bridge_lag_seconds`` is observed by the link as the service acknowledges events.

See docs/architecture.md#bridge-configuration-and-load.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from bridge.engine_state import EngineState
from bridge.link import EngineLink
from bridge.subscriber import Subscriber

LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
               60.0)
_STREAM = {  # SubscriberStats field -> (metric, help)
    "messages": ("messages_total", "Live event messages received."),
    "gaps": ("gaps_total", "Skipped seqs in the live stream."),
    "replays": ("replays_total", "Replay requests sent to the engine."),
    "replayed": ("replayed_batches_total", "Batches received from replays."),
    "replay_failures": ("replay_failures_total", "Replays without a complete answer."),
    "replay_capped": ("replay_capped_total", "Replays cut short at their count/byte caps."),
    "crashes": ("subscriber_crashes_total", "Subscriber failures (restarted, state cleared)."),
    "restarts": ("restarts_total", "Engine restarts detected (another engine process)."),
    "unfilled": ("unfilled_total", "Losses nothing could fill (the engine's entries cleared)."),
    "duplicates": ("duplicates_total", "Live batches a replay had already delivered."),
    "malformed": ("malformed_total", "Messages or payloads that did not parse."),
    "disconnects": ("disconnects_total", "Disconnections of the event stream."),
    "lag_clears": ("lag_clears_total",
                   "Ingest behind past its bound with removals queued: entries cleared."),
    "skipped": ("skipped_batches_total", "Queued batches dropped unread by lag clears."),
}
_STATE = {
    "batches": ("batches_total", "Event batches applied."),
    "stored_blocks": ("blocks_stored_total", "Block copies stored, as the engine reported."),
    "removed_blocks": ("blocks_removed_total", "Block copies removed."),
    "unknown_removes": ("unknown_removes_total", "Removals of blocks the bridge did not hold."),
    "clears": ("clears_total", "Clears (AllBlocksCleared, restarts, losses)."),
    "rehashed": ("rehashed_blocks_total", "Blocks whose kvmesh chain hash was computed."),
    "memo_hits": ("memo_hits_total", "Blocks stored again, not rehashed."),
}
_LINK = {
    "heartbeats": ("heartbeats_total", "Heartbeats the service answered."),
    "registrations": ("registrations_total", "Registrations with the service."),
    "resyncs": ("resyncs_total", "Snapshots sent (SyncWorker)."),
    "events_published": ("events_published_total", "Index events published."),
    "publishes": ("publishes_total", "PublishEvents calls the service acknowledged."),
    "silent_beats": ("silent_beats_total", "Heartbeats skipped: engine metrics silent."),
    "overflows": ("overflows_total", "Pending events dropped for a snapshot."),
    "sheds": ("sheds_total", "Pending events shed for a snapshot (they outweighed it)."),
    "stale_beats": ("stale_beats_total", "Heartbeats withheld: the bridge was stuck."),
}


class Rank(Protocol):
    worker_id: str
    state: EngineState
    sub: Subscriber
    link: EngineLink


@dataclass(eq=False)  # hashable: the registry keys collectors by identity
class _Collector:
    ranks: Iterable[Rank]

    def collect(self) -> Iterator[Metric]:
        ranks = list(self.ranks)
        now = time.time()
        label = ["worker_id"]

        def family(table: dict[str, tuple[str, str]],
                   value: Callable[[Rank, str], float]) -> Iterator[Metric]:
            for key, (name, doc) in table.items():
                m = CounterMetricFamily(f"kvmesh_bridge_{name.removesuffix('_total')}", doc,
                                        labels=label)
                for r in ranks:
                    m.add_metric([r.worker_id], float(value(r, key)))
                yield m

        yield from family(_STREAM, lambda r, key: getattr(r.sub.stats, key))
        yield from family(_STATE, lambda r, key: getattr(r.state.stats, key))
        yield from family(_LINK, lambda r, key: r.link.counters[key])
        unroutable = CounterMetricFamily("kvmesh_bridge_unroutable_blocks",
                                         "New blocks never indexed, by reason.",
                                         labels=["worker_id", "reason"])
        indexed = GaugeMetricFamily("kvmesh_bridge_indexed_blocks",
                                    "Chain hashes the index holds for the engine.", labels=label)
        pending = GaugeMetricFamily("kvmesh_bridge_pending_events",
                                    "Index events waiting to be published.", labels=label)
        behind = GaugeMetricFamily("kvmesh_bridge_behind_seconds",
                                   "Now minus the last applied batch's engine time stamp.",
                                   labels=label)
        up = GaugeMetricFamily("kvmesh_bridge_up",
                               "1 while registered and the engine's metrics answer.",
                               labels=label)
        for r in ranks:
            for reason, n in sorted(r.state.stats.unroutable.items()):
                unroutable.add_metric([r.worker_id, reason], n)
            indexed.add_metric([r.worker_id], r.state.indexed_blocks)
            pending.add_metric([r.worker_id], len(r.link.pending))
            ts = r.state.last_ts
            behind.add_metric([r.worker_id], max(0.0, now - ts) if ts else 0.0)
            up.add_metric([r.worker_id], float(r.link.registered and not r.link.silent))
        yield from (unroutable, indexed, pending, behind, up)


class BridgeMetrics:
    """One registry for the process (tests run several bridges in one process)."""

    def __init__(self, ranks: Iterable[Rank]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_Collector(ranks))
        self.lag = Histogram("kvmesh_bridge_lag_seconds",
                             "Engine batch timestamp to index acknowledgement.", ["worker_id"],
                             buckets=LAG_BUCKETS, registry=self.registry)
        self._server = None

    def watch(self, link: EngineLink) -> None:
        """Observe ``link``'s lag."""
        link.on_lag = self.lag.labels(link.worker_id).observe

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """``/metrics`` over HTTP (no authentication: loopback unless meant); the bound
        port (``port=0``: a free one)."""
        self._server, _ = start_http_server(port, addr=host, registry=self.registry)
        return self._server.server_port

    def close(self) -> None:
        """Stop serving ``/metrics`` (if it was served)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
